#include "tspemu/reference/blas_kernel.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "tspemu/reference/cpu_features.hpp"

namespace tspemu::ref {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool same_core(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Instruction-set tier of an OpenBLAS core name: 1 pre-AVX2 (SSE*, AVX1 without FMA), 2 AVX2+FMA,
// 3 AVX-512; 0 unknown. Names as OpenBLAS 0.3.21's dynamic.c spells them (corename[]).
int core_tier(std::string_view core) {
  static constexpr std::string_view pre_avx2[] = {
      "Katmai", "Coppermine",  "Northwood", "Prescott",  "Banias",     "Atom",         "Core2",
      "Penryn", "Dunnington",  "Nehalem",   "Athlon",    "Opteron",    "Opteron_SSE3", "Barcelona",
      "Nano",   "Sandybridge", "Bobcat",    "Bulldozer", "Piledriver", "Steamroller",  "Generic"};
  static constexpr std::string_view avx2[] = {"Haswell", "Excavator", "Zen"};
  static constexpr std::string_view avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  auto in = [&](const auto& list) {
    return std::any_of(std::begin(list), std::end(list),
                       [&](std::string_view n) { return same_core(n, core); });
  };
  if (in(avx512)) return 3;
  if (in(pre_avx2)) return 1;
  if (in(avx2)) return 2;
  return 0;
}

// Exec /proc/self/exe with argv after setting the given variables; returns only on failure.
void reexec(char** argv, const char* why) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::execv("/proc/self/exe", argv);
  std::cerr << "tspemu: blas: execv(/proc/self/exe) to " << why
            << " failed: " << std::strerror(errno) << "; running on " << describe_blas() << "\n";
}

}  // namespace

BlasKernel blas_kernel() {
  BlasKernel k;
  k.config = openblas_get_config();
  k.core = openblas_get_corename();
  // "OpenBLAS 0.3.21 NO_LAPACKE ..." -> "OpenBLAS 0.3.21"
  const auto first = k.config.find(' ');
  const auto second = first == std::string::npos ? first : k.config.find(' ', first + 1);
  k.library = k.config.substr(0, second);
  return k;
}

std::string best_supported_core() {
  const CpuFeatures f = cpu_features();
  if (f.avx512_bf16) return "Cooperlake";
  if (f.avx512) return "SkylakeX";
  if (f.avx2_fma) return "Haswell";
  return "";
}

bool is_fallback(std::string_view core, std::string_view best) {
  return core_tier(core) == 1 && core_tier(best) >= 2;
}

bool is_fallback() {
  return is_fallback(blas_kernel().core, best_supported_core());
}

std::string describe_blas() {
  const BlasKernel k = blas_kernel();
  const BlasEnvironment env = blas_environment();
  const std::string best = best_supported_core();
  std::string line = k.library + " " + k.core + " (";
  if (!env.rejected.empty()) {
    line += "selected " + env.rejected + " failed the GEMM check; kept detected " + k.core;
  } else if (!env.detected.empty() && same_core(env.coretype, k.core)) {
    line += "selected; detected " + env.detected;
  } else if (!env.coretype.empty()) {
    line += "OPENBLAS_CORETYPE=" + env.coretype;
    if (is_fallback(k.core, best)) line += "; processor supports " + best;
  } else if (is_fallback(k.core, best)) {
    line += "fallback: processor supports " + best + "; set OPENBLAS_CORETYPE=" + best;
  } else {
    line += "detected";
  }
  return line + ")";
}

bool blas_gemm_check() {
  // Multiples of 1/16 in [-1, 1]: products are multiples of 1/256, |sums| <= K, so every partial
  // sum fits in 24 bits and the fp32 result equals the exact one in any order. Two shapes: a
  // square one and one whose odd sizes exercise every kernel's edge (tail) code; B transposed as
  // in the reference's Linear forward.
  auto check = [](int M, int N, int K) {
    std::vector<float> A(static_cast<std::size_t>(M) * K), B(static_cast<std::size_t>(N) * K),
        C(static_cast<std::size_t>(M) * N, -7.0f);
    for (std::size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(int(i * 7 % 33) - 16) / 16;
    for (std::size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(int(i * 5 % 31) - 15) / 16;
    // C[M, N] = A[M, K] · B[N, K]ᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A.data(), K, B.data(), K,
                0.0f, C.data(), N);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double exact = 0;
        for (int k = 0; k < K; ++k)
          exact += double(A[std::size_t(m) * K + k]) * double(B[std::size_t(n) * K + k]);
        if (double(C[std::size_t(m) * N + n]) != exact) return false;
      }
    return true;
  };
  return check(64, 64, 64) && check(37, 29, 43);
}

BlasEnvironment blas_environment() {
  return {env_or_empty("OPENBLAS_CORETYPE"), env_or_empty("TSPEMU_BLAS_AUTO"),
          env_or_empty("TSPEMU_BLAS_DETECTED"), env_or_empty("TSPEMU_BLAS_REJECTED")};
}

BlasAction decide_blas_action(const BlasEnvironment& env, std::string_view core_in_use,
                              std::string_view best) {
  if (!env.rejected.empty()) return BlasAction::keep;  // already reverted once
  if (!env.detected.empty())                           // a selection, if OpenBLAS honoured it
    return same_core(env.coretype, core_in_use) ? BlasAction::verify : BlasAction::keep;
  if (env.autosel == "0") return BlasAction::keep;
  if (!env.coretype.empty() && env.autosel != "force") return BlasAction::keep;  // user's choice
  return is_fallback(core_in_use, best) ? BlasAction::select : BlasAction::keep;
}

bool select_best_blas_kernel(int argc, char** argv) {
  if (argc < 1 || argv == nullptr || argv[argc] != nullptr) return false;
  const BlasEnvironment env = blas_environment();
  const std::string core = blas_kernel().core;
  switch (decide_blas_action(env, core, best_supported_core())) {
    case BlasAction::keep:
      return false;
    case BlasAction::select:
      ::setenv("TSPEMU_BLAS_DETECTED", core.c_str(), 1);
      ::setenv("OPENBLAS_CORETYPE", best_supported_core().c_str(), 1);
      reexec(argv, "select the processor's best BLAS core");
      // Back on the detected core: undo, so describe_blas() and children see the truth.
      if (env.coretype.empty())
        ::unsetenv("OPENBLAS_CORETYPE");
      else
        ::setenv("OPENBLAS_CORETYPE", env.coretype.c_str(), 1);
      ::unsetenv("TSPEMU_BLAS_DETECTED");
      return false;
    case BlasAction::verify:
      if (blas_gemm_check()) return true;
      std::cerr << "tspemu: blas: " << core
                << " failed the GEMM check against a naive loop; re-executing with the detected "
                << env.detected << "\n";
      ::setenv("TSPEMU_BLAS_REJECTED", core.c_str(), 1);
      ::setenv("OPENBLAS_CORETYPE", env.detected.c_str(), 1);
      reexec(argv, "return to the detected BLAS core");
      return false;
  }
  return false;
}

}  // namespace tspemu::ref
