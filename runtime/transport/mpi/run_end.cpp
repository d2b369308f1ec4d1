// The end of a run and failures: every process's counters and traces everywhere, the messages
// left untaken, and a local failure carried to every process.
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

// Every process's `mine` (sizes may differ) into every process, in process order; the offset of
// each process's part in `offsets` (P + 1 entries).
std::vector<std::byte> gather_all(MpiTransport::Progress& p, int processes,
                                  std::vector<std::byte> mine, std::vector<std::size_t>& offsets) {
  using Command = MpiTransport::Progress::Command;
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(processes));
  const std::uint64_t my_size = mine.size();
  {
    std::atomic<int> done{0};
    Command c;
    c.kind = Command::kGather;
    c.bytes.resize(sizeof my_size);
    std::memcpy(c.bytes.data(), &my_size, sizeof my_size);
    c.gathered = reinterpret_cast<std::byte*>(sizes.data());
    c.flag = &done;
    p.push(std::move(c));
    // acquire: pairs with the progress thread's release store when the gather completes.
    done.wait(0, std::memory_order_acquire);
  }
  offsets.assign(1, 0);
  Command c;
  c.kind = Command::kGatherv;
  for (std::uint64_t n : sizes) {
    c.counts.push_back(checked_int(n, "one process's part of a gather"));
    c.displs.push_back(checked_int(offsets.back(), "a gather"));
    offsets.push_back(offsets.back() + n);
  }
  std::vector<std::byte> all(offsets.back());
  std::atomic<int> done{0};
  c.bytes = std::move(mine);
  c.gathered = all.data();
  c.flag = &done;
  p.push(std::move(c));
  // acquire: as above.
  done.wait(0, std::memory_order_acquire);
  return all;
}

template <class T>
void put(std::vector<std::byte>& out, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}
template <class T>
T get(const std::byte*& at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  at += sizeof v;
  return v;
}

// A trace event as sent: its name and group as indices into the sender's string table.
struct WireEvent {
  TraceEvent event;  // name and group_id not meaningful here
  std::uint32_t name = 0, group = 0;
};

// What every process learns of each rank hosted elsewhere at the end of a run.
struct RankSummary {
  TrafficCounters counters;
  SimStreams::Snapshot sim;
};
static_assert(std::is_trivially_copyable_v<RankSummary>, "RankSummary travels as raw bytes");

}  // namespace

