// runtime_bench: latency and bandwidth of the tspemu rank runtime, with same-run baselines.
//
// Benchmarks (names are what bench/report_runtime.py looks for):
//   coll/<kind>/ranks:<n>/bytes:<S>   every collective, n in {2, 4, 8}, S bytes per rank
//   world_run/ranks:<n>               World::run of an empty function (fork/join round trip)
//   memcpy/bytes:<S>                  single-thread memcpy of S bytes
//   memcpy_pair/bytes:<S>             two threads doing a 2-rank all_gather's copies,
//   unsynchronized pingpong                          two threads on two cores, one cache line,
//   spinning yield_pingpong                    two threads pinned to one core, token handed over
//   with
//                                     sched_yield
//
// How a collective is timed. Ranks are threads inside World::run, and the benchmark loop runs on
// the main thread, which is not a rank; a World::run per call would measure the fork/join, not
// the collective. So one benchmark iteration is ONE World::run in which every rank makes `warmup`
// untimed calls (page faults, caches), then a barrier, then B batches (B = min(K, 15)) of K/B
// timed calls each followed by a barrier. Rank 0 reads the clock after each batch's barrier, so a
// batch interval covers exactly K/B calls on every rank plus one barrier (amortized over the
// batch; K >= 3, up to 2000 for small messages). A final barrier keeps the other ranks' teardown
// out of the allocation-counting window. The benchmark uses manual time with Iterations(1):
// SetIterationTime(median batch time / (K/B)), so the reported time is the time of ONE collective
// call; the median over batches, like the ping-pong baselines, keeps a preemption by another
// process on this shared 2-core machine from dominating a repetition (mean_latency_us reports the
// plain mean over all K calls). Run with --benchmark_repetitions for medians over repetitions.
// K is chosen from the bytes moved so a repetition takes a few to a few hundred ms.
//
// Sizes. S is the per-rank block: broadcast/reduce/all_reduce/sendrecv buffers are S bytes;
// all_gather sends S and receives n*S; reduce_scatter sends n*S and receives S; all_to_all sends
// and receives n blocks of S. Elements are float (S/4 of them; S = 8 means 2 floats).
//
// Counters (nccl-tests conventions,
// https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
//   latency_us   time of one call in microseconds (median batch; mean_latency_us: mean)
//   algbw        algorithm bandwidth in bytes/s = size / time, where size is the nccl-tests
//                "size": S for broadcast, reduce, all_reduce, sendrecv; n*S for all_gather,
//                reduce_scatter, all_to_all
//   busbw        algbw times the bus factor: 1 for broadcast, reduce, sendrecv; (n-1)/n for
//                all_gather, reduce_scatter, all_to_all; 2(n-1)/n for all_reduce
//   allocs_per_iter  calls to global operator new (any thread) during the timed loop, divided by
//                K; the steady state must not allocate (issue 2, section 3)
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "tspemu/runtime/arena.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/world.hpp"

// ---------------------------------------------------------------------------------------------
// Heap allocation counter: every global operator new form bumps it (relaxed: only a count, read
// after barriers that already order the ranks' loops before rank 0's read).
// GCC's -Wmismatched-new-delete sees free() in the replaced operator delete and flags every
// inlined new/delete pair; here operator new is malloc-based, so free() is the matching release.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<std::uint64_t> g_allocs{0};

