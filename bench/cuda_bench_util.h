// What the CUDA bench programs share: exit with the failing call on an error (CK for the CUDA
// runtime, SK for a vlac Status), prefixed with the program's name, and device allocations.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

#define CK(expr)                                                                                        \
  do {                                                                                                  \
    const cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)
#define SK(expr)                                                                                        \
  do {                                                                                                  \
    const ::vlac::Status s_ = (expr);                                                                   \
    if (!s_.is_ok()) {                                                                                  \
      std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, s_.message().c_str());            \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

// `bytes` of device memory, zeroed (exits on failure).
inline void* dalloc(size_t bytes) {
  void* p = nullptr;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMemset(p, 0, bytes));
  return p;
}

// n bf16 values made on the host by next(uniform), uniform() drawing from a seeded LCG in [0, 1)
// (the same stream for the same seed), copied to d.
template <typename F>
void fill_bf16_with(void* d, size_t n, uint32_t seed, F&& next) {
  std::vector<uint16_t> h(n);
  uint32_t s = seed * 2654435761u + 1;
  auto uniform = [&s] {
    s = s * 1664525u + 1013904223u;
    return float(s >> 8) / float(1 << 24);
  };
  for (size_t i = 0; i < n; ++i) h[i] = ::vlac::f32_to_bf16(next(uniform));
  CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
}

// A bench's JSON: into `path` (--out), or to standard output when there is none.
inline void emit_json(const std::string& text, const std::string& path) {
  if (path.empty()) {
    std::printf("%s\n", text.c_str());
    return;
  }
  std::ofstream f(path);
  f << text << "\n";
}

// Uniform bf16 in [-a, a), filled on the host once per buffer.
inline void fill_bf16_uniform(void* d, size_t n, uint32_t seed, float a) {
  fill_bf16_with(d, n, seed, [a](auto& uniform) { return (uniform() * 2.f - 1.f) * a; });
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over reps of one graph replay of `calls` enqueued by fn(i), per call (ms); two eager
// calls first (module load, cuBLASLt plans).
template <typename F>
double graph_ms(cudaStream_t st, int reps, int calls, F&& fn) {
  for (int i = 0; i < 2; ++i) fn(i);
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) fn(i);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    if (r >= 2) ms.push_back(double(t) / calls);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return median(ms);
}
