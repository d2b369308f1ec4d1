#include "dry_reservation.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <new>

namespace tspemu::detail {

namespace {

// Set once, before the fault handler is installed. Release store in instance(); the acquire loads
// (holds, the handler) then see the reservation's fixed base and size.
std::atomic<DryReservation*> g_reservation{nullptr};
struct sigaction g_previous_segv {};
struct sigaction g_previous_bus {};

// The raw system call: sanitizers' write interceptors are not safe to enter from a fault handler.
void write_all(const char* s, std::size_t n) {
  while (n > 0) {
    const long w = ::syscall(SYS_write, STDERR_FILENO, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Only async-signal-safe calls: write(2), _exit(2), sigaction(2), and the previous handler.
void on_fault(int sig, siginfo_t* info, void* context) {
  const DryReservation* r = g_reservation.load(std::memory_order_acquire);
  if (r != nullptr && r->contains(info->si_addr)) {
    // Ranks that fault together: the first reports and exits, the others wait for the exit.
    // Relaxed suffices: the flag only elects the reporter, it publishes nothing.
    static std::atomic<bool> reporting{false};
    if (reporting.exchange(true, std::memory_order_relaxed))
      for (;;) ::pause();
    char hex[2 + 16];  // "0x" and 16 digits
    auto a = reinterpret_cast<std::uintptr_t>(info->si_addr);
    hex[0] = '0';
    hex[1] = 'x';
    for (int i = 15; i >= 0; --i, a >>= 4) hex[2 + i] = "0123456789abcdef"[a & 15];
    const char head[] = "dry run: rank code touched dry-run memory at ";
    const char tail[] = "; a kernel or copy is missing its dry_run() check\n";
    write_all(head, sizeof head - 1);
    write_all(hex, sizeof hex);
    write_all(tail, sizeof tail - 1);
    ::_exit(3);
  }
  const struct sigaction& prev = sig == SIGBUS ? g_previous_bus : g_previous_segv;
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // Default action (an ignored fault would only fault again): restore it and return; the faulting
  // instruction runs again and the signal takes its default course (a core dump).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
}

void install_fault_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGSEGV, &sa, &g_previous_segv);
  ::sigaction(SIGBUS, &sa, &g_previous_bus);
}

}  // namespace

DryReservation& DryReservation::instance() {
  static DryReservation* r = [] {
    auto* made = new DryReservation();  // lives until exit: the handler may read it at any time
    g_reservation.store(made, std::memory_order_release);
    install_fault_handler();
    return made;
  }();
  return *r;
}

DryReservation::DryReservation() {
  // Sanitizers and small address spaces may refuse 16 TiB: halve until granted (>= 64 GiB).
  for (std::size_t size = std::size_t{1} << 44; size >= (std::size_t{1} << 36); size /= 2) {
    void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      base_ = static_cast<std::byte*>(p);
      size_ = size;
      return;
    }
  }
  throw std::bad_alloc();
}

bool DryReservation::holds(const void* p) noexcept {
  const DryReservation* r = g_reservation.load(std::memory_order_acquire);
  return r != nullptr && r->contains(p);
}

void* DryReservation::take(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = free_list_.find(bytes);
  if (it != free_list_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  if (bytes > size_ - used_) throw std::bad_alloc();
  void* p = base_ + used_;
  used_ += bytes;
  return p;
}

void DryReservation::give_back(void* p, std::size_t bytes) noexcept {
  std::lock_guard lock(mutex_);
  try {
    free_list_[bytes].push_back(p);
  } catch (...) {  // the address range is lost, nothing else: it was never backed
  }
}

}  // namespace tspemu::detail
