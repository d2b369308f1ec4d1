// DryReservation: the address space that dry-run arenas hand out (arena.hpp,
// WorldOptions::dry_run).
//
// What: one process-wide PROT_NONE, MAP_NORESERVE mapping (2^44 bytes of address space, halved
// until the system grants it), carved by a bump pointer with a free list per block size. Blocks
// are distinct and 64-byte aligned but never backed: touching one faults, and the fault handler
// installed with the reservation stops the process with a message naming the address (a kernel or
// copy that misses its dry_run() test) and exit code 3; a fault elsewhere goes to the previous
// handler, so crashes outside dry memory behave as before.
// Requirements: none; the reservation is made on first use and lives until exit.
// Guarantees: take/give_back are thread-safe (a mutex: dry arenas call them once per new block
// size, their own caches serve the rest). Exhausting the reservation throws std::bad_alloc.
// Cost: the mapping costs page-table reservations only (no memory); a take is a mutex and a map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace tspemu::detail {

class DryReservation {
 public:
  // The process's reservation, made (with its fault handler) on the first call.
  static DryReservation& instance();

  // `bytes` (a multiple of 64) of unbacked, 64-byte aligned address space.
  void* take(std::size_t bytes);
  void give_back(void* p, std::size_t bytes) noexcept;

  // Whether p lies in the process's reservation (false before one is made).
  static bool holds(const void* p) noexcept;

  // Async-signal-safe: plain reads of values fixed before the handler is installed.
  bool contains(const void* p) const noexcept {
    // Compared as integers: p may point anywhere, outside the reservation's object.
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto base = reinterpret_cast<std::uintptr_t>(base_);
    return a >= base && a - base < size_;
  }

 private:
  DryReservation();
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::mutex mutex_;
  std::size_t used_ = 0;                                           // guarded by mutex_
  std::unordered_map<std::size_t, std::vector<void*>> free_list_;  // guarded by mutex_
};

}  // namespace tspemu::detail
