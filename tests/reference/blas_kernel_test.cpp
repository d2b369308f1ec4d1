// BLAS kernel selection (blas_kernel.hpp): the CPU feature probe, the start-up decision, the GEMM
// check, and a GEMM run in a child process under a forced Prescott core and under the core the
// selector picks (through a real re-execution), which must agree to fp32 rounding.
#include "tspemu/reference/blas_kernel.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tspemu/reference/numerics.hpp"

namespace tspemu::ref {
namespace {

TEST(BlasKernel, BestSupportedCoreAgreesWithBuiltinCpuSupports) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool skylakex = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  std::string expected;
  if (skylakex && __builtin_cpu_supports("avx512bf16"))
    expected = "Cooperlake";
  else if (skylakex)
    expected = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    expected = "Haswell";
  EXPECT_EQ(best_supported_core(), expected);
#else
  EXPECT_EQ(best_supported_core(), "");
#endif
}

TEST(BlasKernel, DescribeBlasNamesLibraryAndTheCoreInUse) {
  const BlasKernel k = blas_kernel();
  EXPECT_EQ(k.library.rfind("OpenBLAS ", 0), 0u) << k.config;
  EXPECT_FALSE(k.core.empty());
  const std::string line = describe_blas();
  EXPECT_EQ(line.rfind(k.library + " " + k.core + " (", 0), 0u) << line;
}

TEST(BlasKernel, FallbackMeansPreAvx2CoreOnAnAvx2OrBetterProcessor) {
  EXPECT_TRUE(is_fallback("Prescott", "Cooperlake"));
  EXPECT_TRUE(is_fallback("sandybridge", "Haswell"));  // case ignored, as OpenBLAS does
  EXPECT_TRUE(is_fallback("Nehalem", "SkylakeX"));
  EXPECT_FALSE(is_fallback("Haswell", "Cooperlake"));
  EXPECT_FALSE(is_fallback("Zen", "Cooperlake"));
  EXPECT_FALSE(is_fallback("Cooperlake", "Cooperlake"));
  EXPECT_FALSE(is_fallback("Prescott", ""));  // processor has nothing better
  EXPECT_FALSE(is_fallback("NotACore", "Cooperlake"));
}

TEST(BlasKernel, DecisionKeepsUserChoiceSelectsOnFallbackAndNeverLoops) {
  using A = BlasAction;
  // Arguments: OPENBLAS_CORETYPE, TSPEMU_BLAS_AUTO, TSPEMU_BLAS_DETECTED, TSPEMU_BLAS_REJECTED,
  // then the core OpenBLAS runs; the processor's best core is Cooperlake.
  auto d = [](const char* coretype, const char* autosel, const char* detected, const char* rejected,
              const char* core) {
    return decide_blas_action(BlasEnvironment{coretype, autosel, detected, rejected}, core,
                              "Cooperlake");
  };
  EXPECT_EQ(d("", "", "", "", "Prescott"), A::select);
  EXPECT_EQ(d("", "", "", "", "Cooperlake"), A::keep);
  EXPECT_EQ(d("", "", "", "", "Haswell"), A::keep);
  EXPECT_EQ(d("Prescott", "", "", "", "Prescott"), A::keep);  // the user's own choice
  EXPECT_EQ(d("", "0", "", "", "Prescott"), A::keep);
  EXPECT_EQ(d("Prescott", "force", "", "", "Prescott"), A::select);
  // After the re-execution: verify once, whatever TSPEMU_BLAS_AUTO says; never select again.
  EXPECT_EQ(d("Cooperlake", "", "Prescott", "", "Cooperlake"), A::verify);
  EXPECT_EQ(d("Cooperlake", "force", "Prescott", "", "Cooperlake"), A::verify);
  // OpenBLAS did not honour the request (unknown name): nothing to verify, nothing to retry.
  EXPECT_EQ(d("Cooperlake", "", "Prescott", "", "Prescott"), A::keep);
  // The selection failed the GEMM check and the process went back: stop there.
  EXPECT_EQ(d("Prescott", "", "Prescott", "Cooperlake", "Prescott"), A::keep);
}

TEST(BlasKernel, GemmCheckPassesOnTheCoreInUse) {
  EXPECT_TRUE(blas_gemm_check());
}

struct ProbeRun {
  std::string describe, core;
  std::vector<float> c;
  std::vector<double> oracle;
};

ProbeRun run_probe(const std::string& env) {
  const std::string cmd =
      "env -u OPENBLAS_CORETYPE -u TSPEMU_BLAS_AUTO -u TSPEMU_BLAS_DETECTED "
      "-u TSPEMU_BLAS_REJECTED " +
      env + " " TSPEMU_BLAS_PROBE;
  ProbeRun run;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return run;
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << cmd;
  std::istringstream in(out);
  std::getline(in, run.describe);
  std::getline(in, run.core);
  for (std::string c, o; in >> c >> o;) {
    run.c.push_back(static_cast<float>(std::strtod(c.c_str(), nullptr)));
    run.oracle.push_back(std::strtod(o.c_str(), nullptr));
  }
  return run;
}

TEST(BlasKernel, ForcedPrescottAndTheSelectedCoreAgreeToFp32Rounding) {
  const std::string best = best_supported_core();
  if (!is_fallback("Prescott", best)) GTEST_SKIP() << "no core better than Prescott on this CPU";
  // The user's explicit choice is kept: the selector does not act.
  const ProbeRun prescott = run_probe("OPENBLAS_CORETYPE=Prescott");
  EXPECT_EQ(prescott.core, "Prescott");
  EXPECT_EQ(prescott.describe, blas_kernel().library +
                                   " Prescott (OPENBLAS_CORETYPE=Prescott; processor supports " +
                                   best + ")");
  // Forced Prescott treated as the detected core: the selector re-executes onto the best core.
  const ProbeRun selected = run_probe("OPENBLAS_CORETYPE=Prescott TSPEMU_BLAS_AUTO=force");
  EXPECT_EQ(selected.core, best);
  EXPECT_EQ(selected.describe,
            blas_kernel().library + " " + best + " (selected; detected Prescott)");
  ASSERT_EQ(prescott.c.size(), 48u * 40u);
  ASSERT_EQ(selected.c.size(), prescott.c.size());
  ASSERT_EQ(selected.oracle, prescott.oracle);
  const Verdict v = check_close("sgemm " + best, selected.c, prescott.c, prescott.oracle);
  EXPECT_TRUE(v) << v.report;
}

TEST(BlasKernel, AutoZeroKeepsTheForcedCore) {
  if (!is_fallback("Prescott", best_supported_core())) GTEST_SKIP() << "nothing to select";
  EXPECT_EQ(run_probe("OPENBLAS_CORETYPE=Prescott TSPEMU_BLAS_AUTO=0").core, "Prescott");
}

}  // namespace
}  // namespace tspemu::ref
