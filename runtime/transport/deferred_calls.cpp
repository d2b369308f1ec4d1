#include "deferred_calls.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "../world/dry_reservation.hpp"
#include "call.hpp"
#include "early_exposure.hpp"

namespace tspemu::detail {

namespace {

std::uint64_t digest_all(std::span<const std::byte> bytes) {
  // Four independent multiply-xorshift lanes over 8-byte words (a dependency chain per lane, so
  // about 4x the speed of one), then the tail; not cryptographic: it catches a user's write, not
  // an adversary.
  constexpr std::uint64_t kMul = 0x9e3779b97f4a7c15ULL;
  std::uint64_t lane[4] = {1, 2, 3, 4};
  const std::size_t words = bytes.size() / 8;
  std::size_t i = 0;
  for (; i + 4 <= words; i += 4)
    for (int l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, bytes.data() + (i + static_cast<std::size_t>(l)) * 8, 8);
      lane[l] = (lane[l] ^ w) * kMul;
      lane[l] ^= lane[l] >> 29;
    }
  std::uint64_t h = bytes.size();
  for (; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, bytes.data() + i * 8, 8);
    h = ((h ^ w) * kMul) ^ (h >> 31);
  }
  for (std::size_t b = words * 8; b < bytes.size(); ++b)
    h = ((h ^ static_cast<std::uint64_t>(bytes[b])) * kMul) ^ (h >> 31);
  for (std::uint64_t l : lane) h = ((h ^ l) * kMul) ^ (h >> 29);
  return h;
}

}  // namespace

std::uint64_t digest_of(std::span<const std::byte> bytes) {
  if (bytes.empty() || DryReservation::holds(bytes.data())) return 0;
  if (bytes.size() <= kWholeDigestBytes) return digest_all(bytes);
  // Larger buffers: kDigestLines 64-byte lines spread evenly from the first to the last (line i of
  // the sample starts at i * (size - 64) / (kDigestLines - 1)), so the check costs the same few
  // hundred cache misses whatever the size: a sample proportional to the size costs large buffers
  // more than the overlap can hide (docs/benchmarks.md).
  const std::size_t last = bytes.size() - 64;
  std::uint64_t h = bytes.size();
  for (std::size_t i = 0; i < kDigestLines; ++i)
    h = h * 31 + digest_all(bytes.subspan(i * last / (kDigestLines - 1), 64));
  return h;
}

namespace {
std::uint64_t call_digest(const DeferredCall& c) {
  return digest_of(c.buffers[0]) * 3 + digest_of(c.buffers[1]);
}
}  // namespace

std::uint64_t DeferredCalls::add(Comm& /*comm*/, DeferredCall call) {
  call.digest = call_digest(call);
  const std::uint64_t id = next_id_++;
  pending_.push_back(Entry{id, false, std::move(call)});
  return id;
}

void DeferredCalls::drop(std::uint64_t id) {
  for (Entry& e : pending_)
    if (e.id == id && !e.dropped) {
      if (e.call.exposure) e.call.exposure->close();
      e.dropped = true;
      ++dropped_;
    }
}

void DeferredCalls::run_through(Comm& comm, std::uint64_t id) {
  while (!pending_.empty() && pending_.front().id <= id) {
    Entry e = std::move(pending_.front());
    pending_.pop_front();
    if (e.dropped) {
      --dropped_;
      completed_ = e.id;
      continue;
    }
    try {
      // Closed first: no member copies into the buffers while they are checked or after.
      if (e.call.exposure) e.call.exposure->close();
      if (call_digest(e.call) != e.call.digest ||
          (e.call.exposure && !e.call.exposure->blocks_unchanged()))
        raise(comm,
              std::logic_error(
                  "rank " + std::to_string(comm.world_rank(comm.rank())) + ": " + e.call.what +
                  " #" + std::to_string(e.call.seq) + " on group " + comm.name() +
                  ": its buffers changed between the issue and the wait (a non-blocking "
                  "collective's send and receive buffers belong to it until wait() "
                  "returns)"));
      running_ = true;
      e.call.run(comm);
      running_ = false;
    } catch (...) {
      running_ = false;
      failure_ = std::current_exception();
      pending_.clear();
      dropped_ = 0;
      throw;
    }
    completed_ = e.id;
  }
  if (failure_ != nullptr && id > completed_) std::rethrow_exception(failure_);
}

}  // namespace tspemu::detail
