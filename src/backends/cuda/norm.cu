// RMSNorm (1 + w), adaptive RMSNorm, LayerNorm and the gated residual fused with the next norm.
// One block per row; per-thread fp32 partial sums reduced through warp shuffles, then shared memory.
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/env.h"
#include "backends/cuda/kernels.h"

namespace vlac::cuda {
namespace {

constexpr int kThreads = 256;

// Sum of v over the block (every thread gets it). `red` holds one float per warp. W: the block's
// warps when known at compile time (kThreads / 32), 0 for any whole number of warps (<= 32).
template <int W>
__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  const int warps = W > 0 ? W : int(blockDim.x / 32);
  for (int i = 0; i < warps; ++i) s += red[i];
  return s;
}

// y = norm(x) for one row, x read through Tx (the stored values), y written as Ty.
template <typename Tx, typename Ty>
__device__ void norm_row(const Tx* xr, Ty* yr, int64_t d, NormKind kind, const float* w, const float* b,
                         const float* mod, float eps, float* red) {
  if (kind == NormKind::Layer) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) s += ld(xr, i);
    const float mean = block_sum<kThreads / 32>(s, red) / float(d);
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) {
      const float c = ld(xr, i) - mean;
      v += c * c;
    }
    const float inv = rsqrtf(block_sum<kThreads / 32>(v, red) / float(d) + eps);
    for (int64_t i = threadIdx.x; i < d; i += kThreads) st(yr, i, (ld(xr, i) - mean) * inv * w[i] + b[i]);
    return;
  }
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    const float v = ld(xr, i);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum<kThreads / 32>(ss, red) / float(d) + eps);
  if (kind == NormKind::Rms) {
    for (int64_t i = threadIdx.x; i < d; i += kThreads) st(yr, i, (ld(xr, i) * inv) * (1.0f + w[i]));
  } else {
    for (int64_t i = threadIdx.x; i < d; i += kThreads)
      st(yr, i, (ld(xr, i) * inv) * (1.0f + mod[i]) + mod[d + i]);
  }
}

template <typename Tx, typename Ty>
__global__ void __launch_bounds__(kThreads) norm_kernel(const Tx* x, Ty* y, int64_t d, NormKind kind, const float* w,
                                                         const float* b, const float* mod, float eps) {
  pdl_wait();
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x;
  norm_row(x + r * d, y + r * d, d, kind, w, b, mod, eps, red);
}

// h_out = h_in + branch ⊙ gate (rounded as Th stores it; h_out may be h_in), then y = norm(h_out).
// The gate product is __fmul_rn so it is never contracted into an FMA with the sum: the same bits
// as a separate multiply and add (the unfused ops and the CPU).
template <typename Th, typename Tb, typename Ty>
__global__ void __launch_bounds__(kThreads) residual_norm_kernel(const Th* h_in, Th* h, const Tb* branch,
                                                                  const float* gate, Ty* y, int64_t d, NormKind kind,
                                                                  const float* w, const float* b, const float* mod,
                                                                  float eps, int parts, int64_t part_stride) {
  pdl_wait();
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x;
  const Th* hi = h_in + r * d;
  Th* hr = h + r * d;
  const Tb* br = branch + r * d;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    float add = ld(br, i);
    for (int q = 1; q < parts; ++q) add += ld(br + q * part_stride, i);  // K parts, in order
    if (gate) add = as_stored<Th>(__fmul_rn(add, as_stored<Th>(gate[i])));
    st(hr, i, ld(hi, i) + add);
  }
  // Each thread re-reads only its own elements, so no barrier is needed before norm_row.
  if (kind != NormKind::None) norm_row(static_cast<const Th*>(hr), y + r * d, d, kind, w, b, mod, eps, red);
}

