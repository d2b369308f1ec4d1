// --weights DIR, --save DIR and --save-shard-size of `run` and `train`: a Hugging Face Llama
// checkpoint directory in and out (reference/hf_checkpoint.hpp).
//
// What: with --weights, the model is the checkpoint's — its config.json sets every model option,
// so a model flag given beside it (--layers --hidden --heads --kv-heads --ffn --vocab --tied) is
// refused as a conflict naming both — and its weights (fp32, from F32/F64/F16/BF16) replace the
// seeded ones. --save writes the run's weights (run: the weights it used; train: the weights
// after the last step) as config.json + model.safetensors, sharded with an index above
// --save-shard-size bytes (0: one file).
// Guarantees: every problem is a ConfigError (exit 2) before any rank starts: an unreadable or
// invalid checkpoint (the reader's message: the file and the tensor or key), a conflicting flag,
// a --save directory that cannot be created or written.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "problem_options.hpp"
#include "tspemu/reference/model.hpp"

namespace tspemu::app {

struct CheckpointArgs {
  std::string weights;  // "": seeded weights
  std::string save;     // "": nothing saved
  std::uint64_t save_shard_bytes = 0;
  // The model flags of the same subcommand (set by add_checkpoint_options), to refuse them
  // beside --weights: CLI11 counts what the command line and --config gave.
  std::vector<const CLI::Option*> model_flags;
};

// Call after add_problem_options on the same subcommand.
void add_checkpoint_options(CLI::App& sub, CheckpointArgs& a);

// The checkpoint of --weights with problem.model set to its config (nullptr without
// --weights); also checks that --save can be written. ConfigError on any problem.
std::shared_ptr<const ref::ModelWeights<float>> load_checkpoint_option(const CheckpointArgs& a,
                                                                       ProblemOptions& problem);

// Writes w to --save (nothing without it) and one line naming the files to out.
void save_checkpoint_option(const CheckpointArgs& a, const ref::ModelWeights<float>& w,
                            std::ostream& out);

}  // namespace tspemu::app
