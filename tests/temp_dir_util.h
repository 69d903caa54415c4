// A temporary folder for a test, removed with everything in it when the object goes. One class for
// every test helper header (cli/cli_test_util.h, io/st_test_util.h, package/package_test_util.h).
// Test-only; never used by src/.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace vlac::testutil {

/// Names in a folder, hidden ones included (empty when it does not exist).
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  return out;
}

class TempDir {
 public:
  /// Made under $TMPDIR (else /tmp) as vlac-TAG-XXXXXX.
  explicit TempDir(const std::string& tag = "test") {
    std::string t = (std::filesystem::temp_directory_path() / ("vlac-" + tag + "-XXXXXX")).string();
    char* p = mkdtemp(t.data());
    if (p == nullptr) ADD_FAILURE() << "mkdtemp failed for " << t;
    path_ = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  /// Names in the folder, hidden ones (a writer's temporaries) included.
  std::vector<std::string> entries() const { return list_dir(path_); }

 private:
  std::string path_;
};

}  // namespace vlac::testutil
