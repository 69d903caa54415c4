// `vlac compile` and `vlac run` on packages, through the CLI (VLAC_BINARY): package actions
// byte-identical to the folder's on the tiny lerobot fixtures (fp32/bf16, large/small cap),
// weight streaming under --mem-budget, byte-identical recompiles, engines under the cap, SIGKILL
// at several moments (CLI and in-process via the on_stage hook), corrupted packages, bad flags,
// a policy folder missing a tensor.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <functional>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"
#include "compile/pi05_compile.h"
#include "core/bytes.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "package/package.h"

namespace vlac {
namespace {

namespace fs = std::filesystem;
using clitest::exists;
using clitest::Proc;
using clitest::read_file;
using clitest::run_vlac;
using clitest::TempDir;
using nlohmann::json;

const std::string kFixtures = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05";

std::string policy_of(const std::string& fixture) { return kFixtures + "/" + fixture + "/policy"; }

// Packages and folder runs shared by the tests of this binary (compiled once, removed at exit).
TempDir& cache_dir() {
  static TempDir d("compile-cache");
  return d;
}

// Compiles (once per resolved folder, dtype, cap) and returns the package path; "" on failure.
std::string package_for(const std::string& fixture, const std::string& dtype, const std::string& cap) {
  static std::map<std::string, std::string> done;
  const std::string policy = fs::canonical(policy_of(fixture)).string();
  const std::string key = policy + "|" + dtype + "|" + cap;
  if (auto it = done.find(key); it != done.end()) return it->second;
  const std::string out =
      cache_dir().file(fs::path(policy).parent_path().filename().string() + "-" + dtype + "-" + cap + ".vlac");
  Proc p = run_vlac({"compile", policy, "-o", out, "--dtype", dtype, "--engine-cap", cap, "--quiet"});
  EXPECT_EQ(p.rc, 0) << p.out;
  if (p.rc != 0) return "";
  EXPECT_NE(p.out.find("vlac compile: "), std::string::npos) << p.out;
  done[key] = out;
  return out;
}

// Raw bytes of one tensor of a safetensors file ("" when absent).
std::string tensor_bytes(const std::string& path, const std::string& key) {
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  if (!f.is_ok()) return {};
  const TensorInfo* t = f->find(key);
  if (!t) return {};
  return std::string(reinterpret_cast<const char*>(f->data(*t)), t->nbytes());
}

std::vector<std::string> run_args(const std::string& what, const std::string& fixture, const std::string& out) {
  const std::string dir = kFixtures + "/" + fixture;
  return {"run", what, "--obs", dir + "/obs.safetensors", "--noise", dir + "/noise.safetensors", "--out", out, "--quiet"};
}

// `vlac run` on the folder with --dtype, once per (fixture, dtype): the output file.
std::string folder_run(const std::string& fixture, const std::string& dtype) {
  static std::map<std::string, std::string> done;
  const std::string key = fixture + "|" + dtype;
  if (auto it = done.find(key); it != done.end()) return it->second;
  const std::string out = cache_dir().file("folder-" + fixture + "-" + dtype + ".safetensors");
  auto args = run_args(policy_of(fixture), fixture, out);
  args.insert(args.end(), {"--dtype", dtype});
  Proc p = run_vlac(args);
  EXPECT_EQ(p.rc, 0) << p.out;
  done[key] = out;
  return out;
}

uint64_t ir_bytes(const TensorSpec& s) {
  uint64_t n = dtype_size(s.dtype);
  for (int64_t d : s.shape) n *= uint64_t(d);
  return n;
}

json read_json(const std::string& path) {
  json j = json::parse(read_file(path), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << path;
  return j;
}

// tiny_a_bf16 holds a bf16 checkpoint (the others fp32, lerobot's default).
const char* kCases[] = {"tiny_a", "tiny_b", "tiny_b_absent_cam", "tiny_a_bf16"};

TEST(CompileCli, PackageActionsEqualFolderActions) {
  for (const char* fx : kCases)
    for (const char* dtype : {"fp32", "bf16"})
      for (const char* cap : {"512MiB", "16KiB"}) {
        SCOPED_TRACE(std::string(fx) + " " + dtype + " cap " + cap);
        const std::string pkg = package_for(fx, dtype, cap);
        ASSERT_FALSE(pkg.empty());
        const std::string want = folder_run(fx, dtype);
        const std::string out = cache_dir().file(std::string("pkg-") + fx + "-" + dtype + "-" + cap + ".safetensors");
        Proc p = run_vlac(run_args(pkg, fx, out));
        ASSERT_EQ(p.rc, 0) << p.out;
        const std::string a = tensor_bytes(out, "action_normalized"), b = tensor_bytes(want, "action_normalized");
        ASSERT_FALSE(a.empty());
        EXPECT_TRUE(a == b) << "action_normalized differs between the package and the folder";
        EXPECT_EQ(tensor_bytes(out, "action"), tensor_bytes(want, "action"));
        // The same --dtype on the package is accepted; the other is refused (exit 2).
        auto same = run_args(pkg, fx, cache_dir().file("same.safetensors"));
        same.insert(same.end(), {"--dtype", dtype});
        EXPECT_EQ(run_vlac(same).rc, 0);
        auto other = run_args(pkg, fx, cache_dir().file("other.safetensors"));
        other.insert(other.end(), {"--dtype", std::string(dtype) == "fp32" ? "bf16" : "fp32"});
        Proc o = run_vlac(other);
        EXPECT_EQ(o.rc, 2) << o.out;
        EXPECT_NE(o.out.find("compiled for"), std::string::npos) << o.out;
      }
}

TEST(CompileCli, MemBudgetStreamsEnginesWithTheSameActions) {
  for (const char* fx : {"tiny_a", "tiny_b"})
    for (const char* dtype : {"fp32", "bf16"}) {
      SCOPED_TRACE(std::string(fx) + " " + dtype);
      const std::string pkg = package_for(fx, dtype, "16KiB");
      ASSERT_FALSE(pkg.empty());
      const std::string out = cache_dir().file("budget.safetensors"), rep = cache_dir().file("budget.json");
      auto args = run_args(pkg, fx, out);
      args.insert(args.end(), {"--mem-budget", "64KiB", "--report-json", rep});
      Proc p = run_vlac(args);
      ASSERT_EQ(p.rc, 0) << p.out;
      EXPECT_TRUE(tensor_bytes(out, "action_normalized") == tensor_bytes(folder_run(fx, dtype), "action_normalized"));
      const json r = read_json(rep);
      ASSERT_TRUE(r.contains("evictions")) << r.dump();
      EXPECT_GT(r["evictions"].get<int64_t>(), 0);
      EXPECT_GT(r["evicted_bytes"].get<int64_t>(), 0);
      EXPECT_EQ(r["mem_budget"].get<int64_t>(), 64 << 10);
      EXPECT_NE(p.out.find("evictions"), std::string::npos) << p.out;
      // A budget below every engine's size still runs (each engine mapped, run, dropped in turn).
      auto tiny = run_args(pkg, fx, out);
      tiny.insert(tiny.end(), {"--mem-budget", "1B"});
      Proc t = run_vlac(tiny);
      ASSERT_EQ(t.rc, 0) << t.out;
      EXPECT_TRUE(tensor_bytes(out, "action_normalized") == tensor_bytes(folder_run(fx, dtype), "action_normalized"));
      // Without a budget nothing is evicted.
      const std::string rep0 = cache_dir().file("nobudget.json");
      auto args0 = run_args(pkg, fx, out);
      args0.insert(args0.end(), {"--report-json", rep0});
      ASSERT_EQ(run_vlac(args0).rc, 0);
      EXPECT_EQ(read_json(rep0)["evictions"].get<int64_t>(), 0);
    }
}

// bytes of a little-endian f32 tensor as floats.
std::vector<float> as_floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

TEST(CompileCli, PackWeightsKeepsFolderAndPackageEqualAndRefusesABudget) {
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const std::string pkg = package_for("tiny_a", dtype, "16KiB");
    ASSERT_FALSE(pkg.empty());
    const std::string out = cache_dir().file("packed.safetensors"), rep = cache_dir().file("packed.json");
    auto args = run_args(pkg, "tiny_a", out);
    args.insert(args.end(), {"--pack-weights", "--report-json", rep});
    Proc p = run_vlac(args);
    ASSERT_EQ(p.rc, 0) << p.out;
    EXPECT_GT(read_json(rep)["packed_weight_bytes"].get<int64_t>(), 0) << read_json(rep).dump();
    // The folder with --pack-weights runs the same kernels: the same bytes.
    const std::string fout = cache_dir().file("packed-folder.safetensors");
    auto fargs = run_args(policy_of("tiny_a"), "tiny_a", fout);
    fargs.insert(fargs.end(), {"--dtype", dtype, "--pack-weights"});
    ASSERT_EQ(run_vlac(fargs).rc, 0);
    EXPECT_TRUE(tensor_bytes(out, "action_normalized") == tensor_bytes(fout, "action_normalized"));
    // Against the in-place run: the same up to summation order.
    const auto a = as_floats(tensor_bytes(out, "action_normalized"));
    const auto b = as_floats(tensor_bytes(folder_run("tiny_a", dtype), "action_normalized"));
    ASSERT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
    EXPECT_LE(d, std::string(dtype) == "fp32" ? 1e-4 : 2e-2);
    // Packed copies cannot be evicted: with a memory budget it is a usage error.
    auto both = run_args(pkg, "tiny_a", cache_dir().file("both.safetensors"));
    both.insert(both.end(), {"--pack-weights", "--mem-budget", "1MiB"});
    Proc e = run_vlac(both);
    EXPECT_EQ(e.rc, 2) << e.out;
    EXPECT_NE(e.out.find("packed weights"), std::string::npos) << e.out;
  }
}

TEST(CompileCli, TwoCompilesAreByteIdentical) {
  for (const char* cap : {"16KiB", "512MiB"}) {
    TempDir a("cmp-a"), b("cmp-b");
    for (const TempDir* d : {&a, &b}) {
      Proc p = run_vlac({"compile", policy_of("tiny_b"), "-o", d->file("p.vlac"), "--engine-cap", cap, "--quiet"});
      ASSERT_EQ(p.rc, 0) << p.out;
    }
    const std::string x = read_file(a.file("p.vlac")), y = read_file(b.file("p.vlac"));
    ASSERT_GT(x.size(), 0u);
    EXPECT_TRUE(x == y) << "two compiles of tiny_b (cap " << cap << ") differ";
    // And equal to the one compiled under another name and folder.
    EXPECT_TRUE(x == read_file(package_for("tiny_b", "bf16", cap)));
    // Nothing else is left beside OUT.
    EXPECT_EQ(a.entries(), std::vector<std::string>{"p.vlac"});
  }
}

TEST(CompileCli, EnginesRespectTheCap) {
  for (const char* fx : {"tiny_a", "tiny_b"})
    for (const char* dtype : {"fp32", "bf16"})
      for (const char* cap : {"16KiB", "512MiB"}) {
        SCOPED_TRACE(std::string(fx) + " " + dtype + " cap " + cap);
        const std::string pkg = package_for(fx, dtype, cap);
        ASSERT_FALSE(pkg.empty());
        const uint64_t cap_bytes = parse_size(cap).value();
        Proc ins = run_vlac({"inspect", pkg, "--json", "--quiet"});
        ASSERT_EQ(ins.rc, 0) << ins.out;
        const json j = json::parse(ins.out, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << ins.out;
        auto opened = Package::open(pkg);
        ASSERT_TRUE(opened.is_ok()) << opened.status().message();
        const json& mj = opened->manifest_json();
        ASSERT_EQ(j["engines"].size(), mj["engines"].size());
        EXPECT_EQ(mj["policy"]["engine_cap"].get<uint64_t>(), cap_bytes);
        EXPECT_EQ(mj["policy"]["dtype"].get<std::string>(), dtype);
        int over = 0;
        for (size_t i = 0; i < mj["engines"].size(); ++i) {
          const json& e = mj["engines"][i];
          const std::string name = e["name"].get<std::string>();
          EXPECT_EQ(j["engines"][i]["name"], e["name"]);
          const uint64_t wb = e["weight_bytes"].get<uint64_t>();
          const bool oc = e["over_cap"].get<bool>();
          if (oc) {
            ++over;
            EXPECT_TRUE(e.contains("over_cap_node")) << name;
            EXPECT_GT(wb, cap_bytes) << name << " is flagged over the cap but is not";
          } else {
            EXPECT_LE(wb, cap_bytes) << name;
          }
          // Every stored weight lies inside its segment; the engine segment holds the weights.
          const PackageSegment* seg = opened->find(e["segment"].get<std::string>());
          ASSERT_NE(seg, nullptr) << name;
          EXPECT_GE(seg->size, wb) << name;
          EXPECT_EQ(j["engines"][i]["size"].get<uint64_t>(), seg->size);
          for (const json& w : e["weights"]) {
            const PackageSegment* ws = opened->find(w["segment"].get<std::string>());
            ASSERT_NE(ws, nullptr) << name;
            EXPECT_LE(w["offset"].get<uint64_t>() + w["bytes"].get<uint64_t>(), ws->size) << name;
          }
        }
        if (std::string(cap) == "512MiB") {
          EXPECT_EQ(over, 0);
          EXPECT_EQ(mj["engines"].size(), 4u);  // one engine per stage
        } else {
          EXPECT_GT(mj["engines"].size(), 10u);
        }
        Proc v = run_vlac({"inspect", pkg, "--verify", "--quiet"});
        EXPECT_EQ(v.rc, 0) << v.out;
      }
}

// The manifest's bookkeeping: weights stored once and read from the same or an earlier engine,
// last-use lists matching the readers, crossings flowing forward, the stages listing every engine,
// and nothing inference never reads (the LM heads) packaged.
TEST(CompileCli, ManifestIsConsistent) {
  for (const char* fx : {"tiny_a", "tiny_b"})
    for (const char* dtype : {"fp32", "bf16"})
      for (const char* cap : {"16KiB", "512MiB"}) {
        SCOPED_TRACE(std::string(fx) + " " + dtype + " cap " + cap);
        auto pk = Package::open(package_for(fx, dtype, cap));
        ASSERT_TRUE(pk.is_ok()) << pk.status().message();
        const json& engines = pk->manifest_json()["engines"];
        std::map<std::string, int> index;  // engine segment / name -> run-order index
        for (size_t i = 0; i < engines.size(); ++i) {
          index[engines[i]["segment"].get<std::string>()] = int(i);
          index[engines[i]["name"].get<std::string>()] = int(i);
        }
        std::map<std::string, std::string> stored_in;  // weight name -> segment
        std::map<std::string, int> last_reader, last_use_at;
        for (size_t i = 0; i < engines.size(); ++i) {
          const json& e = engines[i];
          const std::string name = e["name"].get<std::string>();
          uint64_t own_bytes = 0;
          for (const json& w : e["weights"]) {
            const std::string wn = w["name"].get<std::string>(), seg = w["segment"].get<std::string>();
            EXPECT_EQ(wn.find("lm_head"), std::string::npos) << name << " packages " << wn;
            ASSERT_TRUE(index.count(seg)) << name << ": weight " << wn << " in no engine segment";
            EXPECT_LE(index[seg], int(i)) << name << " reads " << wn << " from a later engine";
            if (auto it = stored_in.find(wn); it != stored_in.end()) {
              EXPECT_EQ(it->second, seg) << wn << " stored twice";
            }
            stored_in[wn] = seg;
            if (seg == e["segment"].get<std::string>()) own_bytes += w["bytes"].get<uint64_t>();
            last_reader[e["stage"].get<std::string>() + "/" + wn] = int(i);
          }
          EXPECT_EQ(own_bytes, e["weight_bytes"].get<uint64_t>()) << name;
          for (const json& lu : e["last_use"]) {
            const std::string key = e["stage"].get<std::string>() + "/" + lu.get<std::string>();
            EXPECT_EQ(last_use_at.count(key), 0u) << key << " has two last uses";
            last_use_at[key] = int(i);
          }
        }
        EXPECT_EQ(last_use_at, last_reader) << "last_use lists differ from the last reader of each weight";
        for (const json& c : pk->manifest_json()["crossing"]) {
          const int prod = index.at(c["producer"].get<std::string>());
          for (const json& u : c["consumers"]) EXPECT_LT(prod, index.at(u.get<std::string>())) << c.dump();
        }
        size_t listed = 0;
        int prev = -1;
        for (const char* stage : {"vision", "text", "lm", "step"}) {
          const json& names = pk->manifest().policy["stages"][stage];
          ASSERT_FALSE(names.empty()) << stage;
          for (const json& n : names) {
            const int at = index.at(n.get<std::string>());
            EXPECT_EQ(at, prev + 1) << "stages do not list the engines in run order";
            prev = at;
            ++listed;
          }
        }
        EXPECT_EQ(listed, engines.size());
      }
}

TEST(CompileCli, EngineDirAndKeepEngines) {
  const std::string ref = read_file(package_for("tiny_a", "bf16", "16KiB"));
  ASSERT_FALSE(ref.empty());
  TempDir d("edir");
  fs::create_directories(d.file("engines"));
  fs::create_directories(d.file("out"));
  // A given folder: used, emptied after, left in place; the package is the same.
  Proc p = run_vlac({"compile", policy_of("tiny_a"), "-o", d.file("out/a.vlac"), "--engine-cap", "16KiB", "--engine-dir",
                     d.file("engines"), "--quiet"});
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_TRUE(read_file(d.file("out/a.vlac")) == ref);
  EXPECT_TRUE(fs::is_directory(d.file("engines")));
  EXPECT_EQ(clitest::list_dir(d.file("engines")), std::vector<std::string>{});
  EXPECT_EQ(clitest::list_dir(d.file("out")), std::vector<std::string>{"a.vlac"});
  // --keep-engines: one file per engine, the same bytes as the package's engine segment.
  p = run_vlac({"compile", policy_of("tiny_a"), "-o", d.file("out/b.vlac"), "--engine-cap", "16KiB", "--engine-dir",
                d.file("engines"), "--keep-engines", "--quiet"});
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_TRUE(read_file(d.file("out/b.vlac")) == ref);
  auto pk = Package::open(d.file("out/b.vlac"));
  ASSERT_TRUE(pk.is_ok());
  size_t n_engines = 0;
  for (const PackageEngine& e : pk->manifest().engines) {
    ++n_engines;
    const std::string f = d.file("engines/" + e.name + ".engine");
    ASSERT_TRUE(exists(f)) << "--keep-engines did not keep " << f;
    auto bytes = pk->data(e.segment);
    ASSERT_TRUE(bytes.is_ok());
    EXPECT_TRUE(read_file(f) == std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size())) << e.name;
  }
  EXPECT_EQ(clitest::list_dir(d.file("engines")).size(), n_engines);
  // --keep-engines without --engine-dir keeps nothing (the temporary folder goes).
  p = run_vlac({"compile", policy_of("tiny_a"), "-o", d.file("out/c.vlac"), "--engine-cap", "16KiB", "--keep-engines",
                "--quiet"});
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_EQ(clitest::list_dir(d.file("out")).size(), 3u);
  // An engine dir that is a file: exit 2, nothing at OUT.
  clitest::write_file(d.file("plain"), "x");
  p = run_vlac({"compile", policy_of("tiny_a"), "-o", d.file("out/e.vlac"), "--engine-dir", d.file("plain"), "--quiet"});
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("plain"), std::string::npos) << p.out;
  EXPECT_FALSE(exists(d.file("out/e.vlac")));
}

// ---- interrupted compiles ----


int count_entries(const std::string& dir) { return int(clitest::list_dir(dir).size()); }

bool has_prefix_entry(const std::string& dir, const std::string& prefix) {
  for (const auto& n : clitest::list_dir(dir))
    if (n.rfind(prefix, 0) == 0) return true;
  return false;
}

// The CLI compile is SIGKILLed at several moments: after the k-th engine file appears, once the
// package's temporary file exists, and after fixed short delays. OUT never exists after a kill;
// a run that finished first left the complete package. Then the next compile succeeds and
// produces the reference bytes.
TEST(CompileKill, SigkillAtSeveralMomentsLeavesNothingAtOut) {
  const std::string ref = read_file(package_for("tiny_b", "bf16", "4KiB"));
  ASSERT_FALSE(ref.empty());
  TempDir d("kill");
  const std::string out = d.file("p.vlac");
  const std::vector<std::string> args = {"compile", policy_of("tiny_b"), "-o", out, "--engine-cap", "4KiB", "--quiet"};
  struct Point {
    int engine_files = 0;     // kill once the engine folder holds this many entries
    bool package_tmp = false; // kill once the package's temporary file exists
    int delay_us = -1;        // kill after this long
  };
  const std::vector<Point> points = {{1, false, -1},  {10, false, -1}, {40, false, -1}, {0, true, -1},
                                     {0, false, 0},   {0, false, 2000}, {0, false, 10000}, {0, false, 40000},
                                     {0, false, 120000}};
  int killed = 0;
  for (const Point& pt : points) {
    const pid_t pid = clitest::spawn_vlac(args);
    ASSERT_GT(pid, 0);
    const std::string edir = d.file(".vlac-engines-" + std::to_string(pid));
    const auto t0 = std::chrono::steady_clock::now();
    bool fired = false, ended = false;
    int status = 0;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        ended = true;
        break;
      }
      bool now = false;
      if (pt.engine_files > 0) now = count_entries(edir) >= pt.engine_files;
      else if (pt.package_tmp) now = has_prefix_entry(d.path(), ".p.vlac.vlac-tmp-");
      else now = std::chrono::steady_clock::now() - t0 >= std::chrono::microseconds(pt.delay_us);
      if (now) {
        kill(pid, SIGKILL);
        fired = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!ended) {
      if (!fired) kill(pid, SIGKILL);
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
    }
    if (WIFSIGNALED(status) && exists(out)) {
      // Killed after the package's atomic rename (while exiting): OUT must be the whole package.
      EXPECT_EQ(WTERMSIG(status), SIGKILL);
      EXPECT_TRUE(read_file(out) == ref) << "a killed compile left a partial file at OUT (point "
                                         << pt.engine_files << "/" << pt.package_tmp << "/" << pt.delay_us << ")";
      fs::remove(out);
    } else if (WIFSIGNALED(status)) {
      EXPECT_EQ(WTERMSIG(status), SIGKILL);
      ++killed;
    } else {
      // Finished before the kill point: the package is complete.
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      EXPECT_TRUE(read_file(out) == ref);
      EXPECT_FALSE(exists(edir)) << "a finished compile left its engine folder";
      fs::remove(out);
    }
  }
  EXPECT_GE(killed, 4) << "too few kills landed mid-compile";
  // The next compile succeeds (whatever the killed runs left) and gives the reference bytes.
  Proc p = run_vlac(args);
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_TRUE(read_file(out) == ref);
  Proc v = run_vlac({"inspect", out, "--verify", "--quiet"});
  EXPECT_EQ(v.rc, 0) << v.out;
  // What the killed runs left beside OUT: the next compile removed their engine folders; only
  // the package writer's hidden temporary of a run killed while packaging may remain.
  int leftovers = 0;
  for (const auto& n : d.entries()) {
    if (n == "p.vlac") continue;
    EXPECT_EQ(n.rfind(".p.vlac.vlac-tmp-", 0), 0u) << "leftover beside OUT: " << n;
    ++leftovers;
  }
  std::printf("[ kill     ] %d of %zu runs killed mid-compile; %d hidden leftovers beside OUT\n", killed, points.size(),
              leftovers);
}

