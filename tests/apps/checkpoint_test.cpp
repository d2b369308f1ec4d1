// `run` and `train` with --weights / --save (checkpoint_options.hpp): a checkpoint saved by one
// run is the same model to the next, bit for bit; a sharded checkpoint round-trips through
// training and PyTorch; bad checkpoints and conflicting flags exit 2 naming the file, tensor or
// flag before any rank starts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_outcome.hpp"
#include "tspemu/reference/hf_checkpoint.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::app {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;
using testing::temp_path;
using testing::tspemu;

const std::vector<std::string> kModel = {"--layers",   "2", "--hidden", "32", "--heads", "4",
                                         "--kv-heads", "4", "--ffn",    "64", "--vocab", "256"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::vector<double> losses(const std::string& json_path) {
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(json_path));
  std::vector<double> out;
  for (const auto& s : j.at("steps")) out.push_back(s.at("loss").get<double>());
  return out;
}

// The seeded model saved by `run --save`, trained from --weights, takes the very steps the
// seeded run takes; the trained weights saved sharded read back as the next run's model.
TEST(Checkpoint, TrainingFromASavedCheckpointIsTheSeededRunBitForBit) {
  const std::string a = temp_path("a"), b = temp_path("b");
  fs::remove_all(a);
  fs::remove_all(b);
  Outcome o = tspemu(with({"run", "--seq", "32", "-q", "--save", a}, kModel));
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("saved: Hugging Face Llama checkpoint in " + a), std::string::npos);
  const std::string j1 = temp_path("seeded.json"), j2 = temp_path("ckpt.json");
  o = tspemu(with({"train", "--seq", "32", "--steps", "3", "-q", "--json", j1}, kModel));
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  o = tspemu({"train", "--seq", "32", "--steps", "3", "-q", "--json", j2, "--weights", a, "--save",
              b, "--save-shard-size", "20kB"});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("weights: the checkpoint in " + a), std::string::npos) << o.out;
  EXPECT_EQ(losses(j1), losses(j2));
  EXPECT_TRUE(fs::exists(b + "/model.safetensors.index.json"));
  const auto before = ref::load_hf_checkpoint<float>(a);
  const auto after = ref::load_hf_checkpoint<float>(b);
  EXPECT_EQ(after.config.to_string(), before.config.to_string());
  EXPECT_NE(after.layers[1].wq, before.layers[1].wq);  // trained
  EXPECT_NE(after.embed, before.embed);                // TSP trains the whole model
  fs::remove_all(a);
  fs::remove_all(b);
}

// Acceptance (issue 16): a generated sharded checkpoint: load -> train 3 steps -> save -> load in
// PyTorch -> the same tensors.
TEST(Checkpoint, AShardedCheckpointTrainedAndSavedReadsBackInPyTorchAsTheSameTensors) {
  if (std::system(TSPEMU_TORCH_PYTHON " -c 'import torch' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << TSPEMU_TORCH_PYTHON << " cannot import torch (Debian: python3-torch)";
  const std::string a = temp_path("a"), b = temp_path("b");
  fs::remove_all(a);
  fs::remove_all(b);
  Outcome o =
      tspemu(with({"run", "--seq", "32", "-q", "--save", a, "--save-shard-size", "30000"}, kModel));
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  ASSERT_TRUE(fs::exists(a + "/model.safetensors.index.json"));
  o = tspemu({"train", "--seq", "32", "--steps", "3", "-q", "--weights", a, "--save", b,
              "--save-shard-size", "30000"});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  ref::SafetensorsWriter inputs;  // PyTorch's forward needs a batch; one token suffices here
  const std::vector<std::int64_t> tok = {1}, pos = {0};
  inputs.add("tokens", std::span<const std::int64_t>(tok), {1, 1});
  inputs.add("targets", std::span<const std::int64_t>(tok), {1, 1});
  inputs.add("positions", std::span<const std::int64_t>(pos), {1});
  inputs.save(b + "_inputs.safetensors");
  const std::string cmd =
      std::string(TSPEMU_TORCH_PYTHON) + " " + TSPEMU_TORCH_HF_CHECKPOINT_SCRIPT + " " + b + " " +
      b + "_inputs.safetensors " + b + "_torch.safetensors > " + b + "_log.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  std::stringstream log;
  log << std::ifstream(b + "_log.txt").rdbuf();
  ASSERT_EQ(rc, 0) << cmd << "\n" << log.str();
  const auto torch = ref::SafetensorsReader::from_file(b + "_torch.safetensors");
  const auto ours = ref::load_hf_checkpoint<float>(b);
  for (const auto& p : ref::parameters(ours)) {
    const std::vector<float> t = torch.read<float>("weight/" + p.name);
    ASSERT_EQ(t.size(), p.data->size()) << p.name;
    EXPECT_EQ(std::memcmp(t.data(), p.data->data(), t.size() * sizeof(float)), 0) << p.name;
  }
  for (const std::string& f : {b + "_inputs.safetensors", b + "_torch.safetensors", b + "_log.txt"})
    fs::remove(f);
  fs::remove_all(a);
  fs::remove_all(b);
}

// A fresh checkpoint of kModel's shape, seeded, in the test's temporary directory `name`.
std::string saved_checkpoint(const std::string& name, std::uint64_t shard_bytes) {
  const std::string dir = temp_path(name);
  fs::remove_all(dir);
  ref::save_hf_checkpoint(
      dir,
      ref::init_weights<float>(
          ref::ModelConfig{
              .vocab = 256, .hidden = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4, .ffn = 64},
          3),
      shard_bytes);
  return dir;
}

TEST(Checkpoint, BadCheckpointsAndConflictingFlagsExitTwoNamingTheFileTensorOrFlag) {
  const std::string a = saved_checkpoint("a", 20000);
  Outcome o = tspemu({"run", "--seq", "32", "-q", "--weights", a, "--hidden", "64"});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("--hidden conflicts with --weights " + a), std::string::npos) << o.err;
  o = tspemu({"train", "-q", "--weights", a, "--tied"});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("--tied conflicts with --weights"), std::string::npos) << o.err;

  const nlohmann::json index =
      nlohmann::json::parse(std::ifstream(a + "/model.safetensors.index.json"));
  const std::string shard = index.at("weight_map").at("model.layers.1.mlp.down_proj.weight");
  fs::rename(a + "/" + shard, a + "/moved");
  o = tspemu({"run", "--seq", "32", "-q", "--weights", a});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("--weights " + a + ": safetensors: cannot open '" + a + "/" + shard + "'"),
            std::string::npos)
      << o.err;
  fs::rename(a + "/moved", a + "/" + shard);

  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(a + "/config.json"));
  cfg["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  std::ofstream(a + "/config.json") << cfg.dump();
  o = tspemu({"train", "-q", "--weights", a});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("unsupported option 'rope_scaling'"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find(a + "/config.json"), std::string::npos) << o.err;

  o = tspemu({"run", "-q", "--weights", a + "/absent"});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("does not exist"), std::string::npos) << o.err;
  fs::remove_all(a);
}

