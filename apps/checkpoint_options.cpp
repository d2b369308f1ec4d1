#include "checkpoint_options.hpp"

#include <CLI/CLI.hpp>

#include <filesystem>
#include <ostream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "output_files.hpp"
#include "tspemu/core/signal_deferral.hpp"
#include "tspemu/reference/hf_checkpoint.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::app {

void add_checkpoint_options(CLI::App& sub, CheckpointArgs& a) {
  sub.add_option("--weights", a.weights,
                 "read the model from this Hugging Face Llama checkpoint directory (config.json "
                 "and model.safetensors, or shards listed by model.safetensors.index.json); its "
                 "config sets the model, so the model flags are refused beside it");
  sub.add_option("--save", a.save,
                 "write the weights (train: after the last step) to this directory as a Hugging "
                 "Face Llama checkpoint: config.json and model.safetensors (fp32)");
  sub.add_option("--save-shard-size", a.save_shard_bytes,
                 "--save: shard the weights into model-0000i-of-0000n.safetensors with an index "
                 "when they pass this many bytes (suffixes kB, MB, GB, KiB, MiB, GiB); 0: one file")
      ->capture_default_str();
  sub.add_flag("--allow-nonfinite-weights", a.allow_nonfinite,
               "--weights: load a checkpoint whose weights hold NaN or Inf (refused by default, "
               "naming the tensor and element: such a model computes garbage)");
  for (const char* flag :
       {"--layers", "--hidden", "--heads", "--kv-heads", "--ffn", "--vocab", "--tied"})
    a.model_flags.push_back(sub.get_option(flag));
}

std::shared_ptr<const ref::ModelWeights<float>> load_checkpoint_option(const CheckpointArgs& a,
                                                                       ProblemOptions& problem) {
  if (!a.save.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.save, ec);
    if (!std::filesystem::is_directory(a.save, ec))
      throw ConfigError("--save " + a.save + ": cannot create the directory");
    check_output_files({{"--save", (std::filesystem::path(a.save) / "config.json").string()}});
  }
  if (a.weights.empty()) return nullptr;
  for (const CLI::Option* flag : a.model_flags)
    if (flag != nullptr && flag->count() > 0)
      throw ConfigError(flag->get_name() + " conflicts with --weights " + a.weights +
                        ": the checkpoint's config.json sets the model");
  try {
    auto w = std::make_shared<const ref::ModelWeights<float>>(
        ref::load_hf_checkpoint<float>(a.weights, {.allow_nonfinite = a.allow_nonfinite}));
    problem.model = w->config;
    return w;
  } catch (const ref::NonFiniteWeightError& e) {
    throw ConfigError("--weights " + a.weights + ": " + e.what() +
                      "; --allow-nonfinite-weights loads it anyway");
  } catch (const std::runtime_error& e) {  // HfConfigError, SafetensorsError, CheckpointError
    throw ConfigError("--weights " + a.weights + ": " + e.what());
  }
}

void save_checkpoint_option(const CheckpointArgs& a, const ref::ModelWeights<float>& w,
                            std::ostream& out) {
  if (a.save.empty()) return;
  std::vector<std::string> files;
  {
    // A SIGINT or SIGTERM during the save stops it at the next chunk; the save's cleanup removes
    // its temporaries, then the signal ends the process (status 128 + signal) with the old
    // checkpoint as it was, or, arriving while the files are renamed, the new one complete.
    const SignalDeferral defer;
    files = ref::save_hf_checkpoint(a.save, w, a.save_shard_bytes);
  }
  out << "saved: Hugging Face Llama checkpoint in " << a.save << " (" << files.size()
      << " files: " << (files.size() > 2 ? "shards, index and " : "model.safetensors and ")
      << "config.json)\n";
}

}  // namespace tspemu::app
