// cuBLASLt wrapper (gemm.h). Row-major y[M,N] = x[M,K]·W[N,K]ᵀ is, in cuBLASLt's column-major
// terms, yᵀ[N,M] = op(W)·xᵀ with W seen as a K×N matrix (ld K) transposed and x as K×M (ld K):
// the "TN" layout, which is also what cuBLASLt's FP8 kernels want later.
#include "backends/cuda/gemm.h"

#include <cublasLt.h>

#include "backends/cuda/capture_edge.h"
#include "backends/cuda/context.h"
#include "backends/cuda/cublaslt_api.h"
#include "backends/cuda/env.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/preload_gemm.h"
#include "backends/cuda/skinny_gemm.h"
#include "backends/cuda/small_gemm.h"
#include "core/atomic_file.h"
#include "mem/host_steps.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace vlac::cuda {

namespace {

Status lt_error(const std::string& what, cublasStatus_t s) {
  return Status(StatusCode::Backend, "cublasLt " + what + ": " + lt().GetStatusString(s));
}
#define VLAC_LT(call, what)                                          \
  do {                                                               \
    const cublasStatus_t vlac_lt_ = (call);                          \
    if (vlac_lt_ != CUBLAS_STATUS_SUCCESS) return lt_error(what, vlac_lt_); \
  } while (0)

cudaDataType_t cuda_type(DType t) {
  return t == DType::F32 ? CUDA_R_32F : t == DType::F8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
}

std::string shape_name(const GemmDesc& d) {
  return std::to_string(d.m) + "x" + std::to_string(d.k) + "x" + std::to_string(d.n) + " " + dtype_name(d.in) +
         (d.tf32 && d.in == DType::F32 ? "(tf32)" : "") + "->" + dtype_name(d.out) +
         (d.k_parts > 1 ? " in " + std::to_string(d.k_parts) + " K parts" : "");
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's top few, best guess first
  std::vector<size_t> candidate_ws;               // the workspace each candidate needs (cuBLASLt's answer)
  std::vector<int> skinny_splits;                 // the skinny kernel's choices where it fits
  int skinny = 0;                                 // > 0: run the skinny kernel with this many splits
  size_t chosen = 0;                              // index of algo in candidates
  int splitk_added = 0;                           // FP8 split-K variants among them (fp8_splitk)
  bool tuned = false;
  int pdl = -1;  // programmatic edge into it when captured: -1 not probed, 0 unsafe or untried, 1 safe
  EdgePort pdl_port = EdgePort::Programmatic;  // where that edge leaves (VLAC_GEMM_PDL=2: launch completion)
  void destroy() {
    if (op) lt().MatmulDescDestroy(op);
    if (a) lt().MatrixLayoutDestroy(a);
    if (b) lt().MatrixLayoutDestroy(b);
    if (c) lt().MatrixLayoutDestroy(c);
    op = nullptr, a = b = c = nullptr;
  }
};

}  // namespace

// The heuristic's first answer is a guess from the shape alone; at M = 50 (the expert) or a
// wave-quantised N another of its top answers is often faster. Each shape's candidates are timed
// once, on its first run outside a capture, on the run's own operands (the result is rewritten
// by the chosen one), and the fastest is kept if it beats the first by 5%. VLAC_GEMM_TUNE=0 keeps
// the first answer (the choice is then the same on every run of every process).
// VLAC_GEMM_CANDIDATES (1..64) asks the heuristic for more (or fewer) answers to time.
constexpr int kMaxCandidates = 64;
static int candidate_count() {
  static const int n = [] {
    const int64_t v = env_count("VLAC_GEMM_CANDIDATES", 8);
    return v < 1 ? 8 : int(std::min<int64_t>(v, kMaxCandidates));
  }();
  return n;
}
static bool tuning_enabled() {
  static const bool on = !env_off("VLAC_GEMM_TUNE");
  return on;
}

// Timing back to back leaves the weight in the L2 cache (50 MB on the H200) after the first run,
// so the expert's 1-16 MB weights are timed hot while a chunk reads every layer's weights cold from
// HBM. So each run is timed after reading 96 MB of a registered weight block (l2_flush), between
// its own events (H200, session 10: recorded chunk 21.42 ms against 22.27 / 22.37 timed hot, one
// run each). VLAC_GEMM_TUNE_COLD=0 times back to back as before.
static bool cold_timing() {
  static const bool on = !env_off("VLAC_GEMM_TUNE_COLD");
  return on;
}
namespace {
std::mutex g_flush_mu;
std::vector<std::pair<const void*, uint64_t>> g_flush_regions;
}  // namespace
void GemmRunner::add_flush_region(const void* p, uint64_t bytes) {
  if (!p || bytes == 0) return;
  std::lock_guard<std::mutex> lock(g_flush_mu);
  g_flush_regions.emplace_back(p, bytes);
}
void GemmRunner::remove_flush_region(const void* p) {
  std::lock_guard<std::mutex> lock(g_flush_mu);
  std::erase_if(g_flush_regions, [&](const auto& r) { return r.first == p; });
}
static std::pair<const void*, uint64_t> largest_flush_region() {
  std::lock_guard<std::mutex> lock(g_flush_mu);
  std::pair<const void*, uint64_t> best{nullptr, 0};
  for (const auto& r : g_flush_regions)
    if (r.second > best.second) best = r;
  return best;
}

// The skinny kernel (skinny_gemm.h) for M <= 64 with bf16 weights. Off by default: on the H200
// it timed faster than cuBLASLt for some expert shapes in isolation (back to back, its weight
// loads overlapping the previous run's tail), yet whole recorded chunks ran 2.4 ms slower with it
// chosen that way and 5.3 ms slower with it forced (24.9 / 27.3 / 29.8 ms, session 9): its split-K
// tail (partials, fence, counter, reduce) is a chain of memory latencies. VLAC_SKINNY_GEMM=auto
// makes it one more candidate of the timing above, =1 runs it wherever it fits (its default split).
enum class SkinnyMode { Off, Auto, Force };
static SkinnyMode skinny_mode() {
  static const SkinnyMode m = [] {
    const std::string e = env_str("VLAC_SKINNY_GEMM");
    if (e == "auto") return SkinnyMode::Auto;
    if (e == "1") return SkinnyMode::Force;
    return SkinnyMode::Off;
  }();
  return m;
}

