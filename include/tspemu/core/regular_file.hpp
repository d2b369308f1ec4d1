// Reading a user's input file: every file tspemu reads (checkpoints, config files, corpora) is a
// regular file of a size known before anything is allocated for it.
//
// What: read_regular_file(path, max_bytes) opens path without blocking (O_NONBLOCK: a FIFO with no
// writer does not hang the open), checks the opened file with fstat — a regular file, at most
// max_bytes — and reads exactly its size, retrying short reads and EINTR.
// Guarantees: a FIFO, socket, device (/dev/zero), directory or missing file is refused before any
// read and a file larger than max_bytes before any allocation, each by a FileReadError whose
// message names the path (sanitized) and the reason ("not a regular file (a FIFO)", "5000000
// bytes, more than ..."); the checks are on the opened descriptor, so the file cannot be swapped
// between check and read. A file that changes size while being read is refused too.
// Cost: one open, fstat and the reads of the file's bytes; one allocation of its size.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "tspemu/core/sanitized.hpp"

namespace tspemu {

// what(): "cannot open 'PATH': REASON" when the open failed, "cannot read 'PATH': REASON" after;
// reason() alone, for a caller that names the file itself.
class FileReadError : public std::runtime_error {
 public:
  FileReadError(const char* verb, const std::string& path, std::string reason)
      : std::runtime_error(std::string("cannot ") + verb + " '" + sanitized(path, 256) +
                           "': " + reason),
        reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

namespace detail {

[[noreturn]] inline void fail_read(const std::string& path, const std::string& reason,
                                   const char* verb = "read") {
  throw FileReadError(verb, path, reason);
}

// The refusal of a file of this mode: "not a regular file (a FIFO)".
inline std::string not_regular(mode_t mode) {
  const char* kind = S_ISDIR(mode)    ? " (a directory)"
                     : S_ISFIFO(mode) ? " (a FIFO)"
                     : S_ISCHR(mode)  ? " (a character device)"
                     : S_ISBLK(mode)  ? " (a block device)"
                     : S_ISSOCK(mode) ? " (a socket)"
                                      : "";
  return std::string("not a regular file") + kind;
}

// Closes the descriptor on every path out of read_regular_file.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace detail

// The bytes of the regular file at path, at most max_bytes of them; `what` names the limit in the
// refusal ("a config file", "--data").
template <class Container = std::string>
Container read_regular_file(const std::string& path, std::uint64_t max_bytes,
                            const std::string& what = "the limit") {
  // O_NONBLOCK only matters for the open of a FIFO (or a device); a regular file's reads never
  // block on it, and the descriptor is refused before any read otherwise.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    detail::fail_read(
        path, err == ENOENT ? std::string("no such file") : std::generic_category().message(err),
        "open");
  }
  const detail::FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) detail::fail_read(path, std::generic_category().message(errno));
  if (!S_ISREG(st.st_mode)) detail::fail_read(path, detail::not_regular(st.st_mode));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    detail::fail_read(path, std::to_string(size) + " bytes, more than " + what + " of " +
                                std::to_string(max_bytes) + " bytes");
  }
  Container bytes;
  try {
    bytes.resize(static_cast<std::size_t>(size));
  } catch (const std::bad_alloc&) {
    detail::fail_read(path, "its " + std::to_string(size) + " bytes do not fit in memory");
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t k = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) detail::fail_read(path, std::generic_category().message(errno));
    if (k == 0) {
      detail::fail_read(path, "it shrank from " + std::to_string(size) + " to " +
                                  std::to_string(done) + " bytes while being read");
    }
    done += static_cast<std::size_t>(k);
  }
  char extra = 0;
  ssize_t k = 0;
  do {
    k = ::read(fd, &extra, 1);
  } while (k < 0 && errno == EINTR);
  if (k > 0)
    detail::fail_read(path, "it grew past " + std::to_string(size) + " bytes while being read");
  return bytes;
}

}  // namespace tspemu
