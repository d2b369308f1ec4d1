// ExposedCall: a collective call published by description rather than by its data, for calls whose
// data is not one contiguous payload (a set of buffers) or whose shape the Fingerprint cannot hold
// (the sequence <-> heads exchange's dimensions).
//
// The Round payload is the description itself (the shape, and where this rank's buffers are);
// peers read it, check it against member 0's, then read the buffers it points to (single copy).
// Why the padding: Round copies payloads of at most kEagerBytes into the mailbox and lets their
// rank return without waiting for its peers. Here peers read through the description into this
// rank's buffers, so the rank must stay until they are done, which Round guarantees (also on
// abort) only for a payload it exposes, i.e. one larger than kEagerBytes.
// Fingerprint: kind as counted, the call's dtype, root kExposedCallRoot and the count the
// traffic model uses; counts are not compared by Round (the shapes are, by require_same_call).
// Another root than a plain collective's -1, so a plain call of the same kind never meets this
// one: it would read the description as data.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "round.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

inline constexpr int kExposedCallRoot = -2;

template <class Fields>
struct ExposedCall {
  Fields fields;
  std::byte keep_exposed[kEagerBytes];

  std::span<const std::byte> payload() const {
    static_assert(sizeof(ExposedCall) > kEagerBytes, "Round must expose the call, not copy it");
    return {reinterpret_cast<const std::byte*>(this), sizeof(*this)};
  }
  // Member r's description; read it under a ReadScope.
  static const Fields& of(const Round& rd, int r) {
    return reinterpret_cast<const ExposedCall*>(rd.payload(r))->fields;
  }
};

// Every member compares each member's fields with member 0's (same(a, b)), so all reach the same
// verdict; on a difference each raises the same CollectiveMismatch naming member 0's call and
// every differing one (describe(fields) reads the member's buffers, hence under the ReadScope).
template <class Fields, class Same, class Describe>
void require_same_call(Round& rd, const Comm& comm, Same&& same, Describe&& describe) {
  std::string calls;
  {
    ReadScope read(rd);
    const Fields& ref = ExposedCall<Fields>::of(rd, 0);
    for (int r = 1; r < rd.size(); ++r) {
      const Fields& f = ExposedCall<Fields>::of(rd, r);
      if (!same(ref, f)) calls += ", rank " + std::to_string(r) + " called " + describe(f);
    }
    if (calls.empty()) return;
    calls = " rank 0 called " + describe(ref) + calls;
  }
  // Every member reached this verdict; wait until all have finished reading before raising, or a
  // slower member's read would see the abort first and throw PeerFailure instead of the mismatch.
  // (kReduced is free here: a mismatched call never reaches its algorithm.)
  rd.advance(kReduced);
  for (int r = 0; r < rd.size(); ++r)
    if (r != rd.rank()) rd.wait_stage(r, kReduced);
  raise(comm.self(), CollectiveMismatch("collective #" + std::to_string(rd.seq()) + " on group " +
                                        comm.name() + " disagrees:" + calls));
}

}  // namespace tspemu::detail
