// Mirrors: keeping other processes' copies of a call's descriptors current (open, post, hold,
// done).
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

bool MpiTransport::remote(const Comm& comm, int member) const {
  return !w_.hosts(comm.group().world_ranks[static_cast<std::size_t>(member)]);
}

void MpiTransport::notify(const CallState& c, int type, int step, std::uint64_t bytes) {
  const Group& g = c.comm->group();
  if (g.other_processes.empty()) return;
  WireHead h;
  h.type = static_cast<std::uint32_t>(type);
  h.generation = p_->run();
  h.group = g.wire_id;
  h.seq = c.seq;
  h.member = c.rank;
  h.step = step;
  h.bytes = bytes;
  std::vector<std::byte>& m = control_buffer();
  m.resize(sizeof h);
  std::memcpy(m.data(), &h, sizeof h);
  p_->send_to_all(g.other_processes, m);
}

bool MpiTransport::mirrors_reached(const CallState& c, std::uint64_t stage) const {
  const Group& g = c.comm->group();
  const std::uint64_t target = stage_value(c.seq, stage);
  for (int r = 0; r < c.size; ++r)
    // seq_cst: as wait_stage's load (pairs with apply's store).
    if (r != c.rank && !w_.hosts(g.world_ranks[static_cast<std::size_t>(r)]) &&
        g.slots[static_cast<std::size_t>(r)].progress.load(std::memory_order_seq_cst) < target)
      return false;
  return true;
}

bool MpiTransport::mirror_reached(const CallState& c, int member, std::uint64_t stage) const {
  // seq_cst: as wait_stage's load (pairs with apply's store).
  return c.comm->group().slots[static_cast<std::size_t>(member)].progress.load(
             std::memory_order_seq_cst) >= stage_value(c.seq, stage);
}

namespace {
std::vector<MpiTransport::Progress::Held>& held_of(MpiTransport::Progress& p, int world_rank) {
  return p.held[static_cast<std::size_t>(world_rank - p.w.first_local)];
}
}  // namespace

void MpiTransport::send_open(const CallState& c, const Fingerprint& fp, const CallHeader& header,
                             std::span<const std::byte> step0) {
  Group& g = c.comm->group();
  if (g.other_processes.empty()) return;
  // The open message is built from fp and header directly (our descriptor is written by the
  // shared-memory open below, which then waits for every member). The calls this rank held back
  // (hold) are the ones just before this one: their fingerprints ride along.
  auto& held = held_of(*p_, c.comm->world_rank(c.rank));
  std::uint64_t first_held = c.seq;
  for (auto it = held.begin(); it != held.end(); ++it)
    if (it->g == &g) {
      first_held = it->first;
      held.erase(it);
      break;
    }
  send_open_message(g, c.rank, c.seq, fp, header, step0, first_held);
}

void MpiTransport::send_open_message(const Group& g, int member, std::uint64_t seq,
                                     const Fingerprint& fp, const CallHeader& header,
                                     std::span<const std::byte> step0, std::uint64_t first_held) {
  WireHead h;
  h.type = kOpen;
  h.generation = p_->run();
  h.group = g.wire_id;
  h.seq = seq;
  h.member = member;
  h.bytes = step0.size();
  OpenBody b;
  b.fp = fp;
  b.header = header;
  b.eager = step0.size() <= kEagerBytes ? 1 : 0;
  b.held = static_cast<std::uint32_t>(seq - first_held);
  const Slot& own = g.slots[static_cast<std::size_t>(member)];
  // At most kHeldOpens - 1 calls are held before one (hold flushes at kHeldOpens).
  if (seq - first_held >= kHeldOpens)
    throw std::logic_error("MPI transport: member " + std::to_string(member) + " held " +
                           std::to_string(seq - first_held) + " opens before call #" +
                           std::to_string(seq) + ", more than " + std::to_string(kHeldOpens - 1));
  // The held fingerprints as runs, written straight into the message: counted first, then written
  // (an array of kHeldOpens runs, built on every open though most hold none, cost ~220
  // instructions per open).
  auto held_fp = [&](std::uint64_t u) -> const Fingerprint& {
    return own.fps[u % (2 * kDescriptors)];
  };
  for (std::uint64_t u = first_held; u < seq; ++u)
    if (u == first_held || held_fp(u) != held_fp(u - 1)) ++b.runs;
  const std::size_t runs_bytes = b.runs * sizeof(HeldRun);
  std::vector<std::byte>& m = control_buffer();
  m.resize(sizeof h + sizeof b + runs_bytes + (b.eager ? step0.size() : 0));
  std::memcpy(m.data(), &h, sizeof h);
  std::memcpy(m.data() + sizeof h, &b, sizeof b);
  std::byte* at = m.data() + sizeof h + sizeof b;
  for (std::uint64_t u = first_held; u < seq;) {
    HeldRun run{held_fp(u), 0};
    for (; u < seq && held_fp(u) == run.fp; ++u) ++run.calls;
    std::memcpy(at, &run, sizeof run);
    at += sizeof run;
  }
  if (b.eager && !step0.empty()) std::memcpy(at, step0.data(), step0.size());
  p_->send_to_all(g.other_processes, m);
}

