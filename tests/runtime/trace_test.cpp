// Traces (trace.hpp) and the simulated clock (sim_clock.hpp): the Chrome JSON parses, has one
// process per rank whose slices nest, a flow from every send to its receive, an arena counter
// that follows the allocations; the buffer is bounded; the simulated clock follows its model.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "test_util.hpp"
#include "tspemu/runtime/trace.hpp"

namespace tspemu::test {
namespace {

using nlohmann::json;

json chrome_json(const World& w) {
  std::ostringstream s;
  w.trace().write_chrome_json(s);
  return json::parse(s.str());  // throws (fails the test) if it is not JSON
}

// A small schedule with every kind of event: a ring of sends (one eager, one not), collectives,
// a span and arena traffic.
void schedule(Rank& r) {
  const int n = r.size();
  auto big = r.arena().allocate<float>(1024, Category::comm);
  auto in = r.arena().allocate<float>(1024, Category::comm);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = value<float>(r.id(), i);
  for (std::size_t count : {std::size_t{16}, std::size_t{1024}})
    sendrecv<float>(r.comm(), big.span().first(count), (r.id() + 1) % n, in.span().first(count),
                    (r.id() + n - 1) % n);
  {
    TraceSpan gemm(r.comm(), "gemm", 2.0 * 64 * 64 * 64);
    auto ws = r.arena().allocate<float>(4096, Category::workspace);
  }
  auto all = r.arena().allocate<float>(16 * static_cast<std::size_t>(n), Category::comm);
  all_gather<float>(r.comm(), big.span().first(16), all.span());
  broadcast<float>(r.comm(), big.span().first(100), 0);
}

TEST(Trace, ChromeJsonHasOneTrackPerRankNestedSlicesFlowsAndArenaCounters) {
  const int n = 4;
  World world({.ranks = n, .trace = true});
  world.run(schedule);
  const json doc = chrome_json(world);
  ASSERT_TRUE(doc.contains("traceEvents"));
  std::map<int, std::string> process_names;
  std::map<int, std::vector<std::pair<double, double>>> slices;  // per pid: (ts, end)
  std::map<int, std::set<std::string>> names;
  std::map<std::uint64_t, int> flow_from, flow_to;  // id -> pid
  std::map<int, double> max_counter;
  for (const json& e : doc["traceEvents"]) {
    const std::string ph = e["ph"];
    const int pid = e["pid"];
    if (ph == "M" && e["name"] == "process_name") process_names[pid] = e["args"]["name"];
    if (ph == "X") {
      const double ts = e["ts"], dur = e["dur"];
      EXPECT_GE(dur, 0);
      slices[pid].emplace_back(ts, ts + dur);
      names[pid].insert(e["name"]);
    }
    if (ph == "s") {
      EXPECT_TRUE(flow_from.emplace(e["id"], pid).second) << "duplicate flow id";
    }
    if (ph == "f") {
      EXPECT_TRUE(flow_to.emplace(e["id"], pid).second) << "duplicate flow id";
    }
    if (ph == "C") max_counter[pid] = std::max(max_counter[pid], e["args"]["bytes"].get<double>());
  }
  ASSERT_EQ(process_names.size(), static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(process_names[r], "rank " + std::to_string(r));
    for (const char* name : {"all_gather #1", "broadcast #2", "gemm"})
      EXPECT_TRUE(names[r].count(name)) << name;
    for (int m : {1, 2}) {
      EXPECT_TRUE(
          names[r].count("send #" + std::to_string(m) + " to " + std::to_string((r + 1) % n)));
      EXPECT_TRUE(names[r].count("recv #" + std::to_string(m) + " from " +
                                 std::to_string((r + n - 1) % n)));
    }
    // Slices of one track nest: sorted by start, each starts after the enclosing one ends or
    // ends before it does.
    auto s = slices[r];
    std::sort(s.begin(), s.end(), [](auto& a, auto& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    std::vector<double> open;
    for (auto [b, e] : s) {
      while (!open.empty() && open.back() <= b) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(e, open.back() + 1e-3) << "slice [" << b << ", " << e << "]";
      }
      open.push_back(e);
    }
    // The arena counter reaches the rank's peak (peaks restart with each run).
    EXPECT_EQ(max_counter[r], static_cast<double>(world.arena(r).stats().peak));
    EXPECT_EQ(world.trace().dropped(r), 0u);
  }
  // Two messages per rank, each an arrow from its sender to its receiver.
  EXPECT_EQ(flow_from.size(), static_cast<std::size_t>(2 * n));
  EXPECT_EQ(flow_to.size(), flow_from.size());
  for (auto [id, from] : flow_from) {
    ASSERT_TRUE(flow_to.count(id)) << "flow " << id << " has no receive";
    EXPECT_EQ(flow_to[id], (from + 1) % n);
  }
}

TEST(Trace, EventsCarryKindSequenceBytesPeerAndRoot) {
  World world({.ranks = 2, .trace = true});
  world.run(schedule);
  std::vector<const TraceEvent*> seen;
  for (const TraceEvent& e : world.trace().events(1))
    if (e.type != TraceEvent::Type::counter) seen.push_back(&e);
  // sendrecv x2 (send, recv, and the big send's wait), span, all_gather, broadcast.
  ASSERT_EQ(seen.size(), 8u);
  EXPECT_EQ(seen[0]->type, TraceEvent::Type::send);
  EXPECT_EQ(seen[0]->peer, 0);
  EXPECT_EQ(seen[0]->bytes, 64u);
  EXPECT_EQ(seen[1]->type, TraceEvent::Type::recv);
  EXPECT_EQ(seen[1]->bytes, 64u);
  EXPECT_EQ(seen[4]->type, TraceEvent::Type::send);  // waiting for the receiver of 4 KiB
  EXPECT_EQ(std::string(seen[4]->name), "send wait");
  EXPECT_EQ(std::string(seen[5]->name), "gemm");
  EXPECT_EQ(seen[5]->flops, 2.0 * 64 * 64 * 64);
  EXPECT_EQ(std::string(seen[6]->name), "all_gather");
  EXPECT_EQ(seen[6]->seq, 1u);
  EXPECT_EQ(seen[6]->bytes, 64u);
  EXPECT_EQ(world.trace().group_name(seen[6]->group_id), "world");
  EXPECT_EQ(std::string(seen[7]->name), "broadcast");
  EXPECT_EQ(seen[7]->root, 0);
  EXPECT_EQ(seen[7]->bytes, 400u);
  // Recording continues across runs until cleared.
  const std::size_t one_run = world.trace().events(1).size();
  world.run(schedule);
  EXPECT_EQ(world.trace().events(1).size(), 2 * one_run);
  world.trace().clear();
  EXPECT_TRUE(world.trace().events(1).empty());
}

TEST(Trace, BufferIsBoundedAndCountsWhatItDrops) {
  World world({.ranks = 2, .trace = true, .trace_capacity = 5});
  world.run(schedule);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(world.trace().events(r).size(), 5u);
    EXPECT_GT(world.trace().dropped(r), 0u);
  }
  const json doc = chrome_json(world);
  EXPECT_NE(doc.dump().find("events dropped"), std::string::npos);
}

TEST(Trace, OffRecordsNothing) {
  World world({.ranks = 2});
  world.run(schedule);
  EXPECT_FALSE(world.trace().enabled());
  EXPECT_TRUE(world.trace().events(0).empty());
  EXPECT_EQ(world.simulated_seconds(0), 0.0);
}

TEST(SimClock, FollowsTheModelThroughSpansMessagesAndCollectives) {
  const SimClockModel m = *SimClockModel::preset("nvlink");
  EXPECT_FALSE(SimClockModel::preset("nonsense").has_value());
  const int n = 4;
  const double flops = 3e12;  // rank 0 only: everyone waits for it at the all_gather
  const std::size_t block = 1 << 16, msg = 1 << 14;
  World world({.ranks = n, .trace = true, .sim_clock = m});
  world.run([&](Rank& r) {
    std::vector<float> x(block), all(block * n), in(msg);
    if (r.id() == 0) TraceSpan work(r.comm(), "gemm", flops);
    all_gather<float>(r.comm(), x, all);
    if (r.id() == 0) send<float>(r.comm(), std::span<const float>(in), 1);
    if (r.id() == 1) recv<float>(r.comm(), in, 0);
  });
  const double ns = 1e-9;  // each event's cost is truncated to whole nanoseconds
  const double gather = (n - 1) * m.message_seconds(block * sizeof(float));
  const double after_gather = m.compute_seconds(flops) + gather;
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const double expect = after_gather + (r == 1 ? m.message_seconds(msg * sizeof(float)) : 0);
    EXPECT_NEAR(world.simulated_seconds(r), expect, 3 * ns);
  }
  // The simulated tracks are labelled as an estimate with the model's parameters.
  std::ostringstream s;
  world.trace().write_chrome_json(s);
  const json doc = json::parse(s.str());
  EXPECT_EQ(doc["otherData"]["simulated_clock"],
            "estimate from a cost model, not a measurement (model nvlink: peak 989 TFLOP/s, "
            "alpha 2.0 us, beta 450 GB/s)");
  int simulated_slices = 0;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "X" && e["pid"].get<int>() >= 1000) ++simulated_slices;
  EXPECT_EQ(simulated_slices, 1 + n + 1);  // the span, every all_gather, the receive
  // Each simulated track is labelled with its rank's compute / exposed / overlapped split (rank 1
  // waits for rank 0's span, the all_gather and the message).
  std::map<int, std::string> labels;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_labels")
      labels[e["pid"].get<int>()] = e["args"]["labels"].get<std::string>();
  ASSERT_EQ(labels.size(), static_cast<std::size_t>(n));
  EXPECT_EQ(labels[1000].rfind("compute 3.033 ms, exposed comm 0.008 ms, overlapped comm 0.000", 0),
            0u)
      << labels[1000];
  EXPECT_EQ(labels[1001].rfind("compute 0.000 ms, exposed comm 3.043 ms", 0), 0u) << labels[1001];
}

