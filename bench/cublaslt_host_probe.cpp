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
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
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
    CHECK_LT(lt().MatmulDescCreate(&q.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    CHECK_LT(lt().MatmulDescSetAttribute(q.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CHECK_LT(lt().MatmulDescSetAttribute(q.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
    CHECK_LT(lt().MatrixLayoutCreate(&q.a, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.n), s.k));
    CHECK_LT(lt().MatrixLayoutCreate(&q.b, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.m), s.k));
    CHECK_LT(lt().MatrixLayoutCreate(&q.c, CUDA_R_16BF, uint64_t(s.n), uint64_t(s.m), s.n));
    if (!loaded.empty()) {
      q.algo = loaded[plans.size()];
      q.ok = true;
      if (check) {
        cublasLtMatmulHeuristicResult_t r{};
        q.ok = lt().MatmulAlgoCheck(h, q.op, q.a, q.b, q.c, q.c, &q.algo, &r) == CUBLAS_STATUS_SUCCESS;
      }
    } else if (!algo_ids) {
      cublasLtMatmulPreference_t pref = nullptr;
      CHECK_LT(lt().MatmulPreferenceCreate(&pref));
      CHECK_LT(lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                 sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t res[8];
      int got = 0;
      CHECK_LT(lt().MatmulAlgoGetHeuristic(h, q.op, q.a, q.b, q.c, q.c, pref, 8, res, &got));
      lt().MatmulPreferenceDestroy(pref);
      q.ok = got > 0;
      if (q.ok) q.algo = res[0].algo;
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
        q.ok = lt().MatmulAlgoCheck(h, q.op, q.a, q.b, q.c, q.c, &q.algo, &r) == CUBLAS_STATUS_SUCCESS &&
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
    CHECK_LT(lt().Matmul(h, plans[i].op, &alpha, w, plans[i].a, x, plans[i].b, &beta, y, plans[i].c, y, plans[i].c,
                         &plans[i].algo, ws, ws_bytes, nullptr));
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
      const int64_t m = 968, n = 2048, k = 2048, kk = k / c.batches;
      cublasLtMatmulDesc_t op = nullptr;
      cublasLtMatrixLayout_t a = nullptr, b = nullptr, y = nullptr;
      CHECK_LT(lt().MatmulDescCreate(&op, c.ct, CUDA_R_32F));
      const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
      CHECK_LT(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
      CHECK_LT(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
      CHECK_LT(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof(c.epi)));
      CHECK_LT(lt().MatrixLayoutCreate(&a, c.in, uint64_t(kk), uint64_t(n), k));
      CHECK_LT(lt().MatrixLayoutCreate(&b, c.in, uint64_t(kk), uint64_t(m), k));
      CHECK_LT(lt().MatrixLayoutCreate(&y, c.out, uint64_t(n), uint64_t(m), n));
      if (c.batches > 1) {
        const int32_t bc = c.batches;
        const int64_t st[3] = {kk, kk, n * m};
        cublasLtMatrixLayout_t ls[3] = {a, b, y};
        for (int i = 0; i < 3; ++i) {
          CHECK_LT(lt().MatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
          CHECK_LT(lt().MatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st[i], sizeof(st[i])));
        }
      }
      cublasLtMatmulPreference_t pref = nullptr;
      CHECK_LT(lt().MatmulPreferenceCreate(&pref));
      CHECK_LT(lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t res[8];
      int got = 0;
      const cublasStatus_t st = lt().MatmulAlgoGetHeuristic(h, op, a, b, y, y, pref, 8, res, &got);
      p.mark(std::string("combo ") + c.name + (st == CUBLAS_STATUS_SUCCESS && got > 0 ? "" : " (none)"));
      lt().MatmulPreferenceDestroy(pref);
      lt().MatrixLayoutDestroy(a), lt().MatrixLayoutDestroy(b), lt().MatrixLayoutDestroy(y);
      lt().MatmulDescDestroy(op);
    }
  }
  for (Planned& q : plans) {
    lt().MatrixLayoutDestroy(q.a), lt().MatrixLayoutDestroy(q.b), lt().MatrixLayoutDestroy(q.c);
    lt().MatmulDescDestroy(q.op);
  }
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
