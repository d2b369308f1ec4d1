#include "mpi_job.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "problem_options.hpp"

#if TSPEMU_HAVE_MPI
#include <mpi.h>

#include <stdexcept>
#endif

namespace tspemu::app {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

#if TSPEMU_HAVE_MPI
void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS)
    throw std::runtime_error(std::string("tspemu across processes: ") + call +
                             " failed (MPI error " + std::to_string(rc) + ")");
}

// The commands' own communicator, apart from the worlds' (each World dups its own) and from
// anything a program embedding tspemu_cli does on MPI_COMM_WORLD. Made by the first exchange,
// which every process reaches in the same order (MPI_Comm_dup is collective).
MPI_Comm job_comm() {
  static MPI_Comm comm = [] {
    MPI_Comm c = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &c), "MPI_Comm_dup");
    return c;
  }();
  return comm;
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Per element: a's bits when they are not all zero, else b's (merge_written).
void merge_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint32_t*>(in);
  auto* b = static_cast<std::uint32_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (a[i] != 0) b[i] = a[i];
}
#endif

}  // namespace

MpiJob mpi_job() {
  MpiJob j;
  j.processes = std::max(1, env_int("OMPI_COMM_WORLD_SIZE", 1));
  j.process = std::clamp(env_int("OMPI_COMM_WORLD_RANK", 0), 0, j.processes - 1);
  return j;
}

void require_ranks_divisible(int ranks, const std::string& flag) {
  const MpiJob job = mpi_job();
  if (!job.spans()) return;
#if !TSPEMU_HAVE_MPI
  throw ConfigError("launched by mpirun with " + std::to_string(job.processes) +
                    " processes, but this tspemu was built without MPI (TSPEMU_MPI, docs/mpi.md: "
                    "Using it); run it without mpirun");
#endif
  if (ranks % job.processes != 0)
    throw ConfigError(flag + " " + std::to_string(ranks) + ": launched by mpirun with " +
                      std::to_string(job.processes) +
                      " processes, which must divide the ranks (each process runs ranks / P of "
                      "them)");
}

void share_records(std::span<std::byte> records, std::size_t record_bytes, int n_ranks) {
#if TSPEMU_HAVE_MPI
  const MpiJob job = mpi_job();
  if (!job.spans() || n_ranks == 0) return;
  // One broadcast per process of its consecutive ranks' records (WorldOptions::mpi's layout).
  const std::size_t per_process = static_cast<std::size_t>(n_ranks / job.processes) * record_bytes;
  for (int q = 0; q < job.processes; ++q)
    check_mpi(MPI_Bcast(records.data() + static_cast<std::size_t>(q) * per_process,
                        static_cast<int>(per_process), MPI_BYTE, q, job_comm()),
              "MPI_Bcast");
#else
  (void)records, (void)record_bytes, (void)n_ranks;
#endif
}

void share_from_printer(std::span<std::byte> bytes) {
#if TSPEMU_HAVE_MPI
  if (!mpi_job().spans()) return;
  check_mpi(MPI_Bcast(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0, job_comm()),
            "MPI_Bcast");
#else
  (void)bytes;
#endif
}

void merge_written(std::span<float> tensor) {
#if TSPEMU_HAVE_MPI
  const MpiJob job = mpi_job();
  if (!job.spans() || tensor.empty()) return;
  static const MPI_Op op = [] {
    MPI_Op made;
    check_mpi(MPI_Op_create(merge_op, 1, &made), "MPI_Op_create");
    return made;
  }();
  static_assert(sizeof(float) == sizeof(std::uint32_t));
  constexpr std::size_t kChunk = std::size_t{1} << 28;  // elements per call: within an int count
  for (std::size_t at = 0; at < tensor.size(); at += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, tensor.size() - at));
    float* p = tensor.data() + at;
    check_mpi(MPI_Reduce(job.prints() ? MPI_IN_PLACE : p, job.prints() ? p : nullptr, n,
                         MPI_UINT32_T, op, 0, job_comm()),
              "MPI_Reduce");
  }
#else
  (void)tensor;
#endif
}

int agree_exit_code(int code) {
#if TSPEMU_HAVE_MPI
  if (!mpi_job().spans() || !mpi_usable()) return code;
  int agreed = code;
  if (MPI_Allreduce(&code, &agreed, 1, MPI_INT, MPI_MAX, job_comm()) != MPI_SUCCESS) return 1;
  return agreed;
#else
  return code;
#endif
}

}  // namespace tspemu::app