// In-process: a forked child runs compile_pi05 and SIGKILLs itself from the on_stage hook at the
// first, a middle and the last engine, and just before packaging.
TEST(CompileKill, OnStageHookKillPoints) {
  const std::string policy = policy_of("tiny_a");
  const std::string ref = read_file(package_for("tiny_a", "bf16", "16KiB"));
  ASSERT_FALSE(ref.empty());
  TempDir d("hook");
  const std::string out = d.file("p.vlac");
  // The stages, from one complete in-process compile (which must equal the CLI's package).
  std::vector<std::string> stages;
  {
    Pi05CompileOptions o;
    o.out = out;
    o.engine_cap = 16 << 10;
    o.on_stage = [&stages](const std::string& s) { stages.push_back(s); };
    auto r = compile_pi05(policy, o);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_TRUE(read_file(out) == ref) << "the library and the CLI compile differ";
    fs::remove(out);
  }
  ASSERT_GT(stages.size(), 4u);
  EXPECT_EQ(stages.front(), "engine:vision.0");
  EXPECT_EQ(stages.back(), "package");
  EXPECT_EQ(d.entries(), std::vector<std::string>{}) << "the in-process compile left files";
  const std::vector<std::string> targets = {stages[0], stages[1], stages[stages.size() / 2], stages[stages.size() - 2],
                                            stages.back()};
  std::vector<pid_t> children;
  for (const std::string& target : targets) {
    fflush(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      Pi05CompileOptions o;
      o.out = out;
      o.engine_cap = 16 << 10;
      o.on_stage = [&target](const std::string& s) {
        if (s == target) raise(SIGKILL);
      };
      auto r = compile_pi05(policy, o);
      _exit(r.is_ok() ? 0 : 3);  // only when the stage never came
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << target;
    EXPECT_FALSE(exists(out)) << "killed at " << target;
    children.push_back(pid);
  }
  // The killed children left their engine folders (engine files of the finished engines).
  const std::string last_dir = d.file(".vlac-engines-" + std::to_string(children.back()));
  ASSERT_TRUE(exists(last_dir));
  EXPECT_GT(count_entries(last_dir), 4);
  // Worst case for the next compile: a stale folder under the very name it will use (pid reuse),
  // holding engine files of the killed run plus a junk one.
  const std::string mine = d.file(".vlac-engines-" + std::to_string(getpid()));
  fs::rename(last_dir, mine);
  clitest::write_file(mine + "/lm.0.engine", "junk");
  clitest::write_file(mine + "/zz.engine", "junk");
  Pi05CompileOptions o;
  o.out = out;
  o.engine_cap = 16 << 10;
  auto r = compile_pi05(policy, o);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(read_file(out) == ref);
  // The CLI too, next to all these leftovers.
  fs::remove(out);
  Proc p = run_vlac({"compile", policy, "-o", out, "--engine-cap", "16KiB", "--quiet"});
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_TRUE(read_file(out) == ref);
}

// ---- corrupted packages ----

struct Rejected {
  Proc run, verify;
};
Rejected try_package(const std::string& pkg, const std::string& out) {
  Rejected r;
  r.run = run_vlac(run_args(pkg, "tiny_a", out));
  r.verify = run_vlac({"inspect", pkg, "--verify", "--quiet"});
  return r;
}

void expect_rejected(const Rejected& r, const std::string& pkg, const std::string& out, const std::string& what) {
  EXPECT_EQ(r.run.rc, 2) << what << ": vlac run: " << r.run.out;
  EXPECT_NE(r.run.out.find(pkg), std::string::npos) << what << ": vlac run does not name the file: " << r.run.out;
  EXPECT_EQ(r.verify.rc, 2) << what << ": vlac inspect --verify: " << r.verify.out;
  EXPECT_NE(r.verify.out.find(pkg), std::string::npos) << what << ": inspect does not name the file: " << r.verify.out;
  EXPECT_FALSE(exists(out)) << what << ": vlac run wrote an output";
}

TEST(CompileCli, FlippedBytesAreRejected) {
  const std::string good_path = package_for("tiny_a", "fp32", "16KiB");
  ASSERT_FALSE(good_path.empty());
  const std::string good = read_file(good_path);
  auto pk = Package::open(good_path);
  ASSERT_TRUE(pk.is_ok());
  std::vector<const PackageSegment*> engines, others;
  for (const auto& s : pk->segments()) (s.kind == package::SegmentKind::Engine ? engines : others).push_back(&s);
  ASSERT_GT(engines.size(), 3u);
  ASSERT_FALSE(others.empty());
  std::vector<const PackageSegment*> pick = {engines.front(), engines[engines.size() / 2], engines.back()};
  for (const PackageSegment* s : others) pick.push_back(s);  // config.json, processor files, stats
  TempDir d("flip");
  const std::string bad = d.file("bad.vlac"), out = d.file("o.safetensors");
  for (const PackageSegment* s : pick)
    for (uint64_t at : {uint64_t(0), s->size / 2, s->size - 1}) {
      std::string b = good;
      b[size_t(s->offset + at)] = char(b[size_t(s->offset + at)] ^ 0x04);
      clitest::write_file(bad, b);
      const std::string what = "segment '" + s->name + "' byte " + std::to_string(at);
      Rejected r = try_package(bad, out);
      expect_rejected(r, bad, out, what);
      EXPECT_NE(r.verify.out.find(s->name), std::string::npos) << what << ": " << r.verify.out;
      EXPECT_NE(r.verify.out.find("checksum"), std::string::npos) << what << ": " << r.verify.out;
    }
  // Header, segment table and manifest bytes.
  for (uint64_t at : {uint64_t(0), uint64_t(9), uint64_t(40), pk->layout().table_end - 1, pk->layout().table_end + 5,
                      pk->layout().manifest_end - 2}) {
    std::string b = good;
    b[size_t(at)] = char(b[size_t(at)] ^ 0x20);
    clitest::write_file(bad, b);
    expect_rejected(try_package(bad, out), bad, out, "byte " + std::to_string(at));
  }
  // A byte in the alignment padding between segments (must be zero).
  const PackageSegment* e0 = engines.front();
  if (e0->size % 65536 != 0) {
    std::string b = good;
    b[size_t(e0->offset + e0->size)] = 1;
    clitest::write_file(bad, b);
    Rejected r = try_package(bad, out);
    EXPECT_EQ(r.verify.rc, 2) << r.verify.out;
  }
}

TEST(CompileCli, TruncatedOrExtendedPackagesAreRejected) {
  const std::string good_path = package_for("tiny_a", "fp32", "16KiB");
  ASSERT_FALSE(good_path.empty());
  const std::string good = read_file(good_path);
  auto pk = Package::open(good_path);
  ASSERT_TRUE(pk.is_ok());
  TempDir d("trunc");
  const std::string bad = d.file("bad.vlac"), out = d.file("o.safetensors");
  for (uint64_t n : {uint64_t(0), uint64_t(7), uint64_t(64), pk->layout().table_end - 1, pk->layout().manifest_end - 1,
                     pk->segments().back().offset, uint64_t(good.size() / 2), uint64_t(good.size() - 1)}) {
    clitest::write_file(bad, good.substr(0, size_t(n)));
    expect_rejected(try_package(bad, out), bad, out, "truncated to " + std::to_string(n));
  }
  clitest::write_file(bad, good + std::string(1, '\0'));
  expect_rejected(try_package(bad, out), bad, out, "one byte appended");
  clitest::write_file(bad, good + std::string(65536, '\0'));
  expect_rejected(try_package(bad, out), bad, out, "64 KiB appended");
}

// A file whose magic is wrong is a bad package (exit 2), not a policy folder missing config.json.
TEST(CompileCli, BadMagicRunExits2) {
  const std::string good = read_file(package_for("tiny_a", "fp32", "16KiB"));
  TempDir d("magic");
  const std::string bad = d.file("bad.vlac"), out = d.file("o.safetensors");
  std::string b = good;
  b[0] = char(b[0] ^ 1);
  clitest::write_file(bad, b);
  Proc p = run_vlac(run_args(bad, "tiny_a", out));
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find(bad), std::string::npos) << p.out;
  clitest::write_file(bad, "");
  p = run_vlac(run_args(bad, "tiny_a", out));
  EXPECT_EQ(p.rc, 2) << p.out;
}

