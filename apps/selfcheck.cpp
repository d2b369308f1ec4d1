#include "selfcheck.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "problem_options.hpp"
#include "run_memory.hpp"
#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::app {

namespace {

// One collective under test: `call` runs it on rank r and returns whether r's result is exact.
struct Check {
  const char* name;
  CollectiveKind kind;
  std::function<bool(Rank&, std::size_t count)> call;
};

float value(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 17));
}

// What the ranks' factors (rank + 1) of value() sum to, 1 + 2 + ... + n: exact, n·(n + 1) is even.
float rank_value_sum(int n) {
  const int sum = n * (n + 1) / 2;
  return static_cast<float>(sum);
}

std::vector<Check> checks() {
  std::vector<Check> c;
  c.push_back({"broadcast", CollectiveKind::broadcast, [](Rank& r, std::size_t n) {
                 const int root = r.size() - 1;
                 auto b = r.arena().allocate<float>(n, Category::comm);
                 for (std::size_t i = 0; i < n; ++i) b[i] = r.id() == root ? value(root, i) : -1.f;
                 broadcast<float>(r.comm(), b, root);
                 for (std::size_t i = 0; i < n; ++i)
                   if (b[i] != value(root, i)) return false;
                 return true;
               }});
  c.push_back({"all_gather", CollectiveKind::all_gather, [](Rank& r, std::size_t n) {
                 auto x = r.arena().allocate<float>(n, Category::comm);
                 auto y = r.arena().allocate<float>(n * r.size(), Category::comm);
                 for (std::size_t i = 0; i < n; ++i) x[i] = value(r.id(), i);
                 all_gather<float>(r.comm(), x, y);
                 for (int q = 0; q < r.size(); ++q)
                   for (std::size_t i = 0; i < n; ++i)
                     if (y[q * n + i] != value(q, i)) return false;
                 return true;
               }});
  c.push_back({"reduce_scatter", CollectiveKind::reduce_scatter, [](Rank& r, std::size_t n) {
                 const std::size_t p = static_cast<std::size_t>(r.size());
                 auto x = r.arena().allocate<float>(n * p, Category::comm);
                 auto y = r.arena().allocate<float>(n, Category::comm);
                 for (std::size_t i = 0; i < n * p; ++i) x[i] = value(r.id(), i);
                 reduce_scatter<float>(r.comm(), x, y);
                 const float ranks_sum = rank_value_sum(r.size());
                 for (std::size_t i = 0; i < n; ++i)
                   if (y[i] != ranks_sum * static_cast<float>((r.id() * n + i) % 17)) return false;
                 return true;
               }});
  c.push_back({"all_reduce", CollectiveKind::all_reduce, [](Rank& r, std::size_t n) {
                 auto x = r.arena().allocate<float>(n, Category::comm);
                 for (std::size_t i = 0; i < n; ++i) x[i] = value(r.id(), i);
                 all_reduce<float>(r.comm(), x.span());
                 const float ranks_sum = rank_value_sum(r.size());
                 for (std::size_t i = 0; i < n; ++i)
                   if (x[i] != ranks_sum * static_cast<float>(i % 17)) return false;
                 return true;
               }});
  c.push_back({"reduce", CollectiveKind::reduce, [](Rank& r, std::size_t n) {
                 auto x = r.arena().allocate<float>(n, Category::comm);
                 auto y = r.arena().allocate<float>(n, Category::comm);
                 for (std::size_t i = 0; i < n; ++i) x[i] = value(r.id(), i);
                 reduce<float>(r.comm(), x, y, 0);
                 const float ranks_sum = rank_value_sum(r.size());
                 if (r.id() == 0)
                   for (std::size_t i = 0; i < n; ++i)
                     if (y[i] != ranks_sum * static_cast<float>(i % 17)) return false;
                 return true;
               }});
  c.push_back({"all_to_all", CollectiveKind::all_to_all, [](Rank& r, std::size_t n) {
                 const std::size_t p = static_cast<std::size_t>(r.size());
                 auto x = r.arena().allocate<float>(n * p, Category::comm);
                 auto y = r.arena().allocate<float>(n * p, Category::comm);
                 for (std::size_t i = 0; i < n * p; ++i) x[i] = value(r.id(), i);
                 all_to_all<float>(r.comm(), x, y);
                 for (std::size_t q = 0; q < p; ++q)
                   for (std::size_t i = 0; i < n; ++i)
                     if (y[q * n + i] != value(static_cast<int>(q), r.id() * n + i)) return false;
                 return true;
               }});
  c.push_back({"sendrecv (ring)", CollectiveKind::send, [](Rank& r, std::size_t n) {
                 const int right = (r.id() + 1) % r.size();
                 const int left = (r.id() + r.size() - 1) % r.size();
                 auto x = r.arena().allocate<float>(n, Category::comm);
                 auto y = r.arena().allocate<float>(n, Category::comm);
                 for (std::size_t i = 0; i < n; ++i) x[i] = value(r.id(), i);
                 sendrecv<float>(r.comm(), x, right, y, left);
                 for (std::size_t i = 0; i < n; ++i)
                   if (y[i] != value(left, i)) return false;
                 return true;
               }});
  c.push_back({"barrier", CollectiveKind::barrier, [](Rank& r, std::size_t) {
                 barrier(r.comm());
                 return true;
               }});
  return c;
}

}  // namespace

