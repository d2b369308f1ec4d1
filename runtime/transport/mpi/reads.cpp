// Reads of other processes' messages: requesting, serving, copying in place, and the receive verbs.
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

// Copies bytes [address, address + bytes) of process `pid` into dst; false when the kernel refuses
// (not permitted, no such process, not mapped there).
bool copy_from_process(pid_t pid, std::uint64_t address, std::byte* dst, std::size_t bytes) {
  while (bytes > 0) {
    iovec local{dst, bytes};
    iovec remote{reinterpret_cast<void*>(address), bytes};  // NOLINT(performance-no-int-to-ptr)
    const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) return false;
    const auto n = static_cast<std::size_t>(got);  // a short count stops at an unmapped page
    dst += n;
    address += n;
    bytes -= n;
  }
  return true;
}

namespace {

// Never wait with the reading flag up (shared_memory.cpp: an aborting local owner waits for it to
// drop). relaxed load: only this thread writes its flag; release store: our reads of local peers'
// buffers happen before a peer that sees it down frees them.
void lower_reading_flag(RankState& self) {
  if (self.reading.load(std::memory_order_relaxed))
    self.reading.store(false, std::memory_order_release);
}

thread_local bool fetch_set_live = false;

// What a reply to read `b` of the step message `msg` sends: where the range lies (address_only),
// nothing (a range past the post), the bytes in place (one row, or the rows as an MPI vector type
// the caller frees after MPI_Isend), or the rows packed into `buffer` (a message of pieces).
struct Reply {
  const void* src = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
};
Reply reply_to(const ReadBody& b, const StepMessage& msg, std::vector<std::byte>& buffer) {
  Reply out;
  if (b.address_only != 0) {
    // The reader copies the range itself (FetchSet): this process need not run while it does,
    // and the owner keeps the buffer until the reader's done, as for a reply of the bytes.
    AddressReply a;
    a.bytes = msg.bytes;
    if (msg.pieces == nullptr && b.rows == 1 && b.offset + b.row_bytes <= msg.bytes)
      a.address = reinterpret_cast<std::uintptr_t>(msg.single);
    buffer.resize(sizeof a);
    std::memcpy(buffer.data(), &a, sizeof a);
    out.src = buffer.data();
    out.count = static_cast<int>(sizeof a);
  } else if (b.rows == 0 || b.offset + (b.rows - 1) * b.stride + b.row_bytes > msg.bytes) {
    // A read that left before the post was mirrored at its reader, of more than was posted: an
    // empty reply ends its receive, and the reader, checking the range against the post, throws.
  } else if (msg.pieces == nullptr) {
    out.src = msg.single + b.offset;
    if (b.rows == 1) {
      out.count = static_cast<int>(b.row_bytes);
    } else {
      MPI_Type_create_hvector(static_cast<int>(b.rows), static_cast<int>(b.row_bytes),
                              static_cast<MPI_Aint>(b.stride), MPI_BYTE, &out.type);
      MPI_Type_commit(&out.type);
      out.count = 1;
    }
  } else {
    // A message made of pieces: pack the rows (the reader checked the range against its size).
    buffer.resize(b.rows * b.row_bytes);
    for (std::uint64_t r = 0; r < b.rows; ++r) {
      std::size_t pos = b.offset + r * b.stride, done = 0;
      while (done < b.row_bytes) {
        std::size_t at = pos + done;
        std::size_t i = 0;
        while (i < msg.piece_count && at >= msg.pieces[i].size()) at -= msg.pieces[i++].size();
        const std::size_t len =
            std::min<std::size_t>(msg.pieces[i].size() - at, b.row_bytes - done);
        std::memcpy(buffer.data() + r * b.row_bytes + done, msg.pieces[i].data() + at, len);
        done += len;
      }
    }
    out.src = buffer.data();
    out.count = static_cast<int>(buffer.size());
  }
  return out;
}

}  // namespace

