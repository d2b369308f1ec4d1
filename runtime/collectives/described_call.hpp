// Described calls: collectives whose shape the Fingerprint cannot hold (a set of buffers, the
// sequence <-> heads exchange's dimensions) post a description as data at step 0 — a word count,
// then that many words — and their buffers as later steps.
//
// Fingerprint of such a call: kind as counted, the call's dtype, root kDescribedCallRoot and the
// count the traffic model uses; counts are not compared at the meet (the descriptions are, by
// require_same_description). Another root than a plain collective's -1, so a plain call of the
// same kind never meets this one: it would read the description as data.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../transport/call.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

inline constexpr int kDescribedCallRoot = -2;

// A call's own array of n elements: inline up to N, on the heap beyond (rare: sets of more than
// N buffers), so common calls allocate nothing.
template <class T, std::size_t N>
class CallArray {
 public:
  explicit CallArray(std::size_t n) : n_(n) {
    if (n > N) heap_.resize(n);
  }
  T* data() { return n_ > N ? heap_.data() : inline_.data(); }
  const T* data() const { return n_ > N ? heap_.data() : inline_.data(); }
  std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return data()[i]; }
  std::span<const T> span() const { return {data(), n_}; }

 private:
  std::size_t n_;
  std::array<T, N> inline_{};
  std::vector<T> heap_;
};

// Member r's description (error path only).
inline std::vector<std::uint64_t> description_of(Call& call, int r) {
  std::uint64_t words = 0;
  call.recv(r, 0, 0, std::as_writable_bytes(std::span(&words, 1)));
  std::vector<std::uint64_t> d(words + 1);
  call.recv(r, 0, 0, std::as_writable_bytes(std::span(d)));
  return d;
}

// Whether member r's description equals member 0's, read in bounded pieces.
inline bool same_description(Call& call, int r) {
  std::uint64_t len0 = 0, len = 0;
  call.recv(0, 0, 0, std::as_writable_bytes(std::span(&len0, 1)));
  call.recv(r, 0, 0, std::as_writable_bytes(std::span(&len, 1)));
  if (len != len0) return false;
  constexpr std::size_t kBatch = 32;
  std::uint64_t a[kBatch], b[kBatch];
  for (std::uint64_t at = 0; at < len; at += kBatch) {
    const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(kBatch, len - at));
    const std::size_t offset = static_cast<std::size_t>(1 + at) * sizeof(std::uint64_t);
    call.recv(0, 0, offset, std::as_writable_bytes(std::span(a, m)));
    call.recv(r, 0, offset, std::as_writable_bytes(std::span(b, m)));
    if (std::memcmp(a, b, m * sizeof(std::uint64_t)) != 0) return false;
  }
  return true;
}

// Every member compares each member's description with member 0's, so all reach the same verdict;
// on a difference each reads every description and raises the same CollectiveMismatch, formatted
// by mismatch_message with equal descriptions as the classes (describe(words) formats one). Uses
// step 1 only on a mismatch.
template <class Describe>
void require_same_description(Call& call, Comm& comm, Describe&& describe) {
  bool ok = true;
  for (int r = 1; r < call.size(); ++r) ok = ok && same_description(call, r);
  if (ok) return;
  const auto n = static_cast<std::size_t>(call.size());
  std::vector<std::vector<std::uint64_t>> descriptions(n);
  std::vector<int> cls(n, -1);
  std::vector<std::string> calls(n);
  int classes = 0;
  for (std::size_t r = 0; r < n; ++r) {
    descriptions[r] = description_of(call, static_cast<int>(r));
    calls[r] = describe(descriptions[r]);
    for (std::size_t q = 0; q < r && cls[r] < 0; ++q)
      if (descriptions[q] == descriptions[r]) cls[r] = cls[q];
    if (cls[r] < 0) cls[r] = classes++;
  }
  // Every member reached this verdict; wait until all have finished reading before raising, or a
  // slower member's read would see the abort first and throw PeerFailure instead of the mismatch.
  call.post(1, std::span<const std::byte>());
  for (int r = 0; r < call.size(); ++r)
    if (r != call.rank()) call.recv(r, 1, 0, {});
  raise(comm, CollectiveMismatch(mismatch_message(comm.name(), call.seq(), cls, calls)));
}

}  // namespace tspemu::detail
