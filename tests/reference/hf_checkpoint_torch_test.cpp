// PyTorch reads what save_hf_checkpoint writes: tests/reference/torch_hf_checkpoint.py (Debian's
// python3-torch, the safetensors format parsed by hand) loads the directory as transformers
// would, checks every name and shape against HF LlamaForCausalLM's, and runs a rotate-half Llama
// forward in float64. Its tensors must equal ours bit for bit, and its logits and loss the
// reference's fp64 forward within 1e-12 of their magnitude (two fp64 implementations of the same
// math, as in conformance_test.cpp) — which also checks that q_proj/k_proj rows are in the layout
// HF's RoPE expects. Skipped, saying so, when the interpreter cannot import torch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/hf_checkpoint.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::ref {
namespace {

namespace fs = std::filesystem;

bool torch_available() {
  const std::string cmd = std::string(TSPEMU_TORCH_PYTHON) + " -c 'import torch' > /dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

void torch_reads_back(const ModelConfig& cfg, std::uint64_t shard_bytes, const char* tag) {
  if (!torch_available()) {
    GTEST_SKIP() << TSPEMU_TORCH_PYTHON << " cannot import torch (Debian: python3-torch)";
  }
  const fs::path dir = fs::temp_directory_path() /
                       ("tspemu_hf_torch_" + std::string(tag) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto w = convert_weights<float>(init_weights<double>(cfg, 11));
  const auto files = save_hf_checkpoint((dir / "ckpt").string(), w, shard_bytes);
  EXPECT_EQ(files.size() > 2, shard_bytes != 0);

  const int B = 2, T = 9;
  const auto tokens = testing::random_tokens(std::size_t(B) * T, cfg.vocab, 5);
  const auto targets = testing::random_tokens(std::size_t(B) * T, cfg.vocab, 6);
  std::vector<std::int64_t> positions(T);
  for (int t = 0; t < T; ++t) positions[std::size_t(t)] = 3 + t;
  SafetensorsWriter inputs;
  const std::vector<std::int64_t> tok64(tokens.begin(), tokens.end()),
      tgt64(targets.begin(), targets.end());
  inputs.add("tokens", std::span<const std::int64_t>(tok64), {B, T});
  inputs.add("targets", std::span<const std::int64_t>(tgt64), {B, T});
  inputs.add("positions", std::span<const std::int64_t>(positions), {T});
  inputs.save((dir / "inputs.safetensors").string());

  const std::string cmd =
      std::string(TSPEMU_TORCH_PYTHON) + " " + TSPEMU_TORCH_HF_CHECKPOINT_SCRIPT + " " +
      (dir / "ckpt").string() + " " + (dir / "inputs.safetensors").string() + " " +
      (dir / "torch.safetensors").string() + " > " + (dir / "log.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::stringstream log;
  log << std::ifstream(dir / "log.txt").rdbuf();
  ASSERT_EQ(rc, 0) << "command: " << cmd << "\n" << log.str();

  const auto got = SafetensorsReader::from_file((dir / "torch.safetensors").string());
  for (const auto& p : parameters(w)) {
    const TensorInfo& ti = got.info("weight/" + p.name);
    EXPECT_EQ(ti.dtype, "F32") << p.name;
    EXPECT_EQ(ti.shape, p.shape) << p.name;
    const std::vector<float> t = got.read<float>("weight/" + p.name);
    ASSERT_EQ(t.size(), p.data->size());
    EXPECT_EQ(std::memcmp(t.data(), p.data->data(), t.size() * sizeof(float)), 0) << p.name;
  }
  const auto w64 = convert_weights<double>(w);
  ModelCache<double> cache;
  const Batch batch{B, T, tokens, targets, positions};
  const double loss = model_forward(w64, batch, cache);
  const Verdict logits =
      check_close64(std::string(tag) + " logits", cache.logits, got.read<double>("logits"), 1e-12);
  EXPECT_TRUE(logits) << logits.report;
  const Verdict l = check_close64(std::string(tag) + " loss", std::vector<double>{loss},
                                  got.read<double>("loss"), 1e-12);
  EXPECT_TRUE(l) << l.report;
  if (std::getenv("TSPEMU_VERBOSE"))
    std::printf("%s\n%s\n", logits.report.c_str(), l.report.c_str());
  fs::remove_all(dir);
}

TEST(HfCheckpointTorch, PyTorchReadsAShardedCheckpointWithTheSameTensorsAndLogits) {
  torch_reads_back(testing::tiny_gqa_config(), 2000, "sharded");
}

TEST(HfCheckpointTorch, PyTorchReadsATiedSingleFileCheckpointWithTheSameTensorsAndLogits) {
  torch_reads_back(testing::tiny_tied_config(), 0, "tied");
}

}  // namespace
}  // namespace tspemu::ref
