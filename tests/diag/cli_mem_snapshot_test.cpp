// `vlac mem snapshot` end to end: text, --json, --html (self-contained; rendered by headless
// Chromium when it is installed), and exit 2 with one line for every kind of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_test_util.h"

namespace vlac {
namespace {

namespace fs = std::filesystem;

using clitest::sh_quote;
std::string slurp(const fs::path& p) { return clitest::read_file(p.string()); }
using CliResult = clitest::Apart;
CliResult run_vlac(const std::string& args) { return clitest::run_vlac_apart(args); }

std::string fixture(const std::string& name) { return std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/snapshots/" + name; }

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(CliMemSnapshot, TextNamesTheLeak) {
  CliResult r = run_vlac("mem snapshot --quiet " + sh_quote(fixture("leak.pickle")));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("shape: STAIRCASE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("leaky_train_step"), std::string::npos);
  EXPECT_NE(r.out.find("fix the leak"), std::string::npos);
}

TEST(CliMemSnapshot, JsonHasTheDiagnosis) {
  struct Case {
    const char* file;
    const char* shape;
  };
  for (Case c : {Case{"steady.pickle", "flat"}, Case{"activations.pickle", "sawtooth"}, Case{"leak.pickle", "staircase"},
                 Case{"oom.pickle", "sawtooth"}, Case{"noprofile.pickle", "unknown"}}) {
    CliResult r = run_vlac("mem snapshot --quiet --json " + sh_quote(fixture(c.file)));
    ASSERT_EQ(r.rc, 0) << c.file << ": " << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["shape"], c.shape) << c.file;
    for (const char* k : {"peak_allocated_bytes", "parts", "top_sites", "levers", "timeline", "steps", "notes", "oom", "leak"})
      EXPECT_TRUE(j.contains(k)) << c.file << " lacks " << k;
    if (std::string(c.file) == "leak.pickle") {
      EXPECT_EQ(j["top_sites"][0]["function"], "leaky_train_step");
      EXPECT_EQ(j["levers"][0]["part"], "staircase");
      EXPECT_GT(j["parts"]["staircase_bytes"].get<uint64_t>(), 0u);
    }
    if (std::string(c.file) == "oom.pickle") {
      EXPECT_EQ(j["oom"]["requested_bytes"].get<uint64_t>(), 512ull << 20);
    }
  }
}

TEST(CliMemSnapshot, BadInputIsExitTwoAndOneLine) {
  clitest::TempDir tmp("snapshot-cli");
  const fs::path d = tmp.path();
  std::ofstream(d / "text.pickle") << "this is not a pickle\n";
  std::string leak = slurp(fixture("leak.pickle"));
  std::ofstream(d / "cut.pickle", std::ios::binary) << leak.substr(0, leak.size() / 2);
  std::ofstream(d / "evil.pickle", std::ios::binary) << "cos\nsystem\n(S'touch " + (d / "pwned").string() + "'\ntR.";
  std::ofstream(d / "list.pickle", std::ios::binary) << std::string("\x80\x04]\x94.", 5);
  std::ofstream(d / "empty.pickle", std::ios::binary);
  struct Case {
    std::string args;
    std::string needle;
  };
  std::vector<Case> cases = {
      {sh_quote((d / "missing.pickle").string()), "no such file"},
      {sh_quote((d / "text.pickle").string()), "offset"},
      {sh_quote((d / "cut.pickle").string()), "truncated"},
      {sh_quote((d / "evil.pickle").string()), "not a PyTorch memory snapshot"},
      {sh_quote((d / "list.pickle").string()), ""},  // an empty segment list is a valid (empty) snapshot
      {sh_quote((d / "empty.pickle").string()), "empty input"},
      {sh_quote(d.string()), "is a folder"},
      {sh_quote(fixture("leak.pickle")) + " --device 5", "device 5"},
      {sh_quote(fixture("leak.pickle")) + " --top nope", ""},
  };
  for (const Case& c : cases) {
    CliResult r = run_vlac("mem snapshot --quiet " + c.args);
    if (c.args.find("list.pickle") != std::string::npos) {
      EXPECT_EQ(r.rc, 0) << r.err;
      continue;
    }
    EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.err;
    if (c.args.find("--top nope") != std::string::npos) continue;  // CLI11's own message
    EXPECT_EQ(lines(r.err), 1u) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("vlac mem snapshot: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "pwned")) << "the pickle's payload ran";
}

TEST(CliMemSnapshot, HtmlIsSelfContainedAndAtomic) {
  clitest::TempDir tmp("snapshot-cli");
  const fs::path d = tmp.path();
  fs::path out = d / "leak.html";
  CliResult r = run_vlac("mem snapshot --quiet " + sh_quote(fixture("leak.pickle")) + " --html " + sh_quote(out.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("html: " + out.string()), std::string::npos);
  std::string html = slurp(out);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("leaky_train_step"), std::string::npos);
  // Nothing to fetch: no scripts, links, imports, images or external URLs (the SVG namespace
  // attribute is an identifier, not a fetch).
  for (const char* bad : {"<script", "<link", "@import", "url(", "src=", "href=", "https://"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  size_t http = html.find("http://");
  while (http != std::string::npos) {
    EXPECT_EQ(html.compare(http, 26, "http://www.w3.org/2000/svg"), 0);
    http = html.find("http://", http + 1);
  }
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename().string().find(".vlac-tmp"), std::string::npos) << "temporary left behind";
}

TEST(CliMemSnapshot, HtmlRendersInHeadlessChromium) {
  std::string chromium;
  for (const char* c : {"chromium", "chromium-browser"}) {
    for (const char* dir : {"/usr/bin/", "/usr/local/bin/", "/bin/"})
      if (chromium.empty() && access((std::string(dir) + c).c_str(), X_OK) == 0) chromium = std::string(dir) + c;
  }
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (Debian: apt-get install chromium); HTML render not checked";
  clitest::TempDir tmp("snapshot-cli");
  const fs::path d = tmp.path();
  fs::path out = d / "oom.html";
  CliResult r = run_vlac("mem snapshot --quiet " + sh_quote(fixture("oom.pickle")) + " --html " + sh_quote(out.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string flags = " --headless --no-sandbox --disable-gpu --user-data-dir=" + sh_quote((d / "profile").string()) + " ";
  std::string url = sh_quote("file://" + out.string());
  std::string dom_cmd = "timeout 120 " + chromium + flags + "--dump-dom " + url + " 2>/dev/null";
  std::string dom;
  FILE* p = popen(dom_cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) dom.append(buf, n);
  int st = pclose(p);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "chromium --dump-dom failed: " << st;
  EXPECT_NE(dom.find("<svg"), std::string::npos) << dom.substr(0, 500);
  EXPECT_NE(dom.find("id=\"timeline\""), std::string::npos);
  EXPECT_NE(dom.find("<polygon"), std::string::npos);
  EXPECT_NE(dom.find("id=\"oom\""), std::string::npos);
  fs::path png = d / "shot.png";
  std::string shot = "timeout 120 " + chromium + flags + "--hide-scrollbars --window-size=1200,900 --screenshot=" +
                     sh_quote(png.string()) + " " + url + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(shot.c_str()), 0);
  ASSERT_TRUE(fs::exists(png));
  EXPECT_GT(fs::file_size(png), 10000u);  // a blank page compresses to far less
}

}  // namespace
}  // namespace vlac
