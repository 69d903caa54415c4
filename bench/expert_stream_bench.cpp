// pi0.5's action expert as one chain of GEMM phases in a persistent launch (expert_stream.h), at
// its size: M = 50 tokens, D = 1024; per layer qkv [2560, 1024] on the RMS-normed fp32 residual X,
// o [1024, 2048] on QKV's first 2048 columns added into X (2 K parts), gate|up [8192, 1024] with
// GeGLU on the normed X, down [1024, 4096] added into X (4 K parts): 34.6 MB of bf16 weights a
// layer, every layer its own, so none stays in L2. A step is the 4L phases of --layers L layers
// (default 18: one denoise step's expert); each setting is timed as a CUDA graph of 10 steps (a
// chunk's 10 denoise steps), reported in µs a layer and ms a step:
//   - one launch a step, per ring depth (stages), and for the planned depth with parts left out
//     (ExpertStreamProbe::skip: 1 the math, 2 the grid barriers, 4 the input copies; 1|2|4 leaves
//     the weight stream alone, whose rate is the GB/s printed; 8 streams by the bulk copy engine
//     instead of cp.async, 32 with it one copy a stage where a stage is one run: --narrow; 64 loads
//     half the input rows, what sharing each chunk between two blocks would save; 128 meets only the
//     two warps of each K quarter at every stage instead of the block);
//   - one launch a layer and one launch a phase (what the launch boundaries cost);
//   - cuBLASLt, 5 launches a layer (qkv, o, gate|up, GeGLU, down on bf16 inputs, no norms): the
//     least the executor launches for these GEMMs today;
// then where one launch of a step spends its time per phase kind (per-block %globaltimer stamps:
// input copy, math, wait at the next grid barrier) and how far the X of one launch is from the
// same step's phases launched one at a time. Prints one line per setting and JSON (--out FILE).
//
// Usage: expert_stream_bench [--reps N] [--out FILE] [--layers L] [--o-parts P] [--down-parts P]
//                            [--narrow] [--wgmma]
// (K parts of o and down: 1, 2 or 4; default 2 and 4). --narrow: every W has 512 columns and the
// same bytes as pi0.5's (5120, 4096, 16384 and 8192 rows), so each weight stage is one contiguous
// 16 KB run: the stream's rate without rows spread over the matrix (no cuBLASLt baseline, no check).
// --wgmma: every expert_stream setting with Hopper's warpgroup MMA (an sm_90 GPU and a build with
// 90a-real) instead of mma.sync.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/expert_stream.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels.h"
#include "core/dtype.h"
#include "cuda_bench_util.h"

using namespace vlac;
using namespace vlac::cuda;