// In-place split-K reductions as extra candidates (make()), opt-in with VLAC_GEMM_INPLACE_SPLITK=1:
// on the H200 (session 11, one machine start) recorded chunks took 20.51 / 20.51 ms with them
// against 20.37 ms without (some won the cold timing alone, then lost inside the chunk), and a
// kernel they bring needs no more stack than vlac's (48 B) where the default answers' need
// 160 B (stack_limit_now: +29 MB of GPU memory).
static bool reduction_variants() {
  static const bool on = env_on("VLAC_GEMM_INPLACE_SPLITK");
  return on;
}

// FP8 split-K candidates, opt-in with VLAC_FP8_SPLITK=1 (a probe): at the expert's M = 50 the
// heuristic's FP8 answers run one block per output tile (N / tile blocks on 132 multiprocessors:
// o 1.65x and down 1.32x bf16's time on the H100, session 23), while its bf16 answers split K. Each
// of the first FP8 answers that can split K is offered again with 2, 4 and 8 splits, checked by
// cublasLtMatmulAlgoCheck and timed with the others. cuBLASLt 13.1 refused every such variant on
// the H100 (session 24: VLAC_GEMM_REPORT=1 names each refusal), so today it adds nothing.
static bool fp8_splitk() {
  static const bool on = env_on("VLAC_FP8_SPLITK");
  return on;
}

// VLAC_GEMM_PDL: 1 probes each plan for programmatic edges (GemmRunner::set_programmatic_edges),
// 2 the same with the edge leaving at the predecessor's launch completion, else off. Read at each
// launch of a plan not yet probed, so a process can turn it on between packages.
static int gemm_pdl_mode() {
  const std::string v = env_str("VLAC_GEMM_PDL");
  return v == "1" ? 1 : v == "2" ? 2 : 0;
}

// VLAC_GEMM_REPORT=1: one stderr line per timed shape (candidates, the choice, its split-K, the
// first and best times), to read what the timing chose inside a benchmark.
static bool gemm_report() {
  static const bool on = env_on("VLAC_GEMM_REPORT");
  return on;
}

// The choices of the timing above are kept on disk per GPU and cuBLASLt version, so only the
// first process on a machine times (the "chosen at first load on the target and cached"):
// later ones skip the timing in their first chunk (H200: first load 6.99 -> 6.62 s; the host heap
// only 10 MB smaller, so the candidates' modules were not what it holds). A choice is the index
// in the heuristic's answer list, which is the
// same for the same shape, library and GPU; an index the list no longer has is timed again.
// VLAC_GEMM_CACHE=0 turns it off, VLAC_GEMM_CACHE=FILE names the file; by default
// $XDG_CACHE_HOME/vlac (or ~/.cache/vlac)/gemm_tune_<gpu>_<sm>_<cublasLt version>.txt. A file that
// does not parse is ignored (and rewritten at the next save).
class TuneCache {
 public:
  void open(const std::string& gpu) {
    const char* e = std::getenv("VLAC_GEMM_CACHE");
    if (e && std::string(e) == "0") return;
    if (e && *e) {
      path_ = e;
    } else {
      std::string dir;
      if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = std::string(x) + "/vlac";
      else if (const char* h = std::getenv("HOME"); h && *h) dir = std::string(h) + "/.cache/vlac";
      else return;
      std::string name;
      for (char c : gpu) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      path_ = dir + "/gemm_tune_" + name + ".txt";
      dir_ = dir;
    }
    header_ = "vlac-gemm-tune 1 " + gpu;
    std::ifstream in(path_);
    std::string line;
    if (!in || !std::getline(in, line) || line != header_) return;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string key, choice;
      if (ls >> key >> choice && (choice[0] == 'a' || choice[0] == 's')) choices_[key] = choice;
    }
  }
  bool enabled() const { return !path_.empty(); }
  const std::string* find(const std::string& key) const {
    auto it = choices_.find(key);
    return it == choices_.end() ? nullptr : &it->second;
  }
  // Records and writes the whole file (a temporary name, then rename); a failure only costs the
  // next process its timing.
  void put(const std::string& key, const std::string& choice) {
    if (!enabled()) return;
    choices_[key] = choice;
    if (!dir_.empty()) {
      std::error_code ec;  // a failure shows as the write's below
      std::filesystem::create_directories(dir_, ec);
    }
    std::string text = header_ + "\n";
    for (const auto& [k, c] : choices_) text += k + " " + c + "\n";
    auto f = AtomicFile::create(path_);
    if (!f.is_ok() || !f->write(text.data(), text.size()).is_ok() || !f->commit().is_ok()) {
      if (!warned_) std::fprintf(stderr, "vlac: note: could not write the GEMM tuning cache %s\n", path_.c_str());
      warned_ = true;
    }
  }

 private:
  std::string path_, dir_, header_;
  std::map<std::string, std::string> choices_;
  bool warned_ = false;
};

std::string cache_key(const GemmDesc& d) {
  const auto [m, n, k, in, out, epi, acc, tf32, ldx, parts, ldy] = d.key();
  return std::to_string(m) + "," + std::to_string(n) + "," + std::to_string(k) + "," + std::to_string(in) + "," +
         std::to_string(out) + "," + std::to_string(epi) + "," + std::to_string(int(acc)) + "," +
         std::to_string(int(tf32)) + "," + std::to_string(ldx) + (parts > 1 ? "," + std::to_string(parts) : "") +
         (ldy != 0 && ldy != n ? ",y" + std::to_string(ldy) : "");
}

// VLAC_FP8_FAST_ACCUM=1: Hopper's FP8 MMA sums without the periodic fp32 promotion (faster, less
// exact over long K), for A/B; off by default.
static bool fp8_fast_accum() {
  static const bool on = env_on("VLAC_FP8_FAST_ACCUM");
  return on;
}

// What the cache is keyed by: the GPU, its multiprocessors, cuBLASLt's version, the workspace and
// the timing's settings (another candidate count, the skinny kernel or FP8 fast accumulation
// change the answers).
std::string tune_identity(uint64_t workspace, int sms) {
  int dev = 0;
  cudaDeviceProp prop{};
  std::string name = "unknown";
  if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
    name = std::string(prop.name) + "_sm" + std::to_string(prop.major) + std::to_string(prop.minor);
  else
    (void)cudaGetLastError();
  return name + "_" + std::to_string(sms) + "sms_lt" + std::to_string(lt().GetVersion()) + "_ws" +
         std::to_string(workspace >> 20) + "m_c" + std::to_string(candidate_count()) + "_s" +
         std::to_string(int(skinny_mode())) + (cold_timing() ? "_cold" : "") + (reduction_variants() ? "_inplace" : "") +
         (fp8_fast_accum() ? "_fp8fast" : "") + (fp8_splitk() ? "_fp8sk" : "");
}

