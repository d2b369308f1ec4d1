#include "tspemu/tsp/sequence_layout.hpp"

#include <cstring>
#include <stdexcept>

#include "tspemu/core/dry_run.hpp"

namespace tspemu::tsp {

SequenceLayout::SequenceLayout(LayoutKind kind, int ranks, int seq_len)
    : kind_(kind), ranks_(ranks), seq_len_(seq_len) {
  if (ranks < 1)
    throw std::invalid_argument("SequenceLayout: D=" + std::to_string(ranks) + " must be >= 1");
  if (seq_len < 1)
    throw std::invalid_argument("SequenceLayout: S=" + std::to_string(seq_len) + " must be >= 1");
  const int unit = kind == LayoutKind::zigzag ? 2 * ranks : ranks;
  if (seq_len % unit != 0)
    throw std::invalid_argument(std::string("SequenceLayout: ") + layout_name(kind) +
                                " needs S=" + std::to_string(seq_len) + " divisible by " +
                                (kind == LayoutKind::zigzag ? "2D=" : "D=") + std::to_string(unit));
}

std::int64_t SequenceLayout::position(int rank, int i) const {
  const std::int64_t tl = local_tokens();
  switch (kind_) {
    case LayoutKind::contiguous:
      return rank * tl + i;
    case LayoutKind::zigzag: {
      const std::int64_t c = tl / 2;
      return i < c ? rank * c + i : (2 * ranks_ - 1 - rank) * c + (i - c);
    }
    case LayoutKind::striped:
      return static_cast<std::int64_t>(i) * ranks_ + rank;
  }
  return -1;
}

std::vector<std::int64_t> SequenceLayout::positions(int rank) const {
  std::vector<std::int64_t> p(static_cast<std::size_t>(local_tokens()));
  for (int i = 0; i < local_tokens(); ++i) p[static_cast<std::size_t>(i)] = position(rank, i);
  return p;
}

SequenceLayout TwoLevelLayout::checked_outer(LayoutKind outer, int outer_ranks, LayoutKind inner,
                                             int inner_ranks, int seq_len) {
  try {
    SequenceLayout o(outer, outer_ranks, seq_len);
    (void)SequenceLayout(inner, inner_ranks, o.local_tokens());
    return o;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("two-level layout ") + layout_name(outer) + " over " +
                                std::to_string(outer_ranks) + " then " + layout_name(inner) +
                                " over " + std::to_string(inner_ranks) +
                                " of S=" + std::to_string(seq_len) + ": " + e.what());
  }
}

TwoLevelLayout::TwoLevelLayout(LayoutKind outer, int outer_ranks, LayoutKind inner, int inner_ranks,
                               int seq_len)
    : outer_(checked_outer(outer, outer_ranks, inner, inner_ranks, seq_len)),
      inner_(inner, inner_ranks, outer_.local_tokens()) {}

std::vector<std::int64_t> TwoLevelLayout::positions(int outer_rank, int inner_rank) const {
  std::vector<std::int64_t> p(static_cast<std::size_t>(local_tokens()));
  for (int i = 0; i < local_tokens(); ++i)
    p[static_cast<std::size_t>(i)] = position(outer_rank, inner_rank, i);
  return p;
}

template <class T>
void SequenceLayout::scatter(const T* full, T* shard, int rank, int B, int C) const {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const std::size_t row = static_cast<std::size_t>(C);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < local_tokens(); ++i)
      std::memcpy(shard + (static_cast<std::size_t>(b) * local_tokens() + i) * row,
                  full + (static_cast<std::size_t>(b) * seq_len_ + position(rank, i)) * row,
                  row * sizeof(T));
}

template <class T>
void SequenceLayout::gather(const T* shard, T* full, int rank, int B, int C) const {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const std::size_t row = static_cast<std::size_t>(C);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < local_tokens(); ++i)
      std::memcpy(full + (static_cast<std::size_t>(b) * seq_len_ + position(rank, i)) * row,
                  shard + (static_cast<std::size_t>(b) * local_tokens() + i) * row,
                  row * sizeof(T));
}

template void SequenceLayout::scatter<float>(const float*, float*, int, int, int) const;
template void SequenceLayout::scatter<double>(const double*, double*, int, int, int) const;
template void SequenceLayout::scatter<std::int32_t>(const std::int32_t*, std::int32_t*, int, int,
                                                    int) const;
template void SequenceLayout::gather<float>(const float*, float*, int, int, int) const;
template void SequenceLayout::gather<double>(const double*, double*, int, int, int) const;

}  // namespace tspemu::tsp
