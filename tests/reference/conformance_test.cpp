// Conformance with PyTorch: the same safetensors model and batch run through
// tests/reference/torch_reference.py (Debian's python3-torch) in float64 and float32; logits, loss
// and every parameter gradient are compared.
//   - float64: C++ vs PyTorch within rtol 1e-12 of each tensor's magnitude (two fp64
//     implementations of the same math differ by rounding only, ~1e-15 relative, times modest
//     condition numbers); this also establishes the C++ double instantiation as the oracle.
//   - float32: the acceptance rule of numerics.hpp with the C++ fp32 reference as candidate,
//     PyTorch fp32 as the independent reference, the C++ fp64 oracle as truth:
//       err(C++ fp32) <= testing::kTorchFp32K * err(PyTorch fp32) + tiny.
// A missing interpreter or torch FAILS the test (the script's exit status is checked).
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::ref {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  ModelConfig cfg;
  int B, T;
  std::int64_t first_position;
};

Case gqa_case() {
  return {"gqa_rope", testing::torch_gqa_config(), 2, 19,
          5};  // positions 5..23: RoPE and the mask use given positions
}

Case tied_case() {
  ModelConfig c = gqa_case().cfg;
  c.n_kv_heads = 4;
  c.ffn = 40;
  c.rope_base = 10000.0;
  c.tie_embeddings = true;
  return {"tied_embedding", c, 2, 16, 0};
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using testing::as;

void run_case(const Case& tc) {
  const ModelConfig& cfg = tc.cfg;
  const fs::path dir = fs::temp_directory_path() / ("tspemu_conformance_" + std::string(tc.name) +
                                                    "_" + std::to_string(::getpid()));
  fs::create_directories(dir);

  const auto w64 = init_weights<double>(cfg, 2024);
  const auto w32 = convert_weights<float>(w64);
  const auto tokens = testing::random_tokens(std::size_t(tc.B) * tc.T, cfg.vocab, 31);
  const auto targets = testing::random_tokens(std::size_t(tc.B) * tc.T, cfg.vocab, 32);
  std::vector<std::int64_t> positions(tc.T);
  for (int t = 0; t < tc.T; ++t) positions[t] = tc.first_position + t;

  save_model((dir / "model.safetensors").string(), w64);
  SafetensorsWriter inputs;
  const std::vector<std::int64_t> tok64(tokens.begin(), tokens.end()),
      tgt64(targets.begin(), targets.end());
  inputs.add("tokens", std::span<const std::int64_t>(tok64), {tc.B, tc.T});
  inputs.add("targets", std::span<const std::int64_t>(tgt64), {tc.B, tc.T});
  inputs.add("positions", std::span<const std::int64_t>(positions), {tc.T});
  inputs.save((dir / "inputs.safetensors").string());

  const std::string cmd = std::string(TSPEMU_TORCH_PYTHON) + " " + TSPEMU_TORCH_REFERENCE_SCRIPT +
                          " " + (dir / "model.safetensors").string() + " " +
                          (dir / "inputs.safetensors").string() + " " + dir.string() + " > " +
                          (dir / "log.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "PyTorch reference failed (is python3-torch installed for "
                   << TSPEMU_TORCH_PYTHON << "?)\ncommand: " << cmd << "\n"
                   << slurp(dir / "log.txt");

  const auto t64 = SafetensorsReader::from_file((dir / "torch_f64.safetensors").string());
  const auto t32 = SafetensorsReader::from_file((dir / "torch_f32.safetensors").string());
  EXPECT_EQ(t32.info("grad/model.embed_tokens.weight").dtype, "F32");

  const Batch batch{tc.B, tc.T, tokens, targets, positions};
  ModelCache<double> c64;
  ModelCache<float> c32;
  ModelWeights<double> g64;
  ModelWeights<float> g32;
  model_forward(w64, batch, c64);
  model_forward(w32, batch, c32);
  model_backward(w64, batch, c64, g64);
  model_backward(w32, batch, c32, g32);

  auto compare = [&](const std::string& name, const std::vector<double>& ours64,
                     const std::vector<float>& ours32) {
    const std::vector<double> torch64 = t64.read<double>(name);
    const std::vector<float> torch32 = t32.read<float>(name);
    const Verdict v64 = check_close64(std::string(tc.name) + " f64 " + name, ours64, torch64,
                                      testing::kTorchFp64Rtol);
    EXPECT_TRUE(v64) << v64.report;
    const Verdict v32 = check_close(std::string(tc.name) + " f32 " + name, ours32, torch32, ours64,
                                    testing::kTorchFp32K);
    EXPECT_TRUE(v32) << v32.report;
    if (std::getenv("TSPEMU_VERBOSE"))
      std::printf("%s\n%s\n", v64.report.c_str(), v32.report.c_str());
  };
  compare("logits", c64.logits, c32.logits);
  compare("loss", {c64.loss}, {float(c32.loss)});
  const auto p64 = parameters(g64);
  const auto p32 = parameters(g32);
  for (std::size_t i = 0; i < p64.size(); ++i) {
    compare("grad/" + p64[i].name, *p64[i].data, *p32[i].data);
  }
  // Every gradient PyTorch produced has been compared (nothing extra on its side).
  std::size_t grads = 0;
  for (const auto& [name, info] : t64.tensors()) grads += name.rfind("grad/", 0) == 0;
  EXPECT_EQ(grads, p64.size());
  fs::remove_all(dir);
}

TEST(TorchConformance, GroupedQueryAttentionWithRopeAtOffsetPositions) {
  run_case(gqa_case());
}
TEST(TorchConformance, TiedEmbedding) {
  run_case(tied_case());
}

}  // namespace
}  // namespace tspemu::ref