struct GemmRunner::Impl {
  cublasLtHandle_t handle = nullptr;
  uint64_t workspace = 0;
  uint64_t tuned = 0, switched = 0, skinny_shapes = 0, cached = 0, pdl_probed = 0, pdl_safe = 0;
  int pdl_mode = -1;  // set_programmatic_edges: 0 off, 1 on; -1: VLAC_GEMM_PDL (gemm_pdl_mode)
  TuneCache cache;
  unsigned* counters = nullptr;  // the skinny kernel's tile counters (zero between GEMMs)
  // FP8 plans carry this as their scale pointers until a call sets its own. With the pointers
  // null at plan time, cuBLASLt's heuristic refused every per-row-scaled FP8 plan of the backend
  // (INVALID_VALUE; CUDA 13 on the H100 and H200, session 21), while the same mode with the
  // pointers set first was planned, ran and was right (bench/fp8_scale_modes_bench).
  void* fp8_placeholder = nullptr;
  int sms = 0;
  std::map<decltype(GemmDesc{}.key()), Plan> plans;
  ~Impl() {
    for (auto& [k, p] : plans) p.destroy();
    if (handle) lt().Destroy(handle);
    device_free(counters);
    device_free(fp8_placeholder);
  }
  // ws_limit: the workspace a plan may use (the runner's by default; 0 for the FP8 probe).
  // An FP8 combination cuBLASLt refuses while planning (an F32 output with a bias, K parts, a
  // scale mode: cuBLASLt 13.1 on sm_90) is Unsupported, so the caller widens the weight instead;
  // this is the one place that turns its refusals into that.
  Status make(const GemmDesc& d, Plan& p, uint64_t ws_limit = UINT64_MAX) {
    Status s = make_plan(d, p, ws_limit);
    if (!s.is_ok() && d.in == DType::F8_E4M3 && s.code() == StatusCode::Backend)
      return unsupported("gemm " + shape_name(d) + ": cuBLASLt offers no FP8 plan for this combination (" + s.message() + ")");
    return s;
  }
  Status make_plan(const GemmDesc& d, Plan& p, uint64_t ws_limit);
  void add_fp8_splitk(const GemmDesc& d, Plan& p, uint64_t ws) const;
  // FP8 combinations (clamped shape, output dtype, epilogue, accumulation, K parts) run once.
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int, bool, int>, Status> fp8_probes;
  Status probe_fp8(const GemmDesc& d);
  Status run_skinny(cudaStream_t stream, const GemmDesc& d, int splits, const void* x, const void* w, const void* bias,
                    void* y, void* ws) const {
    const SkinnyGemm g{d.m, d.n, d.k, d.out, bias != nullptr, splits};
    return skinny_gemm(stream, g, x, w, bias, y, ws, counters);
  }
  void tune(cudaStream_t stream, const GemmDesc& d, Plan& p, const void* x, const void* w, const void* bias, void* y,
            void* ws);
  bool probe_pdl(cudaStream_t stream, const GemmDesc& d, Plan& p, const void* w, void* ws, EdgePort port);
};

void GemmRunner::Impl::tune(cudaStream_t stream, const GemmDesc& d, Plan& p, const void* x, const void* w,
                            const void* bias, void* y, void* ws) {
  const HostStep step("gemm_tuning");
  // The device idle first: work on another stream (a second lane: the prefix LM beside the first
  // denoising step) would run beside the candidates and skew their times.
  if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    (void)cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    return;
  }
  const auto flush = cold_timing() ? largest_flush_region() : std::pair<const void*, uint64_t>{nullptr, 0};
  const uint64_t flush_bytes = std::min<uint64_t>(flush.second, 96ull << 20) / 16 * 16;
  // Milliseconds of 3 runs after a warm-up, or < 0 when a run or the timing fails (dropped).
  auto time_ms = [&](auto&& go) -> float {
    if (!go()) {
      (void)cudaGetLastError();
      return -1;
    }
    if (flush_bytes >= 16) {  // cold: each run after an L2 flush, timed alone
      float sum = 0;
      for (int r = 0; r < 3; ++r) {
        float ms = 0;
        if (!l2_flush(stream, flush.first, flush_bytes, ws).is_ok() || cudaEventRecord(e0, stream) != cudaSuccess ||
            !go() || cudaEventRecord(e1, stream) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
          (void)cudaGetLastError();
          return -1;
        }
        sum += ms;
      }
      return sum;
    }
    cudaEventRecord(e0, stream);
    bool ok = true;
    for (int r = 0; r < 3 && ok; ++r) ok = go();
    cudaEventRecord(e1, stream);
    float ms = 0;
    if (!ok || cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return ms;
  };
  const float alpha = 1.0f, beta = 0.0f;
  float first = -1, best = -1;
  size_t best_i = 0;
  for (size_t i = 0; i < p.candidates.size(); ++i) {
    const float ms = time_ms([&] {
      return lt().Matmul(handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.candidates[i], ws, workspace,
                            stream) == CUBLAS_STATUS_SUCCESS;
    });
    if (ms < 0) continue;
    if (i == 0) first = ms;
    if (best < 0 || ms < best) best = ms, best_i = i;
  }
  // The skinny kernel's splits, timed the same way; it is kept if it beats the best cuBLASLt answer.
  float skinny_best = -1;
  int skinny_at = 0;
  for (int splits : p.skinny_splits) {
    const float ms = time_ms([&] { return run_skinny(stream, d, splits, x, w, bias, y, ws).is_ok(); });
    if (ms >= 0 && (skinny_best < 0 || ms < skinny_best)) skinny_best = ms, skinny_at = splits;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  ++tuned;
  if (best_i != 0 && (first < 0 || best < 0.95f * first)) {
    p.algo = p.candidates[best_i];
    p.chosen = best_i;
    ++switched;
  }
  if (skinny_at > 0 && (best < 0 || skinny_best < best)) {
    p.skinny = skinny_at;
    ++skinny_shapes;
  }
  if (gemm_report()) {
    int32_t sk = 1;
    size_t got = 0;
    if (lt().MatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof(sk), &got) !=
        CUBLAS_STATUS_SUCCESS)
      sk = -1;
    std::fprintf(stderr,
                 "vlac gemm: %s candidates %zu (split-K added %d) chosen %zu split-K %d workspace %zu first %.2f us best "
                 "%.2f us%s\n",
                 shape_name(d).c_str(), p.candidates.size(), p.splitk_added, p.chosen, int(sk),
                 p.chosen < p.candidate_ws.size() ? p.candidate_ws[p.chosen] : size_t(0), first * 1000.0f / 3,
                 best * 1000.0f / 3, p.skinny > 0 ? " (skinny kernel)" : "");
  }
  // Timing loaded each candidate's kernels from cuBLASLt's 540 MB library file: give those clean
  // pages back now (a loading step, context.h), not only when the chunk is done, so the first
  // chunk's host peak does not hold the code of every candidate of every shape at once.
  trim_clean_pages();
}

