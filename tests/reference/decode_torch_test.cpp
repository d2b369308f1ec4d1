// Reference decoding against PyTorch: a 32-step greedy run of a batch of prompts (lengths 1, 13
// and 6) through tspemu's prefill/decode_step and through tests/reference/torch_decode.py, a
// KV-cached decode in Debian's python3-torch (Hugging Face's past_key_values scheme: K/V computed
// once per position and appended), on the same safetensors weights.
//   - float64: the 32 greedy tokens of every sequence equal; every step's logits within rtol
//     1e-12 of their magnitude (two fp64 implementations of the same math differ by rounding
//     only, ~1e-15 relative times modest condition numbers, as in conformance_test.cpp; the
//     tokens can only differ where the top-1/top-2 margin is below that, and the margin is
//     reported on failure); the final KV cache (post-RoPE K and V per layer, sequence, position)
//     within the same rtol.
//   - float32, teacher-forced on the fp64 tokens: each step's logits pass the project's rule
//     (numerics.hpp) with PyTorch fp32 as the reference and tspemu's fp64 decode as the oracle:
//       err(tspemu fp32) <= testing::kTorchFp32K * err(PyTorch fp32) + tiny.
// A missing interpreter or torch FAILS the test (the script's exit status is checked).
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::ref {
namespace {

namespace fs = std::filesystem;

constexpr int kTorchSteps = 32;  // greedy steps checked against PyTorch

// The largest logit minus the runner-up of row [V] (how far a token is from a tie).
double top2_margin(const double* row, int V) {
  double a = -std::numeric_limits<double>::infinity(), b = a;
  for (int i = 0; i < V; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return a - b;
}

TEST(TorchDecodeConformance, GreedyKvCachedDecodeOf32StepsMatchesPytorch) {
  const ModelConfig cfg = testing::torch_gqa_config();
  const int V = cfg.vocab;
  const fs::path dir =
      fs::temp_directory_path() / ("tspemu_decode_conformance_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto w64 = init_weights<double>(cfg, 2026);
  const auto w32 = convert_weights<float>(w64);
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::int64_t> flat, lengths;
  for (const int len : {1, 13, 6}) {
    prompts.push_back(testing::random_tokens(len, V, 90 + len));
    flat.insert(flat.end(), prompts.back().begin(), prompts.back().end());
    lengths.push_back(len);
  }
  const int B = int(prompts.size());

  Sampler greedy = Sampler::greedy();
  const Generation<double> g = generate(w64, prompts, kTorchSteps, greedy);
  // fp32, teacher-forced on the fp64 tokens.
  Prefill<float> p32 = prefill(w32, prompts);
  std::vector<std::vector<float>> steps32{p32.logits};
  std::vector<std::int64_t> forced;
  for (int b = 0; b < B; ++b) forced.insert(forced.end(), g.tokens[b].begin(), g.tokens[b].end());
  for (int i = 1; i < kTorchSteps; ++i) {
    std::vector<std::int32_t> fed(B);
    for (int b = 0; b < B; ++b) fed[b] = g.tokens[b][i - 1];
    steps32.push_back(decode_step(w32, p32.cache, std::span<const std::int32_t>(fed)));
  }

  save_model((dir / "model.safetensors").string(), w64);
  SafetensorsWriter inputs;
  const std::vector<std::int64_t> n_new{kTorchSteps};
  inputs.add("prompt_tokens", std::span<const std::int64_t>(flat), {std::int64_t(flat.size())});
  inputs.add("prompt_lengths", std::span<const std::int64_t>(lengths), {B});
  inputs.add("n_new", std::span<const std::int64_t>(n_new), {1});
  inputs.add("forced", std::span<const std::int64_t>(forced), {B, kTorchSteps});
  inputs.save((dir / "inputs.safetensors").string());
  const std::string cmd =
      std::string(TSPEMU_TORCH_PYTHON) + " " + TSPEMU_TORCH_DECODE_SCRIPT + " " +
      (dir / "model.safetensors").string() + " " + (dir / "inputs.safetensors").string() + " " +
      (dir / "torch.safetensors").string() + " > " + (dir / "log.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::stringstream log;
  log << std::ifstream(dir / "log.txt").rdbuf();
  ASSERT_EQ(rc, 0) << "PyTorch decode failed (is python3-torch installed for "
                   << TSPEMU_TORCH_PYTHON << "?)\ncommand: " << cmd << "\n"
                   << log.str();

  const auto torch = SafetensorsReader::from_file((dir / "torch.safetensors").string());
  const std::vector<std::int64_t> torch_tokens = torch.read_int64("tokens");
  const std::vector<double> torch64 = torch.read<double>("logits_f64");  // [n_new, B, V]
  const std::vector<float> torch32 = torch.read<float>("logits_f32");
  ASSERT_EQ(torch_tokens.size(), std::size_t(B) * kTorchSteps);
  ASSERT_EQ(torch64.size(), std::size_t(kTorchSteps) * B * V);
  ASSERT_EQ(torch32.size(), std::size_t(kTorchSteps) * B * V);
  double worst64 = 0, min_margin = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kTorchSteps; ++i) {
    const std::string step = "step " + std::to_string(i);
    const std::size_t off = std::size_t(i) * B * V;
    const std::vector<double> t64(torch64.begin() + off, torch64.begin() + off + B * V);
    const std::vector<float> t32(torch32.begin() + off, torch32.begin() + off + B * V);
    const Verdict v64 =
        check_close64("f64 " + step + " logits", g.logits[i], t64, testing::kTorchFp64Rtol);
    EXPECT_TRUE(v64) << v64.report;
    worst64 = std::max(worst64, v64.candidate.max_abs / v64.candidate.oracle_max);
    const Verdict v32 =
        check_close("f32 " + step + " logits", steps32[i], t32, g.logits[i], testing::kTorchFp32K);
    EXPECT_TRUE(v32) << v32.report;
    for (int b = 0; b < B; ++b) {
      const double margin = top2_margin(g.logits[i].data() + std::size_t(b) * V, V);
      min_margin = std::min(min_margin, margin);
      EXPECT_EQ(g.tokens[b][i], torch_tokens[std::size_t(b) * kTorchSteps + i])
          << "sequence " << b << " " << step << ": top-1/top-2 margin " << margin;
    }
  }
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (int b = 0; b < B; ++b) {
      const std::string at = std::to_string(l) + "." + std::to_string(b);
      const std::size_t n = std::size_t(g.cache.length(l, b)) * g.cache.row();
      const Verdict vk = check_close64("k." + at, {g.cache.keys(l, b), g.cache.keys(l, b) + n},
                                       torch.read<double>("k." + at), testing::kTorchFp64Rtol);
      const Verdict vv = check_close64("v." + at, {g.cache.values(l, b), g.cache.values(l, b) + n},
                                       torch.read<double>("v." + at), testing::kTorchFp64Rtol);
      EXPECT_TRUE(vk) << vk.report;
      EXPECT_TRUE(vv) << vv.report;
    }
  }
  if (std::getenv("TSPEMU_VERBOSE")) {
    std::printf("decode vs torch f64: max |diff| / max|torch| = %.3g; min top-2 margin %.3g\n",
                worst64, min_margin);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tspemu::ref
