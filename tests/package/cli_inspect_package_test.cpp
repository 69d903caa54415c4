// `vlac inspect OUT.vlac [--verify] [--json]` end to end through the built CLI (VLAC_BINARY):
// listing, exact bytes in JSON, exit 2 with the segment named on a flipped byte.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "package/package.h"
#include "package/package_writer.h"
#include "cli/cli_test_util.h"
#include "package_test_util.h"

namespace vlac {
namespace {

using namespace pkgtest;
using nlohmann::json;
using package::SegmentKind;

// `vlac ARGS` (shell text, quoted by the caller), stdout and stderr apart.
using CliRun = clitest::Apart;
CliRun run_vlac(const std::string& args) { return clitest::run_vlac_apart(args); }

std::string write_demo(const TempDir& dir, const std::string& name) {
  std::string path = dir.file(name);
  PackageWriter w(path);
  EXPECT_TRUE(w.add_bytes("engine/0", SegmentKind::Engine, pattern(100'000, 1)).is_ok());
  EXPECT_TRUE(w.add_bytes("engine/1", SegmentKind::Engine, pattern(70'000, 2)).is_ok());
  EXPECT_TRUE(w.add_bytes("stats", SegmentKind::Stats, pattern(300, 3)).is_ok());
  w.set_manifest(two_engine_manifest("stats"));
  auto r = w.finish();
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return path;
}

TEST(CliInspectPackage, TextAndJson) {
  TempDir dir;
  std::string p = write_demo(dir, "demo.vlac");
  CliRun t = run_vlac("inspect --quiet --verify " + clitest::sh_quote(p));
  ASSERT_EQ(t.rc, 0) << t.err;
  for (const char* want : {"engines (run order): 2", "prefix", "expert", "engine/1", "segments: 3", "stats",
                           "crossing values: 1", "state_emb", "prefix -> expert", "normalization: segment 'stats'",
                           "tokenizer: none", "verify: all 3 segment checksums match"})
    EXPECT_NE(t.out.find(want), std::string::npos) << want << "\n" << t.out;

  CliRun j = run_vlac("inspect --quiet --json " + clitest::sh_quote(p));
  ASSERT_EQ(j.rc, 0) << j.err;
  json o = json::parse(j.out, nullptr, false);
  ASSERT_FALSE(o.is_discarded()) << j.out;
  auto pkg = Package::open(p);
  ASSERT_TRUE(pkg.is_ok());
  EXPECT_EQ(o["file_size"], pkg->file_size());
  EXPECT_EQ(o["format_version"], 1);
  ASSERT_EQ(o["segments"].size(), 3u);
  EXPECT_EQ(o["segments"][1]["name"], "engine/1");
  EXPECT_EQ(o["segments"][1]["size"], 70'000);
  EXPECT_EQ(o["segments"][1]["offset"], pkg->segments()[1].offset);
  EXPECT_EQ(o["engines"][0]["size"], 100'000);
  EXPECT_EQ(o["totals"]["engine_bytes"], 170'000);
  EXPECT_EQ(o["verified"], nullptr);
  EXPECT_EQ(o["crossing"][0]["bytes"], 4096);

  // Dispatch on the magic too, whatever the file is called.
  std::string renamed = dir.file("demo.bin");
  ASSERT_EQ(std::rename(p.c_str(), renamed.c_str()), 0);
  CliRun m = run_vlac("inspect --quiet " + clitest::sh_quote(renamed));
  EXPECT_EQ(m.rc, 0) << m.err;
  EXPECT_NE(m.out.find("segments: 3"), std::string::npos) << m.out;
}

TEST(CliInspectPackage, VerifyFailsWithExit2NamingTheSegment) {
  TempDir dir;
  std::string p = write_demo(dir, "bad.vlac");
  std::string b = read_file(p);
  auto pkg = Package::open(p);
  ASSERT_TRUE(pkg.is_ok());
  b[pkg->find("engine/1")->offset + 1234] ^= 0x40;
  write_file(p, b);
  CliRun plain = run_vlac("inspect --quiet " + clitest::sh_quote(p));
  EXPECT_EQ(plain.rc, 0) << "without --verify only the layout is checked";
  CliRun v = run_vlac("inspect --quiet --verify " + clitest::sh_quote(p));
  EXPECT_EQ(v.rc, 2) << v.err;
  EXPECT_NE(v.err.find(p + ": segment 'engine/1': checksum mismatch"), std::string::npos) << v.err;
  CliRun vj = run_vlac("inspect --quiet --verify --json " + clitest::sh_quote(p));
  EXPECT_EQ(vj.rc, 2);
  json o = json::parse(vj.out, nullptr, false);
  ASSERT_FALSE(o.is_discarded()) << vj.out;
  EXPECT_EQ(o["verified"], false);

  // Truncated: rejected at open, exit 2, one line.
  write_file(p, b.substr(0, b.size() - 10));
  CliRun t = run_vlac("inspect --quiet " + clitest::sh_quote(p));
  EXPECT_EQ(t.rc, 2);
  EXPECT_NE(t.err.find(p + ": truncated"), std::string::npos) << t.err;
}

}  // namespace
}  // namespace vlac