// Whether the plan's kernel may be captured on a programmatic edge (Plan::pdl): a graph of a
// memset of xt, late_copy (lets dependents launch at once, spins 40 us, then copies xs into xt)
// and the GEMM of xt on a programmatic edge must give the bits of the same GEMM of xs run plainly.
// A kernel that does not wait for late_copy reads xt's zeros. Twice, since a pass could be luck
// only if the GEMM happened to start late. The weights are the plan's own (read only); x and the
// two outputs are temporary, so only plans whose x and y take at most 8 MiB together are probed
// (M <= 64 shapes, whose launches are what a programmatic edge can hide); bf16 or fp32, no
// accumulation, K parts or strides. Runs outside a capture, on the run's stream, synchronously.
bool GemmRunner::Impl::probe_pdl(cudaStream_t stream, const GemmDesc& d, Plan& p, const void* w, void* ws,
                                 EdgePort port) {
  const HostStep step("gemm_pdl_probe");
  const uint64_t xb = uint64_t(d.m * d.k) * dtype_size(d.in), yb = uint64_t(d.m * d.n) * dtype_size(d.out);
  if (d.in == DType::F8_E4M3 || d.accumulate || d.k_parts > 1 || (d.ldx != 0 && d.ldx != d.k) ||
      (d.ldy != 0 && d.ldy != d.n) || xb + 2 * yb > (8ull << 20) || xb % 16 != 0 || !pdl_enabled())
    return false;
  ++pdl_probed;
  void *xs = nullptr, *xt = nullptr, *y0 = nullptr, *y1 = nullptr;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&](const void* x, void* y) {
    return lt().Matmul(handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, ws, workspace, stream) ==
           CUBLAS_STATUS_SUCCESS;
  };
  bool safe = false;
  // What the probe saw, for the note below: the graph could not be made, or the GEMM's output
  // was all zeros (it read x before late_copy wrote it), partly right, or right both times.
  std::string seen = "could not be allocated or run plainly";
  size_t nodes = 0;
  if (cudaMalloc(&xs, xb) == cudaSuccess && cudaMalloc(&xt, xb) == cudaSuccess && cudaMalloc(&y0, yb) == cudaSuccess &&
      cudaMalloc(&y1, yb) == cudaSuccess && cudaMemsetAsync(xs, 0x3c, xb, stream) == cudaSuccess && gemm(xs, y0) &&
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    const bool built = cudaMemsetAsync(xt, 0, xb, stream) == cudaSuccess && cudaMemsetAsync(y1, 0, yb, stream) == cudaSuccess &&
                       late_copy(stream, xs, xt, xb, 40000).is_ok() && set_capture_edge(stream, port) &&
                       gemm(xt, y1);
    const cudaError_t ce = cudaStreamEndCapture(stream, &g);
    if (g) (void)cudaGraphGetNodes(g, nullptr, &nodes);
    seen = "could not be captured on a programmatic edge";
    if (built && ce == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess) {
      std::vector<unsigned char> a(yb), b(yb);
      int right = 0;
      for (int r = 0; r < 2; ++r) {
        if (cudaGraphLaunch(ge, stream) != cudaSuccess || cudaStreamSynchronize(stream) != cudaSuccess ||
            cudaMemcpy(a.data(), y0, yb, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(b.data(), y1, yb, cudaMemcpyDeviceToHost) != cudaSuccess) {
          seen = "failed to run on a programmatic edge";
          right = -1;
          break;
        }
        if (a == b) {
          ++right;
          continue;
        }
        const bool zeros = std::all_of(b.begin(), b.end(), [](unsigned char c) { return c == 0; });
        seen = zeros ? "read x before its predecessor wrote it (all zeros)" : "gave other values (it read x while it was written)";
        break;
      }
      safe = right == 2;
    }
  }
  (void)cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
  if (ge) (void)cudaGraphExecDestroy(ge);
  if (g) (void)cudaGraphDestroy(g);
  for (void* q : {xs, xt, y0, y1})
    if (q) (void)cudaFree(q);
  (void)cudaGetLastError();
  if (safe) ++pdl_safe;
  std::fprintf(stderr, "vlac gemm: %s: cuBLASLt's kernel %s (VLAC_GEMM_PDL; probe graph of %zu nodes)\n",
               shape_name(d).c_str(),
               safe ? "waits for its predecessor: captured on a programmatic edge" : (seen + ": plain edge").c_str(), nodes);
  return safe;
}

