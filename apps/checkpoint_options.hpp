// --weights DIR, --save DIR and --save-shard-size of `run` and `train`: a Hugging Face Llama
// checkpoint directory in and out (reference/hf_checkpoint.hpp).
//
// What: with --weights, the model is the checkpoint's — its config.json sets every model option,
// so a model flag given beside it (--layers --hidden --heads --kv-heads --ffn --vocab --tied) is
// refused as a conflict naming both — and its weights (fp32, from F32/F64/F16/BF16) replace the
// seeded ones. --save writes the run's weights (run: the weights it used; train: the weights
// after the last step) as config.json + model.safetensors, sharded with an index above
// --save-shard-size bytes (0: one file). A checkpoint whose weights hold NaN or Inf is refused
// naming the tensor and element unless --allow-nonfinite-weights; a tensor the model does not use
// (an lm_head.weight that differs from the embedding beside a tied config) is refused by name.
// Guarantees: every problem is a ConfigError (exit 2) before any rank starts: an unreadable or
// invalid checkpoint (the reader's message: the file and the tensor or key), a conflicting flag,
// a --save directory that cannot be created or written. A --save that fails or is interrupted
// (SIGINT, SIGTERM: the signal then ends the process, status 128 + signal) leaves the directory's
// old checkpoint as it was and no temporary file.
#pragma once

#include "cli_fwd.hpp"

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
  bool allow_nonfinite = false;  // --allow-nonfinite-weights
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
