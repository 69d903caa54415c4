// Atomicity: a package replaced on disk by rename does not change an open Package (the old
// inode stays mapped), reopen() sees the new one; a writer killed with SIGKILL at any point
// leaves nothing at OUT, and the next write succeeds.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "package/package.h"
#include "package/package_writer.h"
#include "package_test_util.h"

namespace vlac {
namespace {

using namespace pkgtest;
using package::SegmentKind;

Status write_two(const std::string& out, uint32_t seed, const std::string& big_file = "", PackageWriterOptions opt = {}) {
  PackageWriter w(out, std::move(opt));
  VLAC_RETURN_IF_ERROR(w.add_bytes("engine/0", SegmentKind::Engine, pattern(200'000, seed)));
  if (big_file.empty()) {
    VLAC_RETURN_IF_ERROR(w.add_bytes("engine/1", SegmentKind::Engine, pattern(300'000, seed + 1)));
  } else {
    VLAC_RETURN_IF_ERROR(w.add_file("engine/1", SegmentKind::Engine, big_file));
  }
  w.set_manifest(two_engine_manifest());
  return w.finish().status();
}

TEST(PackageAtomic, ReplacedOnDiskDoesNotChangeAnOpenPackage) {
  TempDir dir;
  std::string out = dir.file("p.vlac");
  ASSERT_TRUE(write_two(out, 1).is_ok());
  auto old_pkg = Package::open(out);
  ASSERT_TRUE(old_pkg.is_ok());
  auto old_bytes = old_pkg->data("engine/0");
  ASSERT_TRUE(old_bytes.is_ok());
  const auto want_old = pattern(200'000, 1);
  EXPECT_FALSE(old_pkg->replaced_on_disk());

  ASSERT_TRUE(write_two(out, 50).is_ok());  // renamed over `out`
  EXPECT_TRUE(old_pkg->replaced_on_disk());
  old_pkg->drop(*old_pkg->find("engine/0"));  // even re-read from disk, the old inode's bytes come back
  EXPECT_EQ(std::memcmp(old_bytes->data(), want_old.data(), want_old.size()), 0);
  EXPECT_TRUE(old_pkg->verify().is_ok());

  auto fresh = old_pkg->reopen();
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().message();
  EXPECT_FALSE(fresh->replaced_on_disk());
  auto new_bytes = fresh->data("engine/0");
  const auto want_new = pattern(200'000, 50);
  EXPECT_EQ(std::memcmp(new_bytes->data(), want_new.data(), want_new.size()), 0);
  // The old one still holds the old bytes after the new one was opened.
  EXPECT_EQ(std::memcmp(old_bytes->data(), want_old.data(), want_old.size()), 0);

  // Moving a Package keeps its spans valid (the map moves with it).
  Package moved = std::move(old_pkg.value());
  EXPECT_EQ(std::memcmp(old_bytes->data(), want_old.data(), 1000), 0);
  EXPECT_EQ(moved.data("engine/0")->data(), old_bytes->data());
}

/// Forks a writer that stops at `stage` (signals the parent through a pipe, then waits to be
/// killed); the parent SIGKILLs it there. Returns false if the child never reached the stage.
bool kill_writer_at(const std::string& out, const std::string& big, const std::string& stage) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    ::close(fds[0]);
    PackageWriterOptions opt;
    opt.window_bytes = 1 << 20;
    opt.on_stage = [&](const std::string& s) {
      if (s == stage) {
        char c = 'x';
        (void)!::write(fds[1], &c, 1);
        for (;;) pause();
      }
    };
    Status st = write_two(out, 3, big, opt);
    _exit(st.is_ok() ? 0 : 1);
  }
  ::close(fds[1]);
  char c = 0;
  ssize_t n = ::read(fds[0], &c, 1);
  ::close(fds[0]);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  return n == 1 && WIFSIGNALED(status);
}

TEST(PackageAtomic, WriterKilledAtEachStageLeavesNothingAtOut) {
  TempDir dir;
  std::string big = dir.file("engine1.bin");
  make_sparse(big, 8ull << 20);
  std::string out = dir.file("p.vlac");
  for (const char* stage : {"layout", "segment:engine/0", "segment:engine/1", "table", "header", "commit"}) {
    ASSERT_TRUE(kill_writer_at(out, big, stage)) << stage;
    EXPECT_FALSE(exists(out)) << "killed at " << stage;
  }
  // An old package at OUT survives a killed rewrite untouched.
  ASSERT_TRUE(write_two(out, 9).is_ok());
  std::string before = read_file(out);
  ASSERT_TRUE(kill_writer_at(out, big, "commit"));
  EXPECT_EQ(read_file(out), before);
  // The next write succeeds and is valid.
  ASSERT_TRUE(write_two(out, 3, big).is_ok());
  auto p = Package::open(out);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_TRUE(p->verify().is_ok());
}

TEST(PackageAtomic, WriterKilledAtRandomMomentsLeavesNothingOrAValidPackage) {
  TempDir dir;
  std::string big = dir.file("engine1.bin");
  make_sparse(big, 48ull << 20);
  std::string out = dir.file("p.vlac");
  int killed_before_done = 0;
  for (int i = 0; i < 6; ++i) {
    std::remove(out.c_str());
    pid_t pid = fork();
    if (pid == 0) {
      PackageWriterOptions opt;
      opt.window_bytes = 1 << 20;
      _exit(write_two(out, 4, big, opt).is_ok() ? 0 : 1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + 9 * i));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) ++killed_before_done;
    if (exists(out)) {  // finished before the kill: then it must be whole
      auto p = Package::open(out);
      ASSERT_TRUE(p.is_ok()) << p.status().message();
      EXPECT_TRUE(p->verify().is_ok());
    }
  }
  std::printf("killed %d of 6 writers before they finished\n", killed_before_done);
  ASSERT_TRUE(write_two(out, 4, big).is_ok());
  EXPECT_TRUE(Package::open(out).is_ok());
}

}  // namespace
}  // namespace vlac