namespace {

constexpr int kStepsPerGraph = 10;  // a chunk's denoise steps

// Uniform fp32 in [-1, 1) from the same LCG as fill_bf16_with.
std::vector<float> uniform_f32(size_t n, uint32_t seed) {
  std::vector<float> h(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& v : h) {
    s = s * 1664525u + 1013904223u;
    v = float(s >> 8) / float(1 << 24) * 2.f - 1.f;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, layers = 18, o_parts = 2, down_parts = 4;
  bool narrow = false, wgmma = false;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--layers" && i + 1 < argc) layers = std::max(1, std::atoi(argv[++i]));
    else if (a == "--o-parts" && i + 1 < argc) o_parts = std::atoi(argv[++i]);
    else if (a == "--down-parts" && i + 1 < argc) down_parts = std::atoi(argv[++i]);
    else if (a == "--narrow") narrow = true;
    else if (a == "--wgmma") wgmma = true;
    else {
      std::fprintf(stderr, "usage: expert_stream_bench [--reps N] [--out FILE] [--layers L] [--o-parts P] [--down-parts P] [--narrow] [--wgmma]\n");
      return 2;
    }
  }
  SK(device_status());
  constexpr int64_t M = 50, D = 1024, Q = 2560, F = 4096;  // F: GeGLU's width (gate|up has 2F rows)
  const int64_t nph = int64_t(4) * layers;                  // phases a step
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int optin = 0;
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const int sms = prop.multiProcessorCount;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // Weights: uniform in ±sqrt(3/k)/2, so each GEMM's output has a standard deviation ~0.5 per unit
  // of its input's.
  struct Shape { int64_t rows, k; };
  constexpr int64_t kN = 512;  // --narrow's columns
  const Shape wide[4] = {{Q, D}, {D, 2 * D}, {2 * F, D}, {D, F}};  // qkv, o, gate|up, down
  const Shape thin[4] = {{Q * D / kN, kN}, {2 * D * D / kN, kN}, {2 * F * D / kN, kN}, {D * F / kN, kN}};
  const Shape* shapes = narrow ? thin : wide;
  const char* kinds[4] = {"qkv", "o", "gate|up", "down"};
  std::vector<void*> w(static_cast<size_t>(nph));
  double step_bytes = 0;
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < 4; ++k) {
      const Shape s = shapes[k];
      const size_t n = size_t(s.rows * s.k);
      w[size_t(4 * l + k)] = dalloc(n * 2);
      fill_bf16_uniform(w[size_t(4 * l + k)], n, uint32_t(100 + 4 * l + k), std::sqrt(3.f / float(s.k)) * 0.5f);
      step_bytes += double(n) * 2;
    }
  // Activations: X fp32 [M, D] (the residual), QKV bf16 [M, 2560], H bf16 [M, 4096].
  const std::vector<float> x0 = uniform_f32(size_t(M * D), 7);
  auto* x = static_cast<float*>(dalloc(size_t(M * D) * 4));
  void* qkv = dalloc(size_t(M * Q) * 2);
  void* h = dalloc(size_t(M * F) * 2 * (narrow ? 2 : 1));
  // --narrow: the wide outputs (o's and down's) go to their own fp32 buffer; QKV and H grow.
  const int64_t qn = narrow ? thin[0].rows : Q, hn = narrow ? thin[2].rows / 2 : F, yn = thin[3].rows;
  void* qkv_n = narrow ? dalloc(size_t(M * qn) * 2) : nullptr;
  auto* y_n = narrow ? static_cast<float*>(dalloc(size_t(M * yn) * 4)) : nullptr;
  auto reset_x = [&] { CK(cudaMemcpy(x, x0.data(), x0.size() * 4, cudaMemcpyHostToDevice)); };

  std::vector<StreamPhase> phases;
  for (int l = 0; l < layers && narrow; ++l) {
    // qkv, o, gate|up (GeGLU), down with 512 columns each: the inputs' first 512 columns.
    for (int k = 0; k < 4; ++k) {
      StreamPhase p;
      p.w = w[size_t(4 * l + k)], p.rows = thin[k].rows, p.k = kN;
      if (k == 0 || k == 2) p.in = x, p.in_stride = D, p.in_f32 = true, p.norm = true;
      else p.in = k == 1 ? qkv_n : h, p.in_stride = k == 1 ? qn : hn;
      if (k == 0) p.out = qkv_n, p.out_stride = qn;
      else if (k == 2) p.out = h, p.out_stride = hn, p.geglu = true;
      else p.out = y_n, p.out_stride = yn, p.out_f32 = true;
      phases.push_back(p);
    }
  }
  for (int l = 0; l < layers && !narrow; ++l) {
    StreamPhase p;
    p.w = w[size_t(4 * l)], p.rows = Q, p.k = D;  // qkv
    p.in = x, p.in_stride = D, p.in_f32 = true, p.norm = true;
    p.out = qkv, p.out_stride = Q;
    phases.push_back(p);
    p = StreamPhase{};
    p.w = w[size_t(4 * l + 1)], p.rows = D, p.k = 2 * D, p.parts = o_parts;  // o
    p.in = qkv, p.in_stride = Q;
    p.out = x, p.out_stride = D, p.out_f32 = true, p.accumulate = true;
    phases.push_back(p);
    p = StreamPhase{};
    p.w = w[size_t(4 * l + 2)], p.rows = 2 * F, p.k = D;  // gate|up, GeGLU
    p.in = x, p.in_stride = D, p.in_f32 = true, p.norm = true, p.geglu = true;
    p.out = h, p.out_stride = F;
    phases.push_back(p);
    p = StreamPhase{};
    p.w = w[size_t(4 * l + 3)], p.rows = D, p.k = F, p.parts = down_parts;  // down
    p.in = h, p.in_stride = F;
    p.out = x, p.out_stride = D, p.out_f32 = true, p.accumulate = true;
    phases.push_back(p);
  }
  void* dphases = dalloc(size_t(expert_stream_phase_bytes(nph)));
  SK(expert_stream_upload(phases, M, dphases));
  auto* sync = static_cast<unsigned*>(dalloc(size_t(kExpertStreamSyncWords) * sizeof(unsigned)));

