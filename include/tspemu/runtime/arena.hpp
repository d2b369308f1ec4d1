// Arena: one rank's emulated device memory.
//
// What: every buffer a rank's schedule holds (weights, activations, K/V, gradients, communication
// buffers, workspace) is allocated here with a category label, so memory per rank is measured,
// not estimated.
// Requirements: an Arena belongs to one rank and is used by that rank's thread only (it is not
// thread-safe); buffers must be released (destroyed) before the Arena.
// Guarantees: 64-byte aligned storage; exceeding the capacity throws OutOfMemory naming the rank,
// the request, the capacity, the bytes in use and the largest categories; current and peak bytes
// overall, per category and per named phase. Freed blocks are cached by size, so a schedule that
// repeats the same allocations makes no system allocation after its first iteration
// (stats().system_allocations stops growing). The cache holds at most twice the bytes ever live at
// once (stats().cached <= 2 x the arena's highest current: room for a pattern's blocks of other
// sizes freed between its peaks), so schedules of ever-changing sizes cannot grow it without
// bound; a block past that is returned to the system.
// Dry arena (Arena(rank, capacity, /*dry=*/true), what a World with WorldOptions::dry_run makes):
// the same accounting — current and peak by category and phase, the 64-byte granularity,
// OutOfMemory against the capacity — but the blocks are distinct, aligned addresses in one
// unbacked process-wide reservation (PROT_NONE, runtime/dry_reservation.hpp), so a schedule of any
// size costs no memory. Touching a dry block stops the process with a message naming the address
// (exit code 3); code running in a dry world tests core/dry_run.hpp's dry_run() and skips its
// bytes. Zeroing is skipped.
// Accounting: a request of n bytes is charged round_up(n, 64) bytes (the device allocator's
// granularity); cached free blocks are not charged.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tspemu {

enum class Category : unsigned char {
  weights,
  gradients,
  optimizer,
  activations,  // kept for the backward pass
  kv,           // gathered keys/values (transient, within one attention call)
  comm,         // shards in flight, receive buffers
  workspace,    // transient scratch
  other,
  kv_cache,  // decoding's key/value cache: persistent rank state between steps (tsp_kv_cache.hpp)
};
inline constexpr std::size_t kCategoryCount = 9;
const char* category_name(Category c);

struct ArenaStats {
  std::size_t capacity = 0;
  std::size_t current = 0;
  std::size_t peak = 0;
  std::array<std::size_t, kCategoryCount> category_current{};
  std::array<std::size_t, kCategoryCount> category_peak{};
  std::size_t allocations = 0;         // calls to allocate
  std::size_t system_allocations = 0;  // of those, how many reached the system allocator
  std::size_t cached = 0;              // bytes of freed blocks kept for reuse (not charged)
};

class Arena;
class RankTrace;

// A typed, move-only view of arena storage; returns its block to the arena when destroyed.
// Contents are uninitialized unless the allocation asked for zeroing.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }
  operator std::span<T>() { return span(); }
  operator std::span<const T>() const { return span(); }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  void reset();

 private:
  friend class Arena;
  Buffer(Arena* a, T* p, std::size_t n, Category c) : arena_(a), data_(p), size_(n), category_(c) {}
  void swap(Buffer& o) noexcept {
    std::swap(arena_, o.arena_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(category_, o.category_);
  }
  Arena* arena_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  Category category_ = Category::other;
};

class Arena {
 public:
  static constexpr std::size_t kAlignment = 64;

  Arena(int rank, std::size_t capacity, bool dry = false);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // n elements of T charged to category c. Throws OutOfMemory past the capacity.
  template <class T>
  Buffer<T> allocate(std::size_t n, Category c, bool zero = false) {
    static_assert(alignof(T) <= kAlignment);
    // n * sizeof(T) would wrap around for huge n, handing out a tiny block as a huge Buffer;
    // such a request exceeds any capacity.
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw_oom(static_cast<std::size_t>(-1), c);
    void* p = allocate_bytes(n * sizeof(T), c, zero);
    return Buffer<T>(this, static_cast<T*>(p), n, c);
  }

  // RAII scope: while alive, the peak of the arena is also recorded under `name` (nested phases
  // each record their own). A phase entered again keeps the maximum over its entries.
  class Phase {
   public:
    Phase(Phase&&) = delete;
    ~Phase();

   private:
    friend class Arena;
    Phase(Arena* a, std::size_t index) : arena_(a), index_(index) {}
    Arena* arena_;
    std::size_t index_;
  };
  [[nodiscard]] Phase phase(std::string_view name);

  int rank() const { return rank_; }
  bool dry() const { return dry_; }
  const ArenaStats& stats() const { return stats_; }
  // Peak bytes recorded under a phase name (0 if never entered).
  std::size_t phase_peak(std::string_view name) const;
  const std::map<std::string, std::size_t, std::less<>>& phase_peaks() const {
    return phase_peaks_;
  }
  void set_capacity(std::size_t bytes) { stats_.capacity = bytes; }
  // Peaks restart from the current usage; phase peaks are cleared.
  void reset_peaks();
  // Returns cached free blocks to the system.
  void trim();

  void release_bytes(void* p, std::size_t bytes, Category c) noexcept;
  // Records the bytes in use as a counter at every allocation and release (null: off).
  void set_trace(RankTrace* trace) { trace_ = trace; }

 private:
  void* allocate_bytes(std::size_t bytes, Category c, bool zero);
  [[noreturn]] void throw_oom(std::size_t bytes, Category c) const;
  void give_back(void* p,
                 std::size_t charged_bytes) const noexcept;  // to the system or reservation

  int rank_;
  bool dry_;
  RankTrace* trace_ = nullptr;
  ArenaStats stats_;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks_;  // by charged size
  std::size_t high_water_ = 0;  // the highest stats_.current ever: bounds the cache
  std::map<std::string, std::size_t, std::less<>> phase_peaks_;
  std::vector<std::map<std::string, std::size_t, std::less<>>::iterator> active_phases_;
};

template <class T>
void Buffer<T>::reset() {
  if (arena_ != nullptr) arena_->release_bytes(data_, size_ * sizeof(T), category_);
  arena_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

// Human-readable byte count ("1.50 MiB"), used in error messages and reports.
std::string format_bytes(std::size_t bytes);

}  // namespace tspemu