MpiTransport::FetchSet::FetchSet(MpiTransport& transport, CallState& call, int step_read,
                                 std::size_t capacity)
    : t(transport), c(call), step(step_read) {
  if (fetch_set_live)
    throw std::logic_error("rank " + std::to_string(c.comm->world_rank(c.rank)) + ": " + c.op.what +
                           " started a second set of reads while one is open");
  thread_local std::unique_ptr<Read[]> mine;
  thread_local std::size_t room = 0;
  thread_local std::unique_ptr<Source[]> members;
  thread_local std::size_t member_room = 0;
  if (room < capacity) {  // the last set ended: none of the old reads is in flight
    mine.reset(new Read[capacity]);
    room = capacity;
  }
  const auto n = static_cast<std::size_t>(c.size);
  if (member_room < n) {
    members.reset(new Source[n]);
    member_room = n;
  }
  reads = mine.get();
  sources = members.get();
  fetch_set_live = true;
}

MpiTransport::FetchSet::~FetchSet() {
  for (std::size_t i = 0; i < used; ++i)
    if (reads[i].started && !reads[i].in_place) t.cancel_fetch(reads[i].fetch);
  for (int m = 0; asked > 0 && m < c.size; ++m) {
    Source& s = sources[m];
    if (s.state == Source::kAsked) t.cancel_fetch(s.fetch);
    s.state = Source::kUnasked;
  }
  fetch_set_live = false;
}

void MpiTransport::FetchSet::start(std::size_t i, int from, std::size_t offset, std::size_t bytes,
                                   std::byte* dst) {
  for (; used <= i; ++used) reads[used].started = false;  // not all: an 8 B call uses a few
  Read& r = reads[i];
  r.from = from;
  r.offset = offset;
  r.end = offset + bytes;
  r.dst = dst;
  r.in_place = false;
  const Group& g = c.comm->group();
  if (bytes >= kDirectBytes && t.p_->direct_pid[static_cast<std::size_t>(t.w_.process_of(
                                   g.world_ranks[static_cast<std::size_t>(from)]))] != 0) {
    Source& s = sources[from];
    if (s.state == Source::kUnasked) {
      s.state = Source::kAsked;
      ++asked;
      t.start_address_fetch(c, from, step, offset, bytes, s.reply, s.fetch);
    }
    if (s.state != Source::kOverMpi) {
      r.in_place = true;
      r.started = true;
      return;
    }
  }
  r.started = t.start_fetch(c, from, step, offset, bytes, bytes, 1, dst, bytes, r.fetch);
}

void MpiTransport::FetchSet::wait(std::size_t i) {
  if (i >= used || !reads[i].started) return;
  Read& r = reads[i];
  r.started = false;
  if (!r.in_place) t.wait_fetch(c, r.from, r.fetch);
  Source& s = sources[r.from];
  if (r.in_place && s.state == Source::kAsked) {
    t.wait_fetch(c, r.from, s.fetch);
    std::memcpy(&s.where, s.reply, sizeof s.where);
    s.state = s.where.address != 0 ? Source::kKnown : Source::kOverMpi;
  }
  if (step > 0) {  // step 0 was mirrored at the meet
    lower_reading_flag(c.comm->self());
    t.pump_until([&] { return t.mirror_reached(c, r.from, step_stage(step)); });
    t.wait_stage(c, r.from, step_stage(step));
  }
  t.check_read_range(c, r.from, step, r.offset, r.end);
  if (!r.in_place) return;
  const std::size_t bytes = r.end - r.offset;
  const Group& g = c.comm->group();
  const pid_t pid = t.p_->direct_pid[static_cast<std::size_t>(
      t.w_.process_of(g.world_ranks[static_cast<std::size_t>(r.from)]))];
  if (s.state == Source::kKnown && r.end <= s.where.bytes &&
      copy_from_process(pid, s.where.address + r.offset, r.dst, bytes))
    return;
  // Not readable in place after all (a message of pieces, or the kernel refused): over MPI.
  if (t.start_fetch(c, r.from, step, r.offset, bytes, bytes, 1, r.dst, bytes, r.fetch))
    t.wait_fetch(c, r.from, r.fetch);
}

