// Atomic file output (core/atomic_file.hpp) and sanitized message text (core/sanitized.hpp): a
// write replaces the file whole or leaves it as it was, never leaves a temporary behind, and names
// the path and the reason on failure; check_writable refuses what a later write would.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "tspemu/core/atomic_file.hpp"
#include "tspemu/core/sanitized.hpp"

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

TEST(Sanitized, KeepsPrintableAsciiAndQuotesTheRestShort) {
  EXPECT_EQ(sanitized("seq=16K"), "seq=16K");
  EXPECT_EQ(sanitized("a'b\\c\x1b\xff"), "a\\x27b\\x5cc\\x1b\\xff");
  const std::string cut = sanitized(std::string(100000, 'k'), 8);
  EXPECT_EQ(cut, "kkkkkkkk...(100000 bytes)");
}

}  // namespace
}  // namespace tspemu
