// 8-bit weight matrices on the GPU (core/quant.h blobs: codes, then one fp32 scale per row). Each
// GEMM's weight is widened to bf16(decode(code) · scale[n]) in the kernel scratch right before
// the GEMM (in slices of rows when it is large: executor.cpp), and the cuBLASLt bf16 GEMM and
// every rewrite of the bf16-all path run on it unchanged. That rounds each weight once more than
// the CPU (which scales the fp32 sums): cuBLASLt 13.0 on the H200 has no algorithm for a bf16 GEMM
// with a per-row alpha vector (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_*), tried in session 14.
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
template <bool kFp8>
__global__ void dequant16_kernel(const uint8_t* codes, const float* scales, uint16_t* out, int64_t chunks, int64_t k) {
  pdl_wait();
  VLAC_GRID_LOOP(g, chunks) widen16<kFp8>(codes, scales[(g * 16) / k], out, g);
}

template <bool kFp8>
__global__ void dequant1_kernel(const uint8_t* codes, const float* scales, uint16_t* out, int64_t n, int64_t k) {
  pdl_wait();
  VLAC_GRID_LOOP(i, n * k) out[i] = f2bf(decode<kFp8>(codes[i]) * scales[i / k]);
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
    const float s = a.scales[j][(lg * 16) / a.k[j]];
    if ((a.fp8_mask >> j) & 1u) widen16<true>(a.codes[j], s, a.out[j], lg);
    else widen16<false>(a.codes[j], s, a.out[j], lg);
  }
}

}  // namespace

Status dequant_bf16(cudaStream_t stream, const void* blob, DType dt, int64_t n, int64_t k, int64_t row0, int64_t rows,
                    void* out) {
  if (!is_quant_dtype(dt)) return unsupported(std::string("dequant_bf16: ") + dtype_name(dt) + " is no 8-bit weight dtype");
  if (n < 0 || k <= 0 || row0 < 0 || rows < 0 || row0 + rows > n) return invalid_argument("dequant_bf16: bad shape or rows");
  if (rows == 0) return Status::ok();
  const auto* codes = static_cast<const uint8_t*>(blob) + uint64_t(row0) * uint64_t(k);
  const float* scales = reinterpret_cast<const float*>(static_cast<const uint8_t*>(blob) + quant_scales_offset(n, k)) + row0;
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
      VLAC_RETURN_IF_ERROR(dequant_bf16(stream, jobs[j].blob, jobs[j].dt, jobs[j].n, jobs[j].k, 0, jobs[j].n, jobs[j].out));
    return Status::ok();
  }
  a.jobs = count;
  a.first[0] = 0;
  for (int j = 0; j < count; ++j) {
    const DequantJob& d = jobs[j];
    a.codes[j] = static_cast<const uint8_t*>(d.blob);
    a.scales[j] = reinterpret_cast<const float*>(a.codes[j] + quant_scales_offset(d.n, d.k));
    a.out[j] = static_cast<uint16_t*>(d.out);
    a.k[j] = d.k;
    a.first[j + 1] = a.first[j] + d.n * d.k / 16;
    if (d.dt == DType::F8_E4M3) a.fp8_mask |= 1u << j;
  }
  if (a.first[count] == 0) return Status::ok();
  launch(dequant16_many_kernel, grid_1d(a.first[count], kThreads), kThreads, 0, stream, a);
  return launch_status("dequant_bf16_many");
}

}  // namespace vlac::cuda
