// GEMM benchmark for pi0.5's linear shapes: OpenBLAS sgemm vs vlac's Linear (oneDNN matmul on
// weights in place) vs oneDNN with prepacked weights, fp32 and bf16 weights, on this machine.
// Prints JSON on stdout (not a test; no timing assertions anywhere).
// Usage: gemm_bench [--threads N] [--min-seconds S] [--shapes full|medium|pi05] [--pair]
//   --shapes pi05  every distinct Linear shape of the full-size pi0.5 (prefix of 3 cameras: SigLIP
//                  M = 256 per camera, Gemma M = 968; the expert's denoising step M = 50)
//   --pair         only vlac's Linear, bf16 weights against fp32 weights (both in place), calls
//                  interleaved; per shape the median of the per-pair CPU-time ratios bf16/fp32.
//                  Run it with VLAC_MAX_CPU_ISA=avx2 for the AVX2 path (vlac's bf16 kernel
//                  against oneDNN's sgemm).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <dnnl.hpp>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/dnnl_linear.h"
#include "backends/cpu/kernels.h"
#include "core/dtype.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Shape { int64_t m, k, n; const char* what; };

struct Timing { double best_s, median_s, best_cpu_s; int reps; };

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Runs fn once to warm up, then repeats until min_seconds have passed (at least 2, at most 50).
// Wall time and process CPU time per rep: on a shared machine the CPU time (all threads, spin
// included) is the contention-robust measure; with --threads 1 it is exactly the core's time.
Timing time_it(const std::function<void()>& fn, double min_seconds) {
  fn();
  std::vector<double> t, cpu;
  auto start = Clock::now();
  while (t.size() < 2 || (t.size() < 50 && std::chrono::duration<double>(Clock::now() - start).count() < min_seconds)) {
    auto t0 = Clock::now();
    double c0 = process_cpu_seconds();
    fn();
    cpu.push_back(process_cpu_seconds() - c0);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::sort(cpu.begin(), cpu.end());
  return {t.front(), t[t.size() / 2], cpu.front(), int(t.size())};
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = vlac::f32_to_bf16(v[i]);
  return out;
}

// Flags and clock from /proc/cpuinfo (first processor entry).
json cpu_info(int threads) {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model, flags;
  double mhz = 0;
  int n_cpus = 0;
  while (std::getline(f, line)) {
    auto val = [&] { auto p = line.find(':'); return p == std::string::npos ? std::string() : line.substr(p + 2); };
    if (line.rfind("processor", 0) == 0) ++n_cpus;
    else if (model.empty() && line.rfind("model name", 0) == 0) model = val();
    else if (mhz == 0 && line.rfind("cpu MHz", 0) == 0) mhz = std::atof(val().c_str());
    else if (flags.empty() && line.rfind("flags", 0) == 0) flags = " " + val() + " ";
  }
  auto has = [&](const char* fl) { return flags.find(std::string(" ") + fl + " ") != std::string::npos; };
  json j = {{"model", model}, {"mhz", mhz}, {"logical_cpus", n_cpus}, {"threads_used", threads},
            {"avx2", has("avx2")}, {"fma", has("fma")}, {"avx512f", has("avx512f")},
            {"avx512_bf16", has("avx512_bf16")}, {"amx_bf16", has("amx_bf16")},
            {"amx_tile", has("amx_tile")}};
  // Theoretical peaks per core per cycle: fp32 FMA = 2 flops x lanes x 2 FMA ports (assumed 2,
  // as on Xeon server cores); AMX bf16 TMUL = 1024 MACs = 2048 flops; AVX512_BF16 vdpbf16ps =
  // 32 MACs x 2 ports = 128 flops. The clock is cpuinfo's (nominal; turbo unknown in a VM).
  double lanes = has("avx512f") ? 16 : has("avx2") ? 8 : 4;
  double ghz_cores = mhz / 1000.0 * threads;
  j["theoretical_gflops_f32"] = ghz_cores * lanes * 2 * 2;
  if (has("amx_bf16")) j["theoretical_gflops_bf16_amx"] = ghz_cores * 2048;
  if (has("avx512_bf16")) j["theoretical_gflops_bf16_avx512"] = ghz_cores * 128;
  j["theoretical_note"] = "cpuinfo MHz x threads x flops/cycle (2 FMA ports assumed)";
  return j;
}

// oneDNN matmul y[M,N] = x[M,K] · W[N,K]ᵀ with weights reordered once into the layout the
// primitive prefers (what an engine build would store), then timed alone.
struct DnnlMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  std::string impl;

  DnnlMatmul(const Shape& s, bool bf16, const void* w_user, void* x, float* y) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dt in_dt = bf16 ? dt::bf16 : dt::f32;
    dnnl::memory::desc src_md({s.m, s.k}, in_dt, tag::ab);
    dnnl::memory::desc wei_any({s.k, s.n}, in_dt, tag::any);
    dnnl::memory::desc dst_md({s.m, s.n}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_any, dst_md), eng);
    impl = pd.impl_info_str();
    dnnl::memory user_w({{s.k, s.n}, in_dt, tag::ba}, eng, const_cast<void*>(w_user));  // W[N,K] = Wᵀ[K,N] in ba
    wei = dnnl::memory(pd.weights_desc(), eng);
    dnnl::reorder(user_w, wei).execute(strm, user_w, wei);
    strm.wait();
    src = dnnl::memory(src_md, eng, x);
    dst = dnnl::memory(dst_md, eng, y);
    prim = dnnl::matmul(pd);
  }
  void run() {
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    strm.wait();
  }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