// Rows of d % 4 == 0 elements with aligned pointers (every pi0.5 norm): the same arithmetic as
// the two kernels above, with each thread owning C runs of 4 adjacent columns. Every load of a
// row (h, the K parts, the gate, then the norm's w / b / mod) is issued before the first
// reduction, so a row costs about one memory latency instead of one per dependent step: these
// are latency-bound at the expert's 50 rows (session 15: 7.4-7.6 us each, two a layer). Only the
// order of the fp32 sum of squares differs from the scalar kernels (its last bits).
template <typename T> __device__ __forceinline__ void ld4(const T* p, int64_t i, float* v);
template <> __device__ __forceinline__ void ld4<float>(const float* p, int64_t i, float* v) {
  const float4 q = *reinterpret_cast<const float4*>(p + i);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
template <> __device__ __forceinline__ void ld4<uint16_t>(const uint16_t* p, int64_t i, float* v) {
  const uint2 q = *reinterpret_cast<const uint2*>(p + i);
  v[0] = bf2f(uint16_t(q.x & 0xffffu)), v[1] = bf2f(uint16_t(q.x >> 16));
  v[2] = bf2f(uint16_t(q.y & 0xffffu)), v[3] = bf2f(uint16_t(q.y >> 16));
}
template <typename T> __device__ __forceinline__ void st4(T* p, int64_t i, const float* v);
template <> __device__ __forceinline__ void st4<float>(float* p, int64_t i, const float* v) {
  *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
}
template <> __device__ __forceinline__ void st4<uint16_t>(uint16_t* p, int64_t i, const float* v) {
  *reinterpret_cast<uint2*>(p + i) = make_uint2(uint32_t(f2bf(v[0])) | (uint32_t(f2bf(v[1])) << 16),
                                                uint32_t(f2bf(v[2])) | (uint32_t(f2bf(v[3])) << 16));
}

// branch null: no residual (x = h_in, nothing written to h).
// kCodes (NormArgs::codes): y is not written; the row as Ty would store it is quantized to e4m3
// with quantize_rows_e4m3's arithmetic (amax, NaN noted apart, codes of v · 448 / amax, scale
// amax / 448) into codes and scales, the FP8 GEMM's x, with no launch of its own.
template <typename Th, typename Tb, typename Ty, int C, bool kCodes>
__global__ void __launch_bounds__(1024) norm4_kernel(const Th* h_in, Th* h, const Tb* branch, const float* gate, Ty* y,
                                                     int64_t d, NormKind kind, const float* w, const float* b,
                                                     const float* mod, float eps, int parts, int64_t part_stride,
                                                     uint8_t* codes, float* scales) {
  pdl_wait();
  __shared__ float red[32];
  const int64_t row = int64_t(blockIdx.x) * d;
  float v[C][4], p0[C][4], p1[C][4];
  bool ok[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t e = 4 * (int64_t(threadIdx.x) + int64_t(c) * blockDim.x);
    ok[c] = e < d;
    if (!ok[c]) continue;
    ld4(h_in + row, e, v[c]);
    float a[4], g[4];
    if (branch) {
      ld4(branch + row, e, a);
      for (int q = 1; q < parts; ++q) {  // K parts, in order
        float t[4];
        ld4(branch + q * part_stride + row, e, t);
#pragma unroll
        for (int k = 0; k < 4; ++k) a[k] += t[k];
      }
      if (gate) ld4(gate, e, g);
    }
    if (kind == NormKind::Rms || kind == NormKind::Layer) ld4(w, e, p0[c]);
    if (kind == NormKind::Layer) ld4(b, e, p1[c]);
    if (kind == NormKind::AdaRms) ld4(mod, e, p0[c]), ld4(mod + d, e, p1[c]);
    if (branch) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (gate) a[k] = as_stored<Th>(__fmul_rn(a[k], as_stored<Th>(g[k])));
        v[c][k] = v[c][k] + a[k];
      }
      st4(h + row, e, v[c]);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[c][k] = as_stored<Th>(v[c][k]);
    }
  }
  if (kind == NormKind::None) return;
  float mean = 0.0f;
  if (kind == NormKind::Layer) {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (ok[c]) s += (v[c][0] + v[c][1]) + (v[c][2] + v[c][3]);
    mean = block_sum<0>(s, red) / float(d);
  }
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < C; ++c)
    if (ok[c])
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float u = kind == NormKind::Layer ? v[c][k] - mean : v[c][k];
        ss += u * u;
      }
  const float inv = rsqrtf(block_sum<0>(ss, red) / float(d) + eps);
  float amax = 0.0f;
  bool nan = false;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if (!ok[c]) continue;
    const int64_t e = 4 * (int64_t(threadIdx.x) + int64_t(c) * blockDim.x);
    float o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (kind == NormKind::Layer) o[k] = (v[c][k] - mean) * inv * p0[c][k] + p1[c][k];
      else if (kind == NormKind::Rms) o[k] = (v[c][k] * inv) * (1.0f + p0[c][k]);
      else o[k] = (v[c][k] * inv) * (1.0f + p0[c][k]) + p1[c][k];
    }
    if constexpr (kCodes) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[c][k] = as_stored<Ty>(o[k]);  // the row y would hold, kept for the codes
        amax = fmaxf(amax, fabsf(v[c][k]));
        nan = nan || isnan(v[c][k]);
      }
    } else {
      st4(y + row, e, o);
    }
  }
  if constexpr (kCodes) {
    const float qinv = e4m3_row_inv(amax, nan, red, scales + blockIdx.x);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (!ok[c]) continue;
      const int64_t e = 4 * (int64_t(threadIdx.x) + int64_t(c) * blockDim.x);
      uint32_t q = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) q |= uint32_t(f32_to_e4m3(v[c][k] * qinv)) << (8 * k);
      *reinterpret_cast<uint32_t*>(codes + row + e) = q;
    }
  }
}

