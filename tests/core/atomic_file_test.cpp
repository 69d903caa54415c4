// AtomicFile: nothing at the destination until commit; abandoned temporaries are removed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"

namespace fs = std::filesystem;

namespace vlac {

static fs::path temp_dir() {
  std::string t = (fs::temp_directory_path() / "vlac-atomic-XXXXXX").string();
  return mkdtemp(t.data());
}

TEST(AtomicFile, NothingAtDestinationUntilCommit) {
  fs::path d = temp_dir();
  fs::path out = d / "out.bin";
  {
    auto f = AtomicFile::create(out.string());
    ASSERT_TRUE(f.is_ok()) << f.status().message();
    ASSERT_TRUE(f->write("hello", 5).is_ok());
    EXPECT_FALSE(fs::exists(out));
    ASSERT_TRUE(f->commit().is_ok());
  }
  EXPECT_EQ(fs::file_size(out), 5u);
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator{}), 1);
  fs::remove_all(d);
}

TEST(AtomicFile, AbandonRemovesTemporaryAndKeepsOldFile) {
  fs::path d = temp_dir();
  fs::path out = d / "out.bin";
  { std::ofstream(out) << "old"; }
  {
    auto f = AtomicFile::create(out.string());
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(f->write("new content", 11).is_ok());
  }  // destroyed without commit
  EXPECT_EQ(fs::file_size(out), 3u);
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator{}), 1);
  fs::remove_all(d);
}

TEST(AtomicFile, RejectsFolderAsDestination) {
  fs::path d = temp_dir();
  auto f = AtomicFile::create(d.string());
  EXPECT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().exit_code(), 2);
  fs::remove_all(d);
}

}  // namespace vlac