// cuBLASLt may offer an algorithm for an FP8 combination it then refuses at the call (an
// unsupported scale mode is reported by cublasLtMatmul alone, as CUBLAS_STATUS_INVALID_VALUE), and
// a refusal inside a chunk could not fall back to widening. So each FP8 combination of output
// dtype, epilogue, accumulation and K parts runs once on zeroed buffers before a plan of it is
// made, at the GEMM's shape clamped to 64 x 256 x 256·parts (under 0.5 MiB, and up to 4 MiB of
// workspace, all freed after: the probe runs while the weights are on the GPU) on the default
// stream; a failure makes the plan Unsupported. Clamped rather than one shape for all (16 x 16 x 64
// before session 21), so that a GEMM smaller than the clamp is probed at its own size.
Status GemmRunner::Impl::probe_fp8(const GemmDesc& d) {
  const int parts = std::max(1, d.k_parts);
  GemmDesc pd{std::min<int64_t>(d.m, 64), std::min<int64_t>(d.n, 256), std::min<int64_t>(d.k, 256 * parts),
              DType::F8_E4M3, d.out, d.epilogue, d.accumulate};
  pd.k_parts = d.k_parts;
  const auto key = std::tuple(pd.m, pd.n, pd.k, int(d.out), int(d.epilogue), d.accumulate, d.k_parts);
  if (auto it = fp8_probes.find(key); it != fp8_probes.end()) return it->second;
  Plan pp;
  const uint64_t wsb = std::min<uint64_t>(workspace, 4ull << 20);  // a few MiB, briefly, at plan time
  Status st = make(pd, pp, wsb);  // no FP8 algorithm for it: Unsupported from make()
  const uint64_t xs = uint64_t(pd.m * pd.k), wbytes = uint64_t(pd.n * pd.k), sb = uint64_t(std::max(pd.m, pd.n)) * 4,
                 bb = uint64_t(pd.n) * 4, ys = uint64_t(pd.m * pd.n) * std::max(1, d.k_parts) * dtype_size(d.out);
  void *x = nullptr, *w = nullptr, *sc = nullptr, *b = nullptr, *y = nullptr, *wsp = nullptr;
  if (st.is_ok()) {
    if (cudaMalloc(&x, xs) != cudaSuccess || cudaMalloc(&w, wbytes) != cudaSuccess || cudaMalloc(&sc, sb) != cudaSuccess ||
        cudaMalloc(&b, bb) != cudaSuccess || cudaMalloc(&y, ys) != cudaSuccess ||
        (wsb > 0 && cudaMalloc(&wsp, wsb) != cudaSuccess)) {
      (void)cudaGetLastError();
      st = Status(StatusCode::Backend, "gemm: no device memory for the FP8 probe");
    }
  }
  if (st.is_ok()) {
    const std::vector<float> one(size_t(std::max(pd.m, pd.n)), 1.0f);
    (void)cudaMemset(x, 0, xs);
    (void)cudaMemset(w, 0, wbytes);
    (void)cudaMemset(b, 0, bb);
    (void)cudaMemset(y, 0, ys);
    (void)cudaMemcpy(sc, one.data(), sb, cudaMemcpyHostToDevice);
    const void* bias = has_bias(d.epilogue) ? b : nullptr;
    cublasStatus_t ls = CUBLAS_STATUS_SUCCESS;
    if (bias) ls = lt().MatmulDescSetAttribute(pp.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    if (ls == CUBLAS_STATUS_SUCCESS)
      ls = lt().MatmulDescSetAttribute(pp.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sc, sizeof(sc));
    if (ls == CUBLAS_STATUS_SUCCESS)
      ls = lt().MatmulDescSetAttribute(pp.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sc, sizeof(sc));
    const float alpha = 1.0f, beta = d.accumulate ? 1.0f : 0.0f;
    if (ls == CUBLAS_STATUS_SUCCESS)
      ls = lt().Matmul(handle, pp.op, &alpha, w, pp.a, x, pp.b, &beta, y, pp.c, y, pp.c, &pp.algo, wsp, wsb, nullptr);
    const cudaError_t ce = cudaStreamSynchronize(nullptr);
    if (ls != CUBLAS_STATUS_SUCCESS) st = lt_error("FP8 probe of " + shape_name(d), ls);
    else if (ce != cudaSuccess) st = Status(StatusCode::Backend, std::string("FP8 probe: ") + cudaGetErrorString(ce));
    if (!st.is_ok()) st = unsupported("gemm " + shape_name(d) + ": cuBLASLt refuses this FP8 combination (" + st.message() + ")");
    (void)cudaGetLastError();
  }
  for (void* ptr : {x, w, sc, b, y, wsp})
    if (ptr) cudaFree(ptr);
  pp.destroy();
  fp8_probes.emplace(key, st);
  return st;
}

// FP8 rows must be 16-byte multiples (cuBLASLt's FP8 leading dimensions); sm_89 and later.
static Status fp8_precheck(const GemmDesc& d) {
  if (d.k % (16 * std::max(1, d.k_parts)) != 0 || (d.ldx != 0 && d.ldx % 16 != 0))
    return unsupported("gemm " + shape_name(d) + ": FP8 needs k and x's row stride multiples of 16");
  if (device_compute_capability() < 89)
    return unsupported("gemm " + shape_name(d) + ": FP8 GEMMs need compute capability 8.9 or later");
  return Status::ok();
}

void GemmRunner::Impl::add_fp8_splitk(const GemmDesc& d, Plan& p, uint64_t ws) const {
  const size_t base = std::min<size_t>(p.candidates.size(), 4);
  for (size_t i = 0; i < base; ++i) {
    int32_t can = 0, id = -1;
    size_t got = 0;
    const bool cap_ok = lt().MatmulAlgoCapGetAttribute(&p.candidates[i], CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &can,
                                                          sizeof(can), &got) == CUBLAS_STATUS_SUCCESS;
    if (gemm_report()) {
      (void)lt().MatmulAlgoConfigGetAttribute(&p.candidates[i], CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &got);
      std::fprintf(stderr, "vlac gemm: %s FP8 answer %zu of %zu (algo id %d): split-K %s\n", shape_name(d).c_str(), i,
                   p.candidates.size(), int(id), !cap_ok ? "capability unknown" : can ? "supported" : "not supported");
    }
    if (!cap_ok || !can) continue;
    uint32_t schemes = 0;  // the reductions the answer offers (CUBLASLT_REDUCTION_SCHEME_*)
    (void)lt().MatmulAlgoCapGetAttribute(&p.candidates[i], CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes,
                                            sizeof(schemes), &got);
    for (int32_t splits : {2, 4, 8}) {
      if (d.k / splits < 128) break;
      // fp32 partials first (whatever y's dtype); in place or in y's dtype where only those pass.
      for (uint32_t scheme : {uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), uint32_t(CUBLASLT_REDUCTION_SCHEME_INPLACE),
                              uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
        if (scheme != CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE && d.out != DType::F32) continue;  // no bf16 sums
        cublasLtMatmulAlgo_t a = p.candidates[i];
        cublasLtMatmulHeuristicResult_t r{};
        cublasStatus_t cs = lt().MatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits));
        if (cs == CUBLAS_STATUS_SUCCESS)
          cs = lt().MatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme));
        if (cs == CUBLAS_STATUS_SUCCESS) cs = lt().MatmulAlgoCheck(handle, p.op, p.a, p.b, p.c, p.c, &a, &r);
        if (cs != CUBLAS_STATUS_SUCCESS || r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > ws) {
          if (gemm_report())
            std::fprintf(stderr,
                         "vlac gemm: %s FP8 answer %zu, %d splits, reduction %u (offered mask %u): refused (%s, state %d, "
                         "workspace %zu of %llu)\n",
                         shape_name(d).c_str(), i, int(splits), scheme, schemes, lt().GetStatusName(cs), int(r.state),
                         r.workspaceSize, static_cast<unsigned long long>(ws));
          continue;
        }
        const bool seen = std::any_of(p.candidates.begin(), p.candidates.end(), [&](const cublasLtMatmulAlgo_t& c) {
          return std::memcmp(&c, &a, sizeof(c)) == 0;
        });
        if (seen) continue;
        p.candidates.push_back(a), p.candidate_ws.push_back(r.workspaceSize), ++p.splitk_added;
        break;  // one reduction per split count
      }
    }
  }
}

