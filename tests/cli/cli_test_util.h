// Test helpers for CLI tests: run the vlac binary (VLAC_BINARY) and capture its output (both
// streams together, or apart), spawn it in the background, a temporary folder, file helpers.
// Test-only; never used by src/.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "temp_dir_util.h"

extern char** environ;

namespace vlac::clitest {

struct Proc {
  int rc = -1;      // exit code; -1 when killed by a signal
  int signal = 0;   // the signal that ended it, if any
  std::string out;  // stdout + stderr
};

/// Quotes one argument for /bin/sh.
inline std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Runs `vlac ARGS...` (each argument quoted), stdout and stderr captured together.
inline Proc run_vlac(const std::vector<std::string>& args) {
  std::string cmd = std::string(VLAC_BINARY);
  for (const auto& a : args) cmd.append(" ").append(sh_quote(a));
  cmd += " 2>&1";
  Proc p;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return p;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) p.out.append(buf, n);
  const int st = pclose(f);
  if (WIFEXITED(st)) p.rc = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) p.signal = WTERMSIG(st);
  return p;
}

/// Starts `vlac ARGS...` in the background, output to /dev/null; -1 on failure.
inline pid_t spawn_vlac(const std::vector<std::string>& args) {
  std::vector<std::string> all = {VLAC_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

using TempDir = testutil::TempDir;

using testutil::list_dir;

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

/// What `vlac` printed on each stream, and its exit code (-1 when a signal ended it).
struct Apart {
  int rc = -1;
  std::string out, err;
};

/// Runs `vlac SHELL_ARGS` through /bin/sh with stdout and stderr captured apart (in a temporary
/// folder removed on return). SHELL_ARGS is shell text: the caller quotes each argument (sh_quote)
/// and may add redirections such as `< FILE`.
inline Apart run_vlac_apart(const std::string& shell_args) {
  TempDir d("cli-apart");
  const std::string out = d.file("stdout"), err = d.file("stderr");
  const std::string cmd = sh_quote(VLAC_BINARY) + " " + shell_args + " >" + sh_quote(out) + " 2>" + sh_quote(err);
  const int st = std::system(cmd.c_str());
  Apart r;
  if (WIFEXITED(st)) r.rc = WEXITSTATUS(st);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

}  // namespace vlac::clitest
