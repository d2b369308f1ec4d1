// The control protocol: applying the opens, posts, dones and aborts other processes send.
#include "progress.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

void MpiTransport::Progress::receive(const std::vector<std::byte>& m, int source) {
  if (m.size() < sizeof(WireHead)) return;
  WireHead h;
  std::memcpy(&h, m.data(), sizeof h);
  // A message of another run is dropped: one of a run that ended (by a failure) before this one.
  switch (h.type) {
    case kOpen:
    case kPost:
    case kDone: {
      std::lock_guard lock(groups_mu);
      if (h.generation != run()) return;
      auto it = groups.find(h.group);
      if (it == groups.end())
        deferred[h.group].push_back(m);  // the group is not made here yet
      else
        apply(*it->second, m);
      break;
    }
    case kMessage: {
      const auto b = body_of<MessageBody>(m);
      auto in = std::make_unique<Incoming>();
      in->header = b.header;
      const auto payload = extra_of<MessageBody>(m);
      in->payload.assign(payload.begin(), payload.end());
      int dst_world = -1;
      {
        std::lock_guard lock(groups_mu);
        auto it = groups.find(h.group);
        if (it != groups.end())
          dst_world = it->second->world_ranks[static_cast<std::size_t>(b.dst)];
      }
      {
        std::lock_guard lock(incoming_mu);
        if (h.generation != run()) return;
        incoming[{h.group, h.member, b.dst, b.index}] = std::move(in);
        // release: pairs with end_run's acquire load; the message is in `incoming` before.
        messages_from[static_cast<std::size_t>(source)].fetch_add(1, std::memory_order_release);
      }
      // The receiver polls `incoming` under its mutex, so the unpark below is ordered after the
      // insertion; a receiver of a group not registered yet is woken by its next park timeout.
      if (dst_world >= 0)
        w.ranks[static_cast<std::size_t>(dst_world)]->parker.unpark();
      else
        for (int r = w.first_local; r < w.first_local + w.local_ranks; ++r)
          w.ranks[static_cast<std::size_t>(r)]->parker.unpark();
      break;
    }
    case kRead:
      if (h.generation == run()) serve_read(m, source);
      break;
    case kAbort:
      if (h.generation == run()) take_abort(m);
      break;
    default:
      break;
  }
}

void MpiTransport::Progress::apply(Group& g, const std::vector<std::byte>& m) {
  WireHead h;
  std::memcpy(&h, m.data(), sizeof h);
  Slot& s = g.slots[static_cast<std::size_t>(h.member)];
  // A done sent twice (by the finishing member and on an exposure, see owe_done) may arrive after
  // the member's next open: progress never moves back. relaxed: only the poller holding groups_mu
  // writes a mirror's progress.
  if (h.type == kDone &&
      s.progress.load(std::memory_order_relaxed) >= stage_value(h.seq, kDoneStage))
    return;
  Descriptor& d = s.desc[h.seq % kDescriptors];
  std::uint64_t stage = kDoneStage;
  bool exposes = false;
  if (h.type == kOpen) {
    const auto b = body_of<OpenBody>(m);
    d.fp = b.fp;
    d.header = b.header;
    d.eager = b.eager != 0;
    // The eager broadcast's settling reads this ring (shared_memory.hpp: Slot::fps), and so does a
    // receiver's check of its root (MpiTransport::open_rooted); the held calls' entries, and their
    // descriptors (a member that entered one of them in another form meets and reads them), are
    // unread until the progress store below covers them, and free (their sender entered #seq).
    auto data = extra_of<OpenBody>(m);
    std::uint64_t u = h.seq - b.held;
    for (std::uint32_t k = 0; k < b.runs; ++k) {
      HeldRun run;
      std::memcpy(&run, data.data() + k * sizeof(HeldRun), sizeof run);
      for (const std::uint64_t end = u + run.calls; u < end; ++u) {
        s.fps[u % (2 * kDescriptors)] = run.fp;
        Descriptor& held = s.desc[u % kDescriptors];
        held.fp = run.fp;
        held.header = b.header;
        held.eager = true;  // a receiver of an eager broadcast posts nothing
        for (int i = 0; i < kMaxSteps; ++i) held.step(i) = StepMessage{};
        held.step0 = StepMessage{held.data, nullptr, 0, 0};
      }
    }
    data = data.subspan(b.runs * sizeof(HeldRun));
    s.fps[h.seq % (2 * kDescriptors)] = b.fp;
    if (d.eager && !data.empty()) std::memcpy(d.data, data.data(), data.size());
    for (int i = 0; i < kMaxSteps; ++i) d.step(i) = StepMessage{};
    d.step0 = StepMessage{d.eager ? d.data : nullptr, nullptr, 0, h.bytes};
    stage = step_stage(0);
    exposes = !d.eager;
  } else if (h.type == kPost) {
    d.step(h.step) = StepMessage{nullptr, nullptr, 0, h.bytes};
    stage = step_stage(h.step);
    exposes = h.bytes > 0;
  }
  // seq_cst: publishes the mirror's descriptor; pairs with the seq_cst loads of wait_stage
  // (shared_memory.cpp), and is the store half of their Parker handshake, as a local member's
  // own store is. It is also the store half of the exposure handshake with MpiTransport::finish.
  s.progress.store(stage_value(h.seq, stage), std::memory_order_seq_cst);
  wake_members(g);
  if (exposes) owe_done(g, h.seq, w.process_of(g.world_ranks[static_cast<std::size_t>(h.member)]));
}

