#include "tspemu/runtime/all_gather.hpp"

#include <cstring>

#include "arguments.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

void all_gather(Comm& comm, const std::byte* send, std::size_t count, std::byte* recv,
                std::size_t recv_count, Dtype dtype, bool variable, std::uint32_t blocks_present) {
  const char* op = variable ? "all_gatherv" : "all_gather";
  check_comm(comm, op);
  const std::size_t es = dtype_size(dtype);
  const std::size_t n = static_cast<std::size_t>(comm.size());
  const std::size_t me = static_cast<std::size_t>(comm.rank());
  const std::size_t bytes = count * es;
  if (!variable) {
    check_count(comm, op, "recv", recv_count, n * count);
    if (send != recv + me * bytes && overlaps(send, bytes, recv, recv_count * es))
      bad_argument(comm, op, "send overlaps recv but is not this rank's block of it");
  }
  // all_gatherv: the in-place rule (send is exactly this rank's block of recv) can only be checked
  // once the counts are known, after the meet below.
  Call call(comm,
            {variable ? CollectiveKind::all_gatherv : CollectiveKind::all_gather, dtype, -1, count},
            std::span<const std::byte>(send, bytes), /*counts_must_match=*/!variable,
            CallForm::step0_only);
  // Offsets of each block in recv: equal blocks (the meet checked every count equals ours), or
  // the published counts back to back, read once (each fingerprint() is a call into the
  // transport and a read of the member's mailbox slot).
  std::size_t offsets[kMaxRanks + 1];
  offsets[0] = 0;
  for (std::size_t r = 0; r < n; ++r)
    offsets[r + 1] =
        offsets[r] + (variable ? call.fingerprint(static_cast<int>(r)).count : std::size_t{count});
  const std::size_t total = offsets[n];
  const std::size_t my_offset = offsets[me];
  if (variable && total != recv_count) {
    std::string counts;
    for (std::size_t r = 0; r < n; ++r)
      counts += (r ? ", " : "") + std::to_string(call.fingerprint(static_cast<int>(r)).count);
    raise(comm, std::invalid_argument(
                    "rank " + std::to_string(comm.world_rank(comm.rank())) + ": all_gatherv #" +
                    std::to_string(call.seq()) + " on group " + comm.name() + ": recv has " +
                    std::to_string(recv_count) + " elements, the ranks' counts (" + counts +
                    ") sum to " + std::to_string(total)));
  }
  if (variable && send != recv + my_offset * es && overlaps(send, bytes, recv, recv_count * es))
    raise(comm, std::invalid_argument("rank " + std::to_string(comm.world_rank(comm.rank())) +
                                      ": all_gatherv #" + std::to_string(call.seq()) +
                                      " on group " + comm.name() +
                                      ": send overlaps recv but is not this rank's block of it"));
  // Small blocks (all in the mailboxes) in one pass; else block by block.
  if (!call.recv_all_step0(recv, offsets, es)) {
    BlockRead reads[kMaxRanks];
    std::size_t count_reads = 0;
    for (std::size_t i = 0; i < n; ++i) {
      // This rank's own block first (a local copy through the transport, which also knows dry-run
      // memory; none when sending in place), then the next rank's: the ranks spread their first
      // reads over different owners.
      const std::size_t r = (me + i) % n;
      const std::size_t len = (offsets[r + 1] - offsets[r]) * es;
      if (len == 0 || (r < 32 && (blocks_present >> r & 1) != 0)) continue;
      reads[count_reads++] = {static_cast<int>(r), 0, recv + offsets[r] * es, len};
    }
    call.recv_each(0, std::span<const BlockRead>(reads, count_reads));
  }
  const std::size_t received = (total - (offsets[me + 1] - my_offset)) * es;
  call.finish();
  count_traffic(comm, variable ? CollectiveKind::all_gatherv : CollectiveKind::all_gather,
                (n - 1) * bytes, received);
}

}  // namespace tspemu::detail