void MpiTransport::hold(CallState& c) {
  Group& g = c.comm->group();
  auto& held = held_of(*p_, c.comm->world_rank(c.rank));
  auto it = std::find_if(held.begin(), held.end(), [&](const auto& e) { return e.g == &g; });
  if (it == held.end()) {
    held.push_back(Progress::Held{&g, c.rank, c.seq, c.seq});
    it = held.end() - 1;
  }
  it->last = c.seq;
  if (it->last - it->first + 1 >= kHeldOpens) flush_held(c.comm->world_rank(c.rank));
}

void MpiTransport::flush_held(int world_rank) {
  auto& held = held_of(*p_, world_rank);
  for (const auto& e : held) {
    // The open of the last held call, from this rank's own descriptor of it (stable: written by
    // its enter); the rest travel as fingerprints. Its mirrors' descriptor is free: entering the
    // call waited for what wait_mirror_free waits for (shared_memory.hpp: Eager broadcast).
    const Slot& own = e.g->slots[static_cast<std::size_t>(e.member)];
    const Descriptor& d = own.desc[e.last % kDescriptors];
    send_open_message(*e.g, e.member, e.last, own.fps[e.last % (2 * kDescriptors)], d.header,
                      std::span<const std::byte>(d.data, d.eager ? d.step0.bytes : 0), e.first);
  }
  held.clear();
}

void MpiTransport::wait_mirror_free(CallState& c) {
  // Our open rewrites the mirrors of our descriptor c.seq % kDescriptors in the other processes,
  // as enter() rewrites it here, so it leaves on the same condition: every member entered
  // #seq + 1 - kDescriptors (shared_memory.hpp: Eager broadcast). A call after one that met every
  // member has it already.
  const Group& g = c.comm->group();
  if (g.slots[static_cast<std::size_t>(c.rank)].unmet_first == 0 || c.seq + 1 < kDescriptors)
    return;
  const std::uint64_t target = stage_value(c.seq + 1 - kDescriptors, step_stage(0));
  auto entered = [&](int r) {
    // seq_cst: as wait_stage's load (pairs with apply's store).
    return g.slots[static_cast<std::size_t>(r)].progress.load(std::memory_order_seq_cst) >= target;
  };
  if (pump_until([&] {
        for (int r = 0; r < c.size; ++r)
          if (remote(*c.comm, r) && !entered(r)) return false;
        return true;
      }))
    return;
  c.op.stage = "every member to enter";
  for (int r = 0; r < c.size; ++r)
    if (remote(*c.comm, r))
      wait_until(c.comm->self(), g.world_ranks[static_cast<std::size_t>(r)], c.op,
                 [&] { return entered(r); });
}

bool MpiTransport::open_rooted(CallState& c, const Fingerprint& fp, const CallHeader& header,
                               std::span<const std::byte> step0) {
  // The eager form as within one process: the root's open message carries the payload to every
  // other process's mirror of its slot (and its fingerprint to the mirror's Slot::fps ring, which
  // settling reads), so the root meets nobody and a receiver waits for the root alone.
  if (fp.count * dtype_size(fp.dtype) > kEagerBytes || fp.root < 0 || fp.root >= c.size) {
    open(c, fp, header, step0);
    return true;
  }
  Group& g = c.comm->group();
  if (c.rank == fp.root || g.other_processes.empty()) {
    wait_mirror_free(c);
    send_open(c, fp, header, step0);
    return SharedMemoryTransport::open_rooted(c, fp, header, step0);
  }
  // A receiver sends nothing now (hold): it checks the root's fingerprint of the call here, before
  // it enters, so a mismatch never waits for members whose opens are held back.
  const int self = c.comm->world_rank(c.rank);
  if (remote(*c.comm, fp.root) &&
      !pump_until([&] { return mirror_reached(c, fp.root, step_stage(0)); }))
    flush_held(self);  // parking: whoever waits for this rank's progress gets it first
  wait_stage(c, fp.root, step_stage(0));
  // The root's open (or, when it held this call as a receiver itself, its later open) wrote its
  // fingerprint of the call before publishing the progress wait_stage saw.
  const Fingerprint& theirs =
      g.slots[static_cast<std::size_t>(fp.root)].fps[c.seq % (2 * kDescriptors)];
  if (!(theirs == fp))
    raise(c.comm->self(),
          CollectiveMismatch("collective #" + std::to_string(c.seq) + " on group " +
                             c.comm->name() + ": rank " + std::to_string(c.rank) + " called " +
                             describe(fp) + " while rank " + std::to_string(fp.root) +
                             ", the root it names, called " + describe(theirs)));
  const bool met = SharedMemoryTransport::open_rooted(c, fp, header, step0);
  hold(c);
  return met;
}

