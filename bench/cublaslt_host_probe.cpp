// Where cuBLASLt's host memory comes from: the malloc heap in use (mallinfo2) and RssAnon after each
// step of planning and running pi0.5's bf16 GEMM shapes, one JSON object. Session 37's breakdown
// put ~261 MB of a chunk run's host heap under "gemm_plan" (the runner's first heuristic queries);
// this says whether that is per shape or once, whether the heuristic or the first matmul pays it,
// and whether algorithms built from their ids (--algo-ids: no heuristic) avoid it.
// --save-algos FILE writes the chosen algorithms (cuBLASLt's opaque 64-byte structs); --load-algos
// FILE runs the matmuls with those instead of asking (a second process: does running alone pay?),
// --check also passes each through cublasLtMatmulAlgoCheck. --combos then asks for the other kinds
// of GEMM the runner plans (fp32 outputs, bias and GELU epilogues, batched K parts, fp32 inputs).
// Usage: cublaslt_host_probe [--algo-ids | --load-algos FILE [--check]] [--save-algos FILE] [--combos] [--trim] [--out FILE]
#include <dlfcn.h>
#include <malloc.h>

#include <cuda_runtime_api.h>
#include <cublasLt.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/cublaslt_api.h"
#include "mem/host_memory.h"

namespace {

using vlac::cuda::lt;

struct Shape {
  const char* name;
  int64_t m, n, k;
};

// y[m, n] = x[m, k] W[n, k]^T as the GEMM runner lays it out (W is cuBLASLt's A, transposed).
const Shape kShapes[] = {
    {"lm_qkv", 968, 2560, 2048},     {"lm_o", 968, 2048, 2048},       {"lm_gate_up", 968, 32768, 2048},
    {"lm_down", 968, 2048, 16384},   {"expert_qkv", 50, 2560, 1024},  {"expert_o", 50, 1024, 2048},
    {"expert_gate_up", 50, 8192, 1024}, {"expert_down", 50, 1024, 4096}, {"siglip_qkv", 768, 3456, 1152},
    {"siglip_fc1", 768, 4304, 1152}, {"siglip_fc2", 768, 1152, 4304},
};

struct Probe {
  nlohmann::json steps = nlohmann::json::array();
  uint64_t heap0 = vlac::malloc_in_use_bytes(), anon0 = vlac::rss_anon_bytes();
  uint64_t heap_prev = heap0, anon_prev = anon0;
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  void mark(const std::string& name) {
    const uint64_t h = vlac::malloc_in_use_bytes(), a = vlac::rss_anon_bytes();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    steps.push_back({{"step", name}, {"heap_delta_bytes", int64_t(h) - int64_t(heap_prev)},
                     {"anon_delta_bytes", int64_t(a) - int64_t(anon_prev)}, {"heap_bytes", h - heap0},
                     {"anon_bytes", a - anon0}, {"ms", ms}});
    std::fprintf(stderr, "%-28s heap %+9.1f MiB (total %7.1f)  anon %+9.1f MiB (total %7.1f)  %8.1f ms\n", name.c_str(),
                 (double(h) - double(heap_prev)) / 1048576.0, double(h - heap0) / 1048576.0,
                 (double(a) - double(anon_prev)) / 1048576.0, double(a - anon0) / 1048576.0, ms);
    heap_prev = h, anon_prev = a;
    t = std::chrono::steady_clock::now();
  }
};

#define CHECK_LT(call)                                                                       \
  do {                                                                                       \
    const cublasStatus_t s_ = (call);                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
      std::fprintf(stderr, "cublaslt_host_probe: %s: status %d\n", #call, static_cast<int>(s_)); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

// One GEMM's descriptors as the runner makes them: W transposed (cuBLASLt's A), x (B), y (C), with
// `batches` equal K chunks as strided batches (the runner's K parts).
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  bool create(cudaDataType_t in, cudaDataType_t out, cublasComputeType_t ct, cublasLtEpilogue_t epi, int64_t m,
              int64_t n, int64_t k, int batches = 1) {
    const int64_t kk = k / batches;
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    if (lt().MatmulDescCreate(&op, ct, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
        lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)) != CUBLAS_STATUS_SUCCESS ||
        lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)) != CUBLAS_STATUS_SUCCESS ||
        lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)) != CUBLAS_STATUS_SUCCESS ||
        lt().MatrixLayoutCreate(&a, in, uint64_t(kk), uint64_t(n), k) != CUBLAS_STATUS_SUCCESS ||
        lt().MatrixLayoutCreate(&b, in, uint64_t(kk), uint64_t(m), k) != CUBLAS_STATUS_SUCCESS ||
        lt().MatrixLayoutCreate(&c, out, uint64_t(n), uint64_t(m), n) != CUBLAS_STATUS_SUCCESS)
      return false;
    if (batches > 1) {
      const int32_t bc = batches;
      const int64_t st[3] = {kk, kk, n * m};
      cublasLtMatrixLayout_t ls[3] = {a, b, c};
      for (int i = 0; i < 3; ++i)
        if (lt().MatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)) !=
                CUBLAS_STATUS_SUCCESS ||
            lt().MatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st[i], sizeof(st[i])) !=
                CUBLAS_STATUS_SUCCESS)
          return false;
    }
    return true;
  }
  // The heuristic's first answer within `ws_bytes` of workspace; false when it has none.
  bool ask(cublasLtHandle_t h, uint64_t ws_bytes, cublasLtMatmulAlgo_t* algo) const {
    cublasLtMatmulPreference_t pref = nullptr;
    if (lt().MatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
    cublasLtMatmulHeuristicResult_t res[8];
    int got = 0;
    const bool ok =
        lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)) ==
            CUBLAS_STATUS_SUCCESS &&
        lt().MatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 8, res, &got) == CUBLAS_STATUS_SUCCESS && got > 0;
    lt().MatmulPreferenceDestroy(pref);
    if (ok) *algo = res[0].algo;
    return ok;
  }
  void destroy() {
    for (cublasLtMatrixLayout_t l : {a, b, c})
      if (l) lt().MatrixLayoutDestroy(l);
    if (op) lt().MatmulDescDestroy(op);
  }
};

}  // namespace

