// What the parallel decoders share (private to tspemu::tsp; tspw_decoder.hpp, tspm_decoder.hpp,
// tp_decoder.hpp, helix_decoder.hpp): the step of new tokens with the input checks and their
// messages, the measurement of what a collective moved on this rank, weight slices cut from the
// master, the KV heads of a head shard (with duplication past NKV), the Q/K/V projections of a head
// shard, the exchange and log-sum-exp merge of partial attention outputs, and the blocks that are
// plain Megatron TP over a group of n ranks — the vocabulary-parallel embedding (all-reduce) and LM
// head (all-gather of [B, V/n]) and the MLP (column gate/up, row down + all-reduce).
//
// Every GEMM, norm and attention call is per sequence (one GEMM row's bits can depend on the other
// rows of its call, reference/decode.hpp) and the collectives are element-wise, so a sequence's
// logits do not depend on its batch-mates, bitwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"

namespace tspemu::tsp::detail {

using Prompts = std::vector<std::vector<std::int32_t>>;

// The new tokens of one step, sequence-major: sequence b's count[b] tokens at global positions
// start[b].. are rows offset[b].. of the step's N rows.
struct DecodeStep {
  std::vector<std::int32_t> tokens;     // [N]
  std::vector<int> count;               // [B]
  std::vector<std::size_t> offset;      // [B]
  std::vector<std::int64_t> positions;  // [N] global
  bool prefill = false;
  int rows() const { return static_cast<int>(tokens.size()); }
};

// Every prompt at positions 0..P_b-1. std::invalid_argument (or std::length_error past
// max_context) prefixed by `who`, naming the sequence, position and value: B prompts expected, an
// empty prompt, a token outside [0, V).
DecodeStep prefill_step(const std::string& who, const Prompts& prompts, int B, int V,
                        std::int64_t max_context);
// One token per sequence at position lengths[b]. Throws as prefill_step, and when `prefilled` is
// false ("decode_step before prefill").
DecodeStep next_step(const std::string& who, std::span<const std::int32_t> tokens,
                     const std::vector<std::int64_t>& lengths, int V, std::int64_t max_context,
                     bool prefilled);
// The prompts' lengths of a prefill step.
std::vector<std::int64_t> step_lengths(const DecodeStep& step);

// Runs one collective, adding what it moved on this rank (every Comm of the rank counts into the
// rank's counters) to `into`.
void measured(Rank& rank, TrafficCounters& into, const std::function<void()>& collective);

// Rows [first, first + n) of the row-major master [*, cols].
template <class T>
Buffer<T> rows_of(Arena& a, const std::vector<T>& master, std::size_t cols, std::size_t first,
                  std::size_t n);
// Columns [first, first + n) of the row-major master [rows, ld], as [rows, n].
template <class T>
Buffer<T> cols_of(Arena& a, const std::vector<T>& master, std::size_t rows, std::size_t ld,
                  std::size_t first, std::size_t n);

// Shard r of n of the vocabulary: rows [r·V/n, (r+1)·V/n) of the embedding and of the LM head
// (the embedding's when tied), and the final norm whole. Requires n | V.
template <class T>
struct VocabShard {
  int n = 1, r = 0, Vl = 0;
  Buffer<T> embed, head, final_norm;  // [Vl, C], [Vl, C] (empty when tied), [C]
  VocabShard(Arena& a, const ref::ModelWeights<T>& master, int n, int r);
  const T* head_rows() const { return head.empty() ? embed.data() : head.data(); }
};

// A group of one rank (the row of an SP mesh, T = 1) makes no call: embed, lm_head and mlp_block
// skip their collective there (a call over one rank would move nothing but count a call the
// planner's closed forms do not have).

// x [N, C] = embed_tokens(step.tokens): the owner of each id's row writes it, the others zeros,
// and the all-reduce over `comm` (the vocabulary's n ranks, this rank's index r) adds exact
// zeros, so x is the embedding row bit for bit. `x` must be zeroed.
template <class T>
void embed(Rank& rank, Comm& comm, const VocabShard<T>& v, const DecodeStep& st, int C,
           Buffer<T>& x, TrafficCounters& traffic);
// embed's local part: the rows of x [N, C] whose token is in v's shard, the others untouched.
template <class T>
void embed_rows(const VocabShard<T>& v, const DecodeStep& st, int C, T* x);

// LM head: final norm of each sequence's last row of x [N, C], this rank's Vl logits,
// all-gathered over `comm` -> [B, V].
template <class T>
std::vector<T> lm_head(Rank& rank, Comm& comm, const VocabShard<T>& v, const DecodeStep& st,
                       const ref::ModelConfig& m, const Buffer<T>& x, TrafficCounters& traffic);

// Shard r of n of one layer's MLP: rows r·F/n.. of gate and up, those columns of down; and the
// post-attention norm weight whole. Requires n | F.
template <class T>
struct MlpShard {
  int Fl = 0;
  Buffer<T> gate, up, down, post_norm;  // [Fl, C], [Fl, C], [C, Fl], [C]
  MlpShard(Arena& a, const ref::LayerWeights<T>& master, const ref::ModelConfig& m, int n, int r);
};

// x [N, C] = mid + all_reduce over `comm` of down^(r)(silu(n·gate^(r)ᵀ) ⊙ n·up^(r)ᵀ), n =
// rmsnorm(mid).
template <class T>
void mlp_block(Rank& rank, Comm& comm, const MlpShard<T>& w, const DecodeStep& st,
               const ref::ModelConfig& m, const Buffer<T>& mid, Buffer<T>& x,
               TrafficCounters& traffic);
// mlp_block's GEMMs on normalized rows: partial [N, C] = down^(r)(silu(xn·gate^(r)ᵀ) ⊙
// xn·up^(r)ᵀ) per sequence (rows of no sequence untouched); scratch from `a`.
template <class T>
void mlp_partial(Arena& a, const MlpShard<T>& w, const DecodeStep& st, const ref::ModelConfig& m,
                 const T* xn, T* partial);

// The KV heads head shard a of n holds: NKV/n of them from a·NKV/n when n | NKV; when NKV | n
// (n > NKV), KV head a / (n/NKV) alone — each KV head duplicated n/NKV times over the shards, the
// one whose group holds the shard's NH/n query heads.
struct KvHeadShard {
  int first = 0, count = 0;
};
KvHeadShard kv_head_shard(const ref::ModelConfig& m, int n, int a);
// std::invalid_argument "<who>: <name>=n neither divides NKV=.. nor is a multiple of it ..."
// unless n | NKV or NKV | n.
void require_kv_heads_fit(const std::string& who, const char* name, int n, int nkv);

// Head shard a of n of one layer's attention input side: rows a·NH/n·hs.. of W_Q, the shard's KV
// heads' rows of W_K and W_V (kv_head_shard), and the input norm whole. Requires n | NH.
template <class T>
struct QkvShard {
  int NHl = 0;
  KvHeadShard kv;
  Buffer<T> wq, wk, wv, input_norm;  // [NHl·hs, C], [kv.count·hs, C] twice, [C]
  QkvShard(Arena& a, const ref::LayerWeights<T>& master, const ref::ModelConfig& m, int n,
           int shard);
};

// xn = rmsnorm(x); q [N, NHl, hs], k, v [N, kv.count, hs] of the shard, per sequence; RoPE on q
// and k at the step's global positions. rstd [N] is scratch.
template <class T>
void project_qkv(const QkvShard<T>& w, const ref::ModelConfig& m, const DecodeStep& st,
                 const Buffer<T>& x, Buffer<T>& xn, Buffer<T>& rstd, Buffer<T>& q, Buffer<T>& k,
                 Buffer<T>& v);
// project_qkv after its norm: q, k, v from the normalized rows xn [N, C].
template <class T>
void qkv_from_normed(const QkvShard<T>& w, const ref::ModelConfig& m, const DecodeStep& st,
                     const Buffer<T>& xn, Buffer<T>& q, Buffer<T>& k, Buffer<T>& v);

// Flash-decoding across the G members of `comm`: out [N, H, hs] and lse (sequence b's at
// H·offset[b], [H, count[b]]) are this rank's partial attention over its keys for H = G·Hn
// heads; member j receives heads j·Hn.. of every member's partial (one all_to_all: out block then
// lse, as T) and merges them by log-sum-exp in member order 0..G-1 (merge_attention_partials: an
// empty partial, out 0 and lse -inf, leaves the result unchanged) into att [N, Hn·hs]. G = 1: no
// collective, the partial is the result.
template <class T>
void exchange_partials(Rank& rank, Comm& comm, const DecodeStep& st, const T* out, const T* lse,
                       int H, int hs, Buffer<T>& att, TrafficCounters& traffic);

// Megatron TP's weight shards on rank r of n (tp_decoder.hpp, megatron_sp_decoder.hpp): per layer
// the QkvShard (KV heads duplicated past n = NKV), columns r·NH/n·hs.. of W_O (row-parallel) and
// the MlpShard; vocabulary shard r. Checks the master as check_master (`who` prefixes the error).
template <class T>
struct TpShards {
  std::vector<QkvShard<T>> qkv;  // [L]
  std::vector<Buffer<T>> wo;     // [L], [C, NH/n·hs]
  std::vector<MlpShard<T>> mlp;  // [L]
  std::unique_ptr<VocabShard<T>> vocab;
  TpShards(const std::string& who, Arena& a, const ref::ModelWeights<T>& master,
           const ref::ModelConfig& m, int n, int r);
};

// The master weights' sizes against the model (std::invalid_argument "<who>: master weights do
// not match the model ..."), and no dry run (std::logic_error: the decoders compute).
template <class T>
void check_master(const std::string& who, const ref::ModelConfig& m,
                  const ref::ModelWeights<T>& master);
// TSP's weight shards on rank r of D, in the training block's layout (packed_shards.hpp, S = 2D):
// per layer the packed attention and MLP shards and the two norms whole; rows r·V/D.. of the
// embedding and, untied, of the LM head; the final norm whole; all Category::weights. TSP-W keeps
// them in place, TSP-M moves them every step. Checks the master as check_master. Requires D | V.
template <class T>
struct TspShards {
  TspShape packing;  // the dimensions packed_shards.hpp cuts by
  std::vector<Buffer<T>> attention, mlp, input_norm, post_norm;  // [L] each
  Buffer<T> embed;                                               // [V/D, C] rows r·V/D..
  Buffer<T> head;        // [V/D, C]; empty when tied (the embedding's rows serve)
  Buffer<T> final_norm;  // [C]
  const T* head_rows() const { return head.empty() ? embed.data() : head.data(); }
  T* head_rows() { return head.empty() ? embed.data() : head.data(); }
};
template <class T>
TspShards<T> load_tsp_shards(const std::string& who, Arena& a, const ref::ModelConfig& m, int D,
                             int r, const ref::ModelWeights<T>& master);
// The cache, or std::logic_error "<who>: no cache before prefill".
template <class T>
const RankKvCache<T>& cache_or_throw(const std::string& who, const RankKvCache<T>* cache);
// lengths[seq], or std::out_of_range naming seq and B.
std::int64_t length_or_throw(const std::string& who, const std::vector<std::int64_t>& lengths,
                             int seq);

// One step's activations on a rank whose head shard has H query and KVH KV heads of size hs:
// x, mid, xn, partial [N, C]; rstd [N]; q, out [N, H·hs]; k, v [N, KVH·hs]; lse [N·H]. x zeroed.
template <class T>
struct StepBuffers {
  Buffer<T> x, mid, xn, rstd, q, k, v, out, lse, partial;
  StepBuffers(Arena& a, std::size_t rows, std::size_t C, std::size_t H, std::size_t KVH,
              std::size_t hs);
};

// For each new token the cache's ownership gives this token shard (cache.rank()), appends its k,
// v [N, KVH·hs] rows; then, per sequence, its queries q [N, H, hs] over this shard's keys of it,
// masked by global position (causal_attention_forward: a query with no visible key gets out 0,
// lse -inf) into out [N, H, hs] and lse (sequence b's at H·offset[b], [H, count[b]]).
template <class T>
void append_and_attend(RankKvCache<T>& cache, int layer, const DecodeStep& st, StepBuffers<T>& b,
                       int H, int KVH, int hs);

// o_proj, row-parallel: partial = att [N, width] · wo [C, width]ᵀ per sequence, all-reduced over
// the rank's world; mid = x + partial.
template <class T>
void o_proj_all_reduce(Rank& rank, const DecodeStep& st, const ref::ModelConfig& m, const T* att,
                       int width, const Buffer<T>& wo, StepBuffers<T>& b, TrafficCounters& traffic);

}  // namespace tspemu::tsp::detail
