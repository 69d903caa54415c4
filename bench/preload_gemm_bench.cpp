// The preload GEMM (preload_gemm.h) against cuBLASLt at the expert's four shapes, each as a CUDA
// graph of 180 calls over 18 layers' own weights (per call), and the expert's GEMM chain with a
// small kernel between the GEMMs (18 layers × 10 steps a graph, per layer): the chain is where
// loading W before the wait can overlap the kernels before. Prints JSON. Environment switches of
// the kernel (VLAC_PRELOAD_EARLY, _MAX_PARTS, _SMEM_KIB, _PROBE) apply; run once per setting.
// Usage: preload_gemm_bench [--reps N] [--out FILE]
#include <cuda_runtime_api.h>

#include <algorithm>
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

// Per block stamps (preload_gemm_set_stamps) of one launch: the median time of each phase over the
// blocks, and the launch's span from its first block's start to its last block's end (us).
static nlohmann::json phases(const std::vector<unsigned long long>& t, int blocks) {
  static const char* names[] = {"issue_w", "wait_prev", "w_and_x_landed", "mma", "partial", "cluster_sum_store", "last_barrier"};
  nlohmann::json j;
  unsigned long long first = ~0ull, last = 0;
  for (int b = 0; b < blocks; ++b) {
    first = std::min(first, t[size_t(b) * kPreloadStamps]);
    last = std::max(last, t[size_t(b) * kPreloadStamps + kPreloadStamps - 1]);
  }
  for (int i = 0; i + 1 < kPreloadStamps; ++i) {
    std::vector<double> d;
    for (int b = 0; b < blocks; ++b)
      d.push_back(double(t[size_t(b) * kPreloadStamps + i + 1] - t[size_t(b) * kPreloadStamps + i]) / 1e3);
    j[names[i]] = median(d);
  }
  std::vector<double> starts;
  for (int b = 0; b < blocks; ++b) starts.push_back(double(t[size_t(b) * kPreloadStamps] - first) / 1e3);
  j["start_spread_median"] = median(starts);
  j["start_spread_max"] = *std::max_element(starts.begin(), starts.end());
  j["span"] = double(last - first) / 1e3;
  return j;
}

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
    const PreloadGemm pg{m, sh.n, sh.k, sh.out};
    if (preload && preload_gemm_plan(pg, sms).rows > 0)  // else left to cuBLASLt, as the executor does
      return preload_gemm(st, pg, sms, in, w[s][size_t(l)], nullptr, o);
    GemmDesc g;
    g.m = m, g.n = sh.n, g.k = sh.k, g.out = sh.out;
    return runner->run(st, g, in, w[s][size_t(l)], nullptr, o, ws);
  };
  for (int s = 0; s < 4; ++s) {
    const Shape& sh = shapes[s];
    const PreloadGemm pg{m, sh.n, sh.k, sh.out};
    const PreloadTiles t = preload_gemm_plan(pg, sms);
    nlohmann::json r;
    r["tiles"] = {{"rows", t.rows}, {"parts", t.parts}, {"blocks", t.blocks}, {"threads", t.threads}, {"smem", t.smem}};
    r["clusters"] = t.cluster ? t.blocks / t.cluster : 0;
    r["clusters_resident"] = preload_gemm_active_clusters(pg, sms);
    const double mb = double(sh.n * sh.k * 2) / 1e6;
    for (bool pre : {false, true}) {
      const double ms = graph_ms(st, reps, kLayers * kSteps, [&](int i) { SK(gemm(pre, s, i % kLayers, x, y)); });
      r[pre ? "preload_us" : "cublaslt_us"] = ms * 1e3;
      r[pre ? "preload_tbps" : "cublaslt_tbps"] = mb / (ms * 1e3);  // MB per us = TB/s
    }
    if (t.rows > 0) {  // one eager launch, stamped
      auto* st_buf = static_cast<unsigned long long*>(dalloc(size_t(t.blocks) * kPreloadStamps * 8));
      preload_gemm_set_stamps(st_buf);
      SK(gemm(true, s, 0, x, y));
      preload_gemm_set_stamps(nullptr);
      CK(cudaStreamSynchronize(st));
      std::vector<unsigned long long> h(size_t(t.blocks) * kPreloadStamps);
      CK(cudaMemcpy(h.data(), st_buf, h.size() * 8, cudaMemcpyDeviceToHost));
      r["eager_phases_us"] = phases(h, t.blocks);
      std::printf("%-8s eager phases: %s\n", sh.name, r["eager_phases_us"].dump().c_str());
      CK(cudaFree(st_buf));
    }
    if (t.rows == 0) std::printf("%-8s no one-wave tile on this GPU: the preload rows below are cuBLASLt's\n", sh.name);
    std::printf("%-8s rows %3d parts %d blocks %3d threads %3d smem %6.1f KiB clusters %d (resident %d): "
                "cuBLASLt %6.2f us, preload %6.2f us\n",
                sh.name, t.rows, t.parts, t.blocks, t.threads, double(t.smem) / 1024, t.cluster ? t.blocks / t.cluster : 0,
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
  // Two layers of the chain recorded with every GEMM stamped, replayed twice: when each GEMM's
  // blocks start, finish issuing W, pass the wait and have W and x, against the GEMM before.
  {
    std::vector<unsigned long long*> bufs;
    std::vector<int> blocks;
    for (int i = 0; i < 8; ++i) {
      const Shape& sh = shapes[i % 4];
      const int b = preload_gemm_plan(PreloadGemm{m, sh.n, sh.k, sh.out}, sms).blocks;
      blocks.push_back(b);
      bufs.push_back(static_cast<unsigned long long*>(dalloc(size_t(std::max(b, 1)) * kPreloadStamps * 8)));
    }
    int gi = 0;
    auto stamped = [&](int s, int l, const void* in, void* o) {
      preload_gemm_set_stamps(blocks[size_t(gi)] > 0 ? bufs[size_t(gi)] : nullptr);
      ++gi;
      SK(gemm(true, s, l, in, o));
      preload_gemm_set_stamps(nullptr);
    };
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < 2; ++l) {
      stamped(0, l, hx, hq);
      SK(cast_rows(st, hq, DType::BF16, q, ha, DType::BF16, att, m, att));
      stamped(1, l, ha, ho);
      SK(cast(st, ho, DType::F32, hx, DType::BF16, m * d));
      stamped(2, l, hx, hg);
      SK(gelu_tanh(st, hg, DType::BF16, hf, DType::BF16, m * f));
      stamped(3, l, hf, hd);
      SK(cast(st, hd, DType::F32, hx, DType::BF16, m * d));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 2; ++r) CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    unsigned long long t0 = ~0ull;
    std::vector<std::vector<unsigned long long>> h(8);
    for (int i = 0; i < 8; ++i) {
      h[size_t(i)].resize(size_t(blocks[size_t(i)]) * kPreloadStamps);
      CK(cudaMemcpy(h[size_t(i)].data(), bufs[size_t(i)], h[size_t(i)].size() * 8, cudaMemcpyDeviceToHost));
      for (int b = 0; b < blocks[size_t(i)]; ++b) t0 = std::min(t0, h[size_t(i)][size_t(b) * kPreloadStamps]);
    }
    std::printf("chain timeline (us from the first GEMM's first block; medians over blocks, first start, last end):\n");
    for (int i = 0; i < 8; ++i) {
      if (blocks[size_t(i)] == 0) {
        std::printf("  %-8s L%d on cuBLASLt (no one-wave tile on this GPU)\n", shapes[i % 4].name, i / 4);
        continue;
      }
      auto at = [&](int k, bool mn, bool mx) {
        std::vector<double> v;
        for (int b = 0; b < blocks[size_t(i)]; ++b) v.push_back(double(h[size_t(i)][size_t(b) * kPreloadStamps + k] - t0) / 1e3);
        if (mn) return *std::min_element(v.begin(), v.end());
        if (mx) return *std::max_element(v.begin(), v.end());
        return median(v);
      };
      nlohmann::json e = {{"gemm", shapes[i % 4].name}, {"layer", i / 4}, {"first_start", at(0, true, false)},
                          {"w_issued", at(1, false, false)}, {"after_wait", at(2, false, false)},
                          {"landed", at(3, false, false)}, {"mma_done", at(4, false, false)},
                          {"last_end", at(7, false, true)}};
      j["chain_timeline_us"].push_back(e);
      std::printf("  %-8s L%d start %7.2f  W issued %7.2f  wait passed %7.2f  landed %7.2f  mma %7.2f  end %7.2f\n",
                  shapes[i % 4].name, i / 4, e["first_start"].get<double>(), e["w_issued"].get<double>(),
                  e["after_wait"].get<double>(), e["landed"].get<double>(), e["mma_done"].get<double>(),
                  e["last_end"].get<double>());
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    for (auto* b : bufs) CK(cudaFree(b));
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
                        "VLAC_PRELOAD_PIPE", "VLAC_PRELOAD_WAVES", "VLAC_PRELOAD_ONE_WAVE", "VLAC_PRELOAD_TMA"})
    if (const char* v = std::getenv(e)) j["env"][e] = v;
  emit_json(j.dump(2), out);
  return 0;
}