void MpiTransport::settle(RankState& self) {
  // The held opens first: the members' settling waits for this rank's progress.
  flush_held(self.rank);
  SharedMemoryTransport::settle(self);
}

void MpiTransport::open(CallState& c, const Fingerprint& fp, const CallHeader& header,
                        std::span<const std::byte> step0) {
  wait_mirror_free(c);
  send_open(c, fp, header, step0);
  if (!c.comm->group().other_processes.empty())
    pump_until([&] { return mirrors_reached(c, step_stage(0)); });
  SharedMemoryTransport::open(c, fp, header, step0);
}

void MpiTransport::post(CallState& c, int step, std::span<const std::byte> data) {
  SharedMemoryTransport::post(c, step, data);
  notify(c, kPost, step, data.size());
}

void MpiTransport::post(CallState& c, int step, Pieces pieces) {
  if (pieces.size() == 1) return post(c, step, pieces[0]);
  SharedMemoryTransport::post(c, step, pieces);
  std::uint64_t bytes = 0;
  for (const auto& p : pieces) bytes += p.size();
  notify(c, kPost, step, bytes);
}

void MpiTransport::finish(CallState& c) {
  Group& g = c.comm->group();
  // An eager broadcast (open_rooted) exposes nothing and publishes no done.
  if (!g.other_processes.empty() && g.slots[static_cast<std::size_t>(c.rank)].unawaited != c.seq) {
    // Every read of ours has completed (each waited for its reply). Done goes only to processes
    // whose members exposed a buffer in this call: the others wait for nobody's done. A post that
    // exposes one and arrives after the check below is answered by owe_done. seq_cst store of our
    // progress (finish stores the same value again), then seq_cst loads of the mirrors': the
    // handshake with apply's store then owe_done's load.
    g.slots[static_cast<std::size_t>(c.rank)].progress.store(stage_value(c.seq, kDoneStage),
                                                             std::memory_order_seq_cst);
    for (int q : g.other_processes) {
      bool exposed = false;
      for (int r = 0; r < c.size && !exposed; ++r) {
        if (w_.process_of(g.world_ranks[static_cast<std::size_t>(r)]) != q) continue;
        const Slot& s = g.slots[static_cast<std::size_t>(r)];
        // Only the steps the mirror shows posted are read (the rest apply may be writing); a
        // member done with the call posted all it will (steps never posted read as empty). Done
        // says it finished reading, not that it stopped waiting for ours.
        const std::uint64_t reached = s.progress.load(std::memory_order_seq_cst);
        const Descriptor& d = s.desc[c.seq % kDescriptors];
        for (int step = 0; step < kMaxSteps && !exposed; ++step) {
          if (reached < stage_value(c.seq, step_stage(step))) break;
          exposed = step == 0 ? !d.eager : d.step(step).bytes > 0;
        }
      }
      if (!exposed) continue;
      WireHead h;
      h.type = kDone;
      h.generation = p_->run();
      h.group = g.wire_id;
      h.seq = c.seq;
      h.member = c.rank;
      std::vector<std::byte> m(sizeof h);
      std::memcpy(m.data(), &h, sizeof h);
      p_->send_to(q, std::move(m), true);
    }
    if (c.exposed) pump_until([&] { return mirrors_reached(c, kDoneStage); });
  }
  SharedMemoryTransport::finish(c);
}

void MpiTransport::abandon(CallState& c) noexcept {
  SharedMemoryTransport::abandon(c);
  if (!c.exposed || c.finished || c.comm->group().other_processes.empty()) return;
  // Replies already leaving from our buffers: wait for them (bounded: a reply whose reader
  // cancelled its receive may never complete; the run is failing, and the buffers stay mapped).
  const int me = c.comm->world_rank(c.rank);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  // seq_cst: pairs with the progress thread's seq_cst updates of serving.
  while (p_->serving[static_cast<std::size_t>(me)].load(std::memory_order_seq_cst) > 0 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
}

}  // namespace tspemu::detail