CLI::App* add_selfcheck_command(CLI::App& app, SelfcheckOptions& o) {
  auto* check = app.add_subcommand("selfcheck",
                                   "run and verify every collective of the runtime, with timings");
  check->add_option("--ranks", o.ranks, "ranks (threads) in the world")->capture_default_str();
  check->add_option("--count", o.count, "float elements per rank")->capture_default_str();
  check->add_option("--iterations", o.iterations, "timed calls per collective")
      ->capture_default_str();
  return check;
}

std::uint64_t selfcheck_rank_bytes(const SelfcheckOptions& opts) {
  // Both factors are bounded by the option table (2^24 floats, 2^8 ranks): no overflow.
  return 2 * std::uint64_t{opts.count} * static_cast<std::uint64_t>(opts.ranks) * sizeof(float);
}

void require_selfcheck_memory(const SelfcheckOptions& opts, std::uint64_t available,
                              std::size_t capacity) {
  const std::uint64_t rank = selfcheck_rank_bytes(opts);
  const std::uint64_t total = rank * static_cast<std::uint64_t>(opts.ranks);
  const char* why = rank > capacity     ? "a rank's arena exceeds its capacity"
                    : total > available ? "more than the machine's available memory"
                                        : nullptr;
  if (why == nullptr) return;
  throw ConfigError("memory: selfcheck --count " + std::to_string(opts.count) + " --ranks " +
                    std::to_string(opts.ranks) + " needs at least " + format_bytes(rank) +
                    " per rank (all_to_all's input and output of --count x --ranks floats; arena "
                    "capacity " +
                    format_bytes(capacity) + ") and " + format_bytes(total) + " in total (" +
                    format_bytes(available) + " available, MemAvailable in /proc/meminfo): " + why +
                    "; lower --count or --ranks");
}

int selfcheck(const SelfcheckOptions& opts, std::ostream& out) {
  require_selfcheck_memory(opts, available_memory(), WorldOptions{}.arena_capacity);
  World world({.ranks = opts.ranks});
  char line[256];
  std::snprintf(line, sizeof line,
                "tspemu runtime self-check: %d ranks, %zu float elements per rank, %d iterations\n",
                opts.ranks, opts.count, opts.iterations);
  out << line << "blas: " << ref::describe_blas() << "\n";
  out << "bf16 gemm: " << ref::describe_bf16_gemm() << "\n";
  out << "wake handshake: " << wake_handshake() << "\n";
  std::snprintf(line, sizeof line, "%-16s %6s %12s %14s %14s %12s\n", "collective", "result",
                "check us", "sent B/rank", "recv B/rank", "arena peak");
  out << line;
  int failures = 0;
  for (const Check& c : checks()) {
    std::vector<double> times;
    std::vector<int> bad(static_cast<std::size_t>(opts.ranks), 0);
    world.clear_counters();
    world.run([&](Rank& r) {
      for (int it = 0; it < opts.iterations; ++it) {
        barrier(r.comm());
        const auto t0 = std::chrono::steady_clock::now();
        const bool ok = c.call(r, opts.count);
        barrier(r.comm());
        const auto t1 = std::chrono::steady_clock::now();
        if (!ok) bad[static_cast<std::size_t>(r.id())]++;
        if (r.id() == 0)
          times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    });
    std::sort(times.begin(), times.end());
    const bool ok = std::all_of(bad.begin(), bad.end(), [](int b) { return b == 0; });
    failures += ok ? 0 : 1;
    const auto& e = world.counters(0)[c.kind];
    const auto& e_recv = world.counters(0)[CollectiveKind::recv];
    const double iters = opts.iterations;
    std::snprintf(line, sizeof line, "%-16s %6s %12.1f %14.0f %14.0f %12s\n", c.name,
                  ok ? "ok" : "FAIL", times[times.size() / 2],
                  static_cast<double>(e.bytes_sent) / iters,
                  static_cast<double>(c.kind == CollectiveKind::send ? e_recv.bytes_received
                                                                     : e.bytes_received) /
                      iters,
                  format_bytes(world.arena(0).stats().peak).c_str());
    out << line;
  }
  out << (failures == 0 ? "all collectives exact\n" : "SOME COLLECTIVES FAILED\n");
  return failures;
}

}  // namespace tspemu::app