// ---- bad flags and bad folders ----

TEST(CompileCli, BadFlagsExit2AndWriteNothing) {
  TempDir d("flags");
  const std::string out = d.file("p.vlac");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--engine-cap", "abc"}, "--engine-cap: not a size: 'abc'"},
      {{"--engine-cap", "0"}, "--engine-cap"},
      {{"--engine-cap", "1KiB"}, "--engine-cap"},
      {{"--engine-cap", "4095"}, "--engine-cap"},
      {{"--engine-cap", "-4KiB"}, "--engine-cap: not a size: '-4KiB'"},
      {{"--engine-cap", "16QB"}, "--engine-cap: unknown size unit in '16QB'"},
      {{"--engine-cap", ""}, "--engine-cap"},
      {{"--engine-cap", "99999999TiB"}, "--engine-cap"},
      {{"--dtype", "fp16"}, "--dtype"},       {{"--dtype", ""}, "--dtype"},
      {{"--backend", "nosuch"}, "--backend"}, {{"--no-such-flag"}, "no-such-flag"},
      {{"--dtype", "fp8", "--activations", "fp16"}, "--activations must be bf16 or e4m3"},
      {{"--dtype", "int8", "--activations", "e4m3"}, "--activations e4m3 goes with --dtype fp8"},
      {{"--activations", "e4m3"}, "--activations e4m3 goes with --dtype fp8"},
  };
  for (const auto& [flags, needle] : cases) {
    std::vector<std::string> args = {"compile", policy_of("tiny_a"), "-o", out, "--quiet"};
    args.insert(args.end(), flags.begin(), flags.end());
    Proc p = run_vlac(args);
    EXPECT_EQ(p.rc, 2) << flags[0] << " " << (flags.size() > 1 ? flags[1] : "") << ": " << p.out;
    EXPECT_NE(p.out.find(needle), std::string::npos) << p.out;
    EXPECT_EQ(d.entries(), std::vector<std::string>{}) << flags[0];
  }
  Proc noout = run_vlac({"compile", policy_of("tiny_a"), "--quiet"});
  EXPECT_EQ(noout.rc, 2) << noout.out;
  Proc nodir = run_vlac({"compile", d.file("no_such_policy"), "-o", out, "--quiet"});
  EXPECT_EQ(nodir.rc, 2) << nodir.out;
  EXPECT_NE(nodir.out.find("no_such_policy"), std::string::npos) << nodir.out;
  EXPECT_EQ(d.entries(), std::vector<std::string>{});
  // vlac run on a package: bad --mem-budget.
  const std::string pkg = package_for("tiny_a", "fp32", "16KiB");
  for (const char* b : {"0", "abc", "-1MiB"}) {
    auto args = run_args(pkg, "tiny_a", d.file("o.safetensors"));
    args.insert(args.end(), {"--mem-budget", b});
    Proc p = run_vlac(args);
    EXPECT_EQ(p.rc, 2) << b << ": " << p.out;
    EXPECT_FALSE(exists(d.file("o.safetensors")));
  }
}

