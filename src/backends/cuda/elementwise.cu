// Casts, GELU-tanh, GeGLU, the Euler step, RoPE, im2col and the embedding gather: grid-stride
// loops, fp32 math, one rounding at the store (plus the intermediate roundings torch's bf16 mode
// makes, where a function's comment in kernels.h says so).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace vlac::cuda {
namespace {

constexpr int kThreads = 256;

template <typename Tx, typename Ty>
__global__ void cast_kernel(const Tx* x, Ty* y, int64_t n) {
  pdl_wait();
  VLAC_GRID_LOOP(i, n) st(y, i, ld(x, i));
}

template <typename Tx, typename Ty>
__global__ void cast_rows_kernel(const Tx* x, int64_t x_stride, Ty* y, int64_t y_stride, int64_t rows, int64_t cols) {
  pdl_wait();
  VLAC_GRID_LOOP(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    st(y, r * y_stride + c, ld(x, r * x_stride + c));
  }
}

template <typename Tx, typename Ty>
__global__ void gelu_kernel(const Tx* x, Ty* y, int64_t n) {
  pdl_wait();
  VLAC_GRID_LOOP(i, n) st(y, i, gelu_tanh_1(ld(x, i)));
}

template <typename Tx, typename Ty>
__global__ void geglu_kernel(const Tx* gate, const Tx* up, int64_t in_stride, Ty* y, int64_t y_stride, int64_t rows,
                             int64_t f) {
  pdl_wait();
  VLAC_GRID_LOOP(i, rows * f) {
    const int64_t r = i / f, c = i % f;
    const float g = as_stored<Tx>(gelu_tanh_1(ld(gate, r * in_stride + c)));
    st(y, r * y_stride + c, g * ld(up, r * in_stride + c));
  }
}

// 8 consecutive elements per thread with 16-byte loads and stores, one row per blockIdx.y (no
// 64-bit division per element): the LM's [968, 16384] GeGLU is bandwidth-bound. Same arithmetic
// as geglu_kernel, element by element.
template <typename T> __device__ __forceinline__ void ld8(const T* p, float* v);
template <> __device__ __forceinline__ void ld8<float>(const float* p, float* v) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <> __device__ __forceinline__ void ld8<uint16_t>(const uint16_t* p, float* v) {
  const uint4 a = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
  for (int k = 0; k < 4; ++k) v[2 * k] = __uint_as_float(w[k] << 16), v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
}
template <typename T> __device__ __forceinline__ void st8(T* p, const float* v);
template <> __device__ __forceinline__ void st8<float>(float* p, const float* v) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <> __device__ __forceinline__ void st8<uint16_t>(uint16_t* p, const float* v) {
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = uint32_t(f2bf(v[2 * k])) | (uint32_t(f2bf(v[2 * k + 1])) << 16);
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename Tx, typename Ty>
__global__ void geglu8_kernel(const Tx* gate, const Tx* up, int64_t in_stride, Ty* y, int64_t y_stride, int64_t rows,
                              int64_t f) {
  pdl_wait();
  const int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (c >= f) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float g[8], u[8];
    ld8(gate + r * in_stride + c, g);
    ld8(up + r * in_stride + c, u);
    for (int k = 0; k < 8; ++k) g[k] = as_stored<Tx>(gelu_tanh_1(g[k])) * u[k];
    st8(y + r * y_stride + c, g);
  }
}

// GeGLU straight into an FP8 GEMM's x: one block a row, kC chunks of 8 columns a thread kept in
// registers; the row as Ty would store it, then quantize_rows_e4m3's arithmetic (amax with NaN
// noted apart, codes of v · 448 / amax, scale amax / 448), so the same bits as geglu followed by
// quantize_rows_e4m3, with one launch and no write of y.
constexpr int kRowThreads = 256;
template <typename Tx, typename Ty, int kC>
__global__ void __launch_bounds__(kRowThreads) geglu_e4m3_kernel(const Tx* gate, const Tx* up, int64_t in_stride,
                                                                  int64_t f, uint8_t* codes, float* scales) {
  pdl_wait();
  __shared__ float red[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  float v[kC][8];
  float amax = 0.0f;
  bool nan = false;
#pragma unroll
  for (int q = 0; q < kC; ++q) {
    const int64_t c = (int64_t(q) * kRowThreads + threadIdx.x) * 8;
    if (c >= f) continue;
    float u[8];
    ld8(gate + r * in_stride + c, v[q]);
    ld8(up + r * in_stride + c, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[q][k] = as_stored<Ty>(as_stored<Tx>(gelu_tanh_1(v[q][k])) * u[k]);
      amax = fmaxf(amax, fabsf(v[q][k]));
      nan = nan || isnan(v[q][k]);
    }
  }
  const float inv = e4m3_row_inv(amax, nan, red, scales + r);
#pragma unroll
  for (int q = 0; q < kC; ++q) {
    const int64_t c = (int64_t(q) * kRowThreads + threadIdx.x) * 8;
    if (c >= f) continue;
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k / 4] |= uint32_t(f32_to_e4m3(v[q][k] * inv)) << (8 * (k % 4));
    *reinterpret_cast<uint2*>(codes + r * f + c) = make_uint2(w[0], w[1]);
  }
}

__global__ void euler_kernel(const float* x, const float* v, float dt, float* y, int64_t n) {
  pdl_wait();
  VLAC_GRID_LOOP(i, n) y[i] = x[i] + dt * v[i];
}

// RoPE: one thread per (token, i < dh/2) computes the angle's inv_freq (double pow, as the CPU's
// rope_table), sin and cos once and rotates that pair in every head of the row, with 32-bit index
// math. (It was one thread per element: a double pow, a sincosf and three 64-bit divisions per
// element, 9x over for pi0.5's 9 heads; the prefix's RoPE took ~19 us of an H200.) Same bits.
__device__ __forceinline__ void rope_angle(const int64_t* pos, int ti, int i, int dh, float base, float* s, float* c) {
  const float inv_freq = 1.0f / float(pow(double(base), double(float(2 * i) / float(dh))));
  const float a = float(pos[ti]) * inv_freq;
  sincosf(a, s, c);
}


// Rotates pair (i, i + dh/2) of heads [0, h) in row xr into row yr (yr may be xr: each element is
// read and written by this thread alone, and every read of a chunk of heads comes before its writes).
// The first chunk's loads are issued before the angle is computed (rope_load, then rope_finish), so their memory
// latency overlaps the double pow and sincosf (branches the compiler would not hoist loads over).
constexpr int kRopeChunk = 8;  // loads of 8 heads in flight before their stores
struct RopeLoads {
  float x0[kRopeChunk], x1[kRopeChunk];
};
template <typename Tx>
__device__ __forceinline__ void rope_load(const Tx* xr, int h0, int h, int dh, int i, RopeLoads& l) {
  const int half = dh / 2;
#pragma unroll
  for (int k = 0; k < kRopeChunk; ++k)
    if (h0 + k < h) l.x0[k] = ld(xr, (h0 + k) * dh + i), l.x1[k] = ld(xr, (h0 + k) * dh + i + half);
}
template <typename Ty>
__device__ __forceinline__ void rope_store(Ty* yr, int h0, int h, int dh, int i, float s, float c, const RopeLoads& l) {
  const int half = dh / 2;
#pragma unroll
  for (int k = 0; k < kRopeChunk; ++k)
    if (h0 + k < h) {
      float y0, y1;
      rotate(l.x0[k], l.x1[k], s, c, &y0, &y1);
      st(yr, (h0 + k) * dh + i, y0);
      st(yr, (h0 + k) * dh + i + half, y1);
    }
}
// Heads from h0 on (the chunks after the first, which the caller loaded and stored).
template <typename Tx, typename Ty>
__device__ __forceinline__ void rope_row(const Tx* xr, Ty* yr, int h, int dh, int i, float s, float c, int h0 = 0) {
  for (; h0 < h; h0 += kRopeChunk) {
    RopeLoads l;
    rope_load(xr, h0, h, dh, i, l);
    rope_store(yr, h0, h, dh, i, s, c, l);
  }
}
// The first chunk rotated from its loads `l` (rope_load(xr, 0, ...)), then the heads after it.
template <typename Tx, typename Ty>
__device__ __forceinline__ void rope_finish(const Tx* xr, Ty* yr, int h, int dh, int i, float s, float c,
                                            const RopeLoads& l) {
  rope_store(yr, 0, h, dh, i, s, c, l);
  rope_row(xr, yr, h, dh, i, s, c, kRopeChunk);
}

// Reads rows of x (`x_stride` apart) and writes the rotated rows to y (`y_stride` apart); y may
// be x (in place) or another buffer of another dtype (one rounding at the store).
template <typename Tx, typename Ty>
__global__ void rope_kernel(const Tx* x, int64_t x_stride, Ty* y, int64_t y_stride, const int64_t* pos, int t, int h,
                            int dh, float base) {
  pdl_wait();
  const int half = dh / 2, n = t * half;
  for (int idx = int(blockIdx.x * blockDim.x + threadIdx.x); idx < n; idx += int(gridDim.x * blockDim.x)) {
    const int i = idx % half, ti = idx / half;
    RopeLoads l;
    rope_load(x + ti * x_stride, 0, h, dh, i, l);
    float s, c;
    rope_angle(pos, ti, i, dh, base, &s, &c);
    rope_finish(x + ti * x_stride, y + ti * y_stride, h, dh, i, s, c, l);
  }
}

// rope_kernel over two jobs: heads [0, a.h) are job a's, [a.h, a.h + b.h) job b's.
struct RopeJobs {
  const void* xa;
  const void* xb;
  void* ya;
  void* yb;
  int64_t xsa, xsb, ysa, ysb, ha, hb;
  // An optional copy of t rows of `cc` columns after the rotations (cc = 0: none), rounded to Ty.
  const void* cx;
  void* cy;
  int64_t cxs, cys, cc;
  int early_dependents;  // rope_pair_to's: the next kernel may launch once these blocks have all started
};
template <typename Tx, typename Ty>
__global__ void rope_pair_kernel(RopeJobs j, const int64_t* pos, int t, int dh, float base) {
  pdl_wait();
  if (j.early_dependents) pdl_launch_dependents();
  const int half = dh / 2, nr = t * half, cc = int(j.cc), n = nr + t * cc;
  for (int idx = int(blockIdx.x * blockDim.x + threadIdx.x); idx < n; idx += int(gridDim.x * blockDim.x)) {
    if (idx >= nr) {  // the copy, after the rotations
      const int e = idx - nr, r = e / cc, c = e % cc;
      st(static_cast<Ty*>(j.cy), r * j.cys + c, ld(static_cast<const Tx*>(j.cx), r * j.cxs + c));
      continue;
    }
    const int i = idx % half, ti = idx / half;
    const Tx* xa = static_cast<const Tx*>(j.xa) + ti * j.xsa;
    const Tx* xb = static_cast<const Tx*>(j.xb) + ti * j.xsb;
    Ty* ya = static_cast<Ty*>(j.ya) + ti * j.ysa;
    Ty* yb = static_cast<Ty*>(j.yb) + ti * j.ysb;
    RopeLoads la, lb;
    rope_load(xa, 0, int(j.ha), dh, i, la);
    rope_load(xb, 0, int(j.hb), dh, i, lb);
    float s, c;
    rope_angle(pos, ti, i, dh, base, &s, &c);
    rope_store(ya, 0, int(j.ha), dh, i, s, c, la);  // both first chunks, then the heads after them
    rope_store(yb, 0, int(j.hb), dh, i, s, c, lb);
    rope_row(xa, ya, int(j.ha), dh, i, s, c, kRopeChunk);
    rope_row(xb, yb, int(j.hb), dh, i, s, c, kRopeChunk);
  }
}

// rope_qkv_to: thread per (token, i < dh/2) for the rotations, then thread per v element.
__global__ void rope_qkv_kernel(RopeQkvJob j, const int64_t* pos, int t, int dh, float base) {
  pdl_wait();
  const int half = dh / 2, nr = t * half, vc = int(j.vc), n = nr + t * vc;
  for (int idx = int(blockIdx.x * blockDim.x + threadIdx.x); idx < n; idx += int(gridDim.x * blockDim.x)) {
    if (idx >= nr) {
      const int e = idx - nr, r = e / vc, c = e % vc;
      const float x = j.v[r * j.v_stride + c];
      j.vo[r * j.vo_stride + c] = x;
      j.vb[r * j.vb_stride + c] = f2bf(x);
      continue;
    }
    const int i = idx % half, ti = idx / half;
    const float* kr = j.k + ti * j.k_stride;
    RopeLoads lq, lk;  // q's first heads and k's, loaded before the angle (rope_load)
    rope_load(j.q + ti * j.q_stride, 0, int(j.hq), dh, i, lq);
    rope_load(kr, 0, int(j.hk), dh, i, lk);
    float s, c;
    rope_angle(pos, ti, i, dh, base, &s, &c);
    rope_finish(j.q + ti * j.q_stride, j.qo + ti * j.qo_stride, int(j.hq), dh, i, s, c, lq);
    float* kor = j.ko + ti * j.ko_stride;
    uint16_t* kbr = j.kb + ti * j.kb_stride;
    auto put_k = [&](int hh, float x0, float x1) {
      float y0, y1;
      rotate(x0, x1, s, c, &y0, &y1);
      kor[hh * dh + i] = y0, kor[hh * dh + i + half] = y1;
      kbr[hh * dh + i] = f2bf(y0), kbr[hh * dh + i + half] = f2bf(y1);
    };
#pragma unroll
    for (int hh = 0; hh < kRopeChunk; ++hh)  // constant indices: lk stays in registers
      if (hh < int(j.hk)) put_k(hh, lk.x0[hh], lk.x1[hh]);
    for (int hh = kRopeChunk; hh < int(j.hk); ++hh) put_k(hh, kr[hh * dh + i], kr[hh * dh + i + half]);
  }
}

// rope_sincos: one thread per (token, i < dh/2), the angle of rope_angle.
__global__ void rope_sincos_kernel(const int64_t* pos, int t, int dh, float base, float* sc) {
  pdl_wait();
  const int half = dh / 2, n = t * half;
  for (int idx = int(blockIdx.x * blockDim.x + threadIdx.x); idx < n; idx += int(gridDim.x * blockDim.x)) {
    float s, c;
    rope_angle(pos, idx / half, idx % half, dh, base, &s, &c);
    sc[2 * idx] = s, sc[2 * idx + 1] = c;
  }
}

template <typename T>
__global__ void im2col_kernel(const float* img, T* cols, int64_t c, int64_t y, int64_t x, int64_t kh, int64_t kw) {
  pdl_wait();
  const int64_t nx = x / kw, patch = c * kh * kw, n = (y / kh) * nx * patch;
  VLAC_GRID_LOOP(idx, n) {
    const int64_t p = idx / patch, e = idx % patch;
    const int64_t py = p / nx, px = p % nx;
    const int64_t ci = e / (kh * kw), ky = (e / kw) % kh, kx = e % kw;
    st(cols, idx, img[(ci * y + py * kh + ky) * x + px * kw + kx]);
  }
}

template <typename Tt, typename To>
__global__ void embedding_kernel(const Tt* table, int64_t v, int64_t d, const int64_t* ids, int64_t t, float scale,
                                 To* out, int* bad) {
  pdl_wait();
  VLAC_GRID_LOOP(idx, t * d) {
    const int64_t ti = idx / d, j = idx % d;
    const int64_t id = ids[ti];
    if (id < 0 || id >= v) {
      st(out, idx, 0.0f);
      if (bad && j == 0) atomicCAS(bad, 0, int(ti) + 1);
      continue;
    }
    st(out, idx, ld(table, id * d + j) * scale);
  }
}

Status check_n(const char* kernel, int64_t n) {
  if (n < 0) return invalid_argument(std::string(kernel) + ": negative size " + std::to_string(n));
  return Status::ok();
}

}  // namespace

