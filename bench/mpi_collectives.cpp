// mpi_collectives: OpenMPI's collectives timed the way runtime_bench times tspemu's, for the
// same-session comparison of bench/compare_openmpi.sh.
//
// Usage: mpirun -np N mpi_collectives [--kinds a,b,...] [--bytes s,s,...] [--repetitions R]
//                                     [--samples]
// Prints, on rank 0, one line per (kind, size): `coll/<kind>/ranks:<N>/bytes:<S> <median us>`
// (the median over R repetitions of each repetition's median batch time per call), the names of
// runtime_bench so the script can pair them; --samples prints every repetition's time instead.
//
// Timing (as runtime_bench's BM_collective): per repetition, `warmup` untimed calls, a barrier,
// then B batches of K/B calls each followed by a barrier; rank 0 times each batch. K is chosen
// from the bytes moved (about 64 MiB per repetition, between 3 and 2000 calls), B = min(K, 15).
// Sizes are per rank as in runtime_bench: broadcast, all_reduce and sendrecv move S bytes,
// all_gather sends S and receives N·S, reduce_scatter sends N·S and receives S; elements are float.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

enum class Kind { broadcast, all_gather, all_reduce, reduce_scatter, sendrecv };

struct KindName {
  Kind kind;
  const char* name;
};
constexpr KindName kKinds[] = {{Kind::broadcast, "broadcast"},
                               {Kind::all_gather, "all_gather"},
                               {Kind::all_reduce, "all_reduce"},
                               {Kind::reduce_scatter, "reduce_scatter"},
                               {Kind::sendrecv, "sendrecv"}};

// The nccl-tests "size" of a call (runtime_bench's nccl_size), which sets the calls per
// repetition.
double moved_bytes(Kind k, int n, std::size_t s) {
  const bool whole = k == Kind::all_gather || k == Kind::reduce_scatter;
  return whole ? static_cast<double>(n) * static_cast<double>(s) : static_cast<double>(s);
}

int timed_calls(Kind k, int n, std::size_t s) {
  const double moved = std::max(moved_bytes(k, n, s), 4096.0);
  return static_cast<int>(std::clamp((64.0 * (1 << 20)) / moved, 3.0, 2000.0));
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// One repetition: the median batch time per call, in seconds (valid on rank 0).
double repetition_seconds(Kind kind, int n, int me, std::size_t s, std::vector<float>& send,
                          std::vector<float>& recv) {
  const int count = static_cast<int>(std::max<std::size_t>(1, s / sizeof(float)));
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  auto op = [&] {
    switch (kind) {
      case Kind::broadcast:
        MPI_Bcast(send.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
      case Kind::all_gather:
        MPI_Allgather(send.data(), count, MPI_FLOAT, recv.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case Kind::all_reduce:
        MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case Kind::reduce_scatter:
        MPI_Reduce_scatter_block(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
        break;
      case Kind::sendrecv:
        MPI_Sendrecv(send.data(), count, MPI_FLOAT, next, 0, recv.data(), count, MPI_FLOAT, prev, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        break;
    }
  };
  const int k = timed_calls(kind, n, s);
  const int batches = std::min(k, 15);
  const int per_batch = k / batches;
  const int warmup = std::max(1, batches * per_batch / 10);
  for (int i = 0; i < warmup; ++i) op();
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<double> batch(static_cast<std::size_t>(batches));
  for (int b = 0; b < batches; ++b) {
    const double t0 = MPI_Wtime();
    for (int i = 0; i < per_batch; ++i) op();
    MPI_Barrier(MPI_COMM_WORLD);
    batch[static_cast<std::size_t>(b)] = MPI_Wtime() - t0;
  }
  return median(batch) / per_batch;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int n = 0;
  int me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::vector<std::string> kinds;
  std::vector<std::size_t> sizes = {8, std::size_t{4} << 20};
  int repetitions = 10;
  bool samples = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--kinds" && has_value) {
      kinds = split(argv[++i]);
    } else if (a == "--bytes" && has_value) {
      sizes.clear();
      for (const auto& b : split(argv[++i])) sizes.push_back(std::stoull(b));
    } else if (a == "--samples") {
      samples = true;
    } else if (a == "--repetitions" && has_value) {
      repetitions = std::max(1, std::atoi(argv[++i]));
    } else {
      if (me == 0)
        std::fprintf(stderr,
                     "mpi_collectives: unknown argument %s (--kinds a,b --bytes s,s "
                     "--repetitions R --samples)\n",
                     a.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  for (const KindName& k : kKinds) {
    if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), k.name) == kinds.end()) continue;
    for (std::size_t s : sizes) {
      const std::size_t c = std::max<std::size_t>(1, s / sizeof(float));
      const std::size_t nc = static_cast<std::size_t>(n) * c;
      std::vector<float> send(k.kind == Kind::reduce_scatter ? nc : c, 1.0f);
      std::vector<float> recv(k.kind == Kind::all_gather ? nc : c, 0.0f);
      std::vector<double> reps;
      for (int r = 0; r < repetitions; ++r)
        reps.push_back(repetition_seconds(k.kind, n, me, s, send, recv));
      if (me != 0) continue;
      std::printf("coll/%s/ranks:%d/bytes:%zu", k.name, n, s);
      if (samples)
        for (double t : reps) std::printf(" %.4f", t * 1e6);
      else
        std::printf(" %.4f", median(reps) * 1e6);
      std::printf("\n");
    }
  }
  MPI_Finalize();
  return 0;
}
