// TspShape: the model and the parallel shape of a TSP run, validated before any thread starts.
//
// Letters (TSP-NOTES.md): D TSP degree (ranks on the one folded axis); B micro-batch; S sequence
// length; Tl = S/D tokens per rank; C hidden; NH/NKV query/KV heads, g = NH/NKV; hs head size;
// F MLP width. Per rank: NHl = NH/D, NKVl = NKV/D heads, Fl = F/D MLP columns.
// Requirements checked by validate() (std::invalid_argument naming the values): a valid model
// config; D >= 1; D | NH, D | NKV (GQA: every shard owns whole KV heads), D | F; S divisible by D
// (2D for zigzag); B >= 1; head_buckets >= 1 dividing NKVl; the whole model (TspModel) also
// D | vocab. The divisibility rules are the strategy table's (strategy.hpp).
#pragma once

#include "tspemu/plan/cost_model.hpp"
#include "tspemu/reference/model_config.hpp"
#include "tspemu/tsp/sequence_layout.hpp"

namespace tspemu::tsp {

struct TspOptions {
  LayoutKind layout = LayoutKind::zigzag;
  // Split each broadcast head shard into this many groups of KV heads, one K/V all-gather per
  // group: the full-sequence K/V buffer shrinks by this factor, the bytes moved stay the same.
  int head_buckets = 1;
  // Backward of attention, trading memory for communication and compute:
  // keep the D broadcast weight shards from forward instead of broadcasting them again
  // (+ (D-1) shards of memory, - D broadcasts);
  bool keep_attention_shards = false;
  // keep the gathered full-sequence K/V of every shard instead of recomputing and re-gathering
  // them (+ D·2·B·S·NKVl·hs floats, - D all-gathers and the K/V projections).
  bool keep_kv = false;
  // The overlapped attention schedule (TSP-NOTES.md, "Overlap"; tsp_attention.hpp): the
  // broadcast of shard r+1 (ibroadcast, nonblocking.hpp) and each head bucket's K/V all-gather
  // (iall_gather) are posted one step ahead of the compute that needs them, in backward the dK/dV
  // reduce-scatter runs under the dQ GEMMs and the reduce of shard r's weight gradient to its
  // owner under shard r+1. Results are bitwise those of the serial schedule (every sum keeps its
  // order); costs one more packed shard (comm) in forward, two more (a shard and a partial
  // gradient) in backward, and with head_buckets > 1 and K/V re-gathered in backward one more
  // bucket of full-sequence K/V, 2·B·S·NKVb·hs (comm: the dK/dV send buffer).
  bool overlap = true;
};

// The cost model's view of the options (plan/cost_model.hpp): what changes bytes and memory.
inline cost::CostOptions cost_options(const TspOptions& o) {
  return {o.head_buckets, o.keep_attention_shards, o.keep_kv, o.overlap};
}

struct TspShape {
  ref::ModelConfig model;
  int D = 1;
  int B = 1;
  int S = 0;
  TspOptions options;

  void validate() const;
  void validate_whole_model() const;  // validate() and the embedding's D | vocab
  int Tl() const { return S / D; }
  int hs() const { return model.head_size(); }
  int NHl() const { return model.n_heads / D; }
  int NKVl() const { return model.n_kv_heads / D; }
  int Fl() const { return model.ffn / D; }
  SequenceLayout layout() const { return SequenceLayout(options.layout, D, S); }

 private:
  void check(bool whole_model) const;
};

}  // namespace tspemu::tsp
