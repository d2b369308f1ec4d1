// Point-to-point messages to and from ranks of other processes.
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

bool MpiTransport::send(Comm& comm, int dst, std::uint64_t index, const MessageHeader& header,
                        std::span<const std::byte> data, const OpRef& op) {
  if (!remote(comm, dst)) return SharedMemoryTransport::send(comm, dst, index, header, data, op);
  WireHead h;
  h.type = kMessage;
  h.generation = p_->run();
  h.group = comm.group().wire_id;
  h.member = comm.rank();
  MessageBody b;
  b.dst = dst;
  b.index = index;
  b.header = header;
  checked_int(sizeof h + sizeof b + data.size(), "a message to another process");
  const int process = w_.process_of(comm.world_rank(dst));
  // relaxed: see Progress::messages_to.
  p_->messages_to[static_cast<std::size_t>(process)].fetch_add(1, std::memory_order_relaxed);
  p_->send_to(process, encode(h, b, data), true);
  return true;  // copied: complete at once
}

void MpiTransport::wait_sent(Comm& comm, int dst, std::uint64_t index, const OpRef& op) {
  if (!remote(comm, dst)) SharedMemoryTransport::wait_sent(comm, dst, index, op);
}

bool MpiTransport::withdraw_send(Comm& comm, int dst, std::uint64_t index) noexcept {
  if (!remote(comm, dst)) return SharedMemoryTransport::withdraw_send(comm, dst, index);
  return true;  // copied at send: it will arrive
}

bool MpiTransport::arrived(const Comm& comm, int src, std::uint64_t index) const {
  if (!remote(comm, src)) return SharedMemoryTransport::arrived(comm, src, index);
  std::lock_guard lock(p_->incoming_mu);
  return p_->incoming.count({comm.group().wire_id, src, comm.rank(), index}) != 0;
}

const MessageHeader& MpiTransport::wait_message(Comm& comm, int src, std::uint64_t index,
                                                const OpRef& op) {
  if (!remote(comm, src)) return SharedMemoryTransport::wait_message(comm, src, index, op);
  const Progress::MessageKey key{comm.group().wire_id, src, comm.rank(), index};
  Progress::Incoming* in = nullptr;
  if (!pump_until([&] {
        std::lock_guard lock(p_->incoming_mu);
        return p_->incoming.count(key) != 0;
      }))
    flush_held(comm.world_rank(comm.rank()));  // parking (see hold)
  wait_until(comm.self(), comm.world_rank(src), op, [&] {
    std::lock_guard lock(p_->incoming_mu);
    auto it = p_->incoming.find(key);
    in = it == p_->incoming.end() ? nullptr : it->second.get();
    return in != nullptr;
  });
  return in->header;  // stays until take() (only this rank takes it)
}

void MpiTransport::take(Comm& comm, int src, std::uint64_t index, std::span<std::byte> dst,
                        const OpRef& op) {
  if (!remote(comm, src)) return SharedMemoryTransport::take(comm, src, index, dst, op);
  std::lock_guard lock(p_->incoming_mu);
  auto it = p_->incoming.find({comm.group().wire_id, src, comm.rank(), index});
  if (it == p_->incoming.end())
    throw std::logic_error("take of message " + std::to_string(index) + " from rank " +
                           std::to_string(src) + " before it arrived");
  if (!dst.empty()) std::memcpy(dst.data(), it->second->payload.data(), dst.size());
  p_->incoming.erase(it);
}

}  // namespace tspemu::detail
