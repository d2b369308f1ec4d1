// The runtime's collectives across MPI processes (WorldOptions::mpi, one rank per process) against
// plain OpenMPI collectives of the same sizes, measured in the same run:
//
//   mpirun --allow-run-as-root --oversubscribe -np P ./build/bench/mpi_runtime_bench [iterations]
//       [bytes... | collective...]
//
// iterations: the fewest calls per repetition at 4 MiB (20 times as many at 8 B); then the sizes to
// time (default 8 and 4194304) and the collectives (default all four), in any order; `tspemu` or
// `openmpi` times that side alone (for counting instructions or messages of one side, e.g. under
// `perf stat`; the ratio column is then absent).
//
// Not a Google Benchmark program: a collective's time is the slowest process's, so each
// repetition is timed in every process between barriers and reduced (max) over processes, which
// Google Benchmark's per-process loop cannot express. Reported: the median over repetitions of the
// time per call (slowest process), for tspemu and for MPI, and their ratio (tspemu / MPI). The
// tspemu side includes what makes it worth using: the fingerprint meet of every call.
// A repetition lasts at least kMinRepetition on the faster side (more calls than `iterations` when
// needed, the same number on both sides): with more processes than cores, a process that the
// scheduler leaves waiting for a time slice (Linux's default base slice: 0.75 ms x (1 + log2
// cores), 1.5 ms on 2) stalls every process it feeds, and a repetition of a few slices' length
// times where the slices fell rather than the collective (the spread this removed:
// docs/benchmarks.md).
// Also reported, per call: the span, from the first process's start to the last one's end
// (steady_clock is one clock for the processes of one node). With more processes than cores a
// process that leaves the barrier late may time a short loop over messages already waiting, so
// the slowest process's own time could be below the wall time the calls took; the span shows
// whether it is.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/world.hpp"