// Copies a policy folder's side files and rewrites model.safetensors through `edit` (which may
// drop or change tensors).
void copy_policy(const std::string& from, const std::string& to,
                 const std::function<bool(TensorSpec*)>& keep) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from))
    if (e.path().filename() != "model.safetensors") fs::copy(e.path(), to + "/" + e.path().filename().string());
  auto src = SafetensorsFile::open(from + "/model.safetensors");
  ASSERT_TRUE(src.is_ok()) << src.status().message();
  std::vector<TensorSpec> specs;
  std::vector<const TensorInfo*> data;
  for (const TensorInfo& t : src->tensors()) {
    TensorSpec s{t.name, t.dtype, t.shape};
    if (!keep(&s)) continue;
    specs.push_back(s);
    data.push_back(&t);
  }
  auto w = SafetensorsWriter::create(to + "/model.safetensors", specs, src->metadata());
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t need = ir_bytes(specs[i]);
    std::string bytes(reinterpret_cast<const char*>(src->data(*data[i])), std::min<uint64_t>(need, data[i]->nbytes()));
    bytes.resize(size_t(need), '\0');
    ASSERT_TRUE(w->write(bytes.data(), bytes.size()).is_ok());
  }
  ASSERT_TRUE(w->finish().is_ok());
}

TEST(CompileCli, MissingOrMisshapenTensorExits2AndLeavesNothing) {
  auto src = SafetensorsFile::open(policy_of("tiny_a") + "/model.safetensors");
  ASSERT_TRUE(src.is_ok());
  std::string victim;
  for (const TensorInfo& t : src->tensors())
    if (t.name.find("language_model") != std::string::npos && t.name.find("q_proj") != std::string::npos) {
      victim = t.name;
      break;
    }
  ASSERT_FALSE(victim.empty());
  TempDir d("missing");
  copy_policy(policy_of("tiny_a"), d.file("policy"), [&](TensorSpec* s) { return s->name != victim; });
  fs::create_directories(d.file("out"));
  const std::string out = d.file("out/p.vlac");
  Proc p = run_vlac({"compile", d.file("policy"), "-o", out, "--quiet"});
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find(victim), std::string::npos) << "the error does not name the tensor: " << p.out;
  EXPECT_EQ(clitest::list_dir(d.file("out")), std::vector<std::string>{}) << "a failed compile left files";

  TempDir d2("misshapen");
  copy_policy(policy_of("tiny_a"), d2.file("policy"), [&](TensorSpec* s) {
    if (s->name == victim) s->shape.back() += 1;
    return true;
  });
  fs::create_directories(d2.file("out"));
  Proc q = run_vlac({"compile", d2.file("policy"), "-o", d2.file("out/p.vlac"), "--quiet"});
  EXPECT_EQ(q.rc, 2) << q.out;
  EXPECT_NE(q.out.find(victim), std::string::npos) << q.out;
  EXPECT_EQ(clitest::list_dir(d2.file("out")), std::vector<std::string>{});
}

