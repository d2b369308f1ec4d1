// Atomic file output (core/atomic_file.hpp) and sanitized message text (core/sanitized.hpp): a
// write replaces the file whole or leaves it as it was, never leaves a temporary behind, and names
// the path and the reason on failure; check_writable refuses what a later write would.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "tspemu/core/atomic_file.hpp"
#include "tspemu/core/sanitized.hpp"
#include "tspemu/core/signal_deferral.hpp"

namespace tspemu {
namespace {

namespace fs = std::filesystem;

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("tspemu_core_") + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  int entries() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  static std::string read(const std::string& p) {
    std::ifstream f(p);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }
  static std::string error_of(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const FileWriteError& e) {
      return e.what();
    }
    return "(no FileWriteError)";
  }
  fs::path dir_;
};

TEST_F(AtomicFile, ReplacesTheFileWholeAndLeavesNoTemporary) {
  const std::string p = path("out.json");
  write_file_atomically(p, "first");
  write_file_atomically(p, "second, longer");
  EXPECT_EQ(read(p), "second, longer");
  EXPECT_EQ(entries(), 1) << "a temporary file was left beside the output";
}

TEST_F(AtomicFile, ThroughASymlinkReplacesTheFileItNames) {
  write_file_atomically(path("real"), "old");
  fs::create_symlink(path("real"), path("link"));
  write_file_atomically(path("link"), "new");
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_EQ(read(path("real")), "new");
}

TEST_F(AtomicFile, AFullDeviceFailsNamingThePathAndTheReason) {
  const std::string msg = error_of([] { write_file_atomically("/dev/full", "bytes"); });
  EXPECT_NE(msg.find("'/dev/full'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
}

TEST_F(AtomicFile, AnUnwritableDirectoryFailsAndKeepsTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  const std::string p = path("out.json");
  write_file_atomically(p, "old");
  fs::permissions(dir_, fs::perms::owner_write, fs::perm_options::remove);
  EXPECT_NE(error_of([&] { write_file_atomically(p, "new"); }).find("cannot create"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_writable(p); }).find("cannot create"), std::string::npos);
  EXPECT_EQ(read(p), "old");
}

TEST_F(AtomicFile, CheckWritableRefusesWhatAWriteWouldAndTouchesNothing) {
  EXPECT_NE(error_of([&] {
              check_writable(path("missing/out.json"));
            }).find("cannot create a temporary file beside"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_writable(dir_.string()); }).find("it is a directory"),
            std::string::npos);
  check_writable(path("new.json"));
  check_writable("/dev/null");
  EXPECT_EQ(entries(), 0) << "check_writable left a file";
}

TEST_F(AtomicFile, StagedFilesChangeNothingUntilCommitAndLeaveNoTemporaryOnFailure) {
  write_file_atomically(path("a"), "old a");
  write_file_atomically(path("b"), "old b");
  try {
    StagedFiles staged;
    staged.stage(path("a"), "new a");
    EXPECT_EQ(entries(), 3);  // a, b and a's temporary
    EXPECT_EQ(read(path("a")), "old a");
    staged.stage(path("missing/b"), "new b");  // fails: no such directory
    ADD_FAILURE() << "staged into a missing directory";
  } catch (const FileWriteError& e) {
    EXPECT_NE(std::string(e.what()).find("missing/b"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read(path("a")), "old a");
  EXPECT_EQ(entries(), 2) << "a temporary was left behind";
  {
    StagedFiles staged;
    staged.stage(path("a"), "new a");
    staged.stage(path("b"), "new b");
    staged.commit();
  }
  EXPECT_EQ(read(path("a")), "new a");
  EXPECT_EQ(read(path("b")), "new b");
  EXPECT_EQ(entries(), 2);
}

// How a child process that ran `body` ended: "signal N", "exit N".
std::string ended(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      body();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                             : "exit " + std::to_string(WEXITSTATUS(status));
}

// A SIGINT or SIGTERM while files are staged stops the next write, the temporaries are removed and
// only then does the signal end the process, by the signal; one that arrives during commit() lets
// the renames finish first. Run in child processes, which the signal ends.
TEST_F(AtomicFile, ASignalWhileStagingRemovesTheTemporariesThenEndsTheProcess) {
  write_file_atomically(path("a"), "old a");
  write_file_atomically(path("b"), "old b");
  for (const int sig : {SIGINT, SIGTERM}) {
    EXPECT_EQ(ended([&] {
                const SignalDeferral defer;
                StagedFiles staged;
                staged.stage(path("a"), "new a");
                ::raise(sig);  // deferred: recorded only
                if (pending_signal() != sig) ::_exit(4);
                staged.stage(path("b"), std::string(1 << 20, 'b'));  // interrupted: throws
                staged.commit();
              }),
              "signal " + std::to_string(sig));
    EXPECT_EQ(read(path("a")), "old a");
    EXPECT_EQ(read(path("b")), "old b");
    EXPECT_EQ(entries(), 2) << "a temporary was left behind";
  }
  EXPECT_EQ(ended([&] {
              const SignalDeferral defer;
              StagedFiles staged;
              staged.stage(path("a"), "new a");
              staged.stage(path("b"), "new b");
              ::raise(SIGTERM);
              staged.commit();  // renames only: not interrupted
            }),
            "signal " + std::to_string(SIGTERM));
  EXPECT_EQ(read(path("a")), "new a");
  EXPECT_EQ(read(path("b")), "new b");
  EXPECT_EQ(entries(), 2);
  // Outside a scope nothing is deferred, and the previous disposition is back.
  EXPECT_EQ(pending_signal(), 0);
  struct sigaction now {};
  ::sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

TEST(Sanitized, KeepsPrintableAsciiAndQuotesTheRestShort) {
  EXPECT_EQ(sanitized("seq=16K"), "seq=16K");
  EXPECT_EQ(sanitized("a'b\\c\x1b\xff"), "a\\x27b\\x5cc\\x1b\\xff");
  const std::string cut = sanitized(std::string(100000, 'k'), 8);
  EXPECT_EQ(cut, "kkkkkkkk...(100000 bytes)");
}

}  // namespace
}  // namespace tspemu
