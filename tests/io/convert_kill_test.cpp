// An interrupted `vlac convert`: the CLI (VLAC_BINARY) is SIGKILLed at several points while it
// writes; nothing may appear at OUT (hidden ".NAME.vlac-tmp-*" / ".NAME.vlac-part-*" files may
// remain, as documented), and a rerun succeeds. Uses a sparse ~320 MiB fp32 input.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../cli/cli_test_util.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"


namespace vlac {
namespace {

namespace fs = std::filesystem;

constexpr int kTensors = 20;
constexpr int64_t kElems = 4 << 20;  // 16 MiB of fp32 each

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("vlac_kill_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// Header written for real, data left as a hole: a valid checkpoint of zeros, instantly.
void write_sparse_checkpoint(const std::string& path) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < kTensors; ++i) specs.push_back({"layers." + std::to_string(i) + ".weight", DType::F32, {kElems}});
  auto header = build_safetensors_header(specs, {{"format", "pt"}});
  ASSERT_TRUE(header.is_ok());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, header->data(), header->size()), static_cast<ssize_t>(header->size()));
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(header->size() + uint64_t{kTensors} * kElems * 4)), 0);
  ::close(fd);
}

using clitest::spawn_vlac;

// Total size of the hidden temporary files in `dir` whose names start with `hidden_prefix`.
uint64_t temp_bytes(const std::string& dir, const std::string& hidden_prefix, int* count = nullptr) {
  uint64_t total = 0;
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(hidden_prefix, 0) != 0) continue;
    ++n;
    std::error_code ec2;
    uint64_t sz = e.file_size(ec2);
    if (!ec2) total += sz;
  }
  if (count != nullptr) *count = n;
  return total;
}

// Starts the convert, waits until the temporaries hold at least `kill_at` bytes, SIGKILLs it.
// Returns true if it was killed mid-write (false: it finished or failed first).
bool run_and_kill(const std::vector<std::string>& args, const std::string& out_dir, const std::string& hidden_prefix,
                  uint64_t kill_at) {
  pid_t pid = spawn_vlac(args);
  EXPECT_GT(pid, 0);
  if (pid <= 0) return false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool killed = false;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;  // ended before the kill point
    int count = 0;
    uint64_t bytes = temp_bytes(out_dir, hidden_prefix, &count);
    if (count > 0 && bytes >= kill_at) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!killed) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  return killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

std::vector<std::string> visible_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n[0] != '.') out.push_back(n);
  }
  return out;
}

TEST(ConvertKill, KilledMidWriteLeavesNothingAtOut) {
  std::string dir = temp_dir("single");
  std::string in = dir + "/in.safetensors";
  write_sparse_checkpoint(in);
  fs::create_directories(dir + "/out");
  const std::string out = dir + "/out/model.safetensors";
  const uint64_t out_data = uint64_t{kTensors} * kElems * 2;
  const std::vector<std::string> args = {"convert", in, out, "--dtype", "bf16", "--buffer", "256KiB", "--quiet"};
  // Kill points: the temporary just created, a quarter written, most of it written.
  for (uint64_t kill_at : {uint64_t{1}, out_data / 4, out_data * 3 / 4}) {
    bool killed = false;
    for (int attempt = 0; attempt < 3 && !killed; ++attempt) {
      killed = run_and_kill(args, dir + "/out", ".model.safetensors.vlac-tmp-", kill_at);
      if (!killed) fs::remove(out);  // it finished first: try again
    }
    EXPECT_TRUE(killed) << "convert always finished before the kill point " << kill_at;
    EXPECT_FALSE(fs::exists(out)) << "a killed convert left a file at OUT (kill at " << kill_at << ")";
    EXPECT_TRUE(visible_files(dir + "/out").empty());
  }
  // Left-overs are hidden temporaries only (documented); a rerun succeeds next to them.
  pid_t pid = spawn_vlac(args);
  ASSERT_GT(pid, 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto f = SafetensorsFile::open(out);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(f->tensors().back().data_end, out_data);
  fs::remove_all(dir);
}

TEST(ConvertKill, KilledShardedWriteLeavesNoShardOrIndex) {
  std::string dir = temp_dir("sharded");
  std::string in = dir + "/in.safetensors";
  write_sparse_checkpoint(in);
  fs::create_directories(dir + "/out");
  const std::string out = dir + "/out/model.safetensors";
  const uint64_t out_data = uint64_t{kTensors} * kElems * 2;
  const std::vector<std::string> args = {"convert", in, out, "--dtype", "bf16", "--max-shard-size", "32MiB",
                                         "--buffer", "256KiB", "--quiet"};
  bool killed = false;
  for (int attempt = 0; attempt < 3 && !killed; ++attempt) {
    // Hidden files of any shard: ".model-0000k-of-00005.safetensors.vlac-{tmp,part}-*".
    killed = run_and_kill(args, dir + "/out", ".model-", out_data * 2 / 3);
    if (!killed)
      for (const auto& n : visible_files(dir + "/out")) fs::remove(dir + "/out/" + n);
  }
  EXPECT_TRUE(killed);
  EXPECT_TRUE(visible_files(dir + "/out").empty()) << "a killed sharded convert left a shard or the index";
  pid_t pid = spawn_vlac(args);
  ASSERT_GT(pid, 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto set = TensorSet::open(dir + "/out/model.safetensors.index.json");
  ASSERT_TRUE(set.is_ok()) << set.status().message();
  EXPECT_EQ(set->tensors().size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(visible_files(dir + "/out").size(), 6u);  // 5 shards of 32 MiB + index
  fs::remove_all(dir);
}

}  // namespace
}  // namespace vlac