void MpiTransport::share_traces() {
  // This process's events, whole (a receiver replaces a rank's copy, so Trace::clear() needs no
  // bookkeeping): [start_ns][names: count, then (length, bytes) each][per local rank: events,
  // dropped, WireEvent each].
  std::vector<std::string> names;
  std::map<std::string, std::uint32_t> index;
  auto name_of = [&](const std::string& n) {
    auto [it, made] = index.emplace(n, static_cast<std::uint32_t>(names.size()));
    if (made) names.push_back(n);
    return it->second;
  };
  std::vector<std::byte> events;
  {
    std::lock_guard lock(w_.groups_mu);  // group_names
    for (int r = w_.first_local; r < w_.first_local + w_.local_ranks; ++r) {
      const RankTrace& t = *w_.ranks[static_cast<std::size_t>(r)]->trace;
      put(events, static_cast<std::uint64_t>(t.events().size()));
      put(events, t.dropped());
      for (const TraceEvent& e : t.events()) {
        WireEvent we{e, name_of(e.name), 0};
        auto g = w_.group_names.find(e.group_id);
        we.group = name_of(g != w_.group_names.end() ? g->second : "group ?");
        we.event.name = nullptr;
        put(events, we);
      }
    }
  }
  std::vector<std::byte> mine;
  put(mine, p_->run_start_ns);
  put(mine, static_cast<std::uint64_t>(names.size()));
  for (const std::string& n : names) {
    put(mine, static_cast<std::uint64_t>(n.size()));
    const auto at = mine.size();
    mine.resize(at + n.size());
    std::memcpy(mine.data() + at, n.data(), n.size());
  }
  mine.insert(mine.end(), events.begin(), events.end());
  std::vector<std::size_t> offsets;
  const std::vector<std::byte> all = gather_all(*p_, w_.processes, std::move(mine), offsets);

  std::lock_guard lock(w_.groups_mu);
  for (int q = 0; q < w_.processes; ++q) {
    if (q == p_->process) continue;
    const std::byte* at = all.data() + offsets[static_cast<std::size_t>(q)];
    // Their clock started elsewhere: aligned at the run's opening barrier, which every process
    // leaves within a poll of the others (microseconds on one machine).
    const std::int64_t shift = p_->run_start_ns - get<std::int64_t>(at);
    std::vector<const char*> text;
    std::vector<std::uint64_t> group;
    const auto n_names = get<std::uint64_t>(at);
    for (std::uint64_t i = 0; i < n_names; ++i) {
      const auto len = get<std::uint64_t>(at);
      std::string n(reinterpret_cast<const char*>(at), len);
      at += len;
      // The same group has the same name in every process; its id here (ids are per process).
      std::uint64_t id = 0;
      auto g = std::find_if(w_.group_names.begin(), w_.group_names.end(),
                            [&](const auto& e) { return e.second == n; });
      if (g != w_.group_names.end()) {
        id = g->first;
      } else if (n.rfind("group ", 0) != 0) {
        id = w_.next_group_id++;
        w_.group_names[id] = n;
      }
      group.push_back(id);
      text.push_back(p_->trace_names.insert(std::move(n)).first->c_str());
    }
    for (int r = q * w_.local_ranks; r < (q + 1) * w_.local_ranks; ++r) {
      RankTrace& t = *w_.ranks[static_cast<std::size_t>(r)]->trace;
      t.clear();
      const auto count = get<std::uint64_t>(at);
      const auto dropped = get<std::uint64_t>(at);
      TraceEvent last;
      for (std::uint64_t i = 0; i < count; ++i) {
        const auto we = get<WireEvent>(at);
        last = we.event;
        last.name = text[we.name];
        last.group_id = group[we.group];
        last.begin_ns += shift;
        last.end_ns += shift;
        t.record(last);
      }
      // The sender's buffer was full (the same capacity as this one): each record now only
      // counts one more dropped event, as it did there.
      for (std::uint64_t i = 0; i < dropped; ++i) t.record(last);
    }
  }
}