namespace {

constexpr int kRepetitions = 7;
constexpr double kMinRepetition = 0.05;  // seconds; see the top

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double slowest(double seconds) {
  double max = 0;
  MPI_Allreduce(&seconds, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return max;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One repetition of one side: its slowest process's time and its span (see the top).
struct Timing {
  double slowest, span;
};
Timing timing(double start, double end) {
  double first = 0, last = 0;
  MPI_Allreduce(&start, &first, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&end, &last, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return {slowest(end - start), last - first};
}

struct Case {
  const char* name;
  // One call of the runtime's collective on the rank's buffers, and of MPI's.
  std::function<void(tspemu::Comm&, std::vector<float>&, std::vector<float>&)> runtime;
  std::function<void(std::vector<float>&, std::vector<float>&)> mpi;
  std::size_t in_factor, out_factor;  // buffer sizes in units of the per-rank count
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int P = 1, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const int iterations_4m = argc > 1 ? std::atoi(argv[1]) : 20;
  std::vector<std::size_t> sizes;
  std::vector<std::string> only;
  bool time_tspemu = true, time_openmpi = true;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg[0] >= '0' && arg[0] <= '9')
      sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    else if (arg == "tspemu")
      time_openmpi = false;
    else if (arg == "openmpi")
      time_tspemu = false;
    else
      only.push_back(arg);
  }
  if (sizes.empty()) sizes = {8, std::size_t{4} << 20};
  const std::size_t n = static_cast<std::size_t>(P);
  const std::vector<Case> cases = {
      {"all_reduce",
       [](tspemu::Comm& c, std::vector<float>& in, std::vector<float>&) {
         tspemu::all_reduce<float>(c, std::span<float>(in));
       },
       [](std::vector<float>& in, std::vector<float>&) {
         MPI_Allreduce(MPI_IN_PLACE, in.data(), static_cast<int>(in.size()), MPI_FLOAT, MPI_SUM,
                       MPI_COMM_WORLD);
       },
       1, 1},
      {"all_gather",
       [](tspemu::Comm& c, std::vector<float>& in, std::vector<float>& out) {
         tspemu::all_gather<float>(c, in, out);
       },
       [](std::vector<float>& in, std::vector<float>& out) {
         MPI_Allgather(in.data(), static_cast<int>(in.size()), MPI_FLOAT, out.data(),
                       static_cast<int>(in.size()), MPI_FLOAT, MPI_COMM_WORLD);
       },
       1, n},
      {"reduce_scatter",
       [](tspemu::Comm& c, std::vector<float>& in, std::vector<float>& out) {
         tspemu::reduce_scatter<float>(c, in, out);
       },
       [](std::vector<float>& in, std::vector<float>& out) {
         MPI_Reduce_scatter_block(in.data(), out.data(), static_cast<int>(out.size()), MPI_FLOAT,
                                  MPI_SUM, MPI_COMM_WORLD);
       },
       n, 1},
      {"broadcast",
       [](tspemu::Comm& c, std::vector<float>& in, std::vector<float>&) {
         tspemu::broadcast<float>(c, std::span<float>(in), 0);
       },
       [](std::vector<float>& in, std::vector<float>&) {
         MPI_Bcast(in.data(), static_cast<int>(in.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
       },
       1, 1},
  };
  tspemu::WorldOptions opts;  // assigned, not designated: WorldOptions grows fields
  opts.ranks = P;
  opts.mpi = true;
  {
    tspemu::World world(opts);
    if (me == 0)
      std::printf(
          "P=%d processes, one rank each; median of %d repetitions of >= %.0f ms, slowest "
          "process\n"
          "%-15s %9s %12s %12s %8s %12s %12s %8s %9s\n",
          P, kRepetitions, kMinRepetition * 1e3, "collective", "bytes", "tspemu us", "OpenMPI us",
          "ratio", "span tspemu", "span MPI", "ratio", "calls");
    for (const std::size_t bytes : sizes) {
      const std::size_t count = bytes / sizeof(float);
      const int fewest = bytes <= 8 ? 20 * iterations_4m : iterations_4m;
      for (const Case& c : cases) {
        if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
        std::vector<float> in(count * c.in_factor, 1.0f), out(count * c.out_factor);
        auto run_ours = [&](int calls) {
          double t0 = 0, t1 = 0;
          world.run([&](tspemu::Rank& r) {
            tspemu::barrier(r.comm());
            t0 = now_seconds();
            for (int i = 0; i < calls; ++i) c.runtime(r.comm(), in, out);
            t1 = now_seconds();
          });
          return timing(t0, t1);
        };
        auto run_theirs = [&](int calls) {
          MPI_Barrier(MPI_COMM_WORLD);
          const double t0 = now_seconds();
          for (int i = 0; i < calls; ++i) c.mpi(in, out);
          return timing(t0, now_seconds());
        };
        // A first, untimed repetition of each side (warming up) sets the calls per repetition.
        // Every process computes the same number: timing() reduced the times over processes.
        double per_call = 1e9;
        if (time_tspemu) per_call = std::min(per_call, run_ours(fewest).slowest / fewest);
        if (time_openmpi) per_call = std::min(per_call, run_theirs(fewest).slowest / fewest);
        const int calls =
            std::max(fewest, static_cast<int>(std::min(kMinRepetition / per_call, 1e8)) + 1);
        std::vector<double> ours, theirs, ours_span, theirs_span;
        for (int rep = 0; rep < kRepetitions; ++rep) {
          if (time_tspemu) {
            const Timing t = run_ours(calls);
            ours.push_back(t.slowest / calls);
            ours_span.push_back(t.span / calls);
          }
          if (time_openmpi) {
            const Timing t = run_theirs(calls);
            theirs.push_back(t.slowest / calls);
            theirs_span.push_back(t.span / calls);
          }
        }
        const double a = time_tspemu ? median(ours) * 1e6 : 0;
        const double b = time_openmpi ? median(theirs) * 1e6 : 0;
        const double sa = time_tspemu ? median(ours_span) * 1e6 : 0;
        const double sb = time_openmpi ? median(theirs_span) * 1e6 : 0;
        if (me == 0)
          std::printf("%-15s %9zu %12.2f %12.2f %8.2f %12.2f %12.2f %8.2f %9d\n", c.name, bytes, a,
                      b, a > 0 && b > 0 ? a / b : 0.0, sa, sb, sa > 0 && sb > 0 ? sa / sb : 0.0,
                      calls);
      }
    }
  }  // the world (and its progress thread) ends before MPI does
  MPI_Finalize();
  return 0;
}
