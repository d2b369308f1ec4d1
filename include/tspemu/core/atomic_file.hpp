// Atomic file output: every file tspemu writes (reports, traces, charts, model checkpoints) is
// written whole or not at all.
//
// What: write_file_atomically(path, bytes) writes a temporary file beside path (same directory, so
// the same filesystem and the rename is atomic), checks every write, syncs and closes it, then
// renames it over path; StagedFiles does the same for several files replaced together, renaming
// none until all are written. check_writable(path) makes and removes such a temporary file without
// touching path, to refuse an unwritable output before any work is done.
// Guarantees: a reader sees the old file or the new one, never a part; on failure the temporary
// is removed, the old file is left as it was and FileWriteError names the path and the reason
// (strerror). Through a symlink the file it names is replaced, not the link. A path that exists
// and is not a regular file (/dev/null, /dev/full, a FIFO) cannot be replaced by a rename, so it
// is written in place, still checking every write and the close (/dev/full fails with ENOSPC).
// A SIGINT or SIGTERM deferred by a SignalDeferral (signal_deferral.hpp) stops a write between
// 16 MiB chunks with FileWriteError, the temporary removed.
// Cost: one write of the bytes, an fsync and a rename.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "tspemu/core/sanitized.hpp"
#include "tspemu/core/signal_deferral.hpp"

namespace tspemu {

class FileWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

[[noreturn]] inline void fail_write(const std::string& what, const std::string& path, int err) {
  throw FileWriteError(what + " '" + sanitized(path, 256) +
                       "': " + std::generic_category().message(err));
}

// Writes all of bytes to fd in chunks, retrying short writes and EINTR; between chunks, a SIGINT or
// SIGTERM deferred by a SignalDeferral (signal_deferral.hpp) ends the write with FileWriteError, so
// the caller's cleanup removes the temporary before the signal takes effect.
inline void write_all(int fd, std::string_view bytes, const std::string& path) {
  constexpr std::size_t kChunk = std::size_t{16} << 20;
  std::size_t done = 0;
  while (done < bytes.size()) {
    if (const int sig = pending_signal(); sig != 0) {
      throw FileWriteError("cannot write '" + sanitized(path, 256) + "': interrupted by " +
                           (sig == SIGINT ? "SIGINT" : "SIGTERM"));
    }
    const ssize_t k = ::write(fd, bytes.data() + done, std::min(kChunk, bytes.size() - done));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail_write("cannot write", path, k < 0 ? errno : EIO);
    done += static_cast<std::size_t>(k);
  }
}

// The file a write to `path` replaces (through a symlink, the file it names), or "" when path is a
// directory or an existing non-regular file (written in place).
inline std::string replaced_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symlinks
  if (fs::is_directory(st))
    throw FileWriteError("cannot write '" + sanitized(path, 256) + "': it is a directory");
  if (fs::exists(st) && !fs::is_regular_file(st)) return "";
  return fs::is_symlink(fs::symlink_status(path, ec)) && fs::exists(st)
             ? fs::canonical(path, ec).string()
             : path;
}

// A new temporary file beside `target`, opened for writing; its name in *temp.
inline int open_temporary(const std::string& target, const std::string& path, std::string* temp) {
  // relaxed: the counter only makes names unique within the process (the pid does across
  // processes, O_EXCL catches the rest); it publishes no data.
  static std::atomic<unsigned> counter{0};
  *temp = target + ".tmp." + std::to_string(::getpid()) + "." +
          std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
  const int fd = ::open(temp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail_write("cannot create a temporary file beside", path, errno);
  return fd;
}

}  // namespace detail

namespace detail {

// bytes written, fsync'ed and closed in a new temporary beside target; its name. On failure the
// temporary is removed and FileWriteError names `path`.
inline std::string write_temporary(const std::string& target, const std::string& path,
                                   std::string_view bytes) {
  std::string temp;
  const int fd = open_temporary(target, path, &temp);
  try {
    write_all(fd, bytes, path);
    if (::fsync(fd) != 0) fail_write("cannot write", path, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail_write("cannot write", path, err);
  }
  return temp;
}

inline void rename_over(const std::string& temp, const std::string& target,
                        const std::string& path) {
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail_write("cannot replace", path, err);
  }
}

}  // namespace detail

inline void write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string target = detail::replaced_file(path);
  if (target.empty()) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) detail::fail_write("cannot open", path, errno);
    try {
      detail::write_all(fd, bytes, path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) detail::fail_write("cannot write", path, errno);
    return;
  }
  detail::rename_over(detail::write_temporary(target, path, bytes), target, path);
}

// Several files replaced as one: stage() writes each whole to a temporary beside it, commit()
// renames them all over their paths. Until commit() nothing at the paths has changed; an
// uncommitted set's temporaries are removed by the destructor (on an error, or on a signal that
// a SignalDeferral deferred), so a failed or interrupted save leaves the old files as they were
// and no temporary. commit() itself is a few renames: inside a SignalDeferral it completes before
// the signal acts. Paths that exist and are not regular files are refused (a set is regular
// files in a directory).
class StagedFiles {
 public:
  StagedFiles() = default;
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  ~StagedFiles() {
    for (std::size_t i = committed_; i < staged_.size(); ++i) ::unlink(staged_[i].temp.c_str());
  }

  void stage(const std::string& path, std::string_view bytes) {
    const std::string target = detail::replaced_file(path);
    if (target.empty()) detail::fail_write("cannot replace", path, EINVAL);
    staged_.reserve(staged_.size() + 1);  // no allocation between writing and recording it
    staged_.push_back({detail::write_temporary(target, path, bytes), target, path});
  }

  // Renames every staged file over its path, in staging order. A rename that fails (nothing
  // short of a broken filesystem: the temporaries are beside their targets) throws, the files
  // renamed before it replaced and the rest removed.
  void commit() {
    for (; committed_ < staged_.size(); ++committed_) {
      const Staged& s = staged_[committed_];
      detail::rename_over(s.temp, s.target, s.path);
    }
  }

 private:
  struct Staged {
    std::string temp, target, path;
  };
  std::vector<Staged> staged_;
  std::size_t committed_ = 0;  // staged_[0, committed_) are renamed
};

inline void check_writable(const std::string& path) {
  const std::string target = detail::replaced_file(path);
  if (target.empty()) {
    if (::access(path.c_str(), W_OK) != 0) detail::fail_write("cannot write", path, errno);
    return;
  }
  std::string temp;
  ::close(detail::open_temporary(target, path, &temp));
  ::unlink(temp.c_str());
}

}  // namespace tspemu
