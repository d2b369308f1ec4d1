#include "tspemu/runtime/arena.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <sstream>

#include "dry_reservation.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/trace.hpp"

namespace tspemu {

const char* category_name(Category c) {
  switch (c) {
    case Category::weights:
      return "weights";
    case Category::gradients:
      return "gradients";
    case Category::optimizer:
      return "optimizer";
    case Category::activations:
      return "activations";
    case Category::kv:
      return "kv";
    case Category::comm:
      return "comm";
    case Category::workspace:
      return "workspace";
    case Category::kv_cache:
      return "kv_cache";
    case Category::other:
      return "other";
  }
  return "?";
}

std::string format_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

namespace {
constexpr std::size_t charged(std::size_t bytes) {
  return (bytes + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
}
}  // namespace

Arena::Arena(int rank, std::size_t capacity, bool dry) : rank_(rank), dry_(dry) {
  stats_.capacity = capacity;
}

Arena::~Arena() {
  trim();
}

void* Arena::allocate_bytes(std::size_t bytes, Category c, bool zero) {
  ++stats_.allocations;
  if (bytes == 0) return nullptr;
  // Checked before rounding, which would wrap to 0 for bytes near SIZE_MAX and then pass.
  if (bytes > stats_.capacity || bytes > static_cast<std::size_t>(-1) - kAlignment)
    throw_oom(bytes, c);
  const std::size_t size = charged(bytes);
  if (size > stats_.capacity - std::min(stats_.capacity, stats_.current) ||
      stats_.current + size > stats_.capacity)
    throw_oom(bytes, c);
  void* p = nullptr;
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached -= size;
  } else {
    p = dry_ ? detail::DryReservation::instance().take(size)
             : ::operator new (size, std::align_val_t{kAlignment});
    ++stats_.system_allocations;
  }
  if (zero && !dry_) std::memset(p, 0, bytes);
  const auto ci = static_cast<std::size_t>(c);
  stats_.current += size;
  stats_.category_current[ci] += size;
  stats_.peak = std::max(stats_.peak, stats_.current);
  high_water_ = std::max(high_water_, stats_.current);
  stats_.category_peak[ci] = std::max(stats_.category_peak[ci], stats_.category_current[ci]);
  for (auto& ph : active_phases_) ph->second = std::max(ph->second, stats_.current);
  if (trace_ != nullptr) trace_->counter("arena bytes", stats_.current);
  return p;
}

void Arena::release_bytes(void* p, std::size_t bytes, Category c) noexcept {
  if (p == nullptr) return;
  const std::size_t size = charged(bytes);
  stats_.current -= size;
  stats_.category_current[static_cast<std::size_t>(c)] -= size;
  if (trace_ != nullptr) trace_->counter("arena bytes", stats_.current);
  // Bounded by twice the most ever live (arena.hpp): a schedule that repeats keeps its blocks, one
  // whose sizes keep changing returns the blocks it would never reuse.
  if (stats_.cached + size > 2 * high_water_) {
    give_back(p, size);
    return;
  }
  try {
    free_blocks_[size].push_back(p);
    stats_.cached += size;
  } catch (...) {
    give_back(p, size);
  }
}

void Arena::give_back(void* p, std::size_t size) const noexcept {
  if (dry_)
    detail::DryReservation::instance().give_back(p, size);
  else
    ::operator delete (p, std::align_val_t{kAlignment});
}

void Arena::trim() {
  for (auto& [size, blocks] : free_blocks_)
    for (void* p : blocks) give_back(p, size);
  free_blocks_.clear();
  stats_.cached = 0;
}

void Arena::reset_peaks() {
  stats_.peak = stats_.current;
  stats_.category_peak = stats_.category_current;
  phase_peaks_.clear();
  active_phases_.clear();
}

Arena::Phase Arena::phase(std::string_view name) {
  auto it = phase_peaks_.find(name);
  if (it == phase_peaks_.end()) it = phase_peaks_.emplace(std::string(name), 0).first;
  it->second = std::max(it->second, stats_.current);
  active_phases_.push_back(it);
  return Phase(this, active_phases_.size() - 1);
}

Arena::Phase::~Phase() {
  // Phases are scopes, so they end in reverse order; reset_peaks() inside a phase drops them.
  if (index_ < arena_->active_phases_.size()) arena_->active_phases_.resize(index_);
}

std::size_t Arena::phase_peak(std::string_view name) const {
  auto it = phase_peaks_.find(name);
  return it == phase_peaks_.end() ? 0 : it->second;
}

void Arena::throw_oom(std::size_t bytes, Category c) const {
  std::vector<std::pair<std::size_t, Category>> cats;
  for (std::size_t i = 0; i < kCategoryCount; ++i)
    if (stats_.category_current[i] > 0)
      cats.emplace_back(stats_.category_current[i], static_cast<Category>(i));
  std::sort(cats.rbegin(), cats.rend());
  std::ostringstream m;
  m << "rank " << rank_ << ": out of device memory allocating " << format_bytes(bytes) << " for "
    << category_name(c) << ": capacity " << format_bytes(stats_.capacity) << ", in use "
    << format_bytes(stats_.current);
  if (!cats.empty()) {
    m << " (";
    for (std::size_t i = 0; i < cats.size() && i < 3; ++i)
      m << (i ? ", " : "") << category_name(cats[i].second) << " " << format_bytes(cats[i].first);
    m << ")";
  }
  throw OutOfMemory(m.str());
}

}  // namespace tspemu