  ExpertStreamPlan plan;
  if (wgmma && !expert_stream_wgmma_available()) {
    std::fprintf(stderr, "expert_stream_bench: --wgmma needs an sm_90 GPU and a build with 90a-real code\n");
    return 1;
  }
  if (!expert_stream_plan(M, sms, optin, &plan, 0, wgmma)) {
    std::fprintf(stderr, "expert_stream_bench: no plan for M = %lld (%d SMs, %d bytes of shared memory)\n",
                 static_cast<long long>(M), sms, optin);
    return 1;
  }
  if (!expert_stream_resident(plan)) {
    std::fprintf(stderr, "expert_stream_bench: the plan's %d blocks of %llu bytes are not all resident\n", plan.blocks,
                 static_cast<unsigned long long>(plan.smem));
    return 1;
  }

  nlohmann::json j;
  // Could two or four blocks share each input chunk (a cluster)? How many such clusters of this
  // kernel are resident at once, and whether a cooperative launch with clusters is accepted.
  {
    nlohmann::json jc = nlohmann::json::object();
    for (int cl : {2, 4}) {
      const int n = expert_stream_max_clusters(plan, cl);
      const cudaError_t coop = expert_stream_cluster_launch_probe(plan.blocks / cl * cl, cl, true);
      const cudaError_t plain = expert_stream_cluster_launch_probe(plan.blocks / cl * cl, cl, false);
      std::printf("clusters of %d: %d resident (%d blocks); cooperative launch with clusters: %s; without: %s\n", cl, n,
                  n * cl, cudaGetErrorString(coop), cudaGetErrorString(plain));
      jc[std::to_string(cl)] = {{"max_active_clusters", n},
                                {"cooperative_launch", cudaGetErrorString(coop)},
                                {"plain_launch", cudaGetErrorString(plain)}};
    }
    j["clusters"] = jc;
  }
  j["device"] = prop.name;
  j["sms"] = sms;
  j["smem_optin"] = optin;
  j["shape"] = {{"m", M}, {"d", D}, {"qkv", Q}, {"f", F}};
  j["layers"] = layers;
  j["narrow"] = narrow;
  j["wgmma"] = wgmma;
  j["o_parts"] = o_parts;
  j["down_parts"] = down_parts;
  j["steps_per_graph"] = kStepsPerGraph;
  j["reps"] = reps;
  j["weight_bytes_per_step"] = step_bytes;
  j["plan"] = {{"blocks", plan.blocks}, {"stages", plan.stages}, {"smem", plan.smem}, {"wgmma", plan.wgmma}};
  nlohmann::json rows = nlohmann::json::array();
  auto gbps = [&](double ms) { return step_bytes / (ms * 1e-3) / 1e9; };
  auto report = [&](const std::string& name, double ms, nlohmann::json extra, bool rate) {
    std::printf("%-52s %8.2f us a layer %8.3f ms a step", name.c_str(), ms * 1e3 / layers, ms);
    if (rate) std::printf(" %7.0f GB/s", gbps(ms));
    std::printf("\n");
    extra["name"] = name;
    extra["us_per_layer"] = ms * 1e3 / layers;
    extra["ms_per_step"] = ms;
    if (rate) extra["gb_per_s"] = gbps(ms);
    rows.push_back(extra);
  };

