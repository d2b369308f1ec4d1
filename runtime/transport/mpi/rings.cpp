// Control messages through ControlRings between the processes of one node.
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

namespace {

constexpr std::uint64_t ring_record_bytes(std::size_t message_bytes) {
  return 8 + ((message_bytes + 7) & ~std::size_t{7});
}
static_assert(std::has_single_bit(kRingBytes));
// The bytes of each ring in use (a power of two): kRingBytes, or TSPEMU_MPI_CONTROL_RING_BYTES
// rounded down to one, at least 4 KiB (a record of kPostedBytes fits), so that tests make writers
// wait for room. Every process of a job reads the same environment: writer and reader agree.
std::size_t ring_bytes_in_use() {
  const char* v = std::getenv("TSPEMU_MPI_CONTROL_RING_BYTES");
  if (v == nullptr) return kRingBytes;
  const std::size_t asked = std::bit_floor(std::strtoull(v, nullptr, 10));
  return std::clamp<std::size_t>(asked, std::bit_ceil(8 + kPostedBytes), kRingBytes);
}
// Copies between a ring's data at byte position `at` (wrapping at `size`, a power of two) and flat
// memory.
void ring_write(ControlRing& r, std::size_t size, std::uint64_t at, const void* src,
                std::size_t n) {
  const std::size_t pos = at & (size - 1), first = std::min(n, size - pos);
  std::memcpy(r.data + pos, src, first);
  std::memcpy(r.data, static_cast<const std::byte*>(src) + first, n - first);
}
void ring_read(const ControlRing& r, std::size_t size, std::uint64_t at, void* dst, std::size_t n) {
  const std::size_t pos = at & (size - 1), first = std::min(n, size - pos);
  std::memcpy(dst, r.data + pos, first);
  std::memcpy(static_cast<std::byte*>(dst) + first, r.data, n - first);
}

}  // namespace

bool MpiTransport::Progress::ring_send(int dest, std::span<const std::byte> bytes) {
  ControlRing* r = ring_to[static_cast<std::size_t>(dest)];
  if (r == nullptr || bytes.size() > kPostedBytes) return false;
  const auto q = static_cast<std::size_t>(dest);
  const std::uint64_t need = ring_record_bytes(bytes.size());
  // The reader's head is loaded only when the room last seen is short, so a writer running ahead
  // of its reader does not pull the reader's cache line on every message.
  while (ring_tail[q] + need > ring_room[q]) {
    // acquire: pairs with the reader's release store of head (take_rings): the record it copied
    // out is done with before this one overwrites it.
    ring_room[q] = r->head.load(std::memory_order_acquire) + ring_bytes;
    if (ring_tail[q] + need <= ring_room[q]) break;
    // The world is being destroyed: no reader takes messages any more (see Progress::loop).
    // acquire: as loop()'s.
    if (stopping.load(std::memory_order_acquire)) return true;
    if (take_rings(64) == 0) std::this_thread::yield();
  }
  const std::uint64_t size = bytes.size();
  ring_write(*r, ring_bytes, ring_tail[q], &size, sizeof size);
  ring_write(*r, ring_bytes, ring_tail[q] + sizeof size, bytes.data(), bytes.size());
  ring_tail[q] += need;
  // release: publishes the record; pairs with the reader's acquire load of tail (take_rings).
  r->tail.store(ring_tail[q], std::memory_order_release);
  return true;
}

int MpiTransport::Progress::take_rings(int limit) {
  int taken = 0;
  for (int source : ring_sources) {
    ControlRing& r = *ring_from[static_cast<std::size_t>(source)];
    // relaxed: this process alone stores head. acquire: pairs with the writer's release store of
    // tail (ring_send); the records below it are written.
    std::uint64_t head = r.head.load(std::memory_order_relaxed);
    const std::uint64_t tail = r.tail.load(std::memory_order_acquire);
    for (; head != tail && taken < limit; ++taken) {
      std::uint64_t size = 0;
      ring_read(r, ring_bytes, head, &size, sizeof size);
      ring_inbox.resize(size);
      ring_read(r, ring_bytes, head + sizeof size, ring_inbox.data(), size);
      head += ring_record_bytes(size);
      // release: the record is copied out before the writer may overwrite it (ring_send).
      r.head.store(head, std::memory_order_release);
      receive(ring_inbox, source);
    }
  }
  return taken;
}