void* counted_alloc(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* counted_aligned_alloc(std::size_t n, std::align_val_t al) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  void* p = nullptr;
  const std::size_t a = std::max(sizeof(void*), static_cast<std::size_t>(al));
  if (posix_memalign(&p, a, n == 0 ? 1 : n) != 0) return nullptr;
  return p;
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return counted_alloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return counted_alloc(n);
}
void* operator new(std::size_t n, std::align_val_t al) {
  if (void* p = counted_aligned_alloc(n, al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t al) {
  if (void* p = counted_aligned_alloc(n, al)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return counted_aligned_alloc(n, al);
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return counted_aligned_alloc(n, al);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace {

using Clock = std::chrono::steady_clock;
using tspemu::Category;
using tspemu::Rank;
using tspemu::World;

constexpr int kRankCounts[] = {2, 4, 8};
// 8 B .. 16 MiB per rank: powers of 4, plus 1 MiB and 4 MiB for the bandwidth target.
constexpr std::size_t kSizes[] = {8,        32,       128,      512,    2048,
                                  8192,     32768,    131072,   524288, std::size_t{1} << 20,
                                  2u << 20, 4u << 20, 16u << 20};

// --pin_ranks: WorldOptions::pin_threads for every world (rank i on core i mod cores). Off by
// default: the numbers are those of a default World, where the scheduler places the rank threads.
bool g_pin_ranks = false;

// One World per rank count, kept for the whole program: its threads sleep between benchmarks.
World& world_for(int n) {
  static std::unique_ptr<World> worlds[9];
  auto& w = worlds[n];
  if (!w) w = std::make_unique<World>(tspemu::WorldOptions{.ranks = n, .pin_threads = g_pin_ranks});
  return *w;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<unsigned>(cpu), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// ---------------------------------------------------------------------------------------------
// Collectives.

// all_gather_inplace: send is this rank's block of recv (no local copy), as a schedule that gathers
// shards into a full buffer would call it; the plain forms are out-of-place (nccl-tests default).
enum class Kind {
  broadcast,
  all_gather,
  all_gather_inplace,
  reduce_scatter,
  all_reduce,
  reduce,
  all_to_all,
  sendrecv,
  barrier
};
constexpr Kind kKinds[] = {Kind::broadcast,      Kind::all_gather, Kind::all_gather_inplace,
                           Kind::reduce_scatter, Kind::all_reduce, Kind::reduce,
                           Kind::all_to_all,     Kind::sendrecv,   Kind::barrier};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::broadcast:
      return "broadcast";
    case Kind::all_gather:
      return "all_gather";
    case Kind::all_gather_inplace:
      return "all_gather_inplace";
    case Kind::reduce_scatter:
      return "reduce_scatter";
    case Kind::all_reduce:
      return "all_reduce";
    case Kind::reduce:
      return "reduce";
    case Kind::all_to_all:
      return "all_to_all";
    case Kind::sendrecv:
      return "sendrecv";
    case Kind::barrier:
      return "barrier";
  }
  return "?";
}

// nccl-tests "size" in bytes (what algbw divides by time) and bus factor.
double nccl_size(Kind k, int n, std::size_t s) {
  switch (k) {
    case Kind::all_gather:
    case Kind::all_gather_inplace:
    case Kind::reduce_scatter:
    case Kind::all_to_all:
      return static_cast<double>(n) * static_cast<double>(s);
    default:
      return static_cast<double>(s);
  }
}
double bus_factor(Kind k, int n) {
  const double f = static_cast<double>(n - 1) / n;
  switch (k) {
    case Kind::all_gather:
    case Kind::all_gather_inplace:
    case Kind::reduce_scatter:
    case Kind::all_to_all:
      return f;
    case Kind::all_reduce:
      return 2 * f;
    default:
      return 1;
  }
}

// Timed calls per repetition: about 64 MiB of traffic, between 3 and 2000 calls.
int timed_calls(Kind k, int n, std::size_t s) {
  const double moved = std::max(nccl_size(k, n, s), 4096.0);
  return static_cast<int>(std::clamp((64.0 * (1 << 20)) / moved, 3.0, 2000.0));
}

void BM_collective(benchmark::State& state, Kind kind, int n, std::size_t s) {
  World& world = world_for(n);
  const std::size_t c = std::max<std::size_t>(1, s / sizeof(float));  // floats per block
  const std::size_t nc = static_cast<std::size_t>(n) * c;
  const int batches = std::min(timed_calls(kind, n, s), 15);
  const int per_batch = timed_calls(kind, n, s) / batches;
  const int calls = batches * per_batch;
  const int warmup = std::max(1, calls / 10);
  std::vector<double> batch_seconds(static_cast<std::size_t>(batches));
  std::uint64_t allocs = 0;
  const std::function<void(Rank&)> fn = [&](Rank& r) {
    auto& comm = r.comm();
    const int me = r.id();
    // Buffers: recv holds n blocks where the collective needs them. Touched once (zero=true).
    const std::size_t send_n = (kind == Kind::reduce_scatter || kind == Kind::all_to_all) ? nc : c;
    const bool gathers =
        kind == Kind::all_gather || kind == Kind::all_gather_inplace || kind == Kind::all_to_all;
    const std::size_t recv_n = gathers ? nc : c;
    auto send = r.arena().allocate<float>(send_n, Category::comm, true);
    auto recv = r.arena().allocate<float>(recv_n, Category::comm, true);
    std::span<float> rp = recv.span();
    std::span<float> sp = kind == Kind::all_gather_inplace
                              ? rp.subspan(static_cast<std::size_t>(me) * c, c)
                              : send.span();
    std::fill(sp.begin(), sp.end(), 1.0f);
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    auto op = [&] {
      switch (kind) {
        case Kind::broadcast:
          tspemu::broadcast<float>(comm, sp, 0);
          break;
        case Kind::all_gather:
        case Kind::all_gather_inplace:
          tspemu::all_gather<float>(comm, sp, rp);
          break;
        case Kind::reduce_scatter:
          tspemu::reduce_scatter<float>(comm, sp, rp);
          break;
        case Kind::all_reduce:
          tspemu::all_reduce<float>(comm, sp, rp);
          break;
        case Kind::reduce:
          tspemu::reduce<float>(comm, sp, rp, 0);
          break;
        case Kind::all_to_all:
          tspemu::all_to_all<float>(comm, sp, rp);
          break;
        case Kind::sendrecv:
          tspemu::sendrecv<float>(comm, sp, next, rp, prev);
          break;
        case Kind::barrier:
          tspemu::barrier(comm);
          break;
      }
    };
    for (int i = 0; i < warmup; ++i) op();
    tspemu::barrier(comm);
    std::uint64_t a0 = 0;
    if (me == 0) a0 = g_allocs.load(std::memory_order_relaxed);
    for (int b = 0; b < batches; ++b) {
      const Clock::time_point t0 = Clock::now();
      for (int i = 0; i < per_batch; ++i) op();
      tspemu::barrier(comm);
      if (me == 0)
        batch_seconds[static_cast<std::size_t>(b)] =
            std::chrono::duration<double>(Clock::now() - t0).count();
    }
    if (me == 0) allocs = g_allocs.load(std::memory_order_relaxed) - a0;
    // Keeps the other ranks from freeing their buffers (the arena's free list may allocate) before
    // rank 0 has read the allocation counter.
    tspemu::barrier(comm);
  };
  double t = 0;
  double mean = 0;
  for (auto _ : state) {
    world.run(fn);
    std::vector<double> sorted = batch_seconds;
    std::nth_element(sorted.begin(), sorted.begin() + batches / 2, sorted.end());
    t = sorted[static_cast<std::size_t>(batches / 2)] / per_batch;
    mean = 0;
    for (double x : batch_seconds) mean += x;
    mean /= calls;
    state.SetIterationTime(t);
  }
  state.counters["latency_us"] = t * 1e6;
  state.counters["mean_latency_us"] = mean * 1e6;
  state.counters["calls"] = calls;
  state.counters["allocs_per_iter"] = static_cast<double>(allocs) / calls;
  if (kind != Kind::barrier) {
    const double alg = nccl_size(kind, n, s) / t;
    state.counters["algbw"] = alg;
    state.counters["busbw"] = alg * bus_factor(kind, n);
  }
}

void BM_world_run(benchmark::State& state, int n) {
  World& world = world_for(n);
  const std::function<void(Rank&)> empty = [](Rank&) {};
  world.run(empty);  // warm
  for (auto _ : state) world.run(empty);
  state.counters["latency_us"] = benchmark::Counter(
      1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// ---------------------------------------------------------------------------------------------
// Baselines.

void BM_memcpy(benchmark::State& state, std::size_t s) {
  std::vector<char> src(s, 1), dst(s, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), s);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.counters["algbw"] =
      benchmark::Counter(static_cast<double>(s), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["latency_us"] = benchmark::Counter(
      1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The copy pattern of a 2-rank out-of-place all_gather with no synchronization at all: two threads
// (one per core), each copying its own S-byte block and the other thread's block into its own
// 2S-byte buffer. Its algbw (2S / time of one step) is what the memory system allows the
// collective; compare coll/all_gather/ranks:2 with it to separate waiting from copying.
void BM_memcpy_pair(benchmark::State& state, std::size_t s) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<char> src[2] = {std::vector<char>(s, 1), std::vector<char>(s, 2)};
  std::vector<char> dst[2] = {std::vector<char>(2 * s, 0), std::vector<char>(2 * s, 0)};
  const int steps = static_cast<int>(std::clamp((64.0 * (1 << 20)) / (2.0 * s), 3.0, 2000.0));
  for (auto _ : state) {
    std::atomic<int> ready{0};
    double seconds = 0;
    auto body = [&](int me) {
      pin_to(me % cores);
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      const auto t0 = Clock::now();
      for (int i = 0; i < steps; ++i) {
        std::memcpy(dst[me].data() + (1 - me) * s, src[1 - me].data(), s);
        std::memcpy(dst[me].data() + me * s, src[me].data(), s);
        benchmark::ClobberMemory();
      }
      if (me == 0) seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    };
    std::thread a(body, 0), b(body, 1);
    a.join();
    b.join();
    state.SetIterationTime(seconds / steps);
    state.counters["algbw"] = 2.0 * static_cast<double>(s) / (seconds / steps);
  }
}

// Runs `trips` round trips between two threads: side A (timing) on cpu_a, side B on cpu_b. The
// reported time is the median over batches of 1000 round trips, so one preemption by a neighbour's
// build does not skew the repetition.
template <class WaitA, class WaitB>
double round_trip_seconds(int cpu_a, int cpu_b, WaitA wait_a, WaitB wait_b) {
  constexpr int kBatch = 1000;
  constexpr int kBatches = 21;
  alignas(64) std::atomic<int> turn{0};  // 0: A's turn, 1: B's turn
  std::vector<double> batch(kBatches);
  std::thread b([&] {
    pin_to(cpu_b);
    for (int i = 0; i < kBatch * (kBatches + 1); ++i) {
      // acquire/release: pairs with A's store; only the hand-off matters here.
      while (turn.load(std::memory_order_acquire) != 1) wait_b();
      turn.store(0, std::memory_order_release);
    }
  });
  std::thread a([&] {
    pin_to(cpu_a);
    for (int k = -1; k < kBatches; ++k) {  // k = -1: warm-up batch
      const auto t0 = Clock::now();
      for (int i = 0; i < kBatch; ++i) {
        turn.store(1, std::memory_order_release);
        while (turn.load(std::memory_order_acquire) != 0) wait_a();
      }
      if (k >= 0)
        batch[static_cast<std::size_t>(k)] =
            std::chrono::duration<double>(Clock::now() - t0).count() / kBatch;
    }
  });
  a.join();
  b.join();
  std::nth_element(batch.begin(), batch.begin() + kBatches / 2, batch.end());
  return batch[kBatches / 2];
}

void BM_pingpong(benchmark::State& state) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (auto _ : state) {
    auto spin = [] {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    };
    state.SetIterationTime(round_trip_seconds(0, 1 % cores, spin, spin));
  }
}

void BM_yield_pingpong(benchmark::State& state) {
  for (auto _ : state) {
    auto yield = [] { sched_yield(); };
    state.SetIterationTime(round_trip_seconds(0, 0, yield, yield));
  }
}

void register_all() {
  benchmark::RegisterBenchmark("pingpong", BM_pingpong)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("yield_pingpong", BM_yield_pingpong)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMicrosecond);
  for (std::size_t s : kSizes)
    benchmark::RegisterBenchmark(("memcpy/bytes:" + std::to_string(s)).c_str(), BM_memcpy, s)
        ->UseRealTime()
        ->MinTime(0.05)
        ->Unit(benchmark::kMicrosecond);
  for (std::size_t s : kSizes)
    if (s >= 131072)
      benchmark::RegisterBenchmark(("memcpy_pair/bytes:" + std::to_string(s)).c_str(),
                                   BM_memcpy_pair, s)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
  for (int n : kRankCounts)
    benchmark::RegisterBenchmark(("world_run/ranks:" + std::to_string(n)).c_str(), BM_world_run, n)
        ->UseRealTime()
        ->MinTime(0.05)
        ->Unit(benchmark::kMicrosecond);
  for (Kind k : kKinds)
    for (int n : kRankCounts)
      for (std::size_t s : kSizes) {
        if (k == Kind::barrier && s != kSizes[0]) continue;
        const std::string name = std::string("coll/") + kind_name(k) +
                                 "/ranks:" + std::to_string(n) +
                                 "/bytes:" + std::to_string(k == Kind::barrier ? 0 : s);
        benchmark::RegisterBenchmark(name.c_str(), BM_collective, k, n, s)
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMicrosecond);
      }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--pin_ranks") == 0)
      g_pin_ranks = true;
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