std::vector<float> floats_of(const std::string& path, const std::string& key) {
  const std::string b = key.empty() ? std::string() : tensor_bytes(path, key);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// max |a - b| and the mean over actions (rows of `width`) of the cosine similarity.
std::pair<double, double> distance(const std::vector<float>& a, const std::vector<float>& b, size_t width) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, cos_sum = 0;
  const size_t rows = std::min(a.size(), b.size()) / width;
  for (size_t r = 0; r < rows; ++r) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t j = r * width; j < (r + 1) * width; ++j) {
      d = std::max(d, double(std::fabs(a[j] - b[j])));
      ab += double(a[j]) * b[j], aa += double(a[j]) * a[j], bb += double(b[j]) * b[j];
    }
    cos_sum += ab / std::sqrt(aa * bb);
  }
  return {d, rows ? cos_sum / double(rows) : 0.0};
}

// Sum of the bytes of the package's weights of dtype `dt` and the names they hold.
std::pair<uint64_t, std::set<std::string>> weights_of(const std::string& pkg_path, const std::string& dt) {
  auto pkg = Package::open(pkg_path);
  EXPECT_TRUE(pkg.is_ok()) << pkg.status().message();
  std::pair<uint64_t, std::set<std::string>> out{0, {}};
  if (!pkg.is_ok()) return out;
  for (const auto& e : pkg->manifest().engines)
    for (const auto& w : e.extra["weights"])
      if (w["dtype"] == dt && out.second.insert(w["name"].get<std::string>()).second) out.first += w["bytes"].get<uint64_t>();
  return out;
}

