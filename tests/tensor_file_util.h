// Test helper: one F32 tensor of a safetensors file as floats (fixtures' expected actions, a run's
// output). Test-only; never used by src/.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace vlac::testutil {

/// The F32 tensor `key` of `path`; a test failure and an empty vector when either is missing.
inline std::vector<float> read_f32(const std::string& path, const std::string& key) {
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  if (!f.is_ok()) return {};
  const TensorInfo* t = f->find(key);
  EXPECT_NE(t, nullptr) << path << ": no tensor " << key;
  if (!t) return {};
  EXPECT_EQ(t->dtype, DType::F32) << path << ": " << key << " is not F32";
  if (t->dtype != DType::F32) return {};
  std::vector<float> v(size_t(t->numel()));
  std::memcpy(v.data(), f->data(*t), t->nbytes());
  return v;
}

}  // namespace vlac::testutil
