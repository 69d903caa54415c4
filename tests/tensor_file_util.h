// Test helper: one tensor of a safetensors file as a vector (fixtures' expected actions and tokens,
// a run's output). Test-only; never used by src/.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace vlac::testutil {

/// The bytes of tensor `key` of `path` as T values; a test failure and an empty vector when either
/// is missing, or when the tensor's element size is not sizeof(T) (`want`, if given, is the dtype
/// the caller expects).
template <typename T>
std::vector<T> read_tensor(const std::string& path, const std::string& key, std::optional<DType> want = {}) {
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  if (!f.is_ok()) return {};
  const TensorInfo* t = f->find(key);
  EXPECT_NE(t, nullptr) << path << ": no tensor " << key;
  if (!t) return {};
  const bool fits = want ? t->dtype == *want : dtype_size(t->dtype) == sizeof(T);
  EXPECT_TRUE(fits) << path << ": " << key << " has dtype " << dtype_name(t->dtype);
  if (!fits) return {};
  std::vector<T> v(t->nbytes() / sizeof(T));
  std::memcpy(v.data(), f->data(*t), t->nbytes());
  return v;
}

/// The F32 tensor `key` of `path`.
inline std::vector<float> read_f32(const std::string& path, const std::string& key) {
  return read_tensor<float>(path, key, DType::F32);
}

}  // namespace vlac::testutil