bool al16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
bool al8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }
template <typename T> bool al_vec(const void* p) { return sizeof(T) == 4 ? al16(p) : al8(p); }

// The 4-column kernel where it applies (d % 4 == 0, d <= 8192, every pointer aligned for its
// dtype's 4 elements): launches it and returns true.
bool norm4_on() {
  static const bool on = !env_off("VLAC_NORM_VEC");
  return on;
}

template <typename Th, typename Tb, typename Ty>
bool try_norm4(cudaStream_t stream, const Th* h_in, Th* h, const Tb* branch, const float* gate, Ty* y, int64_t rows,
               int64_t d, NormKind kind, const float* w, const float* b, const float* mod, float eps, int parts,
               int64_t part_stride, uint8_t* codes = nullptr, float* scales = nullptr) {
  // d <= 8192: at most 2 runs a thread, in registers (4 runs at 1024 threads took a stack frame).
  if (!norm4_on() || d % 4 != 0 || d > 8192) return false;
  if (!al_vec<Th>(h_in) || !al_vec<Th>(h) || (!codes && !al_vec<Ty>(y))) return false;
  if (codes && ((reinterpret_cast<uintptr_t>(codes) & 3u) != 0 || !scales)) return false;
  if (branch && (!al_vec<Tb>(branch) || (parts > 1 && (part_stride % 4) != 0))) return false;
  for (const float* f : {gate, w, b, mod})
    if (f && !al16(f)) return false;
  const int64_t runs = d / 4;
  const int c = runs <= 1024 ? 1 : 2;
  const int threads = int(((runs + c - 1) / c + 31) / 32 * 32);
  auto go = [&](auto kernel) {
    launch(kernel, unsigned(rows), unsigned(threads), 0, stream, h_in, h, branch, gate, y, d, kind, w, b, mod, eps, parts,
           part_stride, codes, scales);
  };
  if (codes) {
    if (c == 1) go(norm4_kernel<Th, Tb, Ty, 1, true>);
    else go(norm4_kernel<Th, Tb, Ty, 2, true>);
  } else {
    if (c == 1) go(norm4_kernel<Th, Tb, Ty, 1, false>);
    else go(norm4_kernel<Th, Tb, Ty, 2, false>);
  }
  return true;
}

Status check_rows(const char* kernel, int64_t rows, int64_t d) {
  if (rows < 0 || d <= 0 || rows > 0x7fffffff)
    return invalid_argument(std::string(kernel) + ": bad shape [" + std::to_string(rows) + ", " + std::to_string(d) + "]");
  return Status::ok();
}

Status launch_norm(const char* name, cudaStream_t stream, const void* x, DType xt, void* y, DType yt, int64_t rows,
                   int64_t d, NormKind kind, const float* w, const float* b, const float* mod, float eps) {
  if (!is_act(xt) || !is_act(yt)) return bad_dtype(name);
  VLAC_RETURN_IF_ERROR(check_rows(name, rows, d));
  if (rows == 0) return Status::ok();
  return dispatch2(xt, yt, [&]<typename Tx, typename Ty>() {
    if (!try_norm4<Tx, Tx, Ty>(stream, static_cast<const Tx*>(x), nullptr, nullptr, nullptr, static_cast<Ty*>(y), rows, d,
                               kind, w, b, mod, eps, 1, 0))
      launch(norm_kernel<Tx, Ty>, unsigned(rows), kThreads, 0, stream, static_cast<const Tx*>(x), static_cast<Ty*>(y), d,
             kind, w, b, mod, eps);
    return launch_status(name);
  });
}

}  // namespace

