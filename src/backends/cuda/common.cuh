// Device-side helpers shared by the .cu files: bf16 <-> fp32 with the CPU's rounding, typed loads
// and stores over F32/BF16 activations, and the launch-status helper.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "core/status.h"
#include "backends/cuda/kernels.h"

namespace vlac::cuda {

/// Backend "<kernel>: <CUDA error string>" if the launch just made (or an earlier asynchronous
/// failure) left an error, else ok.
inline Status launch_status(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::ok();
  return Status(StatusCode::Backend, std::string(kernel) + ": " + cudaGetErrorString(e));
}

// Programmatic dependent launch (Hopper): every vlac kernel is launched allowed to start while
// the kernel before it in the stream drains, and waits (pdl_wait, first thing) until that one is
// complete and its writes visible. What overlaps is the launch and the block scheduling, so a
// chain of small kernels (an expert step is ~300) loses most of its gaps; the arithmetic and
// every memory access stay ordered exactly as before. VLAC_CUDA_PDL=0 turns it off; GPUs before
// sm_90 launch as before.
// -DVLAC_CUDA_PDL_TRIGGER=1 also lets the next kernel launch as soon as this one's blocks have all
// started (griddepcontrol.launch_dependents right after the wait; safe, since the wait is for the
// whole previous grid). Off: on the H200 whole recorded chunks ran 0.5 ms slower with it (session
// 12: 21.36-21.47 ms against 20.92 ms with PDL off altogether, one machine start).
#ifndef VLAC_CUDA_PDL_TRIGGER
#define VLAC_CUDA_PDL_TRIGGER 0
#endif
// Lets the next kernel in the stream launch now (it still waits for this grid's completion in its
// own pdl_wait): for one edge at a time where the successor has independent loads to start.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#if VLAC_CUDA_PDL_TRIGGER
  pdl_launch_dependents();
#endif
#endif
}
template <typename... P, typename... A>
inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned na = 0;
  if (pdl_enabled()) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (const L2Window& w = current_l2_window(); w.bytes) {
    attr[na].id = cudaLaunchAttributeAccessPolicyWindow;
    attr[na].val.accessPolicyWindow.base_ptr = const_cast<void*>(w.base);
    attr[na].val.accessPolicyWindow.num_bytes = w.bytes;
    attr[na].val.accessPolicyWindow.hitRatio = w.hit_ratio;
    attr[na].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr[na++].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    note_l2_window_launch();
  }
  cfg.attrs = na ? attr : nullptr;
  cfg.numAttrs = na;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);  // an error stays for launch_status
}

// A grid-stride loop over [0, n).
#define VLAC_GRID_LOOP(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

inline bool is_act(DType t) { return t == DType::F32 || t == DType::BF16; }
inline Status bad_dtype(const char* kernel) {
  return unsupported(std::string(kernel) + ": activations must be F32 or BF16");
}

// Round to nearest even, NaN kept (the same bits as vlac::f32_to_bf16 on the host).
__device__ __forceinline__ uint16_t f2bf(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

// FP8 e4m3fn (s.eeee.mmm, bias 7, no Inf, S.1111.111 NaN) to fp32, as f8e4m3_to_f32 on the host.
__device__ __forceinline__ float e4m3_to_f32(uint32_t v) {
  const uint32_t s = (v >> 7) & 1u, e = (v >> 3) & 15u, m = v & 7u;
  if (e == 15u && m == 7u) return __uint_as_float(0x7FC00000u | (s << 31));
  const float r = e == 0u ? float(m) * 0x1p-9f : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return s ? -r : r;
}

// fp32 to FP8 e4m3fn, nearest even, saturating at ±448, NaN kept (the bits of f32_to_f8e4m3).
__device__ __forceinline__ uint8_t f32_to_e4m3(float v) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Maximum of v over the block (every thread gets it). `red` holds one float per warp (<= 32); it
// may have been used by an earlier reduction (a barrier comes first).
__device__ __forceinline__ float block_max(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float m = red[0];
  for (int i = 1; i < int(blockDim.x / 32); ++i) m = fmaxf(m, red[i]);
  return m;
}

// FP8 W8A8's row scale, for the kernels that write a GEMM's x as e4m3 codes, one block a row
// (quantize_rows_e4m3, the norms' NormArgs::codes, geglu_e4m3): each thread's max|v| and whether
// it saw a NaN (fmaxf drops NaN), reduced over the block; thread 0 writes *scale = amax / 448
// (NaN for a row with a NaN). Returns 448 / amax, the codes' multiplier (0 for a zero or NaN row).
__device__ __forceinline__ float e4m3_row_inv(float amax, bool nan, float* red, float* scale) {
  amax = block_max(amax, red);
  if (block_max(nan ? 1.0f : 0.0f, red) > 0.0f) amax = __int_as_float(0x7FC00000);
  if (threadIdx.x == 0) *scale = amax / 448.0f;
  return amax > 0.0f ? 448.0f / amax : 0.0f;
}

// GELU, tanh form (pi0.5's gelu_pytorch_tanh; cuBLASLt's GELU epilogue is the same function).
__device__ __forceinline__ float gelu_tanh_1(float v) {
  // 0.5·v·(1 + tanh(z)) = v / (1 + e^(−2z)), z = √(2/π)·(v + 0.044715·v³); expf, not __expf:
  // the fast one loses ~1e-6 relative at large |z|.
  constexpr float kC2 = 2.0f * 0.7978845608028654f;
  return v / (1.0f + expf(-kC2 * (v + 0.044715f * v * v * v)));
}

// RoPE's rotation of one pair, its products and sums rounded as written (no FMA contraction left
// to the compiler), so every kernel that rotates (rope, rope_pair, rope_qkv, the attention's fused
// RoPE) gives the same bits.
__device__ __forceinline__ void rotate(float x0, float x1, float s, float c, float* y0, float* y1) {
  *y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  *y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

// Element access over F32 (float) and BF16 (uint16_t) arrays.
template <typename T> __device__ __forceinline__ float ld(const T* p, int64_t i);
template <> __device__ __forceinline__ float ld<float>(const float* p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float ld<uint16_t>(const uint16_t* p, int64_t i) { return bf2f(p[i]); }
template <typename T> __device__ __forceinline__ void st(T* p, int64_t i, float v);
template <> __device__ __forceinline__ void st<float>(float* p, int64_t i, float v) { p[i] = v; }
template <> __device__ __forceinline__ void st<uint16_t>(uint16_t* p, int64_t i, float v) { p[i] = f2bf(v); }
// The value as an array of T would hold it (bf16 rounding for uint16_t).
template <typename T> __device__ __forceinline__ float as_stored(float v) {
  if constexpr (sizeof(T) == 2) return round_bf(v); else return v;
}

// Calls fn.template operator()<Tx, Ty>() for the two activation dtypes (F32 -> float, BF16 ->
// uint16_t); the caller checked is_act() for both.
template <typename F>
inline Status dispatch2(DType xt, DType yt, F&& fn) {
  if (xt == DType::F32 && yt == DType::F32) return fn.template operator()<float, float>();
  if (xt == DType::F32) return fn.template operator()<float, uint16_t>();
  if (yt == DType::F32) return fn.template operator()<uint16_t, float>();
  return fn.template operator()<uint16_t, uint16_t>();
}

inline unsigned grid_1d(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return unsigned(b < cap ? b : cap);
}

}  // namespace vlac::cuda