// --pair: vlac's Linear over bf16 and over fp32 weights (both in place), the two calls of each
// pair back to back so both see the same load; ratios per pair, then the median.
int run_pairs(const std::vector<Shape>& shapes, int threads, double min_seconds) {
  json out;
  out["cpu"] = cpu_info(threads);
  out["cpu"]["vlac_path"] = vlac::cpu::cpu_path_summary();
  out["what"] = "vlac Linear bf16 weights vs fp32 weights, interleaved pairs; CPU seconds per call";
  json cases = json::array();
  for (const Shape& s : shapes) {
    const double gflop = 2.0 * double(s.m) * double(s.k) * double(s.n) / 1e9;
    auto x = random_floats(size_t(s.m * s.k), 1);
    auto w = random_floats(size_t(s.n * s.k), 2);
    auto wb = to_bf16(w);
    std::vector<float> y(size_t(s.m * s.n));
    auto lb = vlac::cpu::DnnlLinear::create(s.m, s.k, s.n, vlac::DType::BF16, false);
    auto lf = vlac::cpu::DnnlLinear::create(s.m, s.k, s.n, vlac::DType::F32, false);
    if (!lb.is_ok() || !lf.is_ok()) {
      std::fprintf(stderr, "DnnlLinear: %s\n", (lb.is_ok() ? lf.status() : lb.status()).message().c_str());
      return 1;
    }
    std::vector<uint8_t> sb(lb->scratch_bytes()), sf(lf->scratch_bytes());
    auto call = [&](bool bf) {
      const double c0 = process_cpu_seconds();
      if (bf) (void)lb->run(x.data(), wb.data(), nullptr, y.data(), sb.data());
      else (void)lf->run(x.data(), w.data(), nullptr, y.data(), sf.data());
      return process_cpu_seconds() - c0;
    };
    call(true), call(false);  // warm up
    std::vector<double> tb, tf, ratio;
    auto start = Clock::now();
    while (ratio.size() < 3 ||
           (ratio.size() < 41 && std::chrono::duration<double>(Clock::now() - start).count() < 2 * min_seconds)) {
      const bool bf_first = ratio.size() % 2 == 0;  // alternate which goes first
      const double a = call(bf_first), b = call(!bf_first);
      tb.push_back(bf_first ? a : b), tf.push_back(bf_first ? b : a);
      ratio.push_back(tb.back() / tf.back());
    }
    auto median = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    const double mb = median(tb), mf = median(tf), r = median(ratio);
    std::fprintf(stderr, "%5lldx%5lldx%5lld bf16 %7.1f GFLOP/cpu-s  fp32 %7.1f  bf16/fp32 %.3f  (%zu pairs) %s\n",
                 (long long)s.m, (long long)s.k, (long long)s.n, gflop / mb, gflop / mf, r, ratio.size(), s.what);
    cases.push_back({{"m", s.m}, {"k", s.k}, {"n", s.n}, {"what", s.what}, {"gflop", gflop},
                     {"bf16_impl", lb->impl()}, {"fp32_impl", lf->impl()}, {"pairs", ratio.size()},
                     {"bf16_median_cpu_s", mb}, {"fp32_median_cpu_s", mf},
                     {"bf16_gflops_per_cpu_s", gflop / mb}, {"fp32_gflops_per_cpu_s", gflop / mf},
                     {"bf16_over_fp32_median_ratio", r}});
  }
  out["cases"] = cases;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double min_seconds = 0.6;
  std::string shape_set = "full";
  bool pair = false;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--pair")) pair = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--pair")) { --i; continue; }
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--min-seconds")) min_seconds = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--shapes")) shape_set = argv[i + 1];
  }
  vlac::cpu::set_num_threads(threads);
  omp_set_num_threads(threads);
  auto wall0 = Clock::now();

  // "medium": the 261M-parameter config of tools/bench_cpu_vs_lerobot.py (Gemma width 1024, expert 512).
  const std::vector<Shape> medium = {
      {2048, 2048, 2048, "square peak reference"},
      {560, 1024, 4096, "medium gemma mlp gate/up, prefix of 2 cameras"},
      {560, 4096, 1024, "medium gemma mlp down, prefix"},
      {560, 1024, 1024, "medium gemma q_proj/o_proj, prefix"},
      {256, 384, 1536, "medium siglip mlp fc1, one camera"},
      {50, 512, 2048, "medium expert mlp gate/up, one denoising step"},
      {50, 2048, 512, "medium expert mlp down, one denoising step"},
  };
  const std::vector<Shape> full = {
      {2048, 2048, 2048, "square peak reference"},
      {968, 2048, 16384, "gemma-2b mlp gate/up, prefix of 3 cameras"},
      {968, 2048, 2048, "gemma-2b q_proj/o_proj, prefix"},
      {256, 1152, 4304, "siglip mlp fc1, one camera"},
      {50, 1024, 4096, "expert mlp gate/up, one denoising step"},
      {50, 1024, 2048, "expert q_proj, one denoising step"},
  };
  const std::vector<Shape> pi05 = {
      {256, 1152, 4304, "siglip mlp fc1, one camera"},
      {256, 4304, 1152, "siglip mlp fc2, one camera"},
      {256, 1152, 1152, "siglip q/k/v/o_proj, one camera"},
      {968, 2048, 16384, "gemma-2b mlp gate/up, prefix of 3 cameras"},
      {968, 16384, 2048, "gemma-2b mlp down, prefix"},
      {968, 2048, 2048, "gemma-2b q_proj/o_proj, prefix"},
      {968, 2048, 256, "gemma-2b k_proj/v_proj, prefix"},
      {50, 1024, 4096, "expert mlp gate/up, one denoising step"},
      {50, 4096, 1024, "expert mlp down, one denoising step"},
      {50, 1024, 2048, "expert q_proj, one denoising step"},
      {50, 2048, 1024, "expert o_proj, one denoising step"},
      {50, 1024, 256, "expert k_proj/v_proj, one denoising step"},
  };
  if (shape_set != "full" && shape_set != "medium" && shape_set != "pi05") {
    std::fprintf(stderr, "gemm_bench: --shapes must be full, medium or pi05, not '%s'\n", shape_set.c_str());
    return 2;
  }
  const std::vector<Shape>& shapes = shape_set == "medium" ? medium : shape_set == "pi05" ? pi05 : full;
  if (pair) return run_pairs(shapes, threads, min_seconds);
  json out;
  out["cpu"] = cpu_info(threads);
  out["cpu"]["vlac_path"] = vlac::cpu::cpu_path_summary();
  out["openblas_config"] = openblas_get_config();
  out["min_seconds_per_case"] = min_seconds;
  // cblas_sbgemm is declared in cblas.h but Debian's libopenblas 0.3.21 is built without
  // BUILD_BFLOAT16, so the symbol is absent: the only OpenBLAS bf16 path is widening + sgemm.
  out["openblas_sbgemm"] = "not in Debian's libopenblas build (no BUILD_BFLOAT16)";
  json cases = json::array();
  double peak_sgemm = 0, peak_sgemm_cpu = 0;
  for (const Shape& s : shapes) {
    const double gflop = 2.0 * double(s.m) * double(s.k) * double(s.n) / 1e9;
    auto x = random_floats(size_t(s.m * s.k), 1);
    auto w = random_floats(size_t(s.n * s.k), 2);
    auto xb = to_bf16(x);
    auto wb = to_bf16(w);
    std::vector<float> wr(w.size());  // bf16-rounded weights in fp32, the reference for bf16 paths
    for (size_t i = 0; i < w.size(); ++i) wr[i] = vlac::bf16_to_f32(wb[i]);
    std::vector<float> y(size_t(s.m * s.n)), y_ref(y.size()), y_ref_bf(y.size());
    vlac::cpu::linear_f32(x.data(), w.data(), nullptr, y_ref.data(), s.m, s.k, s.n);
    vlac::cpu::linear_f32(x.data(), wr.data(), nullptr, y_ref_bf.data(), s.m, s.k, s.n);
    json row = {{"m", s.m}, {"k", s.k}, {"n", s.n}, {"what", s.what}, {"gflop", gflop}};
    json variants = json::object();
    auto record = [&](const char* name, const Timing& t, const std::vector<float>& ref, json extra) {
      extra["best_s"] = t.best_s;
      extra["median_s"] = t.median_s;
      extra["reps"] = t.reps;
      extra["gflops_best"] = gflop / t.best_s;
      extra["gflops_median"] = gflop / t.median_s;
      extra["best_cpu_s"] = t.best_cpu_s;
      extra["gflops_per_cpu_second"] = gflop / t.best_cpu_s;
      extra["max_abs_diff_vs_ref"] = max_abs_diff(y, ref);  // ref: sgemm on f32 (bf16-rounded for bf16 weights)
      variants[name] = extra;
      std::fprintf(stderr, "%5lldx%5lldx%5lld %-24s %8.1f GFLOP/s wall, %8.1f per CPU-second\n",
                   (long long)s.m, (long long)s.k, (long long)s.n, name, gflop / t.best_s,
                   gflop / t.best_cpu_s);
    };

    // 1. OpenBLAS sgemm, fp32 weights (what vlac used before oneDNN).
    record("openblas_sgemm_f32",
           time_it([&] {
             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.m), int(s.n), int(s.k), 1.0f, x.data(),
                         int(s.k), w.data(), int(s.k), 0.0f, y.data(), int(s.n));
           }, min_seconds),
           y_ref, {{"weights", "f32"}, {"activations", "f32"}});
    if (s.m == 2048 && s.k == 2048 && s.n == 2048) {  // the measured peak: sgemm on a large square
      peak_sgemm = variants["openblas_sgemm_f32"]["gflops_best"].get<double>();
      peak_sgemm_cpu = variants["openblas_sgemm_f32"]["gflops_per_cpu_second"].get<double>();
    }
    // 2./3. vlac's Linear (DnnlLinear): weights used in place (plain layout), fp32 and bf16.
    for (const bool bf : {false, true}) {
      auto lin = vlac::cpu::DnnlLinear::create(s.m, s.k, s.n, bf ? vlac::DType::BF16 : vlac::DType::F32, false);
      if (!lin.is_ok()) {
        std::fprintf(stderr, "DnnlLinear: %s\n", lin.status().message().c_str());
        return 1;
      }
      std::vector<uint8_t> scratch(lin->scratch_bytes());
      const void* wp = bf ? static_cast<const void*>(wb.data()) : static_cast<const void*>(w.data());
      record(bf ? "vlac_linear_bf16" : "vlac_linear_f32",
             time_it([&] { (void)lin->run(x.data(), wp, nullptr, y.data(), scratch.data()); }, min_seconds),
             bf ? y_ref_bf : y_ref,
             {{"weights", bf ? "bf16 in place" : "f32 in place"},
              {"activations", bf ? "bf16 (rounded in timing)" : "f32"},
              {"impl", lin->impl()},
              {"scratch_bytes", scratch.size()}});
    }
    // vlac's Linear over bf16 weights stored transposed, [K,N] (what a compile-time transpose would store).
    {
      std::vector<uint16_t> wt(wb.size());
      for (int64_t nn = 0; nn < s.n; ++nn)
        for (int64_t kk = 0; kk < s.k; ++kk) wt[size_t(kk * s.n + nn)] = wb[size_t(nn * s.k + kk)];
      auto lin = vlac::cpu::DnnlLinear::create(s.m, s.k, s.n, vlac::DType::BF16, false, vlac::cpu::WeightLayout::KN);
      if (lin.is_ok()) {
        std::vector<uint8_t> scratch(lin->scratch_bytes());
        record("vlac_linear_bf16_kn",
               time_it([&] { (void)lin->run(x.data(), wt.data(), nullptr, y.data(), scratch.data()); }, min_seconds),
               y_ref_bf,
               {{"weights", "bf16 in place, stored [K,N]"}, {"activations", "bf16 (rounded in timing)"},
                {"impl", lin->impl()}});
      }
    }
    // 4./5. oneDNN matmul with prepacked weights, fp32 and bf16 (bf16 activations, fp32 out).
    {
      DnnlMatmul mm(s, false, w.data(), x.data(), y.data());
      record("onednn_f32", time_it([&] { mm.run(); }, min_seconds), y_ref,
             {{"weights", "f32 prepacked"}, {"activations", "f32"}, {"impl", mm.impl}});
    }
    if (vlac::cpu::cpu_isa().bf16_matmul) {  // none below AVX-512 in oneDNN 2.6 (see cpu_isa.h)
      std::vector<uint16_t> xb2(xb.size());
      DnnlMatmul mm(s, true, wb.data(), xb2.data(), y.data());
      record("onednn_bf16",
             time_it([&] {
               for (size_t i = 0; i < x.size(); ++i) xb2[i] = vlac::f32_to_bf16(x[i]);
               mm.run();
             }, min_seconds),
             y_ref_bf, {{"weights", "bf16 prepacked"}, {"activations", "bf16 (converted in timing)"}, {"impl", mm.impl}});
    }
    row["variants"] = variants;
    cases.push_back(row);
  }
  out["measured_peak_gflops_sgemm"] = peak_sgemm;
  out["measured_peak_gflops_per_cpu_second_sgemm"] = peak_sgemm_cpu;
  out["load_note"] = "the machine is shared: best-of-reps is reported next to the median";
  for (json& c : cases)
    for (auto& [name, v] : c["variants"].items()) {
      v["fraction_of_measured_sgemm_peak"] = v["gflops_best"].get<double>() / peak_sgemm;
      v["cpu_fraction_of_measured_sgemm_peak"] = v["gflops_per_cpu_second"].get<double>() / peak_sgemm_cpu;
    }
  out["cases"] = cases;
  out["wall_s"] = std::chrono::duration<double>(Clock::now() - wall0).count();
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