int main(int argc, char** argv) {
  bool algo_ids = false, trim = false, check = false, combos = false;
  std::string out, save, load;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--algo-ids") algo_ids = true;
    else if (a == "--trim") trim = true;
    else if (a == "--check") check = true;
    else if (a == "--combos") combos = true;
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--save-algos" && i + 1 < argc) save = argv[++i];
    else if (a == "--load-algos" && i + 1 < argc) load = argv[++i];
    else {
      std::fprintf(stderr, "usage: cublaslt_host_probe [--algo-ids | --load-algos FILE [--check]] [--save-algos FILE] "
                           "[--combos] [--trim] [--out FILE]\n");
      return 2;
    }
  }
  Probe p;
  if (cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "cublaslt_host_probe: no CUDA device\n");
    return 1;
  }
  p.mark("cuda_context");
  if (!vlac::cuda::cublaslt_load().is_ok()) {
    std::fprintf(stderr, "cublaslt_host_probe: %s\n", vlac::cuda::cublaslt_load().message().c_str());
    return 1;
  }
  p.mark("cublaslt_load");
  cublasLtHandle_t h = nullptr;
  CHECK_LT(lt().Create(&h));
  p.mark("create");
  // For --algo-ids: the two entry points the runner does not resolve.
  using GetIds = cublasStatus_t (*)(cublasLtHandle_t, cublasComputeType_t, cudaDataType_t, cudaDataType_t, cudaDataType_t,
                                    cudaDataType_t, cudaDataType_t, int, int*, int*);
  using Init = cublasStatus_t (*)(cublasLtHandle_t, cublasComputeType_t, cudaDataType_t, cudaDataType_t, cudaDataType_t,
                                  cudaDataType_t, cudaDataType_t, int, cublasLtMatmulAlgo_t*);
  void* lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_NOLOAD);
  auto get_ids = lib ? reinterpret_cast<GetIds>(dlsym(lib, "cublasLtMatmulAlgoGetIds")) : nullptr;
  auto init = lib ? reinterpret_cast<Init>(dlsym(lib, "cublasLtMatmulAlgoInit")) : nullptr;
  if (algo_ids && (!get_ids || !init)) {
    std::fprintf(stderr, "cublaslt_host_probe: cublasLtMatmulAlgoGetIds/Init not found\n");
    return 1;
  }
  const uint64_t ws_bytes = 4u << 20;
  void* ws = nullptr;
  if (cudaMalloc(&ws, ws_bytes) != cudaSuccess) return 1;
  struct Planned {
    Desc d;
    cublasLtMatmulAlgo_t algo;
    bool ok;
  };
  std::vector<Planned> plans;
  std::vector<cublasLtMatmulAlgo_t> loaded;
  if (!load.empty()) {
    std::ifstream f(load, std::ios::binary);
    for (size_t i = 0; i < std::size(kShapes); ++i) {
      cublasLtMatmulAlgo_t a{};
      f.read(reinterpret_cast<char*>(&a), sizeof(a));
      loaded.push_back(a);
    }
    if (!f) {
      std::fprintf(stderr, "cublaslt_host_probe: %s: not %zu algorithms\n", load.c_str(), std::size(kShapes));
      return 1;
    }
  }
  for (const Shape& s : kShapes) {
    Planned q{};
    if (!q.d.create(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DEFAULT, s.m, s.n, s.k)) {
      std::fprintf(stderr, "cublaslt_host_probe: %s: descriptors refused\n", s.name);
      return 1;
    }
    if (!loaded.empty()) {
      q.algo = loaded[plans.size()];
      q.ok = true;
      if (check) {
        cublasLtMatmulHeuristicResult_t r{};
        q.ok = lt().MatmulAlgoCheck(h, q.d.op, q.d.a, q.d.b, q.d.c, q.d.c, &q.algo, &r) == CUBLAS_STATUS_SUCCESS;
      }
    } else if (!algo_ids) {
      q.ok = q.d.ask(h, ws_bytes, &q.algo);
    } else {
      int ids[64], got = 0;
      CHECK_LT(get_ids(h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 64, ids,
                       &got));
      q.ok = false;
      for (int i = 0; i < got && !q.ok; ++i) {
        if (init(h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, ids[i], &q.algo) !=
            CUBLAS_STATUS_SUCCESS)
          continue;
        cublasLtMatmulHeuristicResult_t r{};
        q.ok = lt().MatmulAlgoCheck(h, q.d.op, q.d.a, q.d.b, q.d.c, q.d.c, &q.algo, &r) == CUBLAS_STATUS_SUCCESS &&
               r.workspaceSize <= ws_bytes;
      }
    }
    plans.push_back(q);
    p.mark(std::string(!loaded.empty() ? (check ? "loaded+check " : "loaded ") : algo_ids ? "algo_ids " : "heuristic ") +
           s.name + (q.ok ? "" : " (none)"));
  }
  if (!save.empty()) {
    std::ofstream f(save, std::ios::binary);
    for (const Planned& q : plans) f.write(reinterpret_cast<const char*>(&q.algo), sizeof(q.algo));
  }
  size_t most = 0;
  for (const Shape& s : kShapes) most = std::max<size_t>(most, size_t(s.n) * size_t(s.k) + size_t(s.m) * (s.k + s.n));
  void* buf = nullptr;
  if (cudaMalloc(&buf, most * 2) != cudaSuccess) return 1;
  cudaMemset(buf, 0, most * 2);
  for (size_t i = 0; i < plans.size(); ++i) {
    const Shape& s = kShapes[i];
    if (!plans[i].ok) continue;
    char* w = static_cast<char*>(buf);
    char* x = w + size_t(s.n) * size_t(s.k) * 2;
    char* y = x + size_t(s.m) * size_t(s.k) * 2;
    const float alpha = 1.0f, beta = 0.0f;
    const Desc& d = plans[i].d;
    CHECK_LT(lt().Matmul(h, d.op, &alpha, w, d.a, x, d.b, &beta, y, d.c, y, d.c, &plans[i].algo, ws, ws_bytes, nullptr));
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    p.mark(std::string("matmul ") + s.name);
  }
  if (combos) {  // one heuristic query per other kind of GEMM, at lm_o's shape
    struct Combo {
      const char* name;
      cudaDataType_t in, out;
      cublasComputeType_t ct;
      cublasLtEpilogue_t epi;
      int batches;
    };
    const Combo cs[] = {
        {"bf16_to_f32", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DEFAULT, 1},
        {"bf16_bias", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_BIAS, 1},
        {"bf16_f32_bias", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_BIAS, 1},
        {"bf16_gelu_bias", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_GELU_BIAS, 1},
        {"bf16_to_f32_batched", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DEFAULT, 4},
        {"f32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DEFAULT, 1},
        {"f32_tf32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLASLT_EPILOGUE_DEFAULT, 1},
    };
    for (const Combo& c : cs) {
      Desc d;
      cublasLtMatmulAlgo_t algo{};
      const bool ok = d.create(c.in, c.out, c.ct, c.epi, 968, 2048, 2048, c.batches) && d.ask(h, ws_bytes, &algo);
      p.mark(std::string("combo ") + c.name + (ok ? "" : " (none)"));
      d.destroy();
    }
  }
  for (Planned& q : plans) q.d.destroy();
  lt().Destroy(h);
  p.mark("destroy");
  if (trim) {
    malloc_trim(0);
    p.mark("malloc_trim");
  }
  const char* ml = std::getenv("CUDA_MODULE_LOADING");
  nlohmann::json j{{"algo_ids", algo_ids},
                   {"loaded_algos", !loaded.empty()},
                   {"checked", check},
                   {"cuda_module_loading", ml ? ml : ""},
                   {"heap_bytes", vlac::malloc_in_use_bytes() - p.heap0},
                   {"anon_bytes", vlac::rss_anon_bytes() - p.anon0},
                   {"steps", p.steps}};
  if (!out.empty()) std::ofstream(out) << j.dump(1) << "\n";
  std::printf("%s\n", j.dump().c_str());
  cudaFree(buf), cudaFree(ws);
  return 0;
}
