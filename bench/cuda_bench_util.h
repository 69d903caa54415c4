// What the CUDA bench programs share: exit with the failing call on an error (CK for the CUDA
// runtime, SK for a vlac Status), prefixed with the program's name, and device allocations.
#pragma once

#include <cuda_runtime_api.h>

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
