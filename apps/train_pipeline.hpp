// `tspemu train --pp P --microbatches M --schedule NAME`: N optimizer steps of the whole model
// run pipeline-parallel on P ranks (pipeline/executor.hpp: the planner's schedule executed with
// non-blocking messages, each stage the dense reference on one rank), every step's loss and
// gradients checked against the full-batch fp32 reference and the fp64 oracle at the same weights.
//
// What: stages = P · V (V = --virtual-stages, 2 by default for interleaved-1f1b, else 1), the
//   layers cut contiguously (pipeline/stage.hpp); the batch of --batch sequences cut into M
//   microbatches; step t reads sequence b at corpus offset ((t·B + b)·S) mod (len − S), as
//   `train` does. At each step, from the weights the pipeline reached: the pipelined loss (the
//   microbatches' mean) and every parameter gradient must satisfy
//   err(pipelined vs oracle) <= k · err(reference fp32 vs oracle) + tiny (numerics.hpp
//   check_close, k = 3); then the weights take the optimizer's update (ref::Optimizer, fp32).
//   The run stops at the first step that breaks the rule, naming the tensor.
// Requirements / refusals (ConfigError, exit 2, before any rank starts): --pp >= 1; a known
//   --schedule whose (P, M, V) the planner accepts (plan/pipeline_schedule.hpp refusal());
//   P · V <= --layers; M dividing --batch; no --layers-only, --weights or --save (the dense
//   stages train seeded weights of the whole model).
// Cost: per step the pipelined step on P ranks plus the fp32 and fp64 full-batch references.
#pragma once

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace tspemu::app {

struct TrainArgs;

struct PipelineTrainArgs {
  int pp = 0;  // 0: not pipelined (the strategy's run)
  int microbatches = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 0;  // 0: 2 for interleaved-1f1b, else 1
};

void add_pipeline_train_options(CLI::App& train, PipelineTrainArgs& a);
// 0: every step within the rule; 1 otherwise.
int train_pipeline_command(const TrainArgs& a, std::ostream& out);

}  // namespace tspemu::app
