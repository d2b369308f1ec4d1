// attention_with_replicated_weights: the rest of a sequence-parallel attention schedule around a
// user's core, so a Ulysses or ring-attention schedule is only its AttentionCore.
//
// What: on one rank of a check_block run, runs the reference attention block (norm -> QKV -> RoPE
// -> core -> o_proj -> residual, reference/model.hpp) forward and backward on the rank's tokens
// with the FULL master weights (weights replicated on every rank, as in context parallelism),
// sums the five weight gradients over rb.comm() in one all_reduce_buffers (fixed rank order, so
// every replica holds the same bits) and declares them replicated.
// Sub-groups: the form with `reduce_over` sums over that group instead (a mesh axis,
// runtime/mesh.hpp): the ranks whose token shares make up one replica's gradient. On a DP × SP
// mesh that is the whole world (every rank holds other tokens); summing over the `sp` axis only
// leaves each data-parallel replica with its own batches' share, which the check reports as
// replicas that differ.
// Requirements: every rank of rb.comm() calls it (it is collective); the core follows the
// AttentionCore contract. reduce_gradients = false leaves the reduction out: a planted bug the
// check reports as differing replicas and failed weight gradients.
// Cost: the block's GEMMs on the local tokens; one all_reduce of 4·C² + 2·C·kv_dim + C floats.
#pragma once

#include "tspemu/check/block_check.hpp"

namespace tspemu::check {

void attention_with_replicated_weights(RankBlock& rb, const ref::AttentionCore<float>& core,
                                       bool reduce_gradients = true);
void attention_with_replicated_weights(RankBlock& rb, const ref::AttentionCore<float>& core,
                                       Comm& reduce_over, bool reduce_gradients = true);

}  // namespace tspemu::check