Status device_status() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so later launches do not report it
    return Status(StatusCode::Backend, std::string("no CUDA device: ") + cudaGetErrorString(e));
  }
  if (n == 0) return Status(StatusCode::Backend, "no CUDA device: cudaGetDeviceCount returned 0");
  return Status::ok();
}

int device_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return sms;
}

int device_compute_capability() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

Status cast(cudaStream_t stream, const void* x, DType xt, void* y, DType yt, int64_t n) {
  if (!is_act(xt) || !is_act(yt)) return bad_dtype("cast");
  VLAC_RETURN_IF_ERROR(check_n("cast", n));
  if (n == 0) return Status::ok();
  return dispatch2(xt, yt, [&]<typename Tx, typename Ty>() {
    launch(cast_kernel<Tx, Ty>, grid_1d(n, kThreads), kThreads, 0, stream, static_cast<const Tx*>(x), static_cast<Ty*>(y), n);
    return launch_status("cast");
  });
}

Status cast_rows(cudaStream_t stream, const void* x, DType xt, int64_t x_stride, void* y, DType yt, int64_t y_stride,
                 int64_t rows, int64_t cols) {
  if (!is_act(xt) || !is_act(yt)) return bad_dtype("cast_rows");
  if (rows < 0 || cols < 0 || x_stride < cols || y_stride < cols) return invalid_argument("cast_rows: bad shape");
  VLAC_RETURN_IF_ERROR(check_n("cast_rows", rows * cols));
  if (rows * cols == 0) return Status::ok();
  return dispatch2(xt, yt, [&]<typename Tx, typename Ty>() {
    launch(cast_rows_kernel<Tx, Ty>, grid_1d(rows * cols, kThreads), kThreads, 0, stream,
        static_cast<const Tx*>(x), x_stride, static_cast<Ty*>(y), y_stride, rows, cols);
    return launch_status("cast_rows");
  });
}

