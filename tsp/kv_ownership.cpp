#include "tspemu/tsp/kv_ownership.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace tspemu::tsp {

namespace {

std::int64_t clamp_count(std::int64_t n, std::int64_t lo, std::int64_t hi) {
  return std::clamp<std::int64_t>(n - lo, 0, hi - lo);
}

}  // namespace

KvOwnership::KvOwnership(int D, int interleave, std::vector<std::int64_t> prompt_lengths)
    : D_(D), I_(interleave), prompt_(std::move(prompt_lengths)) {
  if (D < 1) throw std::invalid_argument("KvOwnership: D=" + std::to_string(D) + " must be >= 1");
  if (interleave < 1) {
    throw std::invalid_argument("KvOwnership: interleave I=" + std::to_string(interleave) +
                                " must be >= 1 (generated tokens per round-robin block)");
  }
  for (std::size_t b = 0; b < prompt_.size(); ++b) {
    if (prompt_[b] < 1) {
      throw std::invalid_argument("KvOwnership: prompt of sequence " + std::to_string(b) +
                                  " has length " + std::to_string(prompt_[b]) + " (must be >= 1)");
    }
  }
}

void KvOwnership::check_seq(int seq) const {
  if (seq < 0 || seq >= batch()) {
    throw std::out_of_range("KvOwnership: sequence " + std::to_string(seq) + " outside [0, " +
                            std::to_string(batch()) + ")");
  }
}

std::int64_t KvOwnership::prompt_length(int seq) const {
  check_seq(seq);
  return prompt_[static_cast<std::size_t>(seq)];
}

bool KvOwnership::zigzag(int seq) const {
  const std::int64_t P = prompt_length(seq);
  return D_ > 1 && P % (2 * std::int64_t{D_}) == 0;
}

int KvOwnership::owner(int seq, std::int64_t pos) const {
  const std::int64_t P = prompt_length(seq);
  if (pos < 0) {
    throw std::out_of_range("KvOwnership: sequence " + std::to_string(seq) + " position " +
                            std::to_string(pos) + " is negative");
  }
  if (pos >= P) return static_cast<int>((P + (pos - P) / I_) % D_);
  if (zigzag(seq)) {
    const std::int64_t chunk = pos / (P / (2 * std::int64_t{D_}));
    return static_cast<int>(chunk < D_ ? chunk : 2 * D_ - 1 - chunk);
  }
  // Contiguous balanced blocks: the first m = P mod D ranks hold q + 1 positions, the rest q.
  const std::int64_t q = P / D_, m = P % D_;
  const std::int64_t long_span = m * (q + 1);
  return static_cast<int>(pos < long_span ? pos / (q + 1) : m + (pos - long_span) / q);
}

std::int64_t KvOwnership::prompt_count(int rank, int seq, std::int64_t n) const {
  const std::int64_t P = prompt_length(seq);
  const std::int64_t upto = std::min(n, P);
  if (zigzag(seq)) {
    const std::int64_t c = P / (2 * std::int64_t{D_});
    const std::int64_t far = 2 * D_ - 1 - rank;
    return clamp_count(upto, rank * c, (rank + 1) * c) + clamp_count(upto, far * c, (far + 1) * c);
  }
  const std::int64_t q = P / D_, m = P % D_;
  const std::int64_t lo = rank * q + std::min<std::int64_t>(rank, m);
  const std::int64_t hi = (rank + 1) * q + std::min<std::int64_t>(rank + 1, m);
  return clamp_count(upto, lo, hi);
}

std::int64_t KvOwnership::count(int rank, int seq, std::int64_t n) const {
  if (rank < 0 || rank >= D_) {
    throw std::out_of_range("KvOwnership: rank " + std::to_string(rank) + " outside [0, " +
                            std::to_string(D_) + ")");
  }
  const std::int64_t P = prompt_length(seq);
  std::int64_t total = prompt_count(rank, seq, n);
  const std::int64_t generated = std::max<std::int64_t>(n - P, 0);
  // Blocks of I generated tokens go to ranks P mod D, P mod D + 1, ...: rank `rank` is the d-th.
  const std::int64_t blocks = generated / I_, rest = generated % I_;
  const std::int64_t d = ((rank - P) % D_ + D_) % D_;
  total += (blocks / D_ + (d < blocks % D_ ? 1 : 0)) * I_;
  if (d == blocks % D_) total += rest;
  return total;
}

std::vector<std::int64_t> KvOwnership::owned(int rank, int seq, std::int64_t n) const {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(count(rank, seq, n)));
  for (std::int64_t p = 0; p < n; ++p)
    if (owner(seq, p) == rank) out.push_back(p);
  return out;
}

std::string KvOwnership::describe(int seq) const {
  const std::int64_t P = prompt_length(seq);
  return "sequence " + std::to_string(seq) + ": prompt of " + std::to_string(P) + " " +
         (zigzag(seq) ? "zigzag" : "in contiguous blocks") + " over " + std::to_string(D_) +
         " ranks, generated round-robin in blocks of " + std::to_string(I_) + " from rank " +
         std::to_string(P % D_);
}

}  // namespace tspemu::tsp