// The 8-bit packages (--dtype int8 / fp8: every bf16-all matrix as codes with per-row scales)
// against lerobot fp32, next to the bf16-all package they are made from (issue 14's FP8 bound:
// max |Δ| at most 2x the bf16 package's, mean per-action cosine >= 0.999). Weight bytes: each
// quantized matrix holds half the bytes of its bf16 form plus one fp32 scale per row.
TEST(CompileCli, Int8AndFp8PackagesStayNearLerobot) {
  for (const char* fx : {"tiny_a", "tiny_b", "tiny_b_absent_cam"}) {
    SCOPED_TRACE(fx);
    const std::string dir = kFixtures + "/" + fx;
    const std::vector<float> want = floats_of(dir + "/expected.safetensors", "action_normalized");
    const size_t width = size_t(read_json(policy_of(fx) + "/config.json")["max_action_dim"].get<int64_t>());
    std::map<std::string, std::pair<double, double>> dist;
    for (const char* dtype : {"bf16-all", "int8", "fp8"}) {
      const std::string pkg = package_for(fx, dtype, "512MiB");
      ASSERT_FALSE(pkg.empty());
      const std::string out = cache_dir().file(std::string("q-") + fx + "-" + dtype + ".safetensors");
      Proc p = run_vlac(run_args(pkg, fx, out));
      ASSERT_EQ(p.rc, 0) << p.out;
      dist[dtype] = distance(floats_of(out, "action_normalized"), want, width);
      std::printf("[ quant    ] %s %-8s vs lerobot fp32: max|d| %.4g, mean cosine %.6f\n", fx, dtype,
                  dist[dtype].first, dist[dtype].second);
    }
    const double bf16 = dist["bf16-all"].first;
    // INT8: 1.5-2.45x the bf16-all distance on these tiny random models (K of 32-160: the
    // per-weight errors barely average out), on every ISA path; the 2x holds on tiny_a
    // only (docs/quantization.md). 2.5x is the regression bound.
    EXPECT_LE(dist["int8"].first, 2.5 * bf16);
    EXPECT_GE(dist["int8"].second, 0.999);
    // FP8 (3 fraction bits) on uniform random weights: 7-10x, cosine still >= 0.999.
    EXPECT_GE(dist["fp8"].second, 0.999);
    EXPECT_LE(dist["fp8"].first, 12 * bf16);
    // Bytes: every matrix the bf16-all package stores bf16 is 8-bit in the int8 one.
    const auto [bf16_bytes, bf16_names] = weights_of(package_for(fx, "bf16-all", "512MiB"), "BF16");
    for (const char* dt : {"I8", "F8_E4M3"}) {
      const auto [q_bytes, q_names] = weights_of(package_for(fx, dt == std::string("I8") ? "int8" : "fp8", "512MiB"), dt);
      EXPECT_EQ(q_names, bf16_names);
      uint64_t rows = 0, matrices = 0;
      auto pkg = Package::open(package_for(fx, "bf16-all", "512MiB"));
      ASSERT_TRUE(pkg.is_ok());
      std::set<std::string> seen;
      for (const auto& e : pkg->manifest().engines)
        for (const auto& w : e.extra["weights"])
          if (w["dtype"] == "BF16" && seen.insert(w["name"].get<std::string>()).second)
            rows += w["shape"][0].get<uint64_t>(), ++matrices;
      EXPECT_LE(q_bytes, bf16_bytes / 2 + 4 * rows + 64 * matrices) << dt;
      EXPECT_GT(q_bytes, bf16_bytes / 2) << dt;
    }
  }
}