  // 1. One launch a step, per ring depth; the planned one also with parts left out.
  for (int stages : {0, 2, 3, 4, 5, 7}) {
    ExpertStreamPlan p;
    if (!expert_stream_plan(M, sms, optin, &p, stages, wgmma)) {
      std::printf("stages %d: no plan\n", stages);
      continue;
    }
    if (!expert_stream_resident(p)) {
      std::printf("stages %d: not resident (%llu bytes of shared memory a block)\n", stages,
                  static_cast<unsigned long long>(p.smem));
      continue;
    }
    for (int skip : {0, 128, 8, 1, 4, 64, 1 | 4, 2, 1 | 2 | 4, 1 | 2 | 4 | 8, 1 | 2 | 4 | 8 | 32}) {
      // Other depths: whole, and the weight stream alone (with and without the barriers).
      if (stages != 0 && skip != 0 && skip != 7 && skip != 5) continue;
      ExpertStreamProbe pr;
      pr.skip = skip;
      reset_x();
      const double ms = graph_ms(st, reps, kStepsPerGraph,
                                 [&](int) { SK(expert_stream(st, p, dphases, nph, 0, nph, sync, &pr)); });
      std::string name = "stream, one launch a step, stages " + std::to_string(p.stages) + (stages ? "" : " (planned)");
      if (skip) name += ", skip " + std::to_string(skip);
      report(name, ms, {{"stages", p.stages}, {"skip", skip}, {"smem", p.smem}}, true);
    }
  }
  // 2. and 3. One launch a layer, one launch a phase (the planned depth).
  reset_x();
  double ms = graph_ms(st, reps, kStepsPerGraph, [&](int) {
    for (int l = 0; l < layers; ++l) SK(expert_stream(st, plan, dphases, nph, 4 * l, 4, sync));
  });
  report("stream, one launch a layer", ms, {{"stages", plan.stages}, {"skip", 0}}, true);
  reset_x();
  ms = graph_ms(st, reps, kStepsPerGraph, [&](int) {
    for (int64_t i = 0; i < nph; ++i) SK(expert_stream(st, plan, dphases, nph, i, 1, sync));
  });
  report("stream, one launch a phase", ms, {{"stages", plan.stages}, {"skip", 0}}, true);

  // 4. cuBLASLt: the layer's four GEMMs and GeGLU on bf16 inputs (h in place over gate|up's output).
  if (!narrow) {
    auto runner = GemmRunner::create();
    SK(runner.status());
    void* ws = dalloc(runner->workspace_bytes());
    void* xb = dalloc(size_t(M * D) * 2);
    fill_bf16_uniform(xb, size_t(M * D), 8, 1.f);
    void* gu = dalloc(size_t(M * 2 * F) * 2);
    auto* y = static_cast<float*>(dalloc(size_t(M * D) * 4));
    const GemmDesc dq{M, Q, D, DType::BF16, DType::BF16, Epilogue::None, false};
    GemmDesc dout{M, D, 2 * D, DType::BF16, DType::F32, Epilogue::None, false};
    dout.ldx = Q;
    const GemmDesc dgu{M, 2 * F, D, DType::BF16, DType::BF16, Epilogue::None, false};
    GemmDesc ddown{M, D, F, DType::BF16, DType::F32, Epilogue::None, false};
    ddown.ldx = 2 * F;
    for (const GemmDesc& d : {dq, dout, dgu, ddown}) SK(runner->plan(d));
    ms = graph_ms(st, reps, kStepsPerGraph, [&](int) {
      for (int l = 0; l < layers; ++l) {
        SK(runner->run(st, dq, xb, w[size_t(4 * l)], nullptr, qkv, ws));
        SK(runner->run(st, dout, qkv, w[size_t(4 * l + 1)], nullptr, y, ws));
        SK(runner->run(st, dgu, xb, w[size_t(4 * l + 2)], nullptr, gu, ws));
        SK(geglu(st, gu, static_cast<uint16_t*>(gu) + F, DType::BF16, 2 * F, gu, DType::BF16, M, F, 2 * F));
        SK(runner->run(st, ddown, gu, w[size_t(4 * l + 3)], nullptr, y, ws));
      }
    });
    report("cuBLASLt, 5 launches a layer", ms, nlohmann::json::object(), true);
    for (void* p : {ws, xb, gu, static_cast<void*>(y)}) CK(cudaFree(p));
  }