void MpiTransport::Progress::serve_read(const std::vector<std::byte>& m, int from_process) {
  WireHead h;
  std::memcpy(&h, m.data(), sizeof h);
  if (h.generation != run()) return;  // a retried early read of a run that failed
  const auto b = body_of<ReadBody>(m);
  Group* g = nullptr;
  {
    std::lock_guard lock(groups_mu);
    auto it = groups.find(h.group);
    if (it != groups.end()) g = it->second;
  }
  // A read comes only after its reader saw the owner's open or post (mirrored from the owner's
  // own messages, sent after it posted), so the group exists here and the step is posted; the
  // owner keeps the buffer until the reader's done.
  if (g == nullptr) return;
  // The owner sends its open before it writes its own descriptor (it polls while it meets), and a
  // read of a later step may leave before the owner posts (recv_each, recv_reduce): a read of a
  // step not yet published here waits in early_reads. seq_cst: pairs with the owner's store in
  // publish. A reader's reads of one member all reply on one tag (reply_tag) and its receives
  // match replies in the order they leave, so a read also waits behind any earlier one of its tag
  // still held (recv_reduce has two chunks' reads of each member in flight). Only behind those: a
  // read held for a later step must not hold up another reader's, or another member's.
  const bool behind = std::any_of(early_reads.begin(), early_reads.end(), [&](const auto& held) {
    return held.second == from_process && body_of<ReadBody>(held.first).tag == b.tag;
  });
  if (behind || g->slots[static_cast<std::size_t>(h.member)].progress.load(
                    std::memory_order_seq_cst) < stage_value(h.seq, step_stage(h.step))) {
    early_reads.emplace_back(m, from_process);
    return;
  }
  const int owner = g->world_ranks[static_cast<std::size_t>(h.member)];
  // seq_cst increment, then seq_cst load of `aborted`, against the owner's side (WorldShared::fail
  // stores aborted before the owner's abandon() loads serving): either the owner waits for this
  // reply, or this read is dropped (the world is failing; its reader learns so from the abort).
  serving[static_cast<std::size_t>(owner)].fetch_add(1, std::memory_order_seq_cst);
  if (w.aborted.load(std::memory_order_seq_cst)) {
    serving[static_cast<std::size_t>(owner)].fetch_sub(1, std::memory_order_seq_cst);
    return;
  }
  const Descriptor& d = g->slots[static_cast<std::size_t>(h.member)].desc[h.seq % kDescriptors];
  Outstanding o;
  o.kind = Outstanding::kReply;
  o.owner = owner;
  Reply reply = reply_to(b, d.step(h.step), o.buffer);
  MPI_Request r;
  MPI_Isend(reply.src, reply.count, reply.type, from_process, b.tag, comm, &r);
  ++wire_sent[static_cast<std::size_t>(from_process)];
  if (reply.type != MPI_BYTE) MPI_Type_free(&reply.type);
  requests.push_back(r);
  pending.push_back(std::move(o));
}

bool MpiTransport::start_fetch(CallState& c, int from, int step, std::size_t offset,
                               std::size_t stride, std::size_t row_bytes, std::size_t rows,
                               std::byte* dst, std::size_t dst_stride, Fetch& f) {
  Group& g = c.comm->group();
  // Step 0 was mirrored at the meet. A later step's read may leave before its post is mirrored
  // here (the descriptor is apply's to write until then): its owner's process holds it until the
  // owner posts (serve_read), and the range is checked once the post is here (check_read_range).
  if (step == 0 || mirror_reached(c, from, step_stage(step))) {
    check_read_range(c, from, step, offset, offset + (rows - 1) * stride + row_bytes);
    const Descriptor& d = g.slots[static_cast<std::size_t>(from)].desc[c.seq % kDescriptors];
    if (step == 0 && d.eager) {  // came with the open
      for (std::size_t i = 0; i < rows; ++i)
        std::memcpy(dst + i * dst_stride, d.data + offset + i * stride, row_bytes);
      return false;
    }
  }
  checked_int(row_bytes, "a row read from another process");
  checked_int(rows, "rows read from another process");
  f.dst = dst;
  f.rows = rows;
  f.row_bytes = row_bytes;
  f.dst_stride = dst_stride;
  request_read(c, from, step, offset, stride, row_bytes, rows, false, f);
  return true;
}

