#include "round.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

namespace {

void unpark_members(const Group& g, int me) {
  for (int r = 0; r < g.size(); ++r)
    if (r != me)
      g.world->ranks[static_cast<std::size_t>(g.world_ranks[static_cast<std::size_t>(r)])]
          ->parker.unpark();
}

bool compatible(const Fingerprint& a, const Fingerprint& b, bool counts_must_match) {
  return a.kind == b.kind && a.dtype == b.dtype && a.root == b.root &&
         (!counts_must_match || a.count == b.count);
}

}  // namespace

Round::Round(Comm& comm, Fingerprint fp, std::span<const std::byte> payload, std::byte* recv,
             bool counts_must_match)
    : comm_(comm),
      self_(comm.self()),
      group_(comm.group()),
      rank_(comm.rank()),
      size_(comm.size()),
      seq_(comm.next_seq()),
      exposed_(false) {
  inject_delay(self_);
  const std::uint64_t call_bytes = fp.count * dtype_size(fp.dtype);
  op_ = OpRef{collective_name(fp.kind), seq_, &group_, -1, "publish", call_bytes};
  record_ = record_begin(self_, op_.what, seq_, group_, -1, fp.root, call_bytes);
  root_ = fp.root;
  if (self_.trace) trace_begin_ns_ = self_.world->now_ns();
  Slot& mine = group_.slots[static_cast<std::size_t>(rank_)];
  Descriptor& d = mine.desc[seq_ % 2];
  d.fp = fp;
  d.send = payload.data();
  d.recv = recv;
  d.bytes = payload.size();
  d.sim_ns = self_.sim_ns;
  d.eager = payload.size() <= kEagerBytes;
  if (d.eager && !payload.empty()) std::memcpy(d.data, payload.data(), payload.size());
  exposed_ = !d.eager;
  mine.progress.store(stage_value(seq_, kPublished), std::memory_order_seq_cst);
  unpark_members(group_, rank_);
  try {
    for (int i = 0; i < size_; ++i) {
      // Meet the ranks after this one first: spreads the initial polling over the group.
      const int r = (rank_ + i) % size_;
      if (r != rank_) wait_stage(r, kPublished);
      peers_[static_cast<std::size_t>(r)] =
          &group_.slots[static_cast<std::size_t>(r)].desc[seq_ % 2];
    }
    // Every member compares every fingerprint with member 0's, so all of them reach the same
    // verdict and the same message.
    const Fingerprint& ref = peer(0).fp;
    bool ok = true;
    for (int r = 1; r < size_; ++r) ok = ok && compatible(ref, peer(r).fp, counts_must_match);
    if (!ok) {
      std::ostringstream m;
      m << "collective #" << seq_ << " on group " << group_.name << " disagrees:";
      for (int r = 0; r < size_; ++r)
        if (r == 0 || !compatible(ref, peer(r).fp, counts_must_match))
          m << (r ? ", " : " ") << "rank " << r << " called " << describe(peer(r).fp);
      raise(self_, CollectiveMismatch(m.str()));
    }
    if (const SimClockModel* sim = sim_model(self_)) {
      // The call starts on the simulated clock when its last member arrives; every member computes
      // the same start and end from the same published clocks.
      std::int64_t start = 0;
      for (int r = 0; r < size_; ++r) start = std::max(start, peer(r).sim_ns);
      sim_begin_ns_ = start;
      sim_end_ns_ = start + sim_ns_of(sim->collective_seconds(fp.kind, call_bytes, size_));
      self_.sim_ns = sim_end_ns_;
    }
  } catch (...) {
    if (exposed_) wait_all_done_after_abort();
    record_end(self_, record_, false);  // no destructor runs for a throwing constructor
    throw;
  }
}

void Round::begin_read() {
  // seq_cst store then seq_cst load: the reader half of the handshake in RankState::reading.
  self_.reading.store(true, std::memory_order_seq_cst);
  if (self_.world->aborted.load(std::memory_order_seq_cst)) {
    self_.reading.store(false, std::memory_order_release);
    check_abort(self_, op_);
  }
}

void Round::end_read() {
  // release: our reads of peers' buffers happen before a peer that sees `false` frees them.
  self_.reading.store(false, std::memory_order_release);
}

void Round::advance(std::uint64_t stage) {
  group_.slots[static_cast<std::size_t>(rank_)].progress.store(stage_value(seq_, stage),
                                                               std::memory_order_seq_cst);
  unpark_members(group_, rank_);
}

