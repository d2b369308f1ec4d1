// run_pipeline: one pp rank's part of a pipeline-parallel training step — it executes its action
// list of a schedule (plan/pipeline_schedule.hpp: GPipe, 1F1B, interleaved 1F1B, ZB-H1, or an
// imported CSV table) on its stages (stage.hpp), moving activations forward and their gradients
// backward with the runtime's non-blocking point-to-point messages, then reduces the gradients.
//
// What: the schedule is validated first (pipeline_check.hpp, with the mailbox's 4 sends in
//   flight). Then, in the rank's order:
//     RECV_F / RECV_B  irecv posted into a buffer of the arena (Category::comm) from the rank of
//                      the action's peer stage;
//     F                stage.forward on the received input (or the previous stage's output when
//                      that stage is on this rank; nothing on stage 0), output kept for SEND_F;
//     B, I             stage.backward_input on the received output gradient (nothing on the last
//                      stage, whose gradient is that of loss_j / (m · dp): the loss is scaled once,
//                      here), input gradient kept for SEND_B; B then runs backward_weight;
//     W                stage.backward_weight (the accumulation order of the gradients is the
//                      order of the rank's B and W actions);
//     SEND_F / SEND_B  isend of the kept buffer, which stays alive until the send completes (at
//                      most 4 in flight per peer: the fifth waits for the oldest);
//     markers          ignored (the gradients are reduced once, after the list).
//   Every receive is waited when its consumer runs, every send by the end of the list. Then:
//   with tied embeddings, the first stage's embedding gradient and the last stage's LM-head
//   gradient are exchanged and both become first + last; with a dp group, every gradient tensor of
//   every stage is all-reduced (sum, group-rank order) over dp, stages ascending, tensors in
//   Stage::gradients order.
//   With uniform_costs, each compute action runs inside a TraceSpan of cost·flops_per_unit FLOPs,
//   so a world with a simulated clock (peak_flops 1/ns-scale, flops_per_unit above the kernels'
//   own) charges F, B, I, W exactly Costs' units: the measured idle fraction is the schedule's.
// Requirements: pp.size() == schedule.ranks; `stages` holds exactly the stages the schedule puts
//   on pp.rank(), in any order; microbatches.size() == schedule.microbatches; every member of pp
//   and dp calls run_pipeline with the same schedule and options; the dp groups pair ranks
//   holding the same stages.
// Guarantees: an invalid schedule throws std::invalid_argument with the checker's message
//   (rank, action index, stage, microbatch) and the tensor the action carries, before any
//   message moves; a stage compute error
//   propagates (the world fails the other ranks, never a hang); a buffer left unconsumed at the
//   end (an output never sent) throws std::logic_error naming its stage and microbatch. Given
//   deterministic stages, the result does not depend on thread timing: bitwise that of running
//   the same stage calls in each stage's schedule order on one thread.
// Cost: the schedule's compute plus, per microbatch and stage boundary, one message of
//   activation_elements() each way; then one tied exchange of V·C and a dp all-reduce of the
//   stage's gradients.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "tspemu/pipeline/stage.hpp"
#include "tspemu/plan/pipeline_check.hpp"
#include "tspemu/plan/pipeline_clock.hpp"
#include "tspemu/plan/pipeline_schedule.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::pipeline {

struct PipelineOptions {
  bool tied_embeddings = false;  // sum the first stage's embedding and last stage's head grads
  int dp = 1;                    // the data-parallel degree (the loss scale's 1/(m·dp))
  std::optional<Costs> uniform_costs;  // charge each compute action on the simulated clock
  double flops_per_unit = 1e6;
};

struct PipelineStepResult {
  // On the rank holding the last stage: microbatch j's mean loss (unscaled); empty elsewhere.
  std::vector<double> losses;
};

// Called after each compute action of this rank with the action, its stage and what it produced
// (F: the output activation, empty on the last stage; B, I: the input gradient, empty on stage 0;
// W: empty); the stage's gradients() then hold the accumulation so far. For checks that locate a
// difference by stage, microbatch and tensor; it must not keep the span.
template <class T>
using ActionObserver = std::function<void(const Action&, Stage<T>&, std::span<const T>)>;

// `dp`: the data-parallel group of this rank (ranks holding the same stages), or null for dp = 1.
template <class T>
PipelineStepResult run_pipeline(Rank& rank, Comm& pp, Comm* dp, const Schedule& schedule,
                                std::span<const ref::Batch> microbatches,
                                std::span<Stage<T>* const> stages, const PipelineOptions& opt,
                                const ActionObserver<T>& observe = {});

}  // namespace tspemu::pipeline
