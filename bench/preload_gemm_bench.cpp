// The preload GEMM (preload_gemm.h) against cuBLASLt at the expert's four shapes, each as a CUDA
// graph of 180 calls over 18 layers' own weights (per call), and the expert's GEMM chain with a
// small kernel between the GEMMs (18 layers × 10 steps a graph, per layer): the chain is where
// loading W before the wait can overlap the kernels before. Prints JSON. Environment switches of
// the kernel (VLAC_PRELOAD_EARLY, _MAX_PARTS, _SMEM_KIB, _PROBE) apply; run once per setting.
// Usage: preload_gemm_bench [--reps N] [--out FILE]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/preload_gemm.h"
#include "cuda_bench_util.h"

using namespace vlac;
using namespace vlac::cuda;

int main(int argc, char** argv) {
  int reps = 10;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else {
      std::fprintf(stderr, "usage: preload_gemm_bench [--reps N] [--out FILE]\n");
      return 2;
    }
  }
  SK(device_status());
  const int sms = device_sm_count();
  constexpr int kLayers = 18, kSteps = 10;
  constexpr int64_t m = 50, d = 1024, f = 4096, q = 2560, att = 2048;
  struct Shape { const char* name; int64_t n, k; DType out; };
  const Shape shapes[] = {{"qkv", q, d, DType::BF16}, {"o", d, att, DType::F32},
                          {"gate_up", 2 * f, d, DType::BF16}, {"down", d, f, DType::F32}};
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  auto runner = GemmRunner::create();
  SK(runner.status());
  void* ws = dalloc(runner->workspace_bytes());
  // Weights: every layer its own, so nothing stays in L2 between a layer's uses.
  std::vector<void*> w[4];
  for (int s = 0; s < 4; ++s)
    for (int l = 0; l < kLayers; ++l) {
      w[s].push_back(dalloc(size_t(shapes[s].n * shapes[s].k) * 2));
      fill_bf16_uniform(w[s].back(), size_t(shapes[s].n * shapes[s].k), uint32_t(100 * s + l), 0.03f);
    }
  void* x = dalloc(size_t(m * f) * 2);  // the widest input
  fill_bf16_uniform(x, size_t(m * f), 7, 1.0f);
  void* y = dalloc(size_t(m * 2 * f) * 4);
  nlohmann::json j;
  j["gpu_sms"] = sms;
  auto gemm = [&](bool preload, int s, int l, const void* in, void* o) -> Status {
    const Shape& sh = shapes[s];
    if (preload) return preload_gemm(st, PreloadGemm{m, sh.n, sh.k, sh.out}, sms, in, w[s][size_t(l)], nullptr, o);
    GemmDesc g;
    g.m = m, g.n = sh.n, g.k = sh.k, g.out = sh.out;
    return runner->run(st, g, in, w[s][size_t(l)], nullptr, o, ws);
  };
  for (int s = 0; s < 4; ++s) {
    const Shape& sh = shapes[s];
    const PreloadGemm pg{m, sh.n, sh.k, sh.out};
    const PreloadTiles t = preload_gemm_tiles(m, sh.n, sh.k, sms * preload_gemm_waves(), preload_gemm_smem_limit(),
                                               preload_gemm_max_parts());
    nlohmann::json r;
    r["tiles"] = {{"rows", t.rows}, {"parts", t.parts}, {"blocks", t.blocks}, {"threads", t.threads}, {"smem", t.smem}};
    r["clusters"] = t.parts ? t.blocks / t.parts : 0;
    r["clusters_resident"] = preload_gemm_active_clusters(pg, sms);
    const double mb = double(sh.n * sh.k * 2) / 1e6;
    for (bool pre : {false, true}) {
      const double ms = graph_ms(st, reps, kLayers * kSteps, [&](int i) { SK(gemm(pre, s, i % kLayers, x, y)); });
      r[pre ? "preload_us" : "cublaslt_us"] = ms * 1e3;
      r[pre ? "preload_tbps" : "cublaslt_tbps"] = mb / (ms * 1e3);  // MB per us = TB/s
    }
    std::printf("%-8s rows %3d parts %d blocks %3d threads %3d smem %6.1f KiB clusters %d (resident %d): "
                "cuBLASLt %6.2f us, preload %6.2f us\n",
                sh.name, t.rows, t.parts, t.blocks, t.threads, double(t.smem) / 1024, t.parts ? t.blocks / t.parts : 0,
                r["clusters_resident"].get<int>(), r["cublaslt_us"].get<double>(), r["preload_us"].get<double>());
    j["shapes"][sh.name] = r;
  }
  // The chain: qkv → (copy of q's columns) → o → cast → gate|up → GELU → down → cast, per layer.
  void* hq = dalloc(size_t(m * q) * 2);
  void* ha = dalloc(size_t(m * att) * 2);
  void* ho = dalloc(size_t(m * d) * 4);
  void* hx = dalloc(size_t(m * d) * 2);
  void* hg = dalloc(size_t(m * 2 * f) * 2);
  void* hf = dalloc(size_t(m * f) * 2);
  void* hd = dalloc(size_t(m * d) * 4);
  fill_bf16_uniform(hx, size_t(m * d), 9, 1.0f);
  auto layer = [&](bool pre, int l) {
    SK(gemm(pre, 0, l, hx, hq));
    SK(cast_rows(st, hq, DType::BF16, q, ha, DType::BF16, att, m, att));
    SK(gemm(pre, 1, l, ha, ho));
    SK(cast(st, ho, DType::F32, hx, DType::BF16, m * d));
    SK(gemm(pre, 2, l, hx, hg));
    SK(gelu_tanh(st, hg, DType::BF16, hf, DType::BF16, m * f));
    SK(gemm(pre, 3, l, hf, hd));
    SK(cast(st, hd, DType::F32, hx, DType::BF16, m * d));
  };
  for (bool pre : {false, true}) {
    const double ms = graph_ms(st, reps, kLayers * kSteps, [&](int i) { layer(pre, i % kLayers); });
    j["chain"][pre ? "preload_us_per_layer" : "cublaslt_us_per_layer"] = ms * 1e3;
  }
  // The small kernels alone (the chain's floor without any GEMM).
  const double small = graph_ms(st, reps, kLayers * kSteps, [&](int) {
    SK(cast_rows(st, hq, DType::BF16, q, ha, DType::BF16, att, m, att));
    SK(cast(st, ho, DType::F32, hx, DType::BF16, m * d));
    SK(gelu_tanh(st, hg, DType::BF16, hf, DType::BF16, m * f));
    SK(cast(st, hd, DType::F32, hx, DType::BF16, m * d));
  });
  j["chain"]["small_kernels_us_per_layer"] = small * 1e3;
  std::printf("chain per layer: cuBLASLt %.2f us, preload %.2f us, the 4 small kernels alone %.2f us\n",
              j["chain"]["cublaslt_us_per_layer"].get<double>(), j["chain"]["preload_us_per_layer"].get<double>(),
              small * 1e3);
  for (const char* e : {"VLAC_PRELOAD_EARLY", "VLAC_PRELOAD_MAX_PARTS", "VLAC_PRELOAD_SMEM_KIB", "VLAC_PRELOAD_PROBE",
                        "VLAC_PRELOAD_PIPE", "VLAC_PRELOAD_WAVES"})
    if (const char* v = std::getenv(e)) j["env"][e] = v;
  emit_json(j.dump(2), out);
  return 0;
}
