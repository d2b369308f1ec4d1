// MpiJob: the mpirun job this tspemu process belongs to, and what the commands exchange across
// its processes.
//
// What: launched by `mpirun -np P` with P > 1 (OpenMPI's launcher sets OMPI_COMM_WORLD_SIZE and
// OMPI_COMM_WORLD_RANK), the commands that run ranks (run, compare, scale) build their worlds with
// WorldOptions::mpi, so each process runs N/P of the N ranks. Process 0 prints the report and
// writes the files; what the report needs from ranks hosted elsewhere (per-rank measures, output
// tensors, the step time) is sent to it by the functions below, and every process returns the
// exit code agreed by agree_exit_code. Without mpirun (or P = 1) every function here is a no-op.
// Requirements: the exchanges (share_per_rank, share_from_printer, merge_written) are called by
// every process of the job in the same order, after a World spanning the processes was made (it
// initializes MPI); agree_exit_code is called by every process once, at the end.
// Guarantees: an exchange returns the same bytes in every process it writes to; merge_written is
// exact (values are copied, never summed).
// Cost: share_per_rank: N broadcasts of one record; merge_written: one reduce of the tensor to
// process 0; agree_exit_code: one all-reduce of an int.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace tspemu::app {

struct MpiJob {
  int processes = 1;  // P
  int process = 0;    // this process, 0 .. P-1
  bool spans() const { return processes > 1; }
  bool prints() const { return process == 0; }
  // The process hosting world rank r of an N-rank world (WorldOptions::mpi's layout).
  int host_of(int rank, int ranks) const { return rank / (ranks / processes); }
};

// The job of this process, from the launcher's environment.
MpiJob mpi_job();

// Throws ConfigError naming `flag` when the job's P does not divide `ranks`.
void require_ranks_divisible(int ranks, const std::string& flag);

// Element r of `records` (n_ranks of them, record_bytes each) from the process hosting rank r,
// into every process.
void share_records(std::span<std::byte> records, std::size_t record_bytes, int n_ranks);
template <class T>
void share_per_rank(std::vector<T>& v) {
  static_assert(std::is_trivially_copyable_v<T>, "records travel as bytes");
  share_records(std::as_writable_bytes(std::span(v)), sizeof(T), static_cast<int>(v.size()));
}
// Process 0's bytes into every process.
void share_from_printer(std::span<std::byte> bytes);
// Into process 0's copy, every element some process wrote: each process holds the elements its
// ranks wrote and zeros elsewhere (an element written by several ranks has the same value in
// each), and process 0 ends with, per element, a non-zero bit pattern from any process if there
// is one. Other processes' copies are left as they are.
void merge_written(std::span<float> tensor);

// The largest of every process's code (a failure anywhere fails every process). Without an MPI
// world in this process (nothing ran: every process stopped at the same configuration check),
// `code` itself.
int agree_exit_code(int code);

}  // namespace tspemu::app
