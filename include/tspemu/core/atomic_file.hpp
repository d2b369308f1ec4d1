// Atomic file output: every file tspemu writes (reports, traces, charts, model checkpoints) is
// written whole or not at all.
//
// What: write_file_atomically(path, bytes) writes a temporary file beside path (same directory, so
// the same filesystem and the rename is atomic), checks every write, syncs and closes it, then
// renames it over path. check_writable(path) makes and removes such a temporary file without
// touching path, to refuse an unwritable output before any work is done.
// Guarantees: a reader sees the old file or the new one, never a part; on failure the temporary
// is removed, the old file is left as it was and FileWriteError names the path and the reason
// (strerror). Through a symlink the file it names is replaced, not the link. A path that exists
// and is not a regular file (/dev/null, /dev/full, a FIFO) cannot be replaced by a rename, so it
// is written in place, still checking every write and the close (/dev/full fails with ENOSPC).
// Cost: one write of the bytes, an fsync and a rename.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "tspemu/core/sanitized.hpp"

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

// Writes all of bytes to fd, retrying short writes and EINTR.
inline void write_all(int fd, std::string_view bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t k = ::write(fd, bytes.data() + done, bytes.size() - done);
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
  std::string temp;
  const int fd = detail::open_temporary(target, path, &temp);
  try {
    detail::write_all(fd, bytes, path);
    if (::fsync(fd) != 0) detail::fail_write("cannot write", path, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    detail::fail_write("cannot write", path, err);
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    detail::fail_write("cannot replace", path, err);
  }
}

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