Status gelu_tanh(cudaStream_t stream, const void* x, DType xt, void* y, DType yt, int64_t n) {
  if (!is_act(xt) || !is_act(yt)) return bad_dtype("gelu_tanh");
  VLAC_RETURN_IF_ERROR(check_n("gelu_tanh", n));
  if (n == 0) return Status::ok();
  return dispatch2(xt, yt, [&]<typename Tx, typename Ty>() {
    launch(gelu_kernel<Tx, Ty>, grid_1d(n, kThreads), kThreads, 0, stream, static_cast<const Tx*>(x), static_cast<Ty*>(y), n);
    return launch_status("gelu_tanh");
  });
}

Status geglu(cudaStream_t stream, const void* gate, const void* up, DType it, int64_t in_stride, void* y, DType yt,
             int64_t rows, int64_t f, int64_t y_stride) {
  if (!is_act(it) || !is_act(yt)) return bad_dtype("geglu");
  if (y_stride == 0) y_stride = f;
  if (rows < 0 || f < 0 || in_stride < f || y_stride < f) return invalid_argument("geglu: bad shape or stride");
  if (rows * f == 0) return Status::ok();
  const bool aligned = ((reinterpret_cast<uintptr_t>(gate) | reinterpret_cast<uintptr_t>(up) |
                         reinterpret_cast<uintptr_t>(y)) & 15u) == 0;
  const bool wide = aligned && f % 8 == 0 && in_stride % 8 == 0 && y_stride % 8 == 0;
  return dispatch2(it, yt, [&]<typename Tx, typename Ty>() {
    if (wide) {
      const dim3 grid(unsigned((f / 8 + kThreads - 1) / kThreads), unsigned(std::min<int64_t>(rows, 65535)));
      launch(geglu8_kernel<Tx, Ty>, grid, kThreads, 0, stream, static_cast<const Tx*>(gate),
             static_cast<const Tx*>(up), in_stride, static_cast<Ty*>(y), y_stride, rows, f);
    } else {
      launch(geglu_kernel<Tx, Ty>, grid_1d(rows * f, kThreads), kThreads, 0, stream,
          static_cast<const Tx*>(gate), static_cast<const Tx*>(up), in_stride, static_cast<Ty*>(y), y_stride, rows, f);
    }
    return launch_status("geglu");
  });
}