void MpiTransport::start_address_fetch(CallState& c, int from, int step, std::size_t offset,
                                       std::size_t bytes, std::byte* reply, Fetch& f) {
  checked_int(bytes, "a range read from another process");
  f.dst = reply;
  f.rows = 1;
  f.row_bytes = sizeof(AddressReply);
  f.dst_stride = sizeof(AddressReply);
  request_read(c, from, step, offset, bytes, bytes, 1, true, f);
}

void MpiTransport::request_read(CallState& c, int from, int step, std::size_t offset,
                                std::size_t stride, std::size_t row_bytes, std::size_t rows,
                                bool address_only, Fetch& f) {
  Group& g = c.comm->group();
  const int owner_world = g.world_ranks[static_cast<std::size_t>(from)];
  const int reader_world = c.comm->world_rank(c.rank);
  f.source = w_.process_of(owner_world);
  f.tag = reply_tag(p_->run(), reader_world, from);
  f.waiter = &c.comm->self();
  f.state.store(Fetch::kPending, std::memory_order_relaxed);  // not shared yet
  WireHead h;
  h.type = kRead;
  h.generation = p_->run();
  h.group = g.wire_id;
  h.seq = c.seq;
  h.member = from;
  h.step = step;
  ReadBody b;
  b.offset = offset;
  b.stride = stride;
  b.row_bytes = row_bytes;
  b.rows = rows;
  b.reader = reader_world;
  b.tag = f.tag;
  b.address_only = address_only ? 1 : 0;
  f.request = encode(h, b, {});
  Progress::Command cmd;
  cmd.kind = Progress::Command::kFetch;
  cmd.fetch = &f;
  p_->push(std::move(cmd), true);
}

void MpiTransport::check_read_range(const CallState& c, int from, int step, std::size_t offset,
                                    std::size_t end) const {
  const Descriptor& d =
      c.comm->group().slots[static_cast<std::size_t>(from)].desc[c.seq % kDescriptors];
  const std::uint64_t bytes = d.step(step).bytes;
  if (end > bytes)
    throw std::logic_error("rank " + std::to_string(c.comm->world_rank(c.rank)) + ": " + c.op.what +
                           " #" + std::to_string(c.seq) + " reads bytes [" +
                           std::to_string(offset) + ", " + std::to_string(end) + ") of member " +
                           std::to_string(from) + "'s step " + std::to_string(step) +
                           " message of " + std::to_string(bytes) + " bytes");
}

void MpiTransport::wait_fetch(CallState& c, int from, Fetch& f) {
  c.op.stage = "a member's data from another process";
  lower_reading_flag(c.comm->self());
  // seq_cst: pairs with the progress thread's store of `state` (Fetch::state).
  if (pump_until([&] { return f.state.load(std::memory_order_seq_cst) != Fetch::kPending; }))
    return;
  try {
    // seq_cst: pairs with the progress thread's store of `state` (Fetch::state).
    wait_until(c.comm->self(), c.comm->world_rank(from), c.op,
               [&] { return f.state.load(std::memory_order_seq_cst) != Fetch::kPending; });
  } catch (...) {
    cancel_fetch(f);  // unwinding: the receive into dst must end before dst may be freed
    throw;
  }
}

void MpiTransport::cancel_fetch(Fetch& f) {
  // seq_cst: pairs with the progress thread's store of `state` (Fetch::state).
  if (f.state.load(std::memory_order_seq_cst) != Fetch::kPending) return;
  Progress::Command cmd;
  cmd.kind = Progress::Command::kCancel;
  cmd.fetch = &f;
  p_->push(std::move(cmd));
  // seq_cst: as above. A cancelled receive completes promptly (MPI_Cancel is local).
  while (f.state.load(std::memory_order_seq_cst) == Fetch::kPending) std::this_thread::yield();
}