  // 5. Where one launch of a step spends its time: stamps [blocks][4L][3] of one launch.
  {
    const size_t ns = size_t(plan.blocks) * size_t(nph) * kExpertStreamStamps;
    auto* stamps = static_cast<unsigned long long*>(dalloc(ns * sizeof(unsigned long long)));
    ExpertStreamProbe pr;
    pr.stamps = stamps;
    reset_x();
    SK(expert_stream(st, plan, dphases, nph, 0, nph, sync));  // warm-up
    SK(expert_stream(st, plan, dphases, nph, 0, nph, sync, &pr));
    CK(cudaStreamSynchronize(st));
    std::vector<unsigned long long> hs(ns);
    CK(cudaMemcpy(hs.data(), stamps, ns * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    CK(cudaFree(stamps));
    auto at = [&](int b, int64_t ph, int s) {
      return double(hs[(size_t(b) * size_t(nph) + size_t(ph)) * kExpertStreamStamps + size_t(s)]);
    };
    unsigned long long lo = ~0ull, hi = 0;
    for (int b = 0; b < plan.blocks; ++b) {
      lo = std::min(lo, hs[size_t(b) * size_t(nph) * kExpertStreamStamps]);
      hi = std::max(hi, hs[(size_t(b) * size_t(nph) + size_t(nph - 1)) * kExpertStreamStamps + 2]);
    }
    // Per phase kind, the median over layers of: the median over blocks of the input copy and of
    // the math, and the median and max over blocks of the wait from a phase's end to the next
    // phase's start (its grid barrier; none after the step's last phase).
    nlohmann::json js = nlohmann::json::object();
    std::printf("one launch a step, stamped (ns; median over layers of the median over blocks):\n");
    for (int k = 0; k < 4; ++k) {
      std::vector<double> copy, math, wait_med, wait_max;
      for (int l = 0; l < layers; ++l) {
        const int64_t ph = 4 * l + k;
        std::vector<double> c, m, wt;
        for (int b = 0; b < plan.blocks; ++b) {
          c.push_back(at(b, ph, 1) - at(b, ph, 0));
          m.push_back(at(b, ph, 2) - at(b, ph, 1));
          if (ph + 1 < nph) wt.push_back(at(b, ph + 1, 0) - at(b, ph, 2));
        }
        copy.push_back(median(c));
        math.push_back(median(m));
        if (!wt.empty()) {
          wait_med.push_back(median(wt));
          wait_max.push_back(*std::max_element(wt.begin(), wt.end()));
        }
      }
      std::printf("  %-8s input copy %7.0f, math %7.0f, barrier wait %7.0f (slowest block %7.0f)\n", kinds[k],
                  median(copy), median(math), median(wait_med), median(wait_max));
      js[kinds[k]] = {{"input_copy_ns", median(copy)},
                      {"math_ns", median(math)},
                      {"barrier_wait_median_ns", median(wait_med)},
                      {"barrier_wait_max_ns", median(wait_max)}};
    }
    const double span = double(hi) - double(lo);
    std::printf("  step span %.0f ns (first block's start to the last block's end)\n", span);
    js["step_span_ns"] = span;
    j["stamps"] = js;
  }

  // 6. One launch a step against the same phases one launch each, from the same X.
  if (!narrow) {
    reset_x();
    SK(expert_stream(st, plan, dphases, nph, 0, nph, sync));
    CK(cudaStreamSynchronize(st));
    std::vector<float> one(x0.size()), each(x0.size());
    CK(cudaMemcpy(one.data(), x, one.size() * 4, cudaMemcpyDeviceToHost));
    reset_x();
    for (int64_t i = 0; i < nph; ++i) SK(expert_stream(st, plan, dphases, nph, i, 1, sync));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(each.data(), x, each.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    bool finite = true;
    for (size_t i = 0; i < one.size(); ++i) {
      finite = finite && std::isfinite(one[i]) && std::isfinite(each[i]);
      num = std::max(num, std::abs(double(one[i]) - double(each[i])));
      den = std::max(den, std::abs(double(each[i])));
    }
    const double rel = finite && den > 0 ? num / den : INFINITY;
    std::printf("check: one launch a step against one a phase, max|dX| / max|X| = %.3g (max|X| %.3g)\n", rel, den);
    j["check"] = {{"max_rel_diff", finite ? nlohmann::json(rel) : nlohmann::json(nullptr)}, {"max_abs_x", den}};
    // The same with skip 128 (each K quarter published by its two warps' barrier; results right).
    ExpertStreamProbe pq;
    pq.skip = 128;
    reset_x();
    SK(expert_stream(st, plan, dphases, nph, 0, nph, sync, &pq));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(one.data(), x, one.size() * 4, cudaMemcpyDeviceToHost));
    double num_q = 0;
    bool finite_q = true;
    for (size_t i = 0; i < one.size(); ++i) {
      finite_q = finite_q && std::isfinite(one[i]);
      num_q = std::max(num_q, std::abs(double(one[i]) - double(each[i])));
    }
    const double rel_q = finite_q && den > 0 ? num_q / den : INFINITY;
    std::printf("check: skip 128 one launch a step against one a phase, max|dX| / max|X| = %.3g\n", rel_q);
    j["check_quarter_barrier"] = finite_q ? nlohmann::json(rel_q) : nlohmann::json(nullptr);
  }
  j["settings"] = rows;
  emit_json(j.dump(2), out_path);
  for (void* p : w) CK(cudaFree(p));
  return 0;
}
