// Times the CUDA attention kernel and the cuBLASLt GEMMs at pi0.5's real shapes (3 cameras at 224,
// 200 prompt slots = 968 prefix tokens, chunk 50, 10 steps) with CUDA events, and prints JSON:
// per op the median and min time of one call over --reps samples (each sample times --inner
// back-to-back calls), and per-chunk sums (count × median). GEMM weights rotate through a 1 GiB
// pool of random bf16 so that a weight is not in L2 from the previous call (as in a real chunk);
// inputs are random, never zeros. The expert's 180 attention calls are also timed as one CUDA
// graph replay, the number to hold against PyTorch SDPA's 5.2 ms (issue 13). On sm_89 and later
// each GEMM is also timed as FP8 W8A8 (issue 14, VLAC_FP8_GEMM's path): cuBLASLt's FP8 GEMM on
// e4m3 weights from a pool of random codes, alone and after quantize_rows_e4m3 of its x, in graphs.
//
// Usage: cuda_bench [--reps N] [--inner N] [--out FILE] [--attention-only | --gemms-only] [--case SUBSTR]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/cudnn_attention.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels.h"
#include "cuda_bench_util.h"

using namespace vlac;
using namespace vlac::cuda;

namespace {

// Random bf16 values ~ N(0, sd)-ish (sum of uniforms), filled on the host once per buffer.
void fill_bf16(void* d, size_t n, uint32_t seed, float sd) {
  fill_bf16_with(d, n, seed, [sd](auto& uniform) {
    float acc = 0;
    for (int j = 0; j < 3; ++j) acc += uniform() - 0.5f;
    return acc * 2.0f * sd;
  });
}

struct Stat {
  double median_ms, min_ms;
};

// Median/min over reps of (time of `inner` calls of fn(i)) / inner.
template <typename F>
Stat time_op(cudaStream_t st, int reps, int inner, F&& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3 * inner; ++i) fn(i);  // warm-up (plans, module load)
  CK(cudaStreamSynchronize(st));
  std::vector<double> ms;
  int call = 0;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < inner; ++i) fn(call++);
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(double(t) / inner);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30, inner = 10;
  bool attention_only = false, gemms_only = false;
  std::string only_case;  // --case SUBSTR: only the attention cases whose name contains it
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--inner" && i + 1 < argc) inner = std::max(1, std::atoi(argv[++i]));
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--attention-only") attention_only = true;
    else if (a == "--gemms-only") gemms_only = true;
    else if (a == "--case" && i + 1 < argc) only_case = argv[++i], attention_only = true;
    else {
      std::fprintf(stderr, "usage: cuda_bench [--reps N] [--inner N] [--out FILE] [--attention-only | --gemms-only] "
                           "[--case SUBSTR]\n");
      return 2;
    }
  }
  SK(device_status());
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  nlohmann::json j;
  j["device"] = prop.name;
  j["sms"] = sms;
  j["l2_bytes"] = prop.l2CacheSize;
  j["reps"] = reps;
  j["inner"] = inner;
  j["setting"] = "pi0.5 full size: 3 cameras at 224, 200 prompt slots (968 prefix tokens), chunk 50, 10 steps, bf16";

  // ---------------------------------------------------------------- attention
  struct AttnCase {
    const char* name;
    int64_t t, h, hk, s, d;
    bool mask;
    int per_chunk;
  };
  const AttnCase attn[] = {
      {"prefix 968 x 8 heads vs 968 (MQA)", 968, 8, 1, 968, 256, true, 18},
      {"expert 50 x 8 heads vs 1018 (MQA)", 50, 8, 1, 1018, 256, true, 180},
      {"siglip 256 x 16 heads x 72 (per camera)", 256, 16, 16, 256, 72, false, 81},
  };
  constexpr int kLayers = 18;
  double attn_chunk_ms = 0, attn_graph_chunk_ms = 0;
  nlohmann::json ja = nlohmann::json::array();
  for (const auto& c : attn) {
    if (gemms_only) break;
    if (!only_case.empty() && std::string(c.name).find(only_case) == std::string::npos) continue;
    AttentionShape a;
    a.t = c.t, a.h = c.h, a.hk = c.hk, a.s = c.s, a.dh = a.dv = c.d;
    const size_t qn = size_t(c.t * c.h * c.d), kn = size_t(c.s * c.hk * c.d);
    void* q = dalloc(qn * 2);
    void* o = dalloc(qn * 2);
    std::vector<void*> ks(kLayers), vs(kLayers);  // one K/V cache per layer, as a chunk reads them
    for (int l = 0; l < kLayers; ++l) {
      ks[size_t(l)] = dalloc(kn * 2), vs[size_t(l)] = dalloc(kn * 2);
      fill_bf16(ks[size_t(l)], kn, 100 + l, 1.0f);
      fill_bf16(vs[size_t(l)], kn, 200 + l, 1.0f);
    }
    fill_bf16(q, qn, 7, 1.5f);
    uint8_t* allow = nullptr;
    if (c.mask) {
      std::vector<uint8_t> m(size_t(c.t * c.s), 1);
      for (int64_t i = 0; i < c.t; ++i)
        for (int64_t k = 900; k < 968 && k < c.s; ++k) m[size_t(i * c.s + k)] = 0;  // padded prompt slots
      allow = static_cast<uint8_t*>(dalloc(m.size()));
      CK(cudaMemcpy(allow, m.data(), m.size(), cudaMemcpyHostToDevice));
    }
    const int splits = attention_splits(a, DType::BF16, sms);
    const uint64_t sb = attention_scratch_bytes(a, DType::BF16, splits);
    void* scratch = sb ? dalloc(sb) : nullptr;
    const float scale = 1.0f / std::sqrt(float(c.d));
    auto call = [&](int i) {
      SK(attention(st, a, DType::BF16, q, ks[size_t(i % kLayers)], vs[size_t(i % kLayers)], {allow, nullptr}, o,
                   DType::BF16, scale, splits, scratch, sb));
    };
    const Stat s = time_op(st, reps, inner, call);
    const double flop = 4.0 * double(c.t * c.h) * double(c.s) * double(c.d);
    nlohmann::json e = {{"name", c.name}, {"splits", splits}, {"median_ms", s.median_ms}, {"min_ms", s.min_ms},
                        {"tflops", flop / (s.median_ms * 1e-3) / 1e12}, {"per_chunk", c.per_chunk},
                        {"chunk_ms", s.median_ms * c.per_chunk}};
    {  // other key splits, to see what the heuristic's choice buys
      nlohmann::json sweep = nlohmann::json::object();
      for (int sp : {1, 2, 4, 8, 16, 32}) {
        const uint64_t b2 = attention_scratch_bytes(a, DType::BF16, sp);
        void* s2 = b2 ? dalloc(b2) : nullptr;
        const Stat s1 = time_op(st, reps, inner, [&](int i) {
          SK(attention(st, a, DType::BF16, q, ks[size_t(i % kLayers)], vs[size_t(i % kLayers)], {allow, nullptr}, o,
                       DType::BF16, scale, sp, s2, b2));
        });
        sweep[std::to_string(sp)] = s1.median_ms;
        std::printf("attention %-42s splits %2d  median %.4f ms (sweep)\n", c.name, sp, s1.median_ms);
        if (s2) CK(cudaFree(s2));
      }
      e["splits_sweep_median_ms"] = sweep;
    }
    {
      // The chunk's calls of this shape (the expert: 18 layers × 10 steps) captured once as a
      // CUDA graph and replayed: the device time without host launch gaps.
      cudaGraph_t g;
      cudaGraphExec_t ge;
      call(0);
      CK(cudaStreamSynchronize(st));
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < c.per_chunk; ++i) call(i);
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      const Stat gs = time_op(st, reps, 1, [&](int) { CK(cudaGraphLaunch(ge, st)); });
      e["graph_chunk_calls_median_ms"] = gs.median_ms;
      e["graph_chunk_calls_min_ms"] = gs.min_ms;
      if (c.per_chunk == 180) e["anchor_pytorch_sdpa_ms"] = 5.2;
      attn_graph_chunk_ms += gs.median_ms;
      std::printf("attention %-42s %d calls in one graph: median %.4f ms\n", c.name, c.per_chunk, gs.median_ms);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
    if (c.per_chunk == 180) {
      // cuDNN's SDPA at the expert's shape (session 28 probe): unsplit (b = 1, all 1018 keys: cuDNN
      // runs one CTA per head and tile of queries, 8 in all), and with the prefix keys cut into 8
      // runs of 121 given as cuDNN's batch (q repeated per run): what a cuDNN expert attention
      // with key splits would pay before its combine (not included; no stats output; no mask).
      // Timed per call and as the chunk's 180 calls in one graph.
      nlohmann::json jc = nlohmann::json::object();
      for (const int b : {1, 8}) {
        CudnnAttentionShape cs;
        cs.b = b, cs.h = c.h, cs.hk = 1, cs.sq = c.t, cs.skv = b == 1 ? c.s : 968 / b, cs.d = c.d;
        cs.q_stride = cs.o_stride = c.h * c.d, cs.k_stride = cs.v_stride = c.d;
        void* qb = dalloc(size_t(b) * qn * 2);
        void* ob = dalloc(size_t(b) * qn * 2);
        fill_bf16(qb, size_t(b) * qn, 9, 1.5f);
        const Status first = cudnn_attention(st, cs, qb, ks[0], vs[0], ob, scale);
        const std::string key = b == 1 ? "unsplit_1018_keys" : "8_runs_of_121_keys_as_batch";
        if (!first.is_ok()) {
          jc[key] = first.message();
          std::printf("attention %-42s cuDNN %s: %s\n", c.name, key.c_str(), first.message().c_str());
        } else {
          CK(cudaStreamSynchronize(st));
          const Stat s1 = time_op(st, reps, inner, [&](int i) {
            SK(cudnn_attention(st, cs, qb, ks[size_t(i % kLayers)], vs[size_t(i % kLayers)], ob, scale));
          });
          cudaGraph_t g;
          cudaGraphExec_t ge;
          CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < c.per_chunk; ++i)
            SK(cudnn_attention(st, cs, qb, ks[size_t(i % kLayers)], vs[size_t(i % kLayers)], ob, scale));
          CK(cudaStreamEndCapture(st, &g));
          CK(cudaGraphInstantiate(&ge, g, 0));
          const Stat gs = time_op(st, reps, 1, [&](int) { CK(cudaGraphLaunch(ge, st)); });
          CK(cudaGraphExecDestroy(ge));
          CK(cudaGraphDestroy(g));
          jc[key] = {{"median_ms", s1.median_ms}, {"graph_chunk_calls_median_ms", gs.median_ms}};
          std::printf("attention %-42s cuDNN %s: median %.4f ms, %d calls in one graph %.4f ms\n", c.name, key.c_str(),
                      s1.median_ms, c.per_chunk, gs.median_ms);
        }
        CK(cudaFree(qb));
        CK(cudaFree(ob));
      }
      e["cudnn_probe"] = jc;
    }
    attn_chunk_ms += s.median_ms * c.per_chunk;
    ja.push_back(e);
    std::printf("attention %-42s splits %2d  median %.4f ms  min %.4f ms  %.1f TFLOP/s\n", c.name, splits, s.median_ms,
                s.min_ms, flop / (s.median_ms * 1e-3) / 1e12);
    for (int l = 0; l < kLayers; ++l) {
      CK(cudaFree(ks[size_t(l)]));
      CK(cudaFree(vs[size_t(l)]));
    }
    CK(cudaFree(q));
    CK(cudaFree(o));
    if (allow) CK(cudaFree(allow));
    if (scratch) CK(cudaFree(scratch));
  }
  j["attention"] = ja;
  j["attention_chunk_ms_sum_of_medians"] = attn_chunk_ms;
  j["attention_chunk_ms_in_graphs"] = attn_graph_chunk_ms;
  j["anchor_pytorch_sdpa_chunk_ms"] = 6.0;
  if (attention_only) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  // ---------------------------------------------------------------- GEMMs
  struct GemmCase {
    const char* name;
    int64_t m, k, n;
    Epilogue epi;
    bool accumulate;
    int per_chunk;
  };
  const GemmCase gemms[] = {
      {"siglip qkv (3 cameras batched)", 768, 1152, 3456, Epilogue::Bias, false, 27},
      {"siglip out proj + residual", 768, 1152, 1152, Epilogue::Bias, true, 27},
      {"siglip fc1 + gelu", 768, 1152, 4304, Epilogue::BiasGelu, false, 27},
      {"siglip fc2 + residual", 768, 4304, 1152, Epilogue::Bias, true, 27},
      {"patch embedding", 768, 588, 1152, Epilogue::Bias, false, 1},
      {"projector", 768, 1152, 2048, Epilogue::Bias, false, 1},
      {"prefix fused qkv", 968, 2048, 2560, Epilogue::None, false, 18},
      {"prefix o_proj + residual", 968, 2048, 2048, Epilogue::None, true, 18},
      {"prefix fused gate+up", 968, 2048, 32768, Epilogue::None, false, 18},
      {"prefix down + residual", 968, 16384, 2048, Epilogue::None, true, 18},
      {"expert fused qkv", 50, 1024, 2560, Epilogue::None, false, 180},
      {"expert o_proj", 50, 2048, 1024, Epilogue::None, false, 180},
      {"expert fused gate+up", 50, 1024, 8192, Epilogue::None, false, 180},
      {"expert down", 50, 4096, 1024, Epilogue::None, false, 180},
      {"action_in_proj", 50, 32, 1024, Epilogue::Bias, false, 10},
      {"action_out_proj", 50, 1024, 32, Epilogue::Bias, false, 10},
  };
  auto runner = GemmRunner::create();
  SK(runner.status());
  void* ws = dalloc(runner->workspace_bytes());
  const size_t pool_bytes = size_t(1) << 30;
  void* pool = dalloc(pool_bytes);
  fill_bf16(pool, pool_bytes / 2, 3, 0.03f);
  const size_t act_bytes = size_t(968) * 32768 * 2;
  void* x = dalloc(act_bytes);
  void* y = dalloc(act_bytes);
  void* bias = dalloc(65536 * 2);
  fill_bf16(x, act_bytes / 2, 4, 1.0f);
  fill_bf16(y, act_bytes / 2, 5, 1.0f);
  fill_bf16(bias, 65536, 6, 0.1f);
  double gemm_chunk_ms = 0, gemm_graph_chunk_ms = 0, gemm_flop = 0;
  nlohmann::json jg = nlohmann::json::array();
  // Median of one call of fn(0..9) captured as one graph of 10 calls.
  auto in_graph_ms = [&](auto&& fn) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 10; ++i) fn(i);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const Stat gs = time_op(st, reps, 1, [&](int) { CK(cudaGraphLaunch(ge, st)); });
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return gs.median_ms / 10;
  };
  // FP8 W8A8 (sm_89+): a pool of random e4m3 codes (no NaN code), one scale per weight row, and
  // x's codes and row scales as quantize_rows_e4m3 writes them.
  const bool fp8 = device_compute_capability() >= 89;
  const size_t pool8_bytes = pool_bytes / 2;
  void *pool8 = nullptr, *xcodes = nullptr;
  float *wscales = nullptr, *xscales = nullptr;
  double fp8_graph_chunk_ms = 0, fp8q_graph_chunk_ms = 0;
  if (fp8) {
    pool8 = dalloc(pool8_bytes);
    std::vector<uint8_t> h(pool8_bytes);
    uint32_t r = 12345;
    for (auto& v : h) {
      r = r * 1664525u + 1013904223u;
      v = uint8_t(r >> 24);
      if ((v & 0x7Fu) == 0x7Fu) v ^= 1u;
    }
    CK(cudaMemcpy(pool8, h.data(), h.size(), cudaMemcpyHostToDevice));
    std::vector<float> sc(65536, 0.03f / 448.0f);
    wscales = static_cast<float*>(dalloc(sc.size() * 4));
    CK(cudaMemcpy(wscales, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
    xcodes = dalloc(size_t(968) * 32768);
    xscales = static_cast<float*>(dalloc(968 * 4));
  }
  for (const auto& c : gemms) {
    GemmDesc d{c.m, c.n, c.k, DType::BF16, DType::BF16, c.epi, c.accumulate};
    const size_t wbytes = (size_t(c.n * c.k) * 2 + 255) / 256 * 256;
    const size_t slots = std::max<size_t>(1, pool_bytes / wbytes);
    const bool has_b = c.epi == Epilogue::Bias || c.epi == Epilogue::BiasGelu;
    const Stat s = time_op(st, reps, inner, [&](int i) {
      const void* w = static_cast<const uint8_t*>(pool) + (size_t(i) % slots) * wbytes;
      SK(runner->run(st, d, x, w, has_b ? bias : nullptr, y, ws));
    });
    // The same calls captured in a CUDA graph (10 calls on 10 weight slots), as the anchor was
    // measured: no host launch gaps between the GEMMs.
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 10; ++i) {
      const void* w = static_cast<const uint8_t*>(pool) + (size_t(i) % slots) * wbytes;
      SK(runner->run(st, d, x, w, has_b ? bias : nullptr, y, ws));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const Stat gs = time_op(st, reps, 1, [&](int) { CK(cudaGraphLaunch(ge, st)); });
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    const double graph_ms = gs.median_ms / 10;
    const double flop = 2.0 * double(c.m) * double(c.k) * double(c.n);
    gemm_chunk_ms += s.median_ms * c.per_chunk;
    gemm_graph_chunk_ms += graph_ms * c.per_chunk;
    gemm_flop += flop * c.per_chunk;
    nlohmann::json jc = {{"name", c.name}, {"m", c.m}, {"k", c.k}, {"n", c.n}, {"median_ms", s.median_ms},
                         {"min_ms", s.min_ms}, {"tflops", flop / (s.median_ms * 1e-3) / 1e12}, {"per_chunk", c.per_chunk},
                         {"chunk_ms", s.median_ms * c.per_chunk}, {"graph_median_ms", graph_ms},
                         {"graph_tflops", flop / (graph_ms * 1e-3) / 1e12}};
    std::printf("gemm %-34s %4lldx%5lldx%5lld  median %.4f ms  min %.4f ms  %.0f TFLOP/s  in a graph %.4f ms  x%d\n",
                c.name, (long long)c.m, (long long)c.k, (long long)c.n, s.median_ms, s.min_ms,
                flop / (s.median_ms * 1e-3) / 1e12, graph_ms, c.per_chunk);
    if (fp8) {
      GemmDesc f = d;
      f.in = DType::F8_E4M3;
      Status ps = runner->plan(f);
      bool gelu_after = false;  // as the executor: no FP8 GELU epilogue, the GELU after the GEMM
      if (!ps.is_ok() && c.epi == Epilogue::BiasGelu) {
        f.epilogue = Epilogue::Bias;
        ps = runner->plan(f);
        gelu_after = ps.is_ok();
      }
      if (!ps.is_ok()) {
        std::printf("  fp8: not offered: %s\n", ps.message().c_str());
        jc["fp8_not_offered"] = ps.message();
        // The widening path's cost is the bf16 GEMM's plus the widening: counted as bf16 here.
        fp8_graph_chunk_ms += graph_ms * c.per_chunk;
        fp8q_graph_chunk_ms += graph_ms * c.per_chunk;
      } else {
        const size_t w8 = (size_t(c.n * c.k) + 255) / 256 * 256;
        const size_t slots8 = std::max<size_t>(1, pool8_bytes / w8);
        auto gemm8 = [&](int i) {
          const void* w = static_cast<const uint8_t*>(pool8) + (size_t(i) % slots8) * w8;
          SK(runner->run_scaled(st, f, xcodes, xscales, w, wscales, has_b ? bias : nullptr, y, ws));
          if (gelu_after) SK(gelu_tanh(st, y, DType::BF16, y, DType::BF16, c.m * c.n));
        };
        auto quant = [&] { SK(quantize_rows_e4m3(st, x, DType::BF16, c.m, c.k, c.k, xcodes, xscales)); };
        quant();
        for (int i = 0; i < 3; ++i) gemm8(i);  // plans and timing outside the capture
        CK(cudaStreamSynchronize(st));
        const double g8 = in_graph_ms(gemm8);
        const double gq = in_graph_ms([&](int i) { quant(), gemm8(i); });
        fp8_graph_chunk_ms += g8 * c.per_chunk;
        fp8q_graph_chunk_ms += gq * c.per_chunk;
        jc["fp8_graph_median_ms"] = g8;
        jc["fp8_with_quantize_graph_median_ms"] = gq;
        jc["fp8_graph_tflops"] = flop / (g8 * 1e-3) / 1e12;
        jc["fp8_gelu_after"] = gelu_after;
        std::printf("  fp8: in a graph %.4f ms (%.0f TFLOP/s), with x's quantization %.4f ms%s\n", g8,
                    flop / (g8 * 1e-3) / 1e12, gq, gelu_after ? " (GELU after)" : "");
      }
    }
    jg.push_back(jc);
  }
  if (fp8) {
    j["fp8_gemm_chunk_ms_in_graphs"] = fp8_graph_chunk_ms;
    j["fp8_with_quantize_chunk_ms_in_graphs"] = fp8q_graph_chunk_ms;
    std::printf("per chunk in graphs: bf16 GEMMs %.3f ms, FP8 %.3f ms, FP8 with x's quantization %.3f ms\n",
                gemm_graph_chunk_ms, fp8_graph_chunk_ms, fp8q_graph_chunk_ms);
  }
  j["gemms"] = jg;
  j["gemm_chunk_ms_sum_of_medians"] = gemm_chunk_ms;
  j["gemm_chunk_ms_in_graphs"] = gemm_graph_chunk_ms;
  j["gemm_chunk_tflop"] = gemm_flop / 1e12;
  j["anchor_cublas_all_gemms_ms"] = 11.2;
  std::printf("per chunk: attention %.3f ms (sum of medians; anchor SDPA 6.0 ms), GEMMs %.3f ms back to back, %.3f ms in "
              "graphs (anchor: cuBLAS in one graph 11.2 ms); attention in graphs %.3f ms\n", attn_chunk_ms, gemm_chunk_ms,
              gemm_graph_chunk_ms, attn_graph_chunk_ms);
  emit_json(j.dump(2), out_path);
  CK(cudaFree(ws));
  CK(cudaFree(pool));
  if (pool8) {
    CK(cudaFree(pool8));
    CK(cudaFree(xcodes));
    CK(cudaFree(wscales));
    CK(cudaFree(xscales));
  }
  CK(cudaFree(x));
  CK(cudaFree(y));
  CK(cudaFree(bias));
  return 0;
}
