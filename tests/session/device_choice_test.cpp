// One device policy (runtime/device_choice) for `vlac run --device` and Pi05Session (what
// vlac.Policy and `vlac serve` open): the names, the fallback, and the same answer from both on
// a policy folder and on a CPU-compiled package. On a machine without a GPU a cuda request is
// the same one error (exit 2) from both and auto runs on the CPU; with a GPU the CPU package is
// re-bound to cuda by the session as by vlac run.
#include <gtest/gtest.h>

#include <string>

#include "cli/cli_test_util.h"
#include "runtime/device_choice.h"
#include "session/pi05_session.h"

namespace vlac {
namespace {

using clitest::Proc;
using clitest::run_vlac;
using clitest::TempDir;

const std::string kCase = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05/tiny_b";

bool has_gpu() { return choose_device("cuda", "", "device").is_ok(); }

TEST(DeviceChoice, NamesAndFallback) {
  auto cpu = choose_device("cpu", "", "device");
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
  EXPECT_EQ(cpu->backend, "cpu");
  EXPECT_FALSE(cpu->gpu);
  auto folder_default = choose_device("", "cpu");
  ASSERT_TRUE(folder_default.is_ok());
  EXPECT_EQ(folder_default->backend, "cpu");
  auto package_default = choose_device("", "");
  ASSERT_TRUE(package_default.is_ok());
  EXPECT_EQ(package_default->backend, "");  // the manifest's backends
  auto bad = choose_device("tpu", "", "device");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().exit_code(), 2);
  EXPECT_EQ(bad.status().message(), "device must be cpu, cuda or auto, got 'tpu'");
  auto cuda = choose_device("cuda", "", "device");
  auto autod = choose_device("auto", "", "device");
  ASSERT_TRUE(autod.is_ok()) << autod.status().message();  // auto never fails
  if (cuda.is_ok()) {
    EXPECT_TRUE(cuda->gpu);
    EXPECT_EQ(autod->backend, "cuda");
  } else {
    EXPECT_EQ(cuda.status().exit_code(), 2);
    EXPECT_EQ(cuda.status().message().rfind("device cuda: ", 0), 0u) << cuda.status().message();
    EXPECT_EQ(autod->backend, "cpu");
    EXPECT_FALSE(autod->gpu);
  }
}

// vlac run's message for `--device cuda` and the session's for device "cuda" name the same cause.
TEST(DeviceChoice, SessionAndVlacRunAgreeOnFolderAndPackage) {
  TempDir tmp("device");
  const std::string folder = kCase + "/policy", pkg = tmp.file("tiny_b.vlac");
  Proc c = run_vlac({"compile", folder, "-o", pkg, "--quiet"});  // a CPU package
  ASSERT_EQ(c.rc, 0) << c.out;
  for (const std::string& path : {folder, pkg}) {
    SCOPED_TRACE(path);
    Pi05SessionOptions o;
    o.device = "cuda";
    auto s = Pi05Session::open(path, o);
    Proc r = run_vlac({"run", path, "--obs", kCase + "/obs.safetensors", "--out", tmp.file("out.safetensors"),
                       "--device", "cuda", "--quiet"});
    if (!has_gpu()) {
      ASSERT_FALSE(s.is_ok());
      EXPECT_EQ(s.status().exit_code(), 2);
      EXPECT_EQ(s.status().message(), choose_device("cuda", "", "device").status().message());
      EXPECT_EQ(r.rc, 2) << r.out;
      EXPECT_NE(r.out.find("vlac run: error: " + choose_device("cuda", "", "--device").status().message()),
                std::string::npos)
          << r.out;
    } else {
      ASSERT_TRUE(s.is_ok()) << s.status().message();
      EXPECT_EQ((*s)->info().device, "cuda");  // a CPU package re-bound to the GPU, as vlac run does
      EXPECT_EQ(r.rc, 0) << r.out;
    }
    o.device = "auto";
    auto a = Pi05Session::open(path, o);
    ASSERT_TRUE(a.is_ok()) << a.status().message();
    EXPECT_EQ((*a)->info().device, choose_device("auto", "")->backend);
    o.device = "cpu";
    auto cpu = Pi05Session::open(path, o);
    ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
    EXPECT_EQ((*cpu)->info().device, "cpu");
    o.device = "";  // vlac run's default: a folder on the CPU, this package on its manifest's (cpu)
    auto d = Pi05Session::open(path, o);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    EXPECT_EQ((*d)->info().device, "cpu");
  }
}

}  // namespace
}  // namespace vlac
