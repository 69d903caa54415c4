// Which FP8 scale modes does this GPU's cuBLASLt run, and how fast (issue 14)? The W8A8 path
// (VLAC_FP8_GEMM=1) asks for one fp32 scale per row of W and of x (OUTER_VEC_32F); in session 21
// the backend's plans of it were refused (their scale pointers were null at the heuristic, the
// `_null_at_plan` variant below), so every e4m3 GEMM widened. This probes each mode cuBLASLt
// declares, on the same operands:
//   outer_vec          A (W) and B (x) per-row vectors
//   scalar             one scale each (per tensor)
//   scalar_w_outer_x, outer_w_scalar_x  one per tensor for one operand, per row for the other
//   alpha_vec          scalar A/B scales and alpha as a device vector over D's rows (W's rows)
//   vec128[_kfast|_rowfast]  a scale per row and 128-wide K block for both, in either layout
//   blk_w_vec_x        W in 128x128 blocks, x per row and K block (both layouts)
// For each: whether a plan exists, whether it runs, its error against a host reference that
// applies the mode's scales at 96 x 384 x 512 (which tells the layout), and its time at pi0.5's
// GEMM shapes next to bf16 (best of cuBLASLt's first 4 heuristics for both, median of --reps).
//
// Usage: fp8_scale_modes_bench [--reps N] [--out FILE]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace {

#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "fp8_scale_modes_bench: %s: %s\n", #x, cudaGetErrorString(e_));          \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

struct Mode {
  std::string name;
  int a_mode = -1, b_mode = -1;  // -1: no scales at all (bf16)
  bool alpha_vec = false;
  bool kfast = true;  // block scales stored [row][kblock] (true) or [kblock][row]
  bool fp8 = true;
  bool null_at_plan = false;  // scale pointers left null until the call (the backend did before session 21)
  bool align16 = false;       // the backend's 16-byte alignment preferences
};

// How many scale values, and the scale of element (row, k) of a [rows, k] operand, under a mode.
size_t scale_count(int mode, int64_t rows, int64_t k) {
  const int64_t kb = (k + 127) / 128;
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return 1;
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return size_t(rows);
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return size_t(rows * kb);
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return size_t(((rows + 127) / 128) * kb);
    default: return 0;
  }
}
size_t scale_index(int mode, bool kfast, int64_t rows, int64_t k, int64_t r, int64_t q) {
  const int64_t kb = (k + 127) / 128, b = q / 128;
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return 0;
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return size_t(r);
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return size_t(kfast ? r * kb + b : b * rows + r);
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: {
      const int64_t rb = (rows + 127) / 128;
      return size_t(kfast ? (r / 128) * kb + b : b * rb + r / 128);
    }
    default: return 0;
  }
}

struct Gemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  std::string error;
  ~Gemm() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (auto* l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

// y[m, n] = x[m, k] · W[n, k]ᵀ as the backend lays it out: cuBLASLt's A = W (transposed), B = x.
bool make(cublasLtHandle_t h, const Mode& md, int64_t m, int64_t n, int64_t k, const void* wsc, const void* xsc,
          size_t ws_bytes, Gemm& g) {
  auto fail = [&](const char* what, cublasStatus_t s) {
    g.error = std::string(what) + ": " + cublasLtGetStatusString(s);
    return false;
  };
  cublasStatus_t s = cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s) return fail("descriptor", s);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (md.fp8) {
    const int32_t am = md.a_mode, bm = md.b_mode;
    if ((s = cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am))) return fail("A mode", s);
    if ((s = cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm))) return fail("B mode", s);
    const void* a_ptr = md.null_at_plan ? nullptr : wsc;
    const void* b_ptr = md.null_at_plan ? nullptr : xsc;
    if ((s = cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_ptr, sizeof a_ptr))) return fail("A scale", s);
    if ((s = cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_ptr, sizeof b_ptr))) return fail("B scale", s);
    if (md.alpha_vec) {
      const int32_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
      if ((s = cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm)))
        return fail("pointer mode", s);
    }
  }
  const cudaDataType_t ti = md.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  if ((s = cublasLtMatrixLayoutCreate(&g.a, ti, uint64_t(k), uint64_t(n), k))) return fail("layout W", s);
  if ((s = cublasLtMatrixLayoutCreate(&g.b, ti, uint64_t(k), uint64_t(m), k))) return fail("layout x", s);
  if ((s = cublasLtMatrixLayoutCreate(&g.c, CUDA_R_16BF, uint64_t(n), uint64_t(m), n))) return fail("layout y", s);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
  if (md.align16) {
    const uint32_t align = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
  }
  g.algos.resize(4);
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(h, g.op, g.a, g.b, g.c, g.c, pref, 4, g.algos.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s) return fail("heuristic", s);
  if (found == 0) return fail("heuristic", CUBLAS_STATUS_NOT_SUPPORTED);
  g.algos.resize(size_t(found));
  if (md.fp8 && md.null_at_plan) {
    cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wsc, sizeof wsc);
    cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xsc, sizeof xsc);
  }
  return true;
}

