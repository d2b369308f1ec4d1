#include "tspemu/check/row_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/silu_mul.hpp"
#include "tspemu/runtime/collectives.hpp"

namespace tspemu::check {

namespace {

std::string str(std::int64_t v) {
  return std::to_string(v);
}

}  // namespace

RowDecoder::RowDecoder(DecodeRank& dr, int interleave) : dr_(dr), interleave_(interleave) {
  if (interleave < 1)
    throw std::invalid_argument("RowDecoder: interleave I=" + str(interleave) + " must be >= 1");
}

std::vector<float> RowDecoder::prefill(const Prompts& prompts) {
  const std::string who = "RowDecoder on rank " + str(dr_.rank().id()) + ": prefill: ";
  std::vector<DecodeRow> rows;
  std::vector<std::int64_t> lengths;
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    const auto n = static_cast<std::int64_t>(prompts[b].size());
    if (n > dr_.max_context())
      throw std::length_error(who + "sequence " + str(std::int64_t(b)) + "'s prompt of " + str(n) +
                              " positions exceeds max_context=" + str(dr_.max_context()));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int32_t t = prompts[b][static_cast<std::size_t>(i)];
      if (t < 0 || t >= dr_.config().vocab)
        throw std::invalid_argument(who + "sequence " + str(std::int64_t(b)) + " position " +
                                    str(i) + " has token " + str(t) + " outside [0, " +
                                    str(dr_.config().vocab) + ")");
      rows.push_back({static_cast<int>(b), i, t});
    }
    lengths.push_back(n);
  }
  cache_.reset();  // a new batch: the old reservation goes back to the arena first
  cache_ = std::make_unique<tsp::RankKvCache<float>>(
      dr_.arena(), dr_.rank().id(), dr_.config(),
      tsp::KvOwnership(dr_.rank().size(), interleave_, lengths), dr_.max_context());
  length_ = lengths;
  return step(rows);
}

std::vector<float> RowDecoder::decode_step(std::span<const std::int32_t> tokens) {
  const std::string who = "RowDecoder on rank " + str(dr_.rank().id()) + ": decode_step: ";
  if (!cache_) throw std::invalid_argument(who + "before prefill");
  if (tokens.size() != length_.size())
    throw std::invalid_argument(who + str(std::int64_t(tokens.size())) + " tokens for B=" +
                                str(std::int64_t(length_.size())) + " sequences");
  std::vector<DecodeRow> rows;
  for (std::size_t b = 0; b < tokens.size(); ++b) {
    const std::int64_t pos = length_[b];
    if (tokens[b] < 0 || tokens[b] >= dr_.config().vocab)
      throw std::invalid_argument(who + "sequence " + str(std::int64_t(b)) + " position " +
                                  str(pos) + " has token " + str(tokens[b]) + " outside [0, " +
                                  str(dr_.config().vocab) + ")");
    if (pos >= dr_.max_context())
      throw std::length_error(who + "sequence " + str(std::int64_t(b)) + " would hold position " +
                              str(pos) + ", beyond max_context=" + str(dr_.max_context()));
    rows.push_back({static_cast<int>(b), pos, tokens[b]});
  }
  std::vector<float> logits = step(rows);
  for (std::int64_t& n : length_) ++n;
  return logits;
}

void RowDecoder::embed(std::span<const DecodeRow> rows, float* x) {
  if (embed_.empty()) embed_ = dr_.weight(-1, "embed", replicated());
  const auto C = static_cast<std::size_t>(dr_.config().hidden);
  for (std::size_t n = 0; n < rows.size(); ++n)
    std::copy_n(embed_.data() + static_cast<std::size_t>(rows[n].token) * C, C, x + n * C);
}