bool geglu_codes_fit(int64_t f, int64_t in_stride) {
  return f > 0 && f % 8 == 0 && in_stride % 8 == 0 && f <= int64_t(8) * 8 * kRowThreads;
}

Status geglu_e4m3(cudaStream_t stream, const void* gate, const void* up, DType it, int64_t in_stride, DType yt,
                  int64_t rows, int64_t f, void* codes, float* scales) {
  if (!is_act(it) || !is_act(yt)) return bad_dtype("geglu_e4m3");
  if (rows < 0 || in_stride < f || rows > 0x7fffffff) return invalid_argument("geglu_e4m3: bad shape or stride");
  if (!geglu_codes_fit(f, in_stride)) return unsupported("geglu_e4m3: f and the row stride must be multiples of 8, f <= 16384");
  if (((reinterpret_cast<uintptr_t>(gate) | reinterpret_cast<uintptr_t>(up)) & 15u) != 0 ||
      (reinterpret_cast<uintptr_t>(codes) & 7u) != 0)
    return unsupported("geglu_e4m3: gate and up must be 16-byte aligned, the codes 8-byte aligned");
  if (rows == 0) return Status::ok();
  const int chunks = int((f / 8 + kRowThreads - 1) / kRowThreads);
  return dispatch2(it, yt, [&]<typename Tx, typename Ty>() {
    auto go = [&](auto kernel) {
      launch(kernel, unsigned(rows), kRowThreads, 0, stream, static_cast<const Tx*>(gate), static_cast<const Tx*>(up),
             in_stride, f, static_cast<uint8_t*>(codes), scales);
    };
    if (chunks <= 1) go(geglu_e4m3_kernel<Tx, Ty, 1>);
    else if (chunks <= 2) go(geglu_e4m3_kernel<Tx, Ty, 2>);
    else if (chunks <= 4) go(geglu_e4m3_kernel<Tx, Ty, 4>);
    else go(geglu_e4m3_kernel<Tx, Ty, 8>);
    return launch_status("geglu_e4m3");
  });
}