cublasStatus_t launch(cublasLtHandle_t h, const Mode& md, Gemm& g, size_t algo, const void* w, const void* x, void* y,
                      const float* alpha_dev, void* ws, size_t ws_bytes, cudaStream_t st) {
  const float one = 1.0f, zero = 0.0f;
  const void* alpha = md.alpha_vec ? static_cast<const void*>(alpha_dev) : &one;
  return cublasLtMatmul(h, g.op, alpha, w, g.a, x, g.b, &zero, y, g.c, y, g.c, &g.algos[algo].algo, ws, ws_bytes, st);
}

template <class T>
T* upload(const std::vector<T>& v) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(16, v.size() * sizeof(T))));
  T* d = static_cast<T*>(p);
  CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: fp8_scale_modes_bench [--reps N] [--out FILE]\n");
      return 2;
    }
  }
  int dev = 0, cc_major = 0, cc_minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    std::fprintf(stderr, "fp8_scale_modes_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  cublasLtHandle_t h = nullptr;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  const size_t ws_bytes = 32u << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));

  using S = cublasLtMatmulMatrixScale_t;
  std::vector<Mode> modes = {
      {"bf16", -1, -1, false, true, false},
      {"outer_vec", S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F},
      {"outer_vec_null_at_plan", S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
       false, true, true, true, false},
      {"outer_vec_align16", S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
       false, true, true, false, true},
      {"scalar", S::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F},
      {"scalar_w_outer_x", S::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F},
      {"outer_w_scalar_x", S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F},
      {"alpha_vec", S::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, true},
      {"vec128_kfast", S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, false, true},
      {"vec128_rowfast", S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, false, false},
      {"blk_w_vec_x_kfast", S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, false, true},
      {"blk_w_vec_x_rowfast", S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, false, false},
  };
  nlohmann::json j;
  j["benchmark"] = "fp8_scale_modes_bench";
  j["gpu"] = prop.name;
  j["compute_capability"] = cc_major * 10 + cc_minor;
  j["cublaslt_version"] = cublasLtGetVersion();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f), ex(-3.0f, 3.0f);

  // 1. Accuracy at 96 x 384 x 512: each mode's scales drawn at its own granularity.
  const int64_t am = 96, an = 384, ak = 512;
  std::vector<uint8_t> xc(size_t(am * ak)), wc(size_t(an * ak));
  for (auto& v : xc) v = vlac::f32_to_f8e4m3(uni(rng) * 200.0f);
  for (auto& v : wc) v = vlac::f32_to_f8e4m3(uni(rng) * 200.0f);
  std::vector<float> xf(xc.size()), wf(wc.size());
  for (size_t i = 0; i < xc.size(); ++i) xf[i] = vlac::f8e4m3_to_f32(xc[i]);
  for (size_t i = 0; i < wc.size(); ++i) wf[i] = vlac::f8e4m3_to_f32(wc[i]);
  uint8_t* dxc = upload(xc);
  uint8_t* dwc = upload(wc);
  std::vector<uint16_t> xb(xf.size()), wb(wf.size());  // bf16 of the same values (exact)
  for (size_t i = 0; i < xf.size(); ++i) xb[i] = uint16_t(std::bit_cast<uint32_t>(xf[i]) >> 16);
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = uint16_t(std::bit_cast<uint32_t>(wf[i]) >> 16);
  uint16_t* dxb = upload(xb);
  uint16_t* dwb = upload(wb);
  void* dy = nullptr;
  CK(cudaMalloc(&dy, size_t(am * an) * 2));
  nlohmann::json& acc = j["accuracy_96x384x512"];
  for (const Mode& md : modes) {
    nlohmann::json r;
    std::vector<float> ws_h(1, 1.0f), xs_h(1, 1.0f), alpha_h;
    auto draw = [&](int mode, int64_t rows, int64_t k) {
      std::vector<float> s(std::max<size_t>(1, scale_count(mode, rows, k)));
      for (auto& v : s) v = std::exp2(ex(rng)) / 448.0f;
      return s;
    };
    if (md.fp8) {
      ws_h = draw(md.a_mode, an, ak);
      xs_h = draw(md.b_mode, am, ak);
    }
    if (md.alpha_vec) {
      alpha_h.resize(size_t(an));
      for (auto& v : alpha_h) v = std::exp2(ex(rng));
    }
    float* dws = upload(ws_h);
    float* dxs = upload(xs_h);
    float* dal = alpha_h.empty() ? nullptr : upload(alpha_h);
    Gemm g;
    if (!make(h, md, am, an, ak, dws, dxs, ws_bytes, g)) {
      r["planned"] = false;
      r["error"] = g.error;
    } else {
      r["planned"] = true;
      CK(cudaMemset(dy, 0, size_t(am * an) * 2));
      const cublasStatus_t s = launch(h, md, g, 0, md.fp8 ? static_cast<const void*>(dwc) : dwb,
                                      md.fp8 ? static_cast<const void*>(dxc) : dxb, dy, dal, ws, ws_bytes, st);
      const cudaError_t ce = cudaStreamSynchronize(st);
      r["ran"] = s == CUBLAS_STATUS_SUCCESS && ce == cudaSuccess;
      if (s != CUBLAS_STATUS_SUCCESS) r["error"] = std::string("matmul: ") + cublasLtGetStatusString(s);
      if (ce != cudaSuccess) {
        r["error"] = std::string("sync: ") + cudaGetErrorString(ce);
        (void)cudaGetLastError();
      }
      if (r["ran"].get<bool>()) {
        std::vector<uint16_t> y(size_t(am * an));
        CK(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost));
        double maxd = 0, maxr = 0;
        for (int64_t i = 0; i < am; ++i)
          for (int64_t c = 0; c < an; ++c) {
            double t = 0;
            for (int64_t q = 0; q < ak; ++q) {
              double v = double(xf[size_t(i * ak + q)]) * wf[size_t(c * ak + q)];
              if (md.fp8)
                v *= double(ws_h[scale_index(md.a_mode, md.kfast, an, ak, c, q)]) *
                     xs_h[scale_index(md.b_mode, md.kfast, am, ak, i, q)];
              t += v;
            }
            if (md.alpha_vec) t *= alpha_h[size_t(c)];
            maxd = std::max(maxd, std::abs(t - bf16_to_float(y[size_t(i * an + c)])));
            maxr = std::max(maxr, std::abs(t));
          }
        r["max_abs_diff_over_max_ref"] = maxr > 0 ? maxd / maxr : 0.0;
      }
    }
    std::printf("accuracy %-22s %s\n", md.name.c_str(), r.dump().c_str());
    acc[md.name] = r;
    for (void* p : {static_cast<void*>(dws), static_cast<void*>(dxs), static_cast<void*>(dal)})
      if (p) cudaFree(p);
  }

  // 2. Speed at pi0.5's shapes (3 cameras: 968 prefix rows; the expert's 50), bf16 against each
  //    mode that ran, operands filled with small random codes (never zeros).
  struct Shape { const char* what; int64_t m, k, n; };
  const Shape shapes[] = {{"lm q|k|v", 968, 2048, 2560},    {"lm o", 968, 2048, 2048},
                          {"lm gate|up", 968, 2048, 32768}, {"lm down", 968, 16384, 2048},
                          {"siglip fc1", 768, 1152, 4304},  {"siglip fc2", 768, 4304, 1152},
                          {"expert q|k|v", 50, 1024, 2560}, {"expert gate|up", 50, 1024, 8192},
                          {"expert down", 50, 4096, 1024}};
  nlohmann::json& sp = j["speed"];
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const Shape& sh : shapes) {
    const size_t xn = size_t(sh.m * sh.k), wn = size_t(sh.n * sh.k), yn = size_t(sh.m * sh.n);
    void *x = nullptr, *w = nullptr, *y = nullptr;
    CK(cudaMalloc(&x, xn * 2));
    CK(cudaMalloc(&w, wn * 2));
    CK(cudaMalloc(&y, yn * 2));
    CK(cudaMemset(x, 0x3a, xn * 2));  // 0x3a3a: a small bf16; 0x3a: a small e4m3
    CK(cudaMemset(w, 0x3a, wn * 2));
    std::vector<float> ones(std::max<size_t>(size_t(sh.n), size_t(sh.m)) * size_t((sh.k + 127) / 128) + 16, 0.01f);
    float* dones = upload(ones);
    nlohmann::json row;
    row["m"] = sh.m, row["k"] = sh.k, row["n"] = sh.n;
    std::printf("speed %-16s m %4lld k %5lld n %5lld:", sh.what, static_cast<long long>(sh.m),
                static_cast<long long>(sh.k), static_cast<long long>(sh.n));
    for (const Mode& md : modes) {
      if (md.fp8 && !acc[md.name].value("ran", false)) continue;
      Gemm g;
      if (!make(h, md, sh.m, sh.n, sh.k, dones, dones, ws_bytes, g)) {
        row[md.name] = {{"error", g.error}};
        std::printf("  %s -", md.name.c_str());
        continue;
      }
      double best = 1e30;
      for (size_t a = 0; a < g.algos.size(); ++a) {
        bool ok = true;
        for (int i = 0; i < 3 && ok; ++i)
          ok = launch(h, md, g, a, w, x, y, dones, ws, ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
        if (!ok || cudaStreamSynchronize(st) != cudaSuccess) {
          (void)cudaGetLastError();
          continue;
        }
        std::vector<float> t;
        for (int r = 0; r < reps; ++r) {
          CK(cudaEventRecord(e0, st));
          (void)launch(h, md, g, a, w, x, y, dones, ws, ws_bytes, st);
          CK(cudaEventRecord(e1, st));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          t.push_back(ms);
        }
        std::nth_element(t.begin(), t.begin() + long(t.size() / 2), t.end());
        best = std::min(best, double(t[t.size() / 2]));
      }
      if (best < 1e29) {
        row[md.name] = {{"median_ms", best}, {"tflops", 2.0 * sh.m * sh.n * sh.k / (best * 1e-3) / 1e12}};
        std::printf("  %s %.4f", md.name.c_str(), best);
      } else {
        row[md.name] = {{"error", "no algorithm ran"}};
        std::printf("  %s x", md.name.c_str());
      }
    }
    std::printf("\n");
    sp[sh.what] = row;
    for (void* p : {x, w, y, static_cast<void*>(dones)}) cudaFree(p);
  }
  const std::string text = j.dump(1);
  if (!out_path.empty()) {
    std::ofstream(out_path + ".tmp") << text << "\n";
    std::rename((out_path + ".tmp").c_str(), out_path.c_str());
  } else {
    std::printf("%s\n", text.c_str());
  }
  return 0;
}
