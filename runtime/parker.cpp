#include "parker.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace tspemu::detail {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

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