void MpiTransport::Progress::owe_done(const Group& g, std::uint64_t seq, int owner_process) {
  // The member exposed a buffer of call #seq, and waits for every member's done. A local member
  // that already finished the call sent no done to its process (it saw no exposure then): send it
  // now. seq_cst load after the seq_cst store of the mirror's progress (apply), against finish's
  // store of its own progress then load of the mirrors: one of the two sides sees the other.
  for (std::size_t m = 0; m < g.world_ranks.size(); ++m) {
    if (!w.hosts(g.world_ranks[m])) continue;
    if (g.slots[m].progress.load(std::memory_order_seq_cst) < stage_value(seq, kDoneStage))
      continue;
    WireHead h;
    h.type = kDone;
    h.generation = run();
    h.group = g.wire_id;
    h.seq = seq;
    h.member = static_cast<std::int32_t>(m);
    std::vector<std::byte> bytes(sizeof h);
    std::memcpy(bytes.data(), &h, sizeof h);
    Command c;
    c.kind = Command::kSend;
    c.dest = owner_process;
    c.bytes = std::move(bytes);
    std::lock_guard lock(queue_mu);  // sent by poll_once's next run_commands
    queue.push_back(std::move(c));
    queued.store(true, std::memory_order_release);
  }
}

void MpiTransport::Progress::take_abort(const std::vector<std::byte>& m) {
  const auto b = body_of<AbortBody>(m);
  const auto text_bytes = extra_of<AbortBody>(m);
  std::string text(reinterpret_cast<const char*>(text_bytes.data()), text_bytes.size());
  if (b.kind == kHang)
    text += "\n(process " + std::to_string(process) + " when the hang report arrived) " +
            describe_pending(w, w.now_ns());
  std::exception_ptr e;
  switch (b.kind) {
    case kMismatch:
      e = std::make_exception_ptr(CollectiveMismatch(text));
      break;
    case kPeer:
      e = std::make_exception_ptr(PeerFailure(text));
      break;
    case kHang:
      e = std::make_exception_ptr(HangError(text));
      break;
    case kOom:
      e = std::make_exception_ptr(OutOfMemory(text));
      break;
    default:
      e = std::make_exception_ptr(Error(text));
      break;
  }
  w.fail(b.rank, text, e, /*from_other_process=*/true);
}

}  // namespace tspemu::detail