Status GemmRunner::Impl::make_plan(const GemmDesc& d, Plan& p, uint64_t ws_limit) {
  const std::string name = shape_name(d);
  if (d.m <= 0 || d.n <= 0 || d.k <= 0) return invalid_argument("gemm " + name + ": sizes must be positive");
  if ((d.in != DType::BF16 && d.in != DType::F32 && d.in != DType::F8_E4M3) ||
      (d.out != DType::BF16 && d.out != DType::F32))
    return unsupported("gemm " + name + ": inputs must be BF16, F32 or F8_E4M3, the output BF16 or F32");
  if (d.in == DType::F32 && d.out != DType::F32) return unsupported("gemm " + name + ": F32 inputs need an F32 output");
  const bool fp8 = d.in == DType::F8_E4M3;
  if (fp8) VLAC_RETURN_IF_ERROR(fp8_precheck(d));
  const cublasComputeType_t ct = d.tf32 && d.in == DType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  VLAC_LT(lt().MatmulDescCreate(&p.op, ct, CUDA_R_32F), "descriptor " + name);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa " + name);
  VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb " + name);
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  switch (d.epilogue) {
    case Epilogue::None: break;
    case Epilogue::Bias: epi = CUBLASLT_EPILOGUE_BIAS; break;
    case Epilogue::Gelu: epi = CUBLASLT_EPILOGUE_GELU; break;
    case Epilogue::BiasGelu: epi = CUBLASLT_EPILOGUE_GELU_BIAS; break;
  }
  VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "epilogue " + name);
  if (fp8) {  // one fp32 scale per row of W (cuBLASLt's A: our n) and of x (its B: our m)
    const int8_t fa = fp8_fast_accum() ? 1 : 0;
    VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)), "fast accumulation " + name);
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)), "W scales " + name);
    VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)), "x scales " + name);
    if (!fp8_placeholder) {
      VLAC_ASSIGN_OR_RETURN(void* ph, device_alloc(256, "the FP8 plans' placeholder scales"));
      fp8_placeholder = ph;
    }
    const void* ph = fp8_placeholder;
    VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ph, sizeof(ph)), "W scale pointer " + name);
    VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ph, sizeof(ph)), "x scale pointer " + name);
    if (has_bias(d.epilogue)) {  // the bias has y's dtype (as everywhere here), said explicitly for FP8
      const int32_t bt = cuda_type(d.out);
      VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)), "bias type " + name);
    }
  }
  const cudaDataType_t ti = cuda_type(d.in), to = cuda_type(d.out);
  if (d.k_parts > 1 && (d.epilogue != Epilogue::None || d.out != DType::F32 || d.accumulate || d.k % (8 * d.k_parts) != 0))
    return invalid_argument("gemm " + name + ": K parts need an F32 output, no epilogue and k a multiple of 8 per part");
  // K parts: W's and x's K chunks are batches (offset kk elements within the same rows), y's the
  // partial products one after another.
  const int64_t kk = d.k_parts > 1 ? d.k / d.k_parts : d.k;
  VLAC_LT(lt().MatrixLayoutCreate(&p.a, ti, uint64_t(kk), uint64_t(d.n), d.k), "layout W " + name);
  if (d.ldx != 0 && d.ldx < d.k) return invalid_argument("gemm " + name + ": x's row stride is below k");
  VLAC_LT(lt().MatrixLayoutCreate(&p.b, ti, uint64_t(kk), uint64_t(d.m), d.ldx ? d.ldx : d.k), "layout x " + name);
  if (d.ldy != 0 && d.ldy < d.n) return invalid_argument("gemm " + name + ": y's row stride is below n");
  const int64_t ldy = d.ldy ? d.ldy : d.n;
  VLAC_LT(lt().MatrixLayoutCreate(&p.c, to, uint64_t(d.n), uint64_t(d.m), ldy), "layout y " + name);
  if (d.k_parts > 1) {
    const int32_t batches = d.k_parts;
    const int64_t strides[3] = {kk, kk, ldy * d.m};
    cublasLtMatrixLayout_t ls[3] = {p.a, p.b, p.c};
    for (int i = 0; i < 3; ++i) {
      VLAC_LT(lt().MatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batches, sizeof(batches)),
              "batch count " + name);
      VLAC_LT(lt().MatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                               sizeof(strides[i])),
              "batch stride " + name);
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  VLAC_LT(lt().MatmulPreferenceCreate(&pref), "preference " + name);
  const uint64_t ws = std::min(workspace, ws_limit);
  const uint32_t align = 16;  // arena offsets are 16-byte aligned, not 256 (cuBLASLt's default assumption)
  cublasStatus_t st = lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    if (st == CUBLAS_STATUS_SUCCESS) st = lt().MatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t res[kMaxCandidates]{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt().MatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, candidate_count(), res, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) lt().MatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_error("heuristic " + name, st);
  if (found == 0) return unsupported("gemm " + name + ": cuBLASLt has no algorithm for this shape");
  p.algo = res[0].algo;
  for (int i = 0; i < found; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(res[i].algo), p.candidate_ws.push_back(res[i].workspaceSize);
  if (fp8 && fp8_splitk() && d.k_parts <= 1 && !d.accumulate) add_fp8_splitk(d, p, ws);
  // Opt-in: split-K answers whose partial sums are reduced in place (in the fp32 output, ordered by
  // counters: deterministic), appended to be timed too: the heuristic's own split-K pick for the
  // expert's down_proj (M = 50) reduces in a second kernel (cublasLt splitKreduce_kernel, ~4 us
  // and a launch per layer and step on the H200). bf16 outputs would sum in bf16: not offered.
  if (reduction_variants() && d.out == DType::F32 && !d.accumulate) {
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_INPLACE;
    int more = 0;
    if (lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)) ==
            CUBLAS_STATUS_SUCCESS &&
        lt().MatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, candidate_count(), res, &more) ==
            CUBLAS_STATUS_SUCCESS) {
      int added = 0;
      for (int i = 0; i < more && added < 4; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const bool seen = std::any_of(p.candidates.begin(), p.candidates.end(), [&](const cublasLtMatmulAlgo_t& c) {
          return std::memcmp(&c, &res[i].algo, sizeof(c)) == 0;
        });
        if (!seen) p.candidates.push_back(res[i].algo), p.candidate_ws.push_back(res[i].workspaceSize), ++added;
      }
    }
  }
  lt().MatmulPreferenceDestroy(pref);
  if (skinny_mode() != SkinnyMode::Off && counters && d.in == DType::BF16 && !d.accumulate && (d.ldx == 0 || d.ldx == d.k) &&
      (d.ldy == 0 || d.ldy == d.n) &&
      (d.epilogue == Epilogue::None || d.epilogue == Epilogue::Bias) && skinny_gemm_fits(d.m, d.n, d.k)) {
    for (int splits : skinny_gemm_splits(d.n, d.k, sms))
      if (skinny_gemm_workspace_bytes(SkinnyGemm{d.m, d.n, d.k, d.out, false, splits}) <= workspace)
        p.skinny_splits.push_back(splits);
    if (skinny_mode() == SkinnyMode::Force && !p.skinny_splits.empty()) {
      p.skinny = p.skinny_splits.front();
      ++skinny_shapes;
    }
  }
  return Status::ok();
}