Status euler_step(cudaStream_t stream, float* x, const float* v, float dt, int64_t n) {
  return euler_step_to(stream, x, v, dt, x, n);
}

Status euler_step_to(cudaStream_t stream, const float* x, const float* v, float dt, float* y, int64_t n) {
  VLAC_RETURN_IF_ERROR(check_n("euler_step", n));
  if (n == 0) return Status::ok();
  launch(euler_kernel, grid_1d(n, kThreads), kThreads, 0, stream, x, v, dt, y, n);
  return launch_status("euler_step");
}

Status rope(cudaStream_t stream, void* x, DType xt, int64_t row_stride, const int64_t* pos, int64_t t, int64_t h,
            int64_t dh, float base) {
  return rope_to(stream, x, xt, row_stride, x, xt, row_stride, pos, t, h, dh, base);
}

Status rope_to(cudaStream_t stream, const void* x, DType xt, int64_t x_stride, void* y, DType yt, int64_t y_stride,
               const int64_t* pos, int64_t t, int64_t h, int64_t dh, float base) {
  if (!is_act(xt) || !is_act(yt)) return bad_dtype("rope");
  if (t < 0 || h <= 0 || dh <= 0 || dh % 2 != 0 || x_stride < h * dh || y_stride < h * dh)
    return invalid_argument("rope: bad shape (dh must be even, row strides >= h·dh)");
  if (x == y && (xt != yt || x_stride != y_stride)) return invalid_argument("rope: in place needs one dtype and stride");
  if (t == 0) return Status::ok();
  if (t * (dh / 2) > INT32_MAX / 2 || h * dh > INT32_MAX / 2) return invalid_argument("rope: sizes above 2^30");
  const int64_t n = t * (dh / 2);
  return dispatch2(xt, yt, [&]<typename Tx, typename Ty>() {
    launch(rope_kernel<Tx, Ty>, grid_1d(n, kThreads), kThreads, 0, stream, static_cast<const Tx*>(x), x_stride, static_cast<Ty*>(y),
                                                               y_stride, pos, int(t), int(h), int(dh), base);
    return launch_status("rope");
  });
}

