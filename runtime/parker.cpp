#include "parker.hpp"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace tspemu::detail {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

namespace parker_impl {
bool asymmetric = false;
}  // namespace parker_impl

namespace {

// Registers this process for MEMBARRIER_CMD_PRIVATE_EXPEDITED; false when the kernel lacks it or
// refuses (ENOSYS, EINVAL, EPERM under seccomp) or TSPEMU_MEMBARRIER is "0".
bool register_membarrier() {
  const char* env = std::getenv("TSPEMU_MEMBARRIER");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  const long supported = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
  if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0;
}

}  // namespace

bool asymmetric_fences() {
  // Magic static: decided once, by the first Parker made (before any rank of any world runs, so
  // before any poster reads parker_impl::asymmetric; the world's threads start after their
  // Parkers exist, which orders this write before their reads).
  static const bool decided = parker_impl::asymmetric = register_membarrier();
  return decided;
}

void Parker::heavy_fence() {
  // Registered at start-up, so this cannot fail with EPERM; nothing else can make it fail.
  syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0);
}

void Parker::park(std::chrono::nanoseconds max) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(max.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(max.count() % 1'000'000'000);
  // The kernel compares *addr with 1 atomically with going to sleep, so an unpark() that already
  // stored 0 makes this return at once.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&sleeping_), FUTEX_WAIT_PRIVATE, 1u, &ts,
          nullptr, 0);
}

void Parker::wake() {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&sleeping_), FUTEX_WAKE_PRIVATE, INT_MAX,
          nullptr, nullptr, 0);
}

}  // namespace tspemu::detail