void MpiTransport::recv_each(CallState& c, int step, std::span<const BlockRead> reads) {
  if (c.comm->group().other_processes.empty()) return Transport::recv_each(c, step, reads);
  if (reads.size() > static_cast<std::size_t>(kMaxRanks))
    throw std::logic_error("recv_each of " + std::to_string(reads.size()) + " reads, more than " +
                           std::to_string(kMaxRanks));
  // Every read of another process's message in flight together, before their owners' posts are
  // mirrored here (each owner's process answers once its owner posted: the post's notice and the
  // read cross instead of following each other); then the local copies while they travel, and
  // the waits.
  // Blocks of processes of this node are copied in place (FetchSet): faster than over MPI on an
  // idle node; on a loaded one each owner must be scheduled to answer where its block lies
  // (docs/benchmarks.md).
  FetchSet fetches(*this, c, step, reads.size());
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const BlockRead& r = reads[i];
    if (remote(*c.comm, r.from) && r.bytes > 0) fetches.start(i, r.from, r.offset, r.bytes, r.dst);
  }
  for (const BlockRead& r : reads)
    if (!remote(*c.comm, r.from))
      SharedMemoryTransport::recv(c, r.from, step, r.offset, {r.dst, r.bytes});
  for (std::size_t i = 0; i < reads.size(); ++i) fetches.wait(i);
  // A remote read of no bytes started nothing: its owner's post is still waited for.
  if (step > 0)
    for (const BlockRead& r : reads)
      if (remote(*c.comm, r.from) && r.bytes == 0) wait_stage(c, r.from, step_stage(step));
}

void MpiTransport::recv(CallState& c, int from, int step, std::size_t offset,
                        std::span<std::byte> dst) {
  if (!remote(*c.comm, from)) return SharedMemoryTransport::recv(c, from, step, offset, dst);
  // A small step 0 came with its owner's open into the mirror, which is a mailbox like a local
  // member's (apply): the shared-memory read takes it (an eager broadcast's receiver, every call).
  // Through recv_rows' general path (range check, rows, a Fetch) it cost twice the instructions.
  // A range past it goes on to recv_rows, which reports it.
  if (step == 0) {
    const Descriptor& d =
        c.comm->group().slots[static_cast<std::size_t>(from)].desc[c.seq % kDescriptors];
    if (d.eager && offset + dst.size() <= d.step0.bytes)
      return SharedMemoryTransport::recv(c, from, step, offset, dst);
  }
  recv_rows(c, from, step, offset, dst.size(), dst.size(), 1, dst.data(), dst.size());
}

void MpiTransport::recv_rows(CallState& c, int from, int step, std::size_t offset,
                             std::size_t stride, std::size_t row_bytes, std::size_t rows,
                             std::byte* dst, std::size_t dst_stride) {
  if (!remote(*c.comm, from))
    return SharedMemoryTransport::recv_rows(c, from, step, offset, stride, row_bytes, rows, dst,
                                            dst_stride);
  if (step > 0) {
    pump_until([&] { return mirror_reached(c, from, step_stage(step)); });
    wait_stage(c, from, step_stage(step));
  }
  if (rows == 0 || row_bytes == 0) return;
  Fetch f;
  if (start_fetch(c, from, step, offset, stride, row_bytes, rows, dst, dst_stride, f))
    wait_fetch(c, from, f);
}

