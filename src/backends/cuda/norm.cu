// RMSNorm (1 + w), adaptive RMSNorm, LayerNorm and the gated residual fused with the next norm.
// One block per row; per-thread fp32 partial sums reduced through warp shuffles, then shared memory.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace vlac::cuda {
namespace {

constexpr int kThreads = 256;

// Sum of v over the block (every thread gets it). `red` holds kThreads/32 floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) s += red[i];
  return s;
}

// y = norm(x) for one row, x read through Tx (the stored values), y written as Ty.
template <typename Tx, typename Ty>
__device__ void norm_row(const Tx* xr, Ty* yr, int64_t d, NormKind kind, const float* w, const float* b,
                         const float* mod, float eps, float* red) {
  if (kind == NormKind::Layer) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) s += ld(xr, i);
    const float mean = block_sum(s, red) / float(d);
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) {
      const float c = ld(xr, i) - mean;
      v += c * c;
    }
    const float inv = rsqrtf(block_sum(v, red) / float(d) + eps);
    for (int64_t i = threadIdx.x; i < d; i += kThreads) st(yr, i, (ld(xr, i) - mean) * inv * w[i] + b[i]);
    return;
  }
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    const float v = ld(xr, i);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(d) + eps);
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
    launch(norm_kernel<Tx, Ty>, unsigned(rows), kThreads, 0, stream, static_cast<const Tx*>(x), static_cast<Ty*>(y), d,
                                                                  kind, w, b, mod, eps);
    return launch_status(name);
  });
}

}  // namespace

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
  auto go = [&]<typename Th, typename Tb, typename Ty>() {
    launch(residual_norm_kernel<Th, Tb, Ty>, unsigned(rows), kThreads, 0, stream, static_cast<const Th*>(h_in),
           static_cast<Th*>(h), static_cast<const Tb*>(branch), gate, static_cast<Ty*>(y), d, norm.kind, norm.w, norm.b,
           norm.mod, norm.eps, branch_parts, part_stride);
    return launch_status(name);
  };
  if (ht == DType::F32) {
    return dispatch2(bt, yt, [&]<typename Tb, typename Ty>() { return go.template operator()<float, Tb, Ty>(); });
  }
  return dispatch2(bt, yt, [&]<typename Tb, typename Ty>() { return go.template operator()<uint16_t, Tb, Ty>(); });
}

}  // namespace vlac::cuda
