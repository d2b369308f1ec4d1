// KvOwnership: which rank holds the key/value cache entry of each (sequence, global position)
// when a decoder's cache is sharded over the sequence (TSP-W decoding, tspw_decoder.hpp).
//
// What (D ranks, sequence b with a prompt of P_b tokens, I = interleave):
//   prompt positions 0..P_b-1:
//     zigzag when 2D | P_b: 2D chunks of c = P_b/(2D); rank r owns chunks r and 2D-1-r — the
//       training forward's SequenceLayout (sequence_layout.hpp), so a prefill through the training
//       forward would leave its keys exactly where this map says they are;
//     otherwise contiguous balanced blocks: with q = P_b / D, m = P_b mod D, rank r owns
//       [r·q + min(r, m), (r+1)·q + min(r+1, m)) — the first m ranks one position more. A prompt
//       shorter than D leaves D - P_b ranks with no key of that sequence.
//   generated positions P_b + i (i >= 0): round-robin in blocks of I tokens, starting at rank
//       P_b mod D (the first rank the blocks above left one short, so I = 1 keeps every rank
//       within one position of the others): owner = (P_b + floor(i / I)) mod D.
//   Positions are always global: a key is rotated by RoPE at its global position when written,
//   so attention over any subset of keys on any rank is exact (softmax is order-free).
// Requirements: D >= 1, I >= 1, every P_b >= 1 (checked: std::invalid_argument naming the value).
// Guarantees: every position has exactly one owner; owned(r, b, n) lists rank r's positions
//   below n in ascending order; count(r, b, n) equals owned(r, b, n).size() in O(1) (closed form).
//   Per sequence, the ranks' counts below any n >= P_b differ by at most I (the blocks' extra
//   prompt position sits on ranks the round-robin reaches last).
// Cost: owner O(1); owned O(n).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tspemu::tsp {

class KvOwnership {
 public:
  KvOwnership() = default;
  KvOwnership(int D, int interleave, std::vector<std::int64_t> prompt_lengths);

  int ranks() const { return D_; }
  int interleave() const { return I_; }
  int batch() const { return static_cast<int>(prompt_.size()); }
  std::int64_t prompt_length(int seq) const;
  // Whether sequence seq's prompt is laid out zigzag (2D | P_b), else in contiguous blocks.
  bool zigzag(int seq) const;

  int owner(int seq, std::int64_t pos) const;
  std::vector<std::int64_t> owned(int rank, int seq, std::int64_t n) const;  // ascending
  std::int64_t count(int rank, int seq, std::int64_t n) const;
  // "prompt zigzag over 4 ranks, generated round-robin in blocks of 1 from rank 0" for messages.
  std::string describe(int seq) const;

 private:
  void check_seq(int seq) const;
  std::int64_t prompt_count(int rank, int seq, std::int64_t n) const;  // positions < min(n, P_b)

  int D_ = 1;
  int I_ = 1;
  std::vector<std::int64_t> prompt_;
};

}  // namespace tspemu::tsp