void MpiTransport::recv_reduce(CallState& c, int step, std::size_t offset, std::size_t count,
                               Dtype dtype, std::byte* acc) {
  if (c.comm->group().other_processes.empty())
    return SharedMemoryTransport::recv_reduce(c, step, offset, count, dtype, acc);
  const int n = c.size;
  const std::size_t es = dtype_size(dtype);
  const std::size_t bytes = count * es;
  if (bytes == 0) {
    if (step > 0) {
      pump_until([&] { return mirrors_reached(c, step_stage(step)); });
      for (int i = 1; i < n; ++i) wait_stage(c, (c.rank + i) % n, step_stage(step));
    }
    return;
  }
  if (step == 0 && bytes <= kEagerBytes) {
    // A small step 0 came with the opens, in the mirrors' mailboxes, unless a member's was larger:
    // summed from there as one process sums its members' mailboxes (no set of reads, no copy).
    bool with_opens = true;
    const Group& g = c.comm->group();
    for (int r = 0; with_opens && r < n; ++r)
      with_opens = !remote(*c.comm, r) ||
                   g.slots[static_cast<std::size_t>(r)].desc[c.seq % kDescriptors].eager;
    if (with_opens) return sum_members(c, 0, offset, count, dtype, acc, nullptr);
  }
  // The range in chunks, kWindow chunks' reads in flight: a chunk's ranges of members in other
  // processes are copied to scratch by reads in flight together (leaving before their owners'
  // posts are mirrored here, as in recv_each), and each chunk is summed once its copies are in,
  // while the next one travels, so the sum reads them still in cache. The shared-memory sum reads
  // the local members' ranges in place (no copy) and the copies, in group-rank order: the same
  // sum_ranks_into as one process, so the result is bitwise the same. Measured (all_reduce 4 MiB,
  // mpi_runtime_bench, P = 8 on 2 cores, same-run ratio to OpenMPI, builds or chunk sizes
  // alternated, load 12-28): 64 KiB chunks 1.29 / 1.24 / 1.40, 128 KiB 1.56 / 1.59 / 1.35, 32 KiB
  // 1.36 / 1.55 / 1.37; a window of 16 chunks 1.86 / 2.44 against 1.32 / 1.48 with 2.
  constexpr std::size_t kChunk = std::size_t{64} << 10;
  constexpr std::size_t kWindow = 2;
  const std::size_t chunk = std::max(es, std::min(bytes, kChunk) / es * es);
  const std::size_t chunks = (bytes + chunk - 1) / chunk;
  const std::size_t window = std::min(chunks, kWindow);
  std::size_t remotes = 0;
  for (int r = 0; r < n; ++r) remotes += remote(*c.comm, r) ? 1 : 0;
  thread_local std::vector<std::byte> scratch;
  if (scratch.size() < window * remotes * chunk) scratch.resize(window * remotes * chunk);
  // A range past a message fails before any chunk is summed into acc (start_fetch checks a single
  // chunk's; a later step's, whose post may not be here yet, fails at its chunk's wait).
  for (int r = 0; step == 0 && chunks > 1 && r < n; ++r)
    if (remote(*c.comm, r)) check_read_range(c, r, 0, offset, offset + bytes);
  // Chunk k's copy of the j-th member in another process: scratch slot (k % window) * remotes + j,
  // read (k % window) * n + r of the set.
  const std::byte* copied[kMaxRanks];
  FetchSet fetches(*this, c, step, window * static_cast<std::size_t>(n));
  const auto start = [&](std::size_t k) {
    const std::size_t w = k % window, begin = k * chunk;
    std::byte* to = scratch.data() + w * remotes * chunk;
    for (int r = 0; r < n; ++r) {
      if (!remote(*c.comm, r)) continue;
      fetches.start(w * static_cast<std::size_t>(n) + static_cast<std::size_t>(r), r,
                    offset + begin, std::min(chunk, bytes - begin), to);
      to += chunk;
    }
  };
  for (std::size_t k = 0; k < window; ++k) start(k);
  // The local members' posts, while the first chunks travel (sum_members reads their buffers).
  for (int i = 1; step > 0 && i < n; ++i)
    if (!remote(*c.comm, (c.rank + i) % n)) wait_stage(c, (c.rank + i) % n, step_stage(step));
  for (std::size_t k = 0; k < chunks; ++k) {
    const std::size_t w = k % window, begin = k * chunk;
    const std::byte* from = scratch.data() + w * remotes * chunk;
    for (int r = 0; r < n; ++r) {
      copied[r] = nullptr;
      if (!remote(*c.comm, r)) continue;
      fetches.wait(w * static_cast<std::size_t>(n) + static_cast<std::size_t>(r));
      copied[r] = from;
      from += chunk;
    }
    // The waits lowered the reading flag sum_members raises for the in-place reads: it is never
    // up during one.
    sum_members(c, step, offset + begin, std::min(chunk, bytes - begin) / es, dtype, acc + begin,
                copied);
    if (k + window < chunks) start(k + window);  // into the slots just summed
  }
}

}  // namespace tspemu::detail