GemmRunner::GemmRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmRunner::GemmRunner(GemmRunner&&) noexcept = default;
GemmRunner& GemmRunner::operator=(GemmRunner&&) noexcept = default;
GemmRunner::~GemmRunner() = default;

uint64_t GemmRunner::default_workspace_bytes() {
  return uint64_t(env_count("VLAC_GEMM_WORKSPACE_KIB", int64_t(kDefaultWorkspaceBytes >> 10))) << 10;
}

Result<GemmRunner> GemmRunner::create(uint64_t workspace_bytes) {
  VLAC_RETURN_IF_ERROR(cublaslt_load());  // loaded here, not linked (cublaslt_api.h)
  auto impl = std::make_unique<Impl>();
  VLAC_LT(lt().Create(&impl->handle), "create");
  impl->workspace = workspace_bytes;
  impl->sms = device_sm_count();
  if (tuning_enabled()) impl->cache.open(tune_identity(workspace_bytes, impl->sms));
  if (skinny_mode() != SkinnyMode::Off) {
    VLAC_ASSIGN_OR_RETURN(void* c, device_alloc(kSkinnyCounters * sizeof(unsigned), "the skinny GEMM's tile counters"));
    impl->counters = static_cast<unsigned*>(c);
    const cudaError_t e = cudaMemset(impl->counters, 0, kSkinnyCounters * sizeof(unsigned));
    if (e != cudaSuccess) return Status(StatusCode::Backend, std::string("the skinny GEMM's tile counters: ") +
                                                                 cudaGetErrorString(e));
  }
  return GemmRunner(std::move(impl));
}

enum class OwnF32 { No, Small, Tile };
static OwnF32 runs_own_f32(const GemmDesc& d);

Status GemmRunner::plan(const GemmDesc& d) {
  auto it = impl_->plans.find(d.key());
  if (it != impl_->plans.end()) return Status::ok();  // (every launch of a cuBLASLt shape ends here)
  // The fp32 shapes run by small_gemm.h's kernels need no plan: asking cuBLASLt about them would
  // build its fp32 kind's host heap for nothing (session 37: the executor plans every Linear).
  if (runs_own_f32(d) != OwnF32::No) return Status::ok();
  const HostStep step("gemm_plan");
  if (d.in == DType::F8_E4M3 && d.m > 0 && d.n > 0 && d.k > 0) {
    VLAC_RETURN_IF_ERROR(fp8_precheck(d));  // the cheap refusals first, without a probe
    VLAC_RETURN_IF_ERROR(impl_->probe_fp8(d));
  }
  Plan p;
  Status s = impl_->make(d, p);  // (an FP8 plan refused at the full shape is Unsupported there too)
  if (!s.is_ok()) {
    p.destroy();
    return s;
  }
  impl_->plans.emplace(d.key(), p);
  return Status::ok();
}

Status GemmRunner::run(cudaStream_t stream, const GemmDesc& d, const void* x, const void* w, const void* bias, void* y,
                       void* workspace) {
  if (d.in == DType::F8_E4M3)
    return invalid_argument("gemm " + shape_name(d) + ": FP8 GEMMs need their scales (run_scaled)");
  return run_scaled(stream, d, x, nullptr, w, nullptr, bias, y, workspace);
}

// fp32 with few rows and a small side (pi0.5's action projections and time MLP): small_gemm.h's
// kernels, with no plan and no timing. TF32 is a permission, not a request: these are exact fp32
// (in packages with the fast vision mode every fp32 Linear asks for TF32, and cuBLASLt's TF32
// kind costs host heap of its own: session 37). Shapes marked own_f32 (the fast vision mode's patch
// embedding) take the tiled kernel, so that those packages plan no fp32 GEMM with cuBLASLt.
static OwnF32 runs_own_f32(const GemmDesc& d) {
  if (d.m < 1 || d.n < 1 || d.k < 1 || d.in != DType::F32 || d.out != DType::F32 || d.accumulate || d.k_parts > 1 ||
      (d.epilogue != Epilogue::None && d.epilogue != Epilogue::Bias) || (d.ldx != 0 && d.ldx != d.k) ||
      (d.ldy != 0 && d.ldy != d.n))
    return OwnF32::No;
  if (small_f32_gemm_fits(d.m, d.n, d.k) && small_f32_gemm_enabled()) return OwnF32::Small;
  return tile_f32_gemm_takes(d.own_f32) ? OwnF32::Tile : OwnF32::No;
}

// bf16 with few rows (the expert's GEMMs), opt-in with VLAC_PRELOAD_GEMM=1 (=2: only GEMMs that
// write K parts): preload_gemm.h's kernel, which reads its weights before it waits for x. No plan
// and no timing: what it is for (weights streaming while earlier kernels run) shows only inside a
// recorded chain, not alone. Measured slower in whole chunks so far (sessions 29-32).
static bool runs_preload(const GemmDesc& d, int sms, PreloadGemm* g) {
  const int mode = preload_gemm_mode();
  if (mode == 0 || (mode == 2 && d.k_parts < 2) || d.in != DType::BF16 || d.tf32 ||
      (d.epilogue != Epilogue::None && d.epilogue != Epilogue::Bias))
    return false;
  *g = PreloadGemm{d.m, d.n, d.k, d.out, d.epilogue == Epilogue::Bias, d.accumulate, d.ldx, d.ldy};
  g->k_parts = d.k_parts > 1 ? d.k_parts : 0;
  return preload_gemm_fits(*g, sms);
}