// --dtype fp8 --activations e4m3 (W8A8): the same engine bytes as the fp8 package, the manifest's
// precision "fp8-w8a8", and on the CPU exactly the actions of the fp8 package run with every
// Linear's x rounded to e4m3 (VLAC_CPU_FP8_ACT=1), which differ from its W8A16 actions.
TEST(CompileCli, Fp8W8a8PackageRoundsItsActivations) {
  const std::string fx = "tiny_a";
  const std::string w8a16 = package_for(fx, "fp8", "512MiB");
  ASSERT_FALSE(w8a16.empty());
  const std::string w8a8 = cache_dir().file("tiny_a-fp8-w8a8.vlac");
  Proc c = run_vlac({"compile", policy_of(fx), "-o", w8a8, "--dtype", "fp8", "--activations", "e4m3", "--quiet"});
  ASSERT_EQ(c.rc, 0) << c.out;
  auto pa = Package::open(w8a8);
  auto pb = Package::open(w8a16);
  ASSERT_TRUE(pa.is_ok() && pb.is_ok());
  EXPECT_EQ(pa->manifest().policy.value("precision", std::string()), "fp8-w8a8");
  EXPECT_EQ(pb->manifest().policy.value("precision", std::string()), "fp8-weights");
  EXPECT_EQ(weights_of(w8a8, "F8_E4M3"), weights_of(w8a16, "F8_E4M3"));
  Proc ins = run_vlac({"inspect", w8a8});
  EXPECT_EQ(ins.rc, 0) << ins.out;
  EXPECT_NE(ins.out.find("policy: pi05, precision fp8-w8a8"), std::string::npos) << ins.out;

  const auto actions = [&](const std::string& pkg, const std::string& name, bool env) {
    const std::string out = cache_dir().file(name + ".safetensors");
    if (env) setenv("VLAC_CPU_FP8_ACT", "1", 1);
    Proc p = run_vlac(run_args(pkg, fx, out));
    if (env) unsetenv("VLAC_CPU_FP8_ACT");
    EXPECT_EQ(p.rc, 0) << p.out;
    if (name == "w8a8") {
      EXPECT_NE(p.out.find("fp8-w8a8 package"), std::string::npos) << p.out;
    }
    return tensor_bytes(out, "action_normalized");
  };
  const std::string a = actions(w8a8, "w8a8", false);
  const std::string emulated = actions(w8a16, "fp8-emulated", true);
  const std::string weights_only = actions(w8a16, "fp8-w8a16", false);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, emulated);
  EXPECT_NE(a, weights_only);
}