// Kernels report compute through core/compute_span.hpp, with no Comm: a traced rank records the
// spans nested, and the simulated clock charges nested work once (a block span around its GEMM
// costs the GEMM, a span without FLOPs costs what ran inside it).
TEST(ComputeSpan, ReachesTheRankAndChargesNestedWorkOnce) {
  const SimClockModel m = *SimClockModel::preset("nvlink");
  const double f = 2e12;
  World world({.ranks = 2, .trace = true, .sim_clock = m});
  world.run([&](Rank& r) {
    EXPECT_NE(current_compute_observer(), nullptr);
    {
      ComputeSpan block("block", f);  // r.id() == 0: its own GEMM carries the same FLOPs
      ComputeSpan gemm("gemm", r.id() == 0 ? f : 2 * f);
    }
    ComputeSpan user("user core");  // no FLOPs of its own: charged what ran inside
    ComputeSpan inner("gemm", f);
  });
  const double ns = 1e-9;
  EXPECT_NEAR(world.simulated_seconds(0), 2 * m.compute_seconds(f), 4 * ns);
  EXPECT_NEAR(world.simulated_seconds(1), 3 * m.compute_seconds(f), 4 * ns);
  const auto events = world.trace().events(0);
  std::vector<std::string> names;
  for (const TraceEvent& e : events)
    if (e.type == TraceEvent::Type::span) names.push_back(e.name);
  // Recorded when they end: inner before outer.
  EXPECT_EQ(names, (std::vector<std::string>{"gemm", "block", "gemm", "user core"}));
  World quiet({.ranks = 1});
  quiet.run([](Rank&) { EXPECT_EQ(current_compute_observer(), nullptr); });
  EXPECT_EQ(current_compute_observer(), nullptr);  // never installed on the caller's thread
}

}  // namespace
}  // namespace tspemu::test