Status rope_pair_to(cudaStream_t stream, const RopeJob& a, const RopeJob& b, DType xt, DType yt, const int64_t* pos,
                    int64_t t, int64_t dh, float base, const RowCopyJob* copy, bool early_dependents) {
  if (!is_act(xt) || !is_act(yt)) return bad_dtype("rope_pair");
  for (const RopeJob* r : {&a, &b})
    if (r->h <= 0 || r->x_stride < r->h * dh || r->y_stride < r->h * dh || r->x == r->y)
      return invalid_argument("rope_pair: bad job (heads > 0, row strides >= h·dh, out of place)");
  if (t < 0 || dh <= 0 || dh % 2 != 0) return invalid_argument("rope_pair: bad shape (dh must be even)");
  if (t == 0) return Status::ok();
  if (copy && (copy->cols <= 0 || copy->x_stride < copy->cols || copy->y_stride < copy->cols || !copy->x || !copy->y))
    return invalid_argument("rope_pair: bad copy job (cols > 0, row strides >= cols)");
  const RopeJobs j{a.x, b.x, a.y, b.y, a.x_stride, b.x_stride, a.y_stride, b.y_stride, a.h, b.h,
                   copy ? copy->x : nullptr, copy ? copy->y : nullptr, copy ? copy->x_stride : 0,
                   copy ? copy->y_stride : 0, copy ? copy->cols : 0, early_dependents ? 1 : 0};
  const int64_t n = t * (dh / 2) + t * j.cc;
  if (n > INT32_MAX / 2 || (a.h + b.h) * dh > INT32_MAX / 2) return invalid_argument("rope_pair: sizes above 2^30");
  return dispatch2(xt, yt, [&]<typename Tx, typename Ty>() {
    launch(rope_pair_kernel<Tx, Ty>, grid_1d(n, kThreads), kThreads, 0, stream, j, pos, int(t), int(dh), base);
    return launch_status("rope_pair");
  });
}

