// 8-bit weight matrices on the GPU (core/quant.h blobs: codes, then one fp32 scale per row). Each
// GEMM's weight is widened to bf16(decode(code) · scale[n]) in the kernel scratch right before
// the GEMM (in slices of rows when it is large: executor.cpp), and the cuBLASLt bf16 GEMM and
// every rewrite of the bf16-all path run on it unchanged. That rounds each weight once more than
// the CPU, which scales the fp32 sums. The CPU's arithmetic is opt-in (VLAC_QUANT_EXACT=1): the
// codes widened alone (exact in bf16), the GEMM writing fp32 sums, scale_columns applying the row
// scales, bias, GELU and accumulation with one rounding. It agrees with the CPU to ~1e-6 per GEMM
// (against 2e-3) but costs an extra pass over fp32 sums (+5 ms a chunk on the H200) for a chunk
// error no lower than what another cuBLASLt algorithm choice moves it (docs/quantization.md).
// cuBLASLt 13.0 on the H200 has no bf16 GEMM with a per-row alpha vector
// (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_*, tried in session 14), hence the extra pass.
// FP8 W8A8 (opt-in, VLAC_FP8_GEMM=1): quantize_rows_e4m3 turns a GEMM's x into e4m3 codes with
// one fp32 scale per row, and cuBLASLt's FP8 GEMM applies both scale vectors (gemm.h): no widening.
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "core/quant.h"

namespace vlac::cuda {
namespace {

constexpr int kThreads = 256;

template <bool kFp8>
__device__ __forceinline__ float decode(uint32_t code) {
  if constexpr (kFp8) return e4m3_to_f32(code);
  else return float(int8_t(uint8_t(code)));
}

// 16 codes (one 16-byte load) times one scale, stored as 16 bf16 (two 16-byte stores) at chunk g.
template <bool kFp8>
__device__ __forceinline__ void widen16(const uint8_t* codes, float s, uint16_t* out, int64_t g) {
  const uint4 c = reinterpret_cast<const uint4*>(codes)[g];
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t word = w[i / 2] >> (16 * (i % 2));
    o[i] = uint32_t(f2bf(decode<kFp8>(word & 0xFFu) * s)) | (uint32_t(f2bf(decode<kFp8>((word >> 8) & 0xFFu) * s)) << 16);
  }
  reinterpret_cast<uint4*>(out)[2 * g] = make_uint4(o[0], o[1], o[2], o[3]);
  reinterpret_cast<uint4*>(out)[2 * g + 1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// 16 codes per thread; k % 16 == 0 so they share a row. codes and scales start at the slice's
// first row.
// scales null: the codes alone (times 1, exact).
template <bool kFp8>
__global__ void dequant16_kernel(const uint8_t* codes, const float* scales, uint16_t* out, int64_t chunks, int64_t k) {
  pdl_wait();
  VLAC_GRID_LOOP(g, chunks) widen16<kFp8>(codes, scales ? scales[(g * 16) / k] : 1.0f, out, g);
}

template <bool kFp8>
__global__ void dequant1_kernel(const uint8_t* codes, const float* scales, uint16_t* out, int64_t n, int64_t k) {
  pdl_wait();
  VLAC_GRID_LOOP(i, n * k) out[i] = f2bf(decode<kFp8>(codes[i]) * (scales ? scales[i / k] : 1.0f));
}

// scale_columns: 4 columns per thread where n, ldt, ldy and the pointers allow, else 1.
template <typename Ty, bool kGelu>
__device__ __forceinline__ float finish(float t, float s, const Ty* bias, bool acc, const Ty* y, int64_t yi, int64_t j) {
  float v = s * t;
  if (acc) v += ld(y, yi);
  if (bias) v += ld(bias, j);
  return kGelu ? gelu_tanh_1(v) : v;
}

template <typename Ty, bool kGelu>
__global__ void scale_columns_kernel(const float* t, int64_t ldt, int64_t m, int64_t n, const float* scale,
                                     const Ty* bias, bool acc, Ty* y, int64_t ldy) {
  pdl_wait();
  VLAC_GRID_LOOP(e, m * n) {
    const int64_t i = e / n, j = e % n;
    st(y, i * ldy + j, finish<Ty, kGelu>(t[i * ldt + j], scale[j], bias, acc, y, i * ldy + j, j));
  }
}

template <typename Ty, bool kGelu>
__global__ void scale_columns4_kernel(const float* t, int64_t ldt, int64_t m, int64_t n, const float* scale,
                                      const Ty* bias, bool acc, Ty* y, int64_t ldy) {
  pdl_wait();
  const int64_t n4 = n / 4;
  VLAC_GRID_LOOP(e, m * n4) {
    const int64_t i = e / n4, j = (e % n4) * 4;
    const float4 tv = *reinterpret_cast<const float4*>(t + i * ldt + j);
    const float4 sv = *reinterpret_cast<const float4*>(scale + j);
    const float tt[4] = {tv.x, tv.y, tv.z, tv.w}, ss[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
    for (int q = 0; q < 4; ++q)
      st(y, i * ldy + j + q, finish<Ty, kGelu>(tt[q], ss[q], bias, acc, y, i * ldy + j + q, j + q));
  }
}

// Several matrices in one launch (DequantJob; the 16-code path of each): thread chunk g belongs to
// the job whose chunk range holds it (at most kMaxDequantJobs: a linear scan).
struct ManyArgs {
  const uint8_t* codes[kMaxDequantJobs];
  const float* scales[kMaxDequantJobs];
  uint16_t* out[kMaxDequantJobs];
  int64_t k[kMaxDequantJobs];
  int64_t first[kMaxDequantJobs + 1];  // chunk prefix sums
  uint32_t fp8_mask = 0;
  int jobs = 0;
};

__global__ void dequant16_many_kernel(ManyArgs a) {
  pdl_wait();
  VLAC_GRID_LOOP(g, a.first[a.jobs]) {
    int j = 0;
    while (g >= a.first[j + 1]) ++j;
    const int64_t lg = g - a.first[j];
    const float s = a.scales[j] ? a.scales[j][(lg * 16) / a.k[j]] : 1.0f;
    if ((a.fp8_mask >> j) & 1u) widen16<true>(a.codes[j], s, a.out[j], lg);
    else widen16<false>(a.codes[j], s, a.out[j], lg);
  }
}

// One block per row of x: the row's absolute maximum, then its codes e4m3(x · 448 / amax) and
// scale amax / 448 (a zero row: zero codes, scale 0). The arithmetic of the host reference
// (quantize_row_e4m3_reference in the tests): the same float operations in the same order.
constexpr int kQuantRowThreads = 256;

template <typename Tx, bool kVec>
__global__ void quantize_rows_e4m3_kernel(const Tx* x, int64_t ldx, int64_t k, uint8_t* codes, float* scales) {
  pdl_wait();
  const Tx* row = x + int64_t(blockIdx.x) * ldx;
  uint8_t* out = codes + int64_t(blockIdx.x) * k;
  float amax = 0.0f;
  bool nan = false;
  auto see = [&](float v) {
    amax = fmaxf(amax, fabsf(v));
    nan = nan || isnan(v);
  };
  if constexpr (kVec) {  // 8 bf16 (16 bytes) a load, 8 codes (8 bytes) a store
    for (int64_t c = threadIdx.x; c < k / 8; c += blockDim.x) {
      const uint4 v = reinterpret_cast<const uint4*>(row)[c];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) see(bf2f(uint16_t(w[i]))), see(bf2f(uint16_t(w[i] >> 16)));
    }
  } else {
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) see(ld(row, c));
  }
  __shared__ float red[kQuantRowThreads / 32];
  const float inv = e4m3_row_inv(amax, nan, red, scales + blockIdx.x);
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x; c < k / 8; c += blockDim.x) {
      const uint4 v = reinterpret_cast<const uint4*>(row)[c];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint32_t o[2] = {0, 0};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t lo = f32_to_e4m3(bf2f(uint16_t(w[i])) * inv), hi = f32_to_e4m3(bf2f(uint16_t(w[i] >> 16)) * inv);
        o[i / 2] |= (lo | (hi << 8)) << (16 * (i % 2));
      }
      reinterpret_cast<uint2*>(out)[c] = make_uint2(o[0], o[1]);
    }
  } else {
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) out[c] = f32_to_e4m3(ld(row, c) * inv);
  }
}

}  // namespace