// Control messages between processes of one node travel through ControlRings in memory both map,
// not through MPI: the reader's poll reads a ring's tail where it would test a posted receive
// (MPI_Test, ~650 instructions when nothing came), and a writer copies the message where
// MPI_Isend would match and copy it. Each process makes a memfd holding one ring per process of
// its node (the ring that process writes to it), and the others map it through /proc/<pid>/fd
// (what process_vm_readv's permission check also allows); a pair that cannot keeps MPI.
// Only while the node's processes fit its cores (`oversubscribed` false): oversubscribed, the
// pollers yield more often and the broadcast loses what the instructions saved
// (docs/benchmarks.md, with what was tried).
// TSPEMU_MPI_CONTROL_RINGS=1 uses them regardless, =0 never (so does TSPEMU_MPI_DIRECT_READS=0: the
// path between machines). Collective over the world.
void map_control_rings(MpiTransport::Progress& p, MPI_Comm node, bool oversubscribed) {
  int node_size = 1, node_rank = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  const std::size_t processes = p.wire_sent.size();
  p.ring_to.assign(processes, nullptr);
  p.ring_from.assign(processes, nullptr);
  p.ring_tail.assign(processes, 0);
  p.ring_bytes = ring_bytes_in_use();
  p.ring_room.assign(processes, p.ring_bytes);
  std::vector<int> node_process(static_cast<std::size_t>(node_size));
  check_mpi(MPI_Allgather(&p.process, 1, MPI_INT, node_process.data(), 1, MPI_INT, node),
            "MPI_Allgather");
  auto env_is = [](const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v != nullptr && std::string(v) == value;
  };
  const bool enabled = (!oversubscribed || env_is("TSPEMU_MPI_CONTROL_RINGS", "1")) &&
                       !env_is("TSPEMU_MPI_CONTROL_RINGS", "0") &&
                       !env_is("TSPEMU_MPI_DIRECT_READS", "0");
  const std::size_t bytes = sizeof(ControlRing) * static_cast<std::size_t>(node_size);
  int fd = -1;
  void* mine = MAP_FAILED;
  if (enabled && node_size > 1) {
    fd = memfd_create("tspemu-control-rings", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0)
      mine = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (mine != MAP_FAILED) p.mappings.emplace_back(mine, bytes);
  const long long id[2] = {mine != MAP_FAILED ? static_cast<long long>(getpid()) : 0LL, fd};
  std::vector<long long> ids(2 * static_cast<std::size_t>(node_size));
  check_mpi(MPI_Allgather(id, 2, MPI_LONG_LONG, ids.data(), 2, MPI_LONG_LONG, node),
            "MPI_Allgather");
  std::vector<int> writes(processes, 0), reads(processes, 0);
  for (int k = 0; k < node_size; ++k) {
    const auto at_k = 2 * static_cast<std::size_t>(k);
    if (k == node_rank || ids[at_k] == 0) continue;
    const std::string path =
        "/proc/" + std::to_string(ids[at_k]) + "/fd/" + std::to_string(ids[at_k + 1]);
    const int peer = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (peer < 0) continue;
    void* theirs = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, peer, 0);
    ::close(peer);
    if (theirs == MAP_FAILED) continue;
    p.mappings.emplace_back(theirs, bytes);
    const auto q = static_cast<std::size_t>(node_process[static_cast<std::size_t>(k)]);
    p.ring_to[q] = static_cast<ControlRing*>(theirs) + node_rank;
    writes[q] = 1;
  }
  // Which processes write to this one's rings. Every process opened its peers' memfds before it
  // entered, so each may close its own once this completes.
  check_mpi(MPI_Alltoall(writes.data(), 1, MPI_INT, reads.data(), 1, MPI_INT, p.comm),
            "MPI_Alltoall");
  if (fd >= 0) ::close(fd);
  p.control_over_mpi = false;
  for (std::size_t q = 0; q < processes; ++q) {
    if (static_cast<int>(q) == p.process) continue;
    if (reads[q] == 0) {
      p.control_over_mpi = true;
      continue;
    }
    const auto k = static_cast<std::size_t>(
        std::find(node_process.begin(), node_process.end(), static_cast<int>(q)) -
        node_process.begin());
    p.ring_from[q] = static_cast<ControlRing*>(mine) + k;
    p.ring_sources.push_back(static_cast<int>(q));
  }
}

}  // namespace tspemu::detail