std::vector<float> RowDecoder::logits(std::span<const DecodeRow> rows, const float* x) {
  const ref::ModelConfig& m = dr_.config();
  const int D = dr_.rank().size();
  if (head_.empty()) {
    head_ = dr_.weight(-1, "lm_head", vocab_sharded(dr_.rank().id(), D));
    final_norm_ = dr_.weight(-1, "final_norm", replicated());
  }
  const auto C = static_cast<std::size_t>(m.hidden), Vl = static_cast<std::size_t>(m.vocab / D);
  const auto B = static_cast<std::size_t>(batch());
  std::vector<float> xn(C), rstd(1), mine(B * Vl), all(mine.size() * static_cast<std::size_t>(D)),
      out(B * static_cast<std::size_t>(m.vocab));
  for (std::size_t n = 0; n < rows.size(); ++n) {
    if (n + 1 < rows.size() && rows[n + 1].seq == rows[n].seq) continue;  // not the last row
    ref::rmsnorm_forward(xn.data(), rstd.data(), x + n * C, final_norm_.data(), 1, m.hidden,
                         m.norm_eps);
    ref::matmul_nt(mine.data() + static_cast<std::size_t>(rows[n].seq) * Vl, xn.data(),
                   head_.data(), 1, static_cast<int>(Vl), m.hidden);
  }
  all_gather<float>(dr_.comm(), mine, all);  // [D, B, V/D]
  for (std::size_t p = 0; p < static_cast<std::size_t>(D); ++p)
    for (std::size_t b = 0; b < B; ++b)
      std::copy_n(all.data() + (p * B + b) * Vl, Vl, out.data() + b * Vl * D + p * Vl);
  return out;
}

void RowDecoder::attend_local(int layer, std::span<const DecodeRow> rows, const float* q,
                              float* out, float* lse) {
  const ref::ModelConfig& m = dr_.config();
  const auto NH = static_cast<std::size_t>(m.n_heads), hs = static_cast<std::size_t>(m.head_size());
  for (std::size_t n = 0; n < rows.size(); ++n) {
    const auto keys = cache_->positions(layer, rows[n].seq);
    ref::causal_attention_forward(
        out + n * NH * hs, lse + n * NH, q + n * NH * hs, cache_->keys(layer, rows[n].seq),
        cache_->values(layer, rows[n].seq), &rows[n].pos, keys.data(),
        {1, 1, static_cast<int>(keys.size()), m.n_heads, m.n_kv_heads, m.head_size()});
  }
}

void RowDecoder::merge_at_head_owners(std::span<const DecodeRow> rows, const float* out,
                                      const float* lse, float* att) {
  const ref::ModelConfig& m = dr_.config();
  const int D = dr_.rank().size(), NHl = m.n_heads / D;
  const auto Dz = static_cast<std::size_t>(D), N = rows.size(), Hl = static_cast<std::size_t>(NHl);
  const std::size_t q = Hl * static_cast<std::size_t>(m.head_size()), blk = N * (q + Hl);
  std::vector<float> send(blk * Dz), recv(send.size()), alse(N * Hl, -INFINITY);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t p = 0; p < Dz; ++p) {  // to rank p: its heads' out, then their lse
      std::copy_n(out + (n * Dz + p) * q, q, send.data() + p * blk + n * q);
      std::copy_n(lse + n * Hl * Dz + p * Hl, Hl, send.data() + p * blk + N * q + n * Hl);
    }
  all_to_all<float>(dr_.comm(), send, recv);
  std::fill_n(att, N * q, 0.0f);
  for (std::size_t p = 0; p < Dz; ++p)  // rank order: the same sums on every rank
    for (std::size_t n = 0; n < N; ++n)
      ref::merge_attention_partials(
          att + n * q, alse.data() + n * Hl, recv.data() + p * blk + n * q,
          recv.data() + p * blk + N * q + n * Hl, {1, 1, 0, NHl, NHl, m.head_size()});
}

void RowDecoder::add_all_reduced(std::span<float> part, float* x) {
  all_reduce<float>(dr_.comm(), part);
  for (std::size_t i = 0; i < part.size(); ++i) x[i] += part[i];
}

void RowDecoder::tp_mlp(const TpLayer& w, std::span<const DecodeRow> rows, float* x) {
  const ref::ModelConfig& m = dr_.config();
  const int N = static_cast<int>(rows.size()), C = m.hidden, F = m.ffn / dr_.rank().size();
  const auto NC = rows.size() * static_cast<std::size_t>(C);
  const auto NF = rows.size() * static_cast<std::size_t>(F);
  std::vector<float> xn(NC), rstd(rows.size()), g(NF), u(NF), h(NF), part(NC);
  ref::rmsnorm_forward(xn.data(), rstd.data(), x, w.post_norm.data(), N, C, m.norm_eps);
  ref::matmul_nt(g.data(), xn.data(), w.w_gate.data(), N, F, C);
  ref::matmul_nt(u.data(), xn.data(), w.w_up.data(), N, F, C);
  ref::silu_mul_forward(h.data(), g.data(), u.data(), h.size());
  ref::matmul_nt(part.data(), h.data(), w.w_down.data(), N, C, F);
  add_all_reduced(part, x);
}

}  // namespace tspemu::check
