#include "parker.hpp"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace tspemu::detail {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

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

bool WakeFences::asymmetric_ = false;

bool WakeFences::decide() {
  // A concurrent first call (worlds made on two threads) waits for the one that registers, and
  // call_once's completion orders the write before every return.
  static std::once_flag decided;
  std::call_once(decided, [] { asymmetric_ = register_membarrier(); });
  return asymmetric_;
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
