// The tspemu command; everything but argv handling is in the tspemu_cli library
// (tspemu_main.hpp), which the tests call directly.
#include <iostream>
#include <string>
#include <vector>

#include "tspemu/reference/blas_kernel.hpp"
#include "tspemu_main.hpp"

int main(int argc, char** argv) {
  // Before anything else: may re-execute this process so OpenBLAS loads its best kernels.
  tspemu::ref::select_best_blas_kernel(argc, argv);
  const std::vector<std::string> args(argv + 1, argv + argc);
  return tspemu::app::tspemu_main(args, std::cout, std::cerr);
}