bool residual_norm_codes_fit(int64_t d) { return norm4_on() && d % 4 == 0 && d <= 8192; }

Status rms_norm(cudaStream_t stream, const void* x, DType xt, const float* w, void* y, DType yt, int64_t rows,
                int64_t d, float eps) {
  return launch_norm("rms_norm", stream, x, xt, y, yt, rows, d, NormKind::Rms, w, nullptr, nullptr, eps);
}

Status ada_rms_norm(cudaStream_t stream, const void* x, DType xt, const float* mod, void* y, DType yt,
                    int64_t rows, int64_t d, float eps) {
  return launch_norm("ada_rms_norm", stream, x, xt, y, yt, rows, d, NormKind::AdaRms, nullptr, nullptr, mod, eps);
}

Status layer_norm(cudaStream_t stream, const void* x, DType xt, const float* w, const float* b, void* y,
                  DType yt, int64_t rows, int64_t d, float eps) {
  return launch_norm("layer_norm", stream, x, xt, y, yt, rows, d, NormKind::Layer, w, b, nullptr, eps);
}

Status residual_norm(cudaStream_t stream, void* h, DType ht, const void* branch, DType bt, const float* gate,
                     const NormArgs& norm, void* y, DType yt, int64_t rows, int64_t d) {
  return residual_norm_to(stream, h, h, ht, branch, bt, gate, norm, y, yt, rows, d, 1, 0);
}

Status residual_norm_to(cudaStream_t stream, const void* h_in, void* h, DType ht, const void* branch, DType bt,
                        const float* gate, const NormArgs& norm, void* y, DType yt, int64_t rows, int64_t d,
                        int branch_parts, int64_t part_stride) {
  const char* name = "residual_norm";
  if (branch_parts < 1 || (branch_parts > 1 && part_stride < rows * d))
    return invalid_argument("residual_norm: K parts need a stride of at least rows x d");
  if (!is_act(ht) || !is_act(bt) || (norm.kind != NormKind::None && !is_act(yt))) return bad_dtype(name);
  VLAC_RETURN_IF_ERROR(check_rows(name, rows, d));
  if (rows == 0) return Status::ok();
  if (norm.kind == NormKind::None) yt = ht;  // unused output type
  if (norm.codes && norm.kind == NormKind::None) return invalid_argument("residual_norm: e4m3 codes of no norm");
  auto go = [&]<typename Th, typename Tb, typename Ty>() {
    const bool vec = try_norm4<Th, Tb, Ty>(stream, static_cast<const Th*>(h_in), static_cast<Th*>(h),
                                           static_cast<const Tb*>(branch), gate, static_cast<Ty*>(y), rows, d, norm.kind,
                                           norm.w, norm.b, norm.mod, norm.eps, branch_parts, part_stride, norm.codes,
                                           norm.code_scales);
    if (!vec && norm.codes)
      return unsupported("residual_norm: e4m3 codes need the 4-column kernel (residual_norm_codes_fit, aligned rows)");
    if (!vec)
      launch(residual_norm_kernel<Th, Tb, Ty>, unsigned(rows), kThreads, 0, stream, static_cast<const Th*>(h_in),
             static_cast<Th*>(h), static_cast<const Tb*>(branch), gate, static_cast<Ty*>(y), d, norm.kind, norm.w,
             norm.b, norm.mod, norm.eps, branch_parts, part_stride);
    return launch_status(name);
  };
  if (ht == DType::F32) {
    return dispatch2(bt, yt, [&]<typename Tb, typename Ty>() { return go.template operator()<float, Tb, Ty>(); });
  }
  return dispatch2(bt, yt, [&]<typename Tb, typename Ty>() { return go.template operator()<uint16_t, Tb, Ty>(); });
}

}  // namespace vlac::cuda