void Round::wait_stage(int r, std::uint64_t stage) {
  const std::uint64_t target = stage_value(seq_, stage);
  auto& progress = group_.slots[static_cast<std::size_t>(r)].progress;
  op_.stage = stage == kPublished ? "every member to enter"
              : stage == kReduced ? "reduced chunks"
                                  : "every member to finish";
  // seq_cst load: acquires the peer's descriptor/data (pairs with its seq_cst store) and is the
  // load half of the Parker handshake.
  wait_until(self_, group_.world_ranks[static_cast<std::size_t>(r)], op_,
             [&] { return progress.load(std::memory_order_seq_cst) >= target; });
}

void Round::finish() {
  finished_ = true;
  advance(kDone);
  if (exposed_) {
    try {
      for (int i = 1; i < size_; ++i) wait_stage((rank_ + i) % size_, kDone);
    } catch (...) {
      wait_all_done_after_abort();
      throw;
    }
  }
  recorded_end_ = true;
  record_end(self_, record_, true);
  if (self_.trace)
    self_.trace->record(TraceEvent{TraceEvent::Type::collective, op_.what, seq_, group_.id, -1,
                                   root_, op_.bytes, 0, 0, trace_begin_ns_, self_.world->now_ns(),
                                   sim_begin_ns_, sim_end_ns_});
}

void Round::wait_all_done_after_abort() {
  // The world is aborting (every throwing path above raised it first). Our buffers may still be
  // read by a member that began reading before it saw the abort; such a read is a bounded copy.
  // A member not reading now never will (begin_read rechecks the abort), so wait only for those.
  const std::uint64_t done = stage_value(seq_, kDone);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int wr = group_.world_ranks[static_cast<std::size_t>(r)];
    auto& peer_state = *self_.world->ranks[static_cast<std::size_t>(wr)];
    // seq_cst: the exposer half of the RankState::reading handshake.
    while (group_.slots[static_cast<std::size_t>(r)].progress.load(std::memory_order_seq_cst) <
               done &&
           peer_state.reading.load(std::memory_order_seq_cst))
      std::this_thread::yield();
  }
}

namespace {

template <class T>
void add_typed(T* acc, const T* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += src[i];
}

template <class T>
void sum_typed(T* out, const std::byte* const* srcs, int n, std::size_t count) {
  // Tiles keep the accumulator in L1 and make out aliasing a source safe: a tile is read from
  // every source before it is written.
  constexpr std::size_t kTile = 1024;
  alignas(64) T acc[kTile];
  for (std::size_t t = 0; t < count; t += kTile) {
    const std::size_t len = std::min(kTile, count - t);
    const T* s0 = reinterpret_cast<const T*>(srcs[0]) + t;
    for (std::size_t i = 0; i < len; ++i) acc[i] = s0[i];
    for (int r = 1; r < n; ++r) add_typed(acc, reinterpret_cast<const T*>(srcs[r]) + t, len);
    std::memcpy(out + t, acc, len * sizeof(T));
  }
}

}  // namespace

void add_into(Dtype dtype, std::byte* acc, const std::byte* src, std::size_t count) {
  switch (dtype) {
    case Dtype::f32:
      return add_typed(reinterpret_cast<float*>(acc), reinterpret_cast<const float*>(src), count);
    case Dtype::f64:
      return add_typed(reinterpret_cast<double*>(acc), reinterpret_cast<const double*>(src), count);
    case Dtype::i32:
      return add_typed(reinterpret_cast<std::int32_t*>(acc),
                       reinterpret_cast<const std::int32_t*>(src), count);
    case Dtype::i64:
      return add_typed(reinterpret_cast<std::int64_t*>(acc),
                       reinterpret_cast<const std::int64_t*>(src), count);
    case Dtype::byte:
      break;
  }
  throw std::invalid_argument("reductions are not defined for raw bytes");
}

void sum_ranks_into(Dtype dtype, std::byte* acc, const std::byte* const* srcs, int n,
                    std::size_t count) {
  if (count == 0) return;
  switch (dtype) {
    case Dtype::f32:
      return sum_typed(reinterpret_cast<float*>(acc), srcs, n, count);
    case Dtype::f64:
      return sum_typed(reinterpret_cast<double*>(acc), srcs, n, count);
    case Dtype::i32:
      return sum_typed(reinterpret_cast<std::int32_t*>(acc), srcs, n, count);
    case Dtype::i64:
      return sum_typed(reinterpret_cast<std::int64_t*>(acc), srcs, n, count);
    case Dtype::byte:
      break;
  }
  throw std::invalid_argument("reductions are not defined for raw bytes");
}

}  // namespace tspemu::detail
