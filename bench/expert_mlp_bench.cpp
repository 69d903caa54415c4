// The action expert's MLP at pi0.5's size (M = 50 tokens, D = 1024, F = 4096): the three launches
// the executor runs by default (cuBLASLt gate|up, GeGLU in place, cuBLASLt down) against
// expert_mlp's one cooperative launch, per phase-B split and with parts of it left out
// (ExpertMlpProbe::skip), and where that launch spends its time (per-block %globaltimer stamps).
// Each setting is timed as a CUDA graph of 180 calls over 18 layers' weights, as a chunk runs
// them (a layer's 25 MB are not in L2 from its previous call), with programmatic dependent launch
// as the executor uses it. Prints one line per setting and JSON (--out FILE).
//
// Usage: expert_mlp_bench [--reps N] [--out FILE] [--stream-only]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/expert_mlp.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels.h"
#include "core/dtype.h"
#include "cuda_bench_util.h"
#include "weight_stream_probe.h"

using namespace vlac;
using namespace vlac::cuda;

int main(int argc, char** argv) {
  int reps = 20;
  bool stream_only = false;  // --stream-only: the weight-streaming probes alone
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--stream-only") stream_only = true;
    else {
      std::fprintf(stderr, "usage: expert_mlp_bench [--reps N] [--out FILE] [--stream-only]\n");
      return 2;
    }
  }
  SK(device_status());
  constexpr int64_t M = 50, D = 1024, F = 4096;
  constexpr int kLayers = 18, kCalls = 180;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int optin = 0;
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const int sms = prop.multiProcessorCount;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  std::vector<void*> wgu(kLayers), wd(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    wgu[size_t(l)] = dalloc(size_t(2 * F * D) * 2);
    wd[size_t(l)] = dalloc(size_t(D * F) * 2);
    fill_bf16_uniform(wgu[size_t(l)], size_t(2 * F * D), 10 + l, 0.03f);
    fill_bf16_uniform(wd[size_t(l)], size_t(D * F), 40 + l, 0.015f);
  }
  void* x = dalloc(size_t(M * D) * 2);
  fill_bf16_uniform(x, size_t(M * D), 7, 1.f);
  void* gu = dalloc(size_t(M * 2 * F) * 2);  // gate|up out, h in place (row stride 2F)
  auto* y = static_cast<float*>(dalloc(size_t(M * D) * 4));

  nlohmann::json j;
  j["device"] = prop.name;
  j["sms"] = sms;
  j["shape"] = {{"m", M}, {"d", D}, {"f", F}};
  j["calls_per_graph"] = kCalls;
  j["reps"] = reps;
  nlohmann::json rows = nlohmann::json::array();
  auto report = [&](const std::string& name, double ms, nlohmann::json extra = nlohmann::json::object()) {
    std::printf("%-40s %8.2f us a call\n", name.c_str(), ms * 1e3);
    extra["name"] = name;
    extra["us_per_call"] = ms * 1e3;
    rows.push_back(extra);
  };

  // The executor's default: three launches.
  if (!stream_only) {
    auto runner = GemmRunner::create();
    SK(runner.status());
    void* ws = dalloc(runner->workspace_bytes());
    const GemmDesc d1{M, 2 * F, D, DType::BF16, DType::BF16, Epilogue::None, false};
    GemmDesc d2{M, D, F, DType::BF16, DType::F32, Epilogue::None, false};
    d2.ldx = 2 * F;
    SK(runner->plan(d1));
    SK(runner->plan(d2));
    const double ms = graph_ms(st, reps, kCalls, [&](int i) {
      SK(runner->run(st, d1, x, wgu[size_t(i % kLayers)], nullptr, gu, ws));
      SK(geglu(st, gu, static_cast<uint16_t*>(gu) + F, DType::BF16, 2 * F, gu, DType::BF16, M, F, 2 * F));
      SK(runner->run(st, d2, gu, wd[size_t(i % kLayers)], nullptr, y, ws));
    });
    report("three launches (cuBLASLt, geglu, cuBLASLt)", ms);
    const double g1 = graph_ms(st, reps, kCalls, [&](int i) { SK(runner->run(st, d1, x, wgu[size_t(i % kLayers)], nullptr, gu, ws)); });
    report("  gate|up GEMM alone", g1);
    const double g2 = graph_ms(st, reps, kCalls, [&](int i) { SK(runner->run(st, d2, gu, wd[size_t(i % kLayers)], nullptr, y, ws)); });
    report("  down GEMM alone", g2);
    CK(cudaFree(ws));
  }

  // The one launch, per split and with parts left out.
  unsigned* sync = static_cast<unsigned*>(dalloc(size_t(kExpertMlpSyncWords) * 4));
  void* work = dalloc(size_t(8) * M * D * 4);
  unsigned long long* stamps =
      static_cast<unsigned long long*>(dalloc(size_t(kCalls) * sms * kExpertMlpStamps * sizeof(unsigned long long)));
  for (int splits : {0, 4, 2, 16}) {  // 0: the planner's choice
    if (stream_only) break;
    ExpertMlp p;
    if (!expert_mlp_plan(M, D, F, sms, optin, &p, splits)) {
      std::printf("splits %d: no plan\n", splits);
      continue;
    }
    if (!expert_mlp_resident(p)) {
      std::printf("splits %d: not resident\n", splits);
      continue;
    }
    const std::string tag = "one launch, splits " + std::to_string(p.splits) + (splits ? "" : " (planned)");
    nlohmann::json plan = {{"splits", p.splits}, {"items_per_block", p.items_per_block}, {"smem", p.smem},
                           {"blocks", p.blocks}};
    for (int skip : {0, 1, 2, 4, 8, 1 | 4, 1 | 2 | 4 | 8}) {
      if (splits != 0 && skip != 0) continue;
      ExpertMlpProbe pr;
      pr.skip = skip;
      const double ms = graph_ms(st, reps, kCalls, [&](int i) {
        SK(expert_mlp(st, p, x, wgu[size_t(i % kLayers)], wd[size_t(i % kLayers)], gu, 2 * F, y, D, work, sync, &pr));
      });
      nlohmann::json e = plan;
      e["skip"] = skip;
      report(tag + (skip ? ", skip " + std::to_string(skip) : std::string()), ms, e);
    }
    // Where it spends its time: stamps of every block of every call of one replay.
    std::vector<ExpertMlpProbe> probes(kCalls);
    for (int i = 0; i < kCalls; ++i) probes[size_t(i)].stamps = stamps + size_t(i) * sms * kExpertMlpStamps;
    const double ms = graph_ms(st, 1, kCalls, [&](int i) {
      SK(expert_mlp(st, p, x, wgu[size_t(i % kLayers)], wd[size_t(i % kLayers)], gu, 2 * F, y, D, work, sync,
                    &probes[size_t(i % kCalls)]));
    });
    std::vector<unsigned long long> hs(size_t(kCalls) * sms * kExpertMlpStamps);
    CK(cudaMemcpy(hs.data(), stamps, hs.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    // Per call: each phase's median and max over blocks (ns), the call's span, the gap to the next.
    const char* names[kExpertMlpStamps - 1] = {"entry to PDL wait", "x and W_down in smem", "phase A",
                                               "grid barrier", "phase B"};
    std::vector<std::vector<double>> med(kExpertMlpStamps - 1), mx(kExpertMlpStamps - 1);
    std::vector<double> span, gap;
    for (int c = 0; c < kCalls; ++c) {
      const unsigned long long* s = hs.data() + size_t(c) * p.blocks * kExpertMlpStamps;
      unsigned long long lo = ~0ull, hi = 0;
      for (int ph = 0; ph + 1 < kExpertMlpStamps; ++ph) {
        std::vector<double> v;
        for (int b = 0; b < p.blocks; ++b)
          v.push_back(double(s[b * kExpertMlpStamps + ph + 1]) - double(s[b * kExpertMlpStamps + ph]));
        med[size_t(ph)].push_back(median(v));
        mx[size_t(ph)].push_back(*std::max_element(v.begin(), v.end()));
      }
      for (int b = 0; b < p.blocks; ++b) {
        lo = std::min(lo, s[b * kExpertMlpStamps]);
        hi = std::max(hi, s[b * kExpertMlpStamps + kExpertMlpStamps - 1]);
      }
      span.push_back(double(hi - lo));
      if (c + 1 < kCalls) {
        const unsigned long long* n = s + size_t(p.blocks) * kExpertMlpStamps;
        unsigned long long nlo = ~0ull;
        for (int b = 0; b < p.blocks; ++b) nlo = std::min(nlo, n[b * kExpertMlpStamps]);
        gap.push_back(double(nlo) - double(hi));
      }
    }
    nlohmann::json ph = nlohmann::json::object();
    for (int k = 0; k + 1 < kExpertMlpStamps; ++k) {
      ph[names[k]] = {{"median_over_blocks_ns", median(med[size_t(k)])}, {"max_over_blocks_ns", median(mx[size_t(k)])}};
      std::printf("  %-24s median block %7.0f ns, slowest block %7.0f ns\n", names[k], median(med[size_t(k)]),
                  median(mx[size_t(k)]));
    }
    std::printf("  call span %7.0f ns, gap to the next call %7.0f ns (graph %.2f us a call with stamps)\n",
                median(span), median(gap), ms * 1e3);
    nlohmann::json e = plan;
    e["phases"] = ph;
    e["span_ns"] = median(span);
    e["gap_to_next_ns"] = median(gap);
    report(tag + ", stamped", ms, e);
  }
  // How fast one block a multiprocessor can stream the same 25 MB (18 buffers, as above): into
  // registers, and by the bulk copy engine into shared memory stages.
  {
    const int64_t per_block = (int64_t(3) * F * D * 2 / sms) / 16384 * 16384;  // whole 16 KB chunks
    const int64_t total = per_block * sms;
    std::vector<void*> buf(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      buf[size_t(l)] = dalloc(size_t(total));
      fill_bf16_uniform(buf[size_t(l)], size_t(total / 2), 70 + l, 1.f);
    }
    unsigned* sink = static_cast<unsigned*>(dalloc(64));
    auto gbps = [&](double ms) { return double(total) / (ms * 1e-3) / 1e9; };
    for (int threads : {256, 512, 1024})
      for (int batch : {4, 8, 16, 32}) {
        if (threads * batch > 8192) continue;
        const double ms = graph_ms(st, reps, kCalls, [&](int i) {
          CK(bench::weight_stream_regs(st, buf[size_t(i % kLayers)], per_block, sms, threads, batch, sink));
        });
        report("stream " + std::to_string(total >> 10) + " KiB into registers, " + std::to_string(threads) +
                   " threads x " + std::to_string(batch) + " loads",
               ms, {{"gb_per_s", gbps(ms)}, {"threads", threads}, {"batch", batch}});
      }
    if (prop.major >= 9)
      for (int chunk : {16384, 8192, 32768})
        for (int stages : {4, 8, 2}) {
          if (int64_t(chunk) * stages > 200 * 1024 || per_block % chunk != 0) continue;
          const double ms = graph_ms(st, reps, kCalls, [&](int i) {
            CK(bench::weight_stream_bulk(st, buf[size_t(i % kLayers)], per_block, sms, chunk, stages, sink));
          });
          report("stream by cp.async.bulk, " + std::to_string(chunk >> 10) + " KiB x " + std::to_string(stages) +
                     " stages",
                 ms, {{"gb_per_s", gbps(ms)}, {"chunk", chunk}, {"stages", stages}});
        }
    for (void* b : buf) CK(cudaFree(b));
  }
  j["settings"] = rows;
  emit_json(j.dump(2), out_path);
  return 0;
}
