// Helpers of the CUDA op-by-op harness: a skipping fixture, device buffers, random data and error
// measures. Every kernel is checked against the CPU backend's kernel (or, for the bf16 attention,
// a host emulation of lerobot's bf16 rounding points) on fresh random inputs; outputs are poisoned
// with NaN before each launch so an element the kernel never wrote fails the check.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "core/dtype.h"

namespace vlac::cuda::testing {

#define VLAC_CUDA_OK(expr)                                       \
  do {                                                           \
    const ::vlac::Status vlac_st_ = (expr);                      \
    ASSERT_TRUE(vlac_st_.is_ok()) << vlac_st_.message();         \
  } while (0)
#define VLAC_CUDART_OK(expr)                                     \
  do {                                                           \
    const cudaError_t vlac_e_ = (expr);                          \
    ASSERT_EQ(vlac_e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(vlac_e_); \
  } while (0)

/// Skips every test of a suite with "no CUDA device: <cudaGetErrorString>" where there is none.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status s = device_status();
    if (!s.is_ok()) GTEST_SKIP() << s.message();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  /// Waits for the stream and fails on any asynchronous error.
  void sync() {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  }
  cudaStream_t stream_ = nullptr;
};

/// A device allocation (freed on destruction).
class DevBuf {
 public:
  explicit DevBuf(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&p_, bytes ? bytes : 1) != cudaSuccess) p_ = nullptr;
  }
  ~DevBuf() { if (p_) cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void* get() const { return p_; }
  template <typename T> T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  void poison() { cudaMemset(p_, 0xFF, bytes_); }  // 0xFF.. is NaN in fp32 and bf16
 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
inline void upload(DevBuf& d, const std::vector<T>& h) {
  ASSERT_NE(d.get(), nullptr);
  ASSERT_EQ(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T>
inline std::vector<T> download(const DevBuf& d, size_t n) {
  std::vector<T> h(n);
  if (cudaMemcpy(h.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) h.clear();
  return h;
}
template <typename T>
inline std::unique_ptr<DevBuf> to_device(const std::vector<T>& h) {
  auto d = std::make_unique<DevBuf>(h.size() * sizeof(T));
  cudaMemcpy(d->get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

inline std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}
/// x rounded to bf16 and back (the values a bf16 tensor holds).
inline std::vector<float> bf16_values(std::vector<float> x) {
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
  return x;
}

/// max |a − b| / max |b| over the tensor (infinite if a has a NaN or the sizes differ).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}

}  // namespace vlac::cuda::testing