// A checkpoint file that is a FIFO (nobody writes it: a blocking read would hang) or /dev/zero
// (never ends: read whole it exhausts memory) is refused naming the file, exit 2; so is a
// --config or --data that is one.
TEST(Checkpoint, NonRegularFilesAreRefusedNamingThemWithoutBlocking) {
  const std::string a = saved_checkpoint("a", 0);
  const std::string model = a + "/model.safetensors";
  fs::remove(model);
  ASSERT_EQ(::mkfifo(model.c_str(), 0600), 0);
  Outcome o = tspemu({"run", "--seq", "32", "-q", "--weights", a});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("--weights " + a + ": safetensors: cannot read '" + model +
                       "': not a regular file (a FIFO)"),
            std::string::npos)
      << o.err;
  fs::remove(model);
  fs::create_symlink("/dev/zero", model);
  o = tspemu({"train", "-q", "--weights", a});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("cannot read '" + model + "': not a regular file (a character device)"),
            std::string::npos)
      << o.err;
  fs::remove(model);
  const std::string config = a + "/config.json";
  fs::remove(config);
  ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
  o = tspemu({"run", "-q", "--weights", a});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("cannot read '" + config + "': not a regular file (a FIFO)"),
            std::string::npos)
      << o.err;
  const std::string data = a + "/corpus.txt";
  ASSERT_EQ(::mkfifo(data.c_str(), 0600), 0);
  for (const std::string& corpus : {data, std::string("/dev/zero")}) {
    o = tspemu(with({"train", "-q", "--seq", "32", "--data", corpus}, kModel));
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("--data " + corpus + ": cannot open the file: not a regular file"),
              std::string::npos)
        << o.err;
  }
  fs::remove_all(a);
}

// Weights holding NaN or Inf are refused naming the tensor, the element and the flag that allows
// them; a stored lm_head.weight beside a tied config.json that differs from the embedding is
// refused by name rather than silently unused.
TEST(Checkpoint, NonFiniteWeightsAndAnUnusedHeadAreRefusedNamingTheTensor) {
  const std::string a = temp_path("nonfinite");
  fs::remove_all(a);
  const ref::ModelConfig cfg{
      .vocab = 256, .hidden = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4, .ffn = 64};
  auto w = ref::init_weights<float>(cfg, 3);
  w.layers[1].w_down[70] = std::numeric_limits<float>::infinity();  // row 1, column 6 of [32, 64]
  ref::save_hf_checkpoint(a, w, 0);
  Outcome o = tspemu({"run", "--seq", "32", "-q", "--weights", a});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("--weights " + a +
                       ": safetensors: tensor 'model.layers.1.mlp.down_proj.weight': element 70 "
                       "[1, 6] of 2048 is inf (a weight must be finite) (file '" +
                       a + "/model.safetensors'); --allow-nonfinite-weights loads it anyway"),
            std::string::npos)
      << o.err;
  o = tspemu({"run", "--seq", "32", "-q", "--weights", a, "--allow-nonfinite-weights"});
  EXPECT_EQ(o.err.find("must be finite"), std::string::npos) << o.err;

  w.layers[1].w_down[70] = 0.5f;
  ref::save_hf_checkpoint(a, w, 0);  // untied: lm_head.weight stored
  nlohmann::json config = nlohmann::json::parse(std::ifstream(a + "/config.json"));
  config["tie_word_embeddings"] = true;
  std::ofstream(a + "/config.json") << config.dump();
  o = tspemu({"train", "-q", "--seq", "32", "--weights", a});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("unexpected tensor 'lm_head.weight': the config ties the head to "
                       "'model.embed_tokens.weight'"),
            std::string::npos)
      << o.err;
  fs::remove_all(a);
}

}  // namespace
}  // namespace tspemu::app
