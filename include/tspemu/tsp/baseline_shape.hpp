// BaselineShape: the model and the parallel shape of a baseline run (TP, Megatron-SP, SP, TP+SP),
// validated before any thread starts; and the mesh that places ranks on it.
//
// The four baselines of TSP-NOTES.md ("Baselines on the same runtime") are points of one
// T × Sp mesh (T tensor-parallel degree, Sp sequence/context-parallel degree, T·Sp ranks):
//   TP (Megatron)          T = D, Sp = 1, sequence_parallel = false
//   TP + Megatron-SP       T = D, Sp = 1, sequence_parallel = true
//   SP (context parallel)  T = 1, Sp = D
//   TP + SP                T × Sp = D, any factorization (1×D, D×1 included)
// Mesh (chosen): world rank r sits at row = r / T, col = r % T. A row is a TP group (T
// consecutive ranks, like Megatron's innermost tensor-parallel group), a column an SP group.
// Column col owns head shard col of W_Q/W_K/W_V/W_O and MLP shard col (packed_shards.hpp, cut
// as by a TSP rank col of degree T); row row owns the sequence shard row of SequenceLayout
// zigzag over Sp (contiguous, i.e. the identity, when Sp = 1).
// With sequence_parallel (Megatron-SP), the Tl = S/Sp tokens of a row are further cut into T
// contiguous pieces of Tl/T (the order Megatron uses), one per rank of the row: the block input
// and output of rank (row, col) are the tokens col·Tl/T.. of the row's shard.
// Letters: B micro-batch, S sequence length, C hidden, NH/NKV query/KV heads, hs head size,
// F MLP width. Per rank: NHl = NH/T, NKVl = NKV/T heads, Fl = F/T MLP columns, Tl = S/Sp
// tokens per row, rows() = Tl (or Tl/T with sequence_parallel) token rows of the block input.
// Requirements checked by validate() (std::invalid_argument naming the strategy and the values):
// a valid model config; T, Sp, B, S >= 1; T | NH, T | NKV (GQA: each shard owns whole KV heads),
// T | F; Sp > 1: 2·Sp | S (zigzag); sequence_parallel: T | S/Sp — the rules of the strategy
// table's mesh entries (strategy.hpp); validate_whole_model() adds the whole model's T | vocab
// (mesh_model.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tspemu/reference/model_config.hpp"
#include "tspemu/tsp/sequence_layout.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

struct BaselineShape {
  ref::ModelConfig model;
  int T = 1;   // tensor-parallel degree (ranks in a row)
  int Sp = 1;  // sequence-parallel degree (ranks in a column)
  int B = 1;
  int S = 0;
  bool sequence_parallel = false;  // Megatron-SP inside each TP group

  static BaselineShape tp(const ref::ModelConfig& m, int D, int B, int S);
  static BaselineShape megatron_sp(const ref::ModelConfig& m, int D, int B, int S);
  static BaselineShape sp(const ref::ModelConfig& m, int D, int B, int S);
  static BaselineShape tp_sp(const ref::ModelConfig& m, int T, int Sp, int B, int S);

  void validate() const;
  void validate_whole_model() const;  // validate() and the vocabulary-parallel T | vocab
  std::string strategy() const;       // "TP", "TP+Megatron-SP", "SP", "TP+SP"
  int ranks() const { return T * Sp; }
  int row(int rank) const { return rank / T; }
  int col(int rank) const { return rank % T; }
  int Tl() const { return S / Sp; }  // tokens per sequence of one row
  int rows() const { return sequence_parallel ? Tl() / T : Tl(); }
  int hs() const { return model.head_size(); }
  int NHl() const { return model.n_heads / T; }
  int NKVl() const { return model.n_kv_heads / T; }
  int Fl() const { return model.ffn / T; }
  // The sequence split across rows (zigzag; contiguous when Sp = 1).
  SequenceLayout row_layout() const;
  // The split of a row's Tl tokens across its T ranks under sequence_parallel (contiguous).
  SequenceLayout piece_layout() const { return SequenceLayout(LayoutKind::contiguous, T, Tl()); }
  // Global positions of the rows() token rows of rank's block input, in local order.
  std::vector<std::int64_t> positions(int rank) const;
  // The TSP shape of degree T whose shard col is this mesh's column col (for packing).
  TspShape shard_shape() const;

 private:
  void check(bool whole_model) const;
};

}  // namespace tspemu::tsp
