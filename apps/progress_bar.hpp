// A one-line progress bar on stderr for runs longer than a second: drawn only when stderr is a
// terminal (never into logs or pipes) and not --quiet, and only once a second has passed, so
// short runs print nothing. step() may be called from any one thread at a time.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

namespace tspemu::app {

class ProgressBar {
 public:
  // enabled: false for --quiet; a bar is drawn only if also stderr is a terminal.
  ProgressBar(std::string label, int total, bool enabled);
  ~ProgressBar();  // erases the bar
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void step(const std::string& what = {});

 private:
  void draw();
  std::string label_, what_;
  int total_, done_ = 0;
  bool enabled_, drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::mutex mutex_;  // rank 0's thread and the main thread take turns
};

}  // namespace tspemu::app
