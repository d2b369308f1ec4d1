// Uses an installed tspemu from outside its build: one public header of each module, linked
// through find_package(tspemu) or `pkg-config --cflags --libs tspemu`. Exits 1 on a wrong result.
//   runtime:   4 ranks all-reduce small integers (exact in float, so compared with ==);
//   reference: one double GEMM of small integers (OpenBLAS and the oneTBB oracle path, exact);
//   plan:      the strategy table's names and the cost model's forward volumes (TSP/TP = 1 at
//              B·S = 8h for the paper's 7B-class model);
//   tsp:       the zigzag sequence layout's positions.
#include <array>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/runtime/all_reduce.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/sequence_layout.hpp"

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED %s\n", what);
    ++failures;
  }
}

void check_all_reduce() {
  constexpr int kRanks = 4;
  constexpr int kCount = 7;
  std::array<std::vector<float>, kRanks> got;
  tspemu::World world({.ranks = kRanks});
  world.run([&](tspemu::Rank& r) {
    std::vector<float> x(kCount);  // [kCount], rank r holds 10·r + i
    for (int i = 0; i < kCount; ++i) x[i] = static_cast<float>(10 * r.id() + i);
    tspemu::all_reduce<float>(r.comm(), std::span<float>(x));
    got[r.id()] = x;
  });
  bool ok = true;
  for (const auto& x : got) {
    for (int i = 0; i < kCount; ++i) ok = ok && x[i] == static_cast<float>(60 + kRanks * i);
  }
  expect(ok, "all_reduce over 4 ranks: element i must be sum_r (10r + i) = 60 + 4i on every rank");
}

void check_matmul() {
  // torch: C = A @ B.T
  const std::vector<double> A = {1, 2, 3, 4, 5, 6};   // [2, 3]
  const std::vector<double> B = {1, 0, -1, 2, 1, 0};  // [2, 3]
  const std::vector<double> want = {-2, 4, -2, 13};   // [2, 2]
  std::vector<double> C(4);                           // [2, 2]
  tspemu::ref::matmul_nt<double>(C.data(), A.data(), B.data(), 2, 2, 3);
  expect(C == want, "ref::matmul_nt<double>: [[1,2,3],[4,5,6]] @ [[1,0,-1],[2,1,0]].T");
}

void check_plan() {
  namespace cost = tspemu::tsp::cost;
  expect(std::string(tspemu::tsp::strategy_named("tp-sp").title) == "TP+SP",
         "strategy table: tp-sp is titled TP+SP");
  const cost::ModelShape m = cost::paper_7b(1, 8 * 4096);  // B·S = 8h
  expect(cost::paper_forward_elements(m, cost::Strategy::tsp(8)) ==
             cost::paper_forward_elements(m, cost::Strategy::tp(8)),
         "cost model: TSP's forward volume equals TP's at B·S = 8h (1/2 + 4h/(B·S) = 1)");
}

void check_layout() {
  const tspemu::tsp::SequenceLayout zigzag(tspemu::tsp::LayoutKind::zigzag, 4, 16);
  // 8 chunks of 2 tokens; rank 1 holds chunks 1 and 6.
  expect(zigzag.positions(1) == std::vector<std::int64_t>{2, 3, 12, 13},
         "zigzag layout D=4, S=16: rank 1 must hold positions 2, 3, 12, 13");
}

}  // namespace

int main() {
  check_all_reduce();
  check_matmul();
  check_plan();
  check_layout();
  if (failures == 0)
    std::puts("consumer: runtime, reference, plan and tsp from the installed package: ok");
  return failures == 0 ? 0 : 1;
}