Status rope_qkv_to(cudaStream_t stream, const RopeQkvJob& j, const int64_t* pos, int64_t t, int64_t dh, float base) {
  if (t < 0 || dh <= 0 || dh % 2 != 0 || j.hq <= 0 || j.hk <= 0 || j.vc <= 0)
    return invalid_argument("rope_qkv: bad shape (dh even, heads and v columns > 0)");
  if (!j.q || !j.qo || !j.k || !j.ko || !j.kb || !j.v || !j.vo || !j.vb || j.q_stride < j.hq * dh ||
      j.qo_stride < j.hq * dh || j.k_stride < j.hk * dh || j.ko_stride < j.hk * dh || j.kb_stride < j.hk * dh ||
      j.v_stride < j.vc || j.vo_stride < j.vc || j.vb_stride < j.vc)
    return invalid_argument("rope_qkv: a null pointer or a row stride below its row");
  if (t == 0) return Status::ok();
  const int64_t n = t * (dh / 2) + t * j.vc;
  if (n > INT32_MAX / 2 || (j.hq + j.hk) * dh > INT32_MAX / 2) return invalid_argument("rope_qkv: sizes above 2^30");
  launch(rope_qkv_kernel, grid_1d(n, kThreads), kThreads, 0, stream, j, pos, int(t), int(dh), base);
  return launch_status("rope_qkv");
}

Status rope_sincos(cudaStream_t stream, const int64_t* pos, int64_t t, int64_t dh, float base, float* sc) {
  if (t < 0 || dh <= 0 || dh % 2 != 0 || (t > 0 && (!pos || !sc)))
    return invalid_argument("rope_sincos: bad shape (dh even) or a null pointer");
  if (t == 0) return Status::ok();
  const int64_t n = t * (dh / 2);
  if (n > INT32_MAX / 2) return invalid_argument("rope_sincos: sizes above 2^30");
  launch(rope_sincos_kernel, grid_1d(n, kThreads), kThreads, 0, stream, pos, int(t), int(dh), base, sc);
  return launch_status("rope_sincos");
}

Status im2col_patches(cudaStream_t stream, const float* img, void* cols, DType ct, int64_t c, int64_t y, int64_t x,
                      int64_t kh, int64_t kw) {
  if (!is_act(ct)) return bad_dtype("im2col_patches");
  if (c <= 0 || kh <= 0 || kw <= 0 || y < kh || x < kw) return invalid_argument("im2col_patches: bad shape");
  const int64_t n = (y / kh) * (x / kw) * c * kh * kw;
  if (ct == DType::F32)
    launch(im2col_kernel<float>, grid_1d(n, kThreads), kThreads, 0, stream, img, static_cast<float*>(cols), c, y, x, kh, kw);
  else
    launch(im2col_kernel<uint16_t>, grid_1d(n, kThreads), kThreads, 0, stream, img, static_cast<uint16_t*>(cols), c, y, x, kh, kw);
  return launch_status("im2col_patches");
}

Status embedding(cudaStream_t stream, const void* table, DType tt, int64_t v, int64_t d, const int64_t* ids,
                 int64_t t, float scale, void* out, DType ot, int* bad) {
  if (!is_act(tt) || !is_act(ot)) return bad_dtype("embedding");
  if (v <= 0 || d <= 0 || t < 0) return invalid_argument("embedding: bad shape");
  if (t == 0) return Status::ok();
  return dispatch2(tt, ot, [&]<typename Tt, typename To>() {
    launch(embedding_kernel<Tt, To>, grid_1d(t * d, kThreads), kThreads, 0, stream, static_cast<const Tt*>(table), v, d, ids, t,
                                                                       scale, static_cast<To*>(out), bad);
    return launch_status("embedding");
  });
}

Status check_token_ids(const int64_t* ids, int64_t t, int64_t v) {
  for (int64_t i = 0; i < t; ++i)
    if (ids[i] < 0 || ids[i] >= v)
      return invalid_argument("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(v) + ")");
  return Status::ok();
}

}  // namespace vlac::cuda