TEST(CompileCli, Int8NeedsEveryMatrixInBf16) {
  Pi05CompileOptions o;
  TempDir d("q8");
  o.out = d.file("p.vlac");
  o.bf16_all_matrices = false;
  o.weight_quant = DType::I8;
  auto r = compile_pi05(policy_of("tiny_a"), o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--dtype int8"), std::string::npos) << r.status().message();
  EXPECT_FALSE(exists(o.out));
  Proc p = run_vlac({"compile", policy_of("tiny_a"), "-o", d.file("x.vlac"), "--dtype", "int4", "--quiet"});
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("int8, fp8"), std::string::npos) << p.out;
  EXPECT_FALSE(exists(d.file("x.vlac")));
}

// A failure after engines were built (a side file that cannot be read): nothing at OUT, and the
// temporary engine folder is removed.
TEST(CompileCli, LateFailureRemovesTheEngineFolder) {
  // A processor file vanishes after every engine is built, while the package is written: the
  // compile fails naming it and leaves nothing beside OUT (no package, no engine folder).
  TempDir d("late");
  copy_policy(policy_of("tiny_a"), d.file("policy"), [](TensorSpec*) { return true; });
  fs::create_directories(d.file("out"));
  const std::string out = d.file("out/p.vlac");
  const std::string victim = d.file("policy/policy_postprocessor.json");
  ASSERT_TRUE(fs::exists(victim));
  Pi05CompileOptions o;
  o.out = out;
  o.engine_cap = 16 << 10;
  o.on_stage = [&](const std::string& stage) {
    if (stage == "package") fs::rename(victim, victim + ".away");
  };
  auto r = compile_pi05(d.file("policy"), o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("policy_postprocessor.json"), std::string::npos) << r.status().message();
  EXPECT_EQ(clitest::list_dir(d.file("out")), std::vector<std::string>{}) << "a failed compile left files";
  // With the file back the same folder compiles.
  fs::rename(victim + ".away", victim);
  Proc ok = run_vlac({"compile", d.file("policy"), "-o", out, "--engine-cap", "16KiB", "--quiet"});
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_EQ(clitest::list_dir(d.file("out")), std::vector<std::string>{"p.vlac"});
}

}  // namespace
}  // namespace vlac