Status quantize_rows_e4m3(cudaStream_t stream, const void* x, DType xt, int64_t m, int64_t k, int64_t ldx, void* codes,
                          float* scales) {
  if (!is_act(xt)) return bad_dtype("quantize_rows_e4m3");
  if (m < 0 || k <= 0 || ldx < k) return invalid_argument("quantize_rows_e4m3: bad shape or row stride");
  if (m == 0) return Status::ok();
  if (m > 0x7FFFFFFF) return invalid_argument("quantize_rows_e4m3: too many rows");
  auto* c = static_cast<uint8_t*>(codes);
  if (xt == DType::BF16) {
    const bool vec = k % 8 == 0 && ldx % 8 == 0 &&
                     ((reinterpret_cast<uintptr_t>(x) & 15u) | (reinterpret_cast<uintptr_t>(codes) & 7u)) == 0;
    launch(vec ? quantize_rows_e4m3_kernel<uint16_t, true> : quantize_rows_e4m3_kernel<uint16_t, false>, dim3(unsigned(m)),
           kQuantRowThreads, 0, stream, static_cast<const uint16_t*>(x), ldx, k, c, scales);
  } else {
    launch(quantize_rows_e4m3_kernel<float, false>, dim3(unsigned(m)), kQuantRowThreads, 0, stream,
           static_cast<const float*>(x), ldx, k, c, scales);
  }
  return launch_status("quantize_rows_e4m3");
}