void MpiTransport::end_run() {
  // Every rank's counters and simulated clock, and how many point-to-point messages went to each
  // process, to every process: World::counters(r) and simulated_seconds(r) then hold for every
  // rank in every process, and the next run starts every process's simulated clock at the same
  // latest time.
  const std::size_t local = static_cast<std::size_t>(w_.local_ranks);
  const std::size_t P = static_cast<std::size_t>(w_.processes);
  const std::size_t block = local * sizeof(RankSummary) + P * sizeof(std::uint64_t);
  std::vector<std::byte> mine(block);
  for (std::size_t i = 0; i < local; ++i) {
    const RankState& r = *w_.ranks[static_cast<std::size_t>(w_.first_local) + i];
    const RankSummary s{r.counters, r.sim.snapshot()};
    std::memcpy(mine.data() + i * sizeof s, &s, sizeof s);
  }
  for (std::size_t q = 0; q < P; ++q) {
    // relaxed: see Progress::messages_to.
    const std::uint64_t n = p_->messages_to[q].load(std::memory_order_relaxed);
    std::memcpy(mine.data() + local * sizeof(RankSummary) + q * sizeof n, &n, sizeof n);
  }
  std::vector<std::byte> all(P * block);
  {
    std::atomic<int> gathered{0};
    Progress::Command gather;
    gather.kind = Progress::Command::kGather;
    gather.bytes = std::move(mine);
    gather.gathered = all.data();
    gather.flag = &gathered;
    p_->push(std::move(gather));
    // acquire: pairs with the progress thread's release store when the gather completes.
    gathered.wait(0, std::memory_order_acquire);
  }
  for (std::size_t r = 0; r < w_.ranks.size(); ++r) {
    if (w_.hosts(static_cast<int>(r))) continue;
    const std::size_t q = static_cast<std::size_t>(w_.process_of(static_cast<int>(r)));
    RankSummary s;
    std::memcpy(&s, all.data() + q * block + (r - q * local) * sizeof s, sizeof s);
    w_.ranks[r]->counters = s.counters;
    w_.ranks[r]->sim.restore(s.sim);
  }
  auto failed_here = [&] {
    std::lock_guard lock(w_.failure_mu);
    return w_.failed_rank >= 0;
  };
  if (!failed_here()) check_messages_taken(all, block);
  if (w_.opts.trace) share_traces();
  int failed = failed_here() ? 1 : 0;
  {
    std::atomic<int> agreed{0};
    Progress::Command agree;
    agree.kind = Progress::Command::kAgree;
    agree.flag = &agreed;
    agree.value = &failed;
    p_->push(std::move(agree));
    // acquire: pairs with the progress thread's release store when the all-reduce completes.
    agreed.wait(0, std::memory_order_acquire);
  }
  if (failed == 0) return;
  // Some process failed: its abort message is on its way (sent before that process's ranks
  // returned). Wait for it, bounded, so this process reports the same first failure.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    if (failed_here()) return;
    if (std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  w_.fail(-1, "another process failed, and its failure did not arrive within 10 s of the run's end",
          std::make_exception_ptr(PeerFailure("another process failed")), true);
}

void MpiTransport::check_messages_taken(const std::vector<std::byte>& summaries,
                                        std::size_t block) {
  // Every message another process's ranks sent here has arrived (bounded: a sender's process is
  // past its run, so its messages are on the wire), then none may be left untaken: a message
  // nobody received is a schedule bug, reported as World::run reports one within a process.
  const std::size_t local = static_cast<std::size_t>(w_.local_ranks);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int q = 0; q < w_.processes; ++q) {
    std::uint64_t expected = 0;
    std::memcpy(&expected,
                summaries.data() + static_cast<std::size_t>(q) * block +
                    local * sizeof(RankSummary) +
                    static_cast<std::size_t>(p_->process) * sizeof expected,
                sizeof expected);
    // acquire: pairs with the progress thread's release increment (Progress::messages_from).
    while (p_->messages_from[static_cast<std::size_t>(q)].load(std::memory_order_acquire) <
           expected) {
      if (std::chrono::steady_clock::now() > until) {
        const Error error("process " + std::to_string(q) + " sent " + std::to_string(expected) +
                          " messages to process " + std::to_string(p_->process) +
                          "'s ranks in this run, and not all of them arrived within 10 s of its "
                          "end");
        w_.fail(q * w_.local_ranks, error.what(), std::make_exception_ptr(error));
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  std::lock_guard lock(p_->incoming_mu);
  if (p_->incoming.empty()) return;
  const auto& [key, message] = *p_->incoming.begin();
  const auto& [group_id, src, dst, index] = key;
  std::lock_guard groups_lock(p_->groups_mu);
  const auto g = p_->groups.find(group_id);
  std::ostringstream m;
  int sender = -1;
  if (g != p_->groups.end()) {
    const Group& group = *g->second;
    sender = group.world_ranks[static_cast<std::size_t>(src)];
    m << "unreceived message: rank " << sender << " sent message #" << index + 1 << " ("
      << message->payload.size() << " B) to rank "
      << group.world_ranks[static_cast<std::size_t>(dst)] << " on group " << group.name
      << ", which rank " << group.world_ranks[static_cast<std::size_t>(dst)]
      << " never received before the run ended";
  } else {
    m << "unreceived message: message #" << index + 1 << " from group rank " << src
      << " to group rank " << dst << " of a group no rank of process " << p_->process
      << " joined, never received before the run ended";
  }
  const CollectiveMismatch error(m.str());
  w_.fail(sender, error.what(), std::make_exception_ptr(error));
}

void MpiTransport::local_failure(int rank, const std::string& message,
                                 const std::exception_ptr& error) noexcept {
  if (w_.processes == 1) return;
  try {
    AbortBody b;
    b.rank = rank;
    try {
      std::rethrow_exception(error);
    } catch (const CollectiveMismatch&) {
      b.kind = kMismatch;
    } catch (const PeerFailure&) {
      b.kind = kPeer;
    } catch (const HangError&) {
      b.kind = kHang;
    } catch (const OutOfMemory&) {
      b.kind = kOom;
    } catch (...) {
      b.kind = kOther;
    }
    WireHead h;
    h.type = kAbort;
    h.generation = p_->run();
    const auto text = std::as_bytes(std::span<const char>(message.data(), message.size()));
    auto m = encode(h, b, text);
    for (int q = 0; q < w_.processes; ++q)
      if (q != p_->process) p_->send_to(q, m);
  } catch (...) {
    // Out of memory while reporting: the other processes see the hang timeout instead.
  }
}

}  // namespace tspemu::detail
