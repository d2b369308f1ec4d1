// tspemu runtime errors.
//
// Two tiers (STYLE.md): programming errors — a bad argument, a root out of range, a buffer too
// small — throw std::invalid_argument at once with the values printed. Runtime failures — a peer
// that failed, a collective the ranks disagree on, a hang, an emulated out-of-memory — are the
// typed exceptions below, each naming the ranks and the operation.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace tspemu {

// Base of every runtime failure.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The ranks of a group called different collectives (kind, count, element type or root), or a
// receive does not match its send. Every participant throws it, with the same message.
class CollectiveMismatch : public Error {
 public:
  using Error::Error;
};

// This rank stopped because another rank failed first; the message names that rank and its error.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

// A wait made no progress within the world's hang timeout, or waited for a rank that had already
// returned from the run function.
class HangError : public Error {
 public:
  using Error::Error;
};

// A rank's arena (its emulated device memory) cannot satisfy an allocation.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// What World::run throws: the first failure of the run, tagged with the rank that raised it.
// cause() is the original exception (rethrow it to inspect its type). diagnosis() is
// "rank R failed: <the original message>"; what() is the diagnosis followed by the last
// operations of every rank (World keeps a few in the message; flight_record() has them all).
class RankFailure : public Error {
 public:
  RankFailure(int rank, const std::string& what, std::exception_ptr cause,
              const std::string& recent_ops = {}, std::string flight_record = {})
      : Error("rank " + std::to_string(rank) + " failed: " + what +
              (recent_ops.empty() ? "" : "\n" + recent_ops)),
        rank_(rank),
        diagnosis_("rank " + std::to_string(rank) + " failed: " + what),
        cause_(std::move(cause)),
        flight_record_(std::move(flight_record)) {}
  int rank() const { return rank_; }
  const std::exception_ptr& cause() const { return cause_; }
  const std::string& diagnosis() const { return diagnosis_; }
  // Every rank's flight recorder (flight_recorder.hpp) at the end of the failed run.
  const std::string& flight_record() const { return flight_record_; }

 private:
  int rank_;
  std::string diagnosis_;
  std::exception_ptr cause_;
  std::string flight_record_;
};

}  // namespace tspemu