Status GemmRunner::run_scaled(cudaStream_t stream, const GemmDesc& d, const void* x, const float* x_scales,
                              const void* w, const float* w_scales, const void* bias, void* y, void* workspace) {
  const std::string name = "gemm " + shape_name(d);
  const bool fp8 = d.in == DType::F8_E4M3;
  if (has_bias(d.epilogue) != (bias != nullptr))
    return invalid_argument(name + ": a bias is given iff the epilogue adds one");
  if (fp8 != (x_scales != nullptr) || fp8 != (w_scales != nullptr))
    return invalid_argument(name + ": scales are given iff the inputs are FP8");
  for (const void* ptr : {x, w, static_cast<const void*>(y), bias, static_cast<const void*>(x_scales),
                          static_cast<const void*>(w_scales)})
    if ((reinterpret_cast<uintptr_t>(ptr) & 15u) != 0) return invalid_argument(name + ": pointers must be 16-byte aligned");
  if (const OwnF32 own = runs_own_f32(d); own != OwnF32::No)
    return (own == OwnF32::Small ? small_f32_gemm : tile_f32_gemm)(stream, d.m, d.n, d.k, static_cast<const float*>(x),
                                                                  static_cast<const float*>(w),
                                                                  static_cast<const float*>(bias), static_cast<float*>(y));
  if (PreloadGemm pg; !fp8 && runs_preload(d, impl_->sms, &pg)) return preload_gemm(stream, pg, impl_->sms, x, w, bias, y);
  VLAC_RETURN_IF_ERROR(plan(d));
  if (impl_->workspace > 0 && workspace == nullptr) return invalid_argument(name + ": no workspace given");
  Plan& p = impl_->plans.at(d.key());
  if (bias) VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), name);
  if (fp8) {  // set before the timing below too: it runs this descriptor
    VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)), name);
    VLAC_LT(lt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)), name);
  }
  if (!p.tuned) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) (void)cudaGetLastError();
    if (cs == cudaStreamCaptureStatusNone) {
      p.tuned = true;  // also when not timed: the choice is fixed from here on
      if (tuning_enabled() && (p.candidates.size() > 1 || !p.skinny_splits.empty()) && !d.accumulate &&
          p.skinny == 0) {
        const std::string key = cache_key(d);
        const std::string* c = impl_->cache.find(key);
        const int v = c ? std::atoi(c->c_str() + 1) : -1;
        const bool skinny_ok = c && (*c)[0] == 's' &&
                               std::find(p.skinny_splits.begin(), p.skinny_splits.end(), v) != p.skinny_splits.end();
        if (c && (*c)[0] == 'a' && v >= 0 && size_t(v) < p.candidates.size()) {
          p.algo = p.candidates[size_t(v)];
          p.chosen = size_t(v);
          ++impl_->cached;
        } else if (skinny_ok) {
          p.skinny = v;
          ++impl_->skinny_shapes;
          ++impl_->cached;
        } else {
          impl_->tune(stream, d, p, x, w, bias, y, workspace);
          impl_->cache.put(key, p.skinny > 0 ? "s" + std::to_string(p.skinny) : "a" + std::to_string(p.chosen));
        }
      }
    }
  }
  if (p.skinny > 0) return impl_->run_skinny(stream, d, p.skinny, x, w, bias, y, workspace);
  if (p.pdl < 0 && p.tuned) {  // the switch is read until the plan is probed: one getenv a launch
    const int mode = impl_->pdl_mode >= 0 ? impl_->pdl_mode : gemm_pdl_mode();
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (mode > 0 && cudaStreamIsCapturing(stream, &cs) != cudaSuccess) (void)cudaGetLastError();
    if (mode > 0 && cs == cudaStreamCaptureStatusNone) {
      p.pdl_port = mode == 2 ? EdgePort::LaunchCompletion : EdgePort::Programmatic;
      p.pdl = impl_->probe_pdl(stream, d, p, w, workspace, p.pdl_port) ? 1 : 0;
    }
  }
  if (p.pdl == 1) (void)set_capture_edge(stream, p.pdl_port);  // only while capturing
  const float alpha = 1.0f, beta = d.accumulate ? 1.0f : 0.0f;
  VLAC_LT(lt().Matmul(impl_->handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace,
                         impl_->workspace, stream),
          name);
  return Status::ok();
}

uint64_t GemmRunner::workspace_bytes() const { return impl_->workspace; }
size_t GemmRunner::plans_of_kind(DType in, DType out, bool tf32) const {
  size_t n = 0;
  for (const auto& [key, p] : impl_->plans)
    n += std::get<3>(key) == int(in) && std::get<4>(key) == int(out) && std::get<7>(key) == tf32;
  return n;
}
uint64_t GemmRunner::chosen_workspace_max(int64_t max_m) const {
  uint64_t most = 0;
  for (const auto& [key, p] : impl_->plans) {
    const int64_t m = std::get<0>(key);
    if (max_m > 0 && m > max_m) continue;
    uint64_t need = 0;
    if (p.skinny > 0)
      need = skinny_gemm_workspace_bytes(
          SkinnyGemm{m, std::get<1>(key), std::get<2>(key), DType(std::get<4>(key)), false, p.skinny});
    else if (p.chosen < p.candidate_ws.size())
      need = p.candidate_ws[p.chosen];
    most = std::max(most, need);
  }
  return most;
}
uint64_t GemmRunner::tuned_shapes() const { return impl_->tuned; }
uint64_t GemmRunner::switched_shapes() const { return impl_->switched; }
uint64_t GemmRunner::skinny_shapes() const { return impl_->skinny_shapes; }
uint64_t GemmRunner::cached_shapes() const { return impl_->cached; }
size_t GemmRunner::plans() const { return impl_->plans.size(); }
void GemmRunner::set_programmatic_edges(bool on) { impl_->pdl_mode = on ? 1 : 0; }
uint64_t GemmRunner::pdl_probed_shapes() const { return impl_->pdl_probed; }
uint64_t GemmRunner::pdl_safe_shapes() const { return impl_->pdl_safe; }

}  // namespace vlac::cuda
