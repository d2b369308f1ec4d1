#include "progress_bar.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace tspemu::app {

ProgressBar::ProgressBar(std::string label, int total, bool enabled)
    : label_(std::move(label)),
      total_(std::max(total, 1)),
      enabled_(enabled && isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
}

void ProgressBar::step(const std::string& what) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = std::min(done_ + 1, total_);
  what_ = what;
  draw();
}

void ProgressBar::draw() {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (elapsed < 1.0) return;
  constexpr int kWidth = 30;
  const int filled = done_ * kWidth / total_;
  std::fprintf(stderr, "\r\033[K%s [%s%s] %d/%d %.1f s %s", label_.c_str(),
               std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(), done_, total_,
               elapsed, what_.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace tspemu::app