Status dequant_bf16(cudaStream_t stream, const void* blob, DType dt, int64_t n, int64_t k, int64_t row0, int64_t rows,
                    void* out, bool scaled) {
  if (!is_quant_dtype(dt)) return unsupported(std::string("dequant_bf16: ") + dtype_name(dt) + " is no 8-bit weight dtype");
  if (n < 0 || k <= 0 || row0 < 0 || rows < 0 || row0 + rows > n) return invalid_argument("dequant_bf16: bad shape or rows");
  if (rows == 0) return Status::ok();
  const auto* codes = static_cast<const uint8_t*>(blob) + uint64_t(row0) * uint64_t(k);
  const float* scales = scaled ? quant_row_scales(blob, n, k) + row0 : nullptr;
  auto* o = static_cast<uint16_t*>(out);
  const bool fp8 = dt == DType::F8_E4M3;
  const bool vec = k % 16 == 0 && ((reinterpret_cast<uintptr_t>(codes) | reinterpret_cast<uintptr_t>(out)) & 15u) == 0;
  if (vec) {
    const int64_t chunks = rows * k / 16;
    launch(fp8 ? dequant16_kernel<true> : dequant16_kernel<false>, grid_1d(chunks, kThreads), kThreads, 0, stream, codes,
           scales, o, chunks, k);
  } else {
    launch(fp8 ? dequant1_kernel<true> : dequant1_kernel<false>, grid_1d(rows * k, kThreads), kThreads, 0, stream, codes,
           scales, o, rows, k);
  }
  return launch_status("dequant_bf16");
}

}  // namespace vlac::cuda

namespace vlac::cuda {

Status dequant_bf16_many(cudaStream_t stream, const DequantJob* jobs, int count) {
  if (count < 0 || count > kMaxDequantJobs) return invalid_argument("dequant_bf16_many: 0 to 8 jobs");
  ManyArgs a;
  bool vec = true;
  for (int j = 0; j < count; ++j) {
    const DequantJob& d = jobs[j];
    if (!is_quant_dtype(d.dt)) return unsupported(std::string("dequant_bf16_many: ") + dtype_name(d.dt) + " is no 8-bit weight dtype");
    if (d.n < 0 || d.k <= 0) return invalid_argument("dequant_bf16_many: bad shape");
    vec = vec && d.k % 16 == 0 && ((reinterpret_cast<uintptr_t>(d.blob) | reinterpret_cast<uintptr_t>(d.out)) & 15u) == 0;
  }
  if (!vec) {  // one launch each (the scalar path)
    for (int j = 0; j < count; ++j)
      VLAC_RETURN_IF_ERROR(
          dequant_bf16(stream, jobs[j].blob, jobs[j].dt, jobs[j].n, jobs[j].k, 0, jobs[j].n, jobs[j].out, jobs[j].scaled));
    return Status::ok();
  }
  a.jobs = count;
  a.first[0] = 0;
  for (int j = 0; j < count; ++j) {
    const DequantJob& d = jobs[j];
    a.codes[j] = static_cast<const uint8_t*>(d.blob);
    a.scales[j] = d.scaled ? quant_row_scales(d.blob, d.n, d.k) : nullptr;
    a.out[j] = static_cast<uint16_t*>(d.out);
    a.k[j] = d.k;
    a.first[j + 1] = a.first[j] + d.n * d.k / 16;
    if (d.dt == DType::F8_E4M3) a.fp8_mask |= 1u << j;
  }
  if (a.first[count] == 0) return Status::ok();
  launch(dequant16_many_kernel, grid_1d(a.first[count], kThreads), kThreads, 0, stream, a);
  return launch_status("dequant_bf16_many");
}

const float* quant_row_scales(const void* blob, int64_t n, int64_t k) {
  return reinterpret_cast<const float*>(static_cast<const uint8_t*>(blob) + quant_scales_offset(n, k));
}

Status scale_columns(cudaStream_t stream, const float* t, int64_t ldt, int64_t m, int64_t n, const float* scale,
                     const void* bias, bool gelu, bool accumulate, void* y, DType yt, int64_t ldy) {
  if (!is_act(yt)) return bad_dtype("scale_columns");
  if (m < 0 || n < 0 || ldt < n || ldy < n) return invalid_argument("scale_columns: bad shape or strides");
  if (m == 0 || n == 0) return Status::ok();
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const bool vec = n % 4 == 0 && ldt % 4 == 0 && ldy % 4 == 0 && a16(t) && a16(scale) &&
                   (reinterpret_cast<uintptr_t>(y) & (yt == DType::F32 ? 15u : 7u)) == 0;
  const int64_t work = vec ? m * (n / 4) : m * n;
  auto go = [&](auto* typed) {
    using Ty = std::remove_pointer_t<decltype(typed)>;
    const Ty* b = static_cast<const Ty*>(bias);
    auto* k1 = gelu ? scale_columns_kernel<Ty, true> : scale_columns_kernel<Ty, false>;
    auto* k4 = gelu ? scale_columns4_kernel<Ty, true> : scale_columns4_kernel<Ty, false>;
    launch(vec ? k4 : k1, grid_1d(work, kThreads), kThreads, 0, stream, t, ldt, m, n, scale, b, accumulate, typed, ldy);
  };
  if (yt == DType::F32) go(static_cast<float*>(y));
  else go(static_cast<uint16_t*>(y));
  return launch_status("scale_columns");
}

}  // namespace vlac::cuda
