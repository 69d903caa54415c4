// GEMMs through cuBLASLt: y[M,N] = x[M,K] · W[N,K]ᵀ (+ bias[N]) (then GELU) (+ y when
// accumulating), with x and W row-major as vlac stores them (PyTorch's Linear layout), so no
// weight is transposed or copied. bf16 (or fp32) in, fp32 accumulation, bf16 or fp32 out.
// The algorithm of each shape is chosen once by cuBLASLt's heuristic and cached with its
// descriptors; the workspace is the caller's (one planned buffer), so run() allocates nothing and
// can be captured in a CUDA graph once planned.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cuda {

enum class Epilogue : uint8_t { None, Bias, Gelu, BiasGelu };
inline bool has_bias(Epilogue e) { return e == Epilogue::Bias || e == Epilogue::BiasGelu; }

struct GemmDesc {
  int64_t m = 0, n = 0, k = 0;
  DType in = DType::BF16;   // x and W: BF16 (fp32 accumulate), F32 (fp32 math, TF32 off), or
                            // F8_E4M3 codes with one fp32 scale per row of each (run_scaled)
  DType out = DType::BF16;  // y: BF16 or F32; the bias has this dtype too (torch's Linear in bf16)
  Epilogue epilogue = Epilogue::None;
  bool accumulate = false;  // y = y + x·Wᵀ...: a residual add fused into the GEMM (beta = 1)
  bool tf32 = false;        // F32 inputs: tensor cores on TF32-rounded inputs (ExecOptions::fast_vision)
  int64_t ldx = 0;          // x's row stride in elements (0: k; more when x is a view into a wider block)
  int64_t ldy = 0;          // y's row stride in elements (0: n; more when y is a column slice of a wider y)
  // > 1: y holds k_parts fp32 partial products [k_parts][m][n] over equal K chunks (one strided
  // batched GEMM), summed in order by their reader (the executor's fused residual norm) instead of
  // a split-K reduction kernel. F32 out, no epilogue or accumulation, k a multiple of 8·k_parts.
  int k_parts = 0;
  // F32: vlac's tiled kernel runs it, never cuBLASLt (small_gemm.h: tile_f32_gemm_takes). Not in
  // key(): the key names cuBLASLt plans, and such a shape gets none.
  bool own_f32 = false;
  auto key() const {
    return std::tuple(m, n, k, int(in), int(out), int(epilogue), accumulate, tf32, ldx, k_parts, ldy);
  }
};

/// Not thread-safe: one runner per thread (the bias pointer is set on the cached descriptor).
/// cuBLASLt's GELU epilogue is the tanh approximation (pi0.5's gelu_pytorch_tanh); it applies to
/// the fp32 sum, then y is rounded once (torch in bf16 rounds the Linear output before its GELU).
class GemmRunner {
 public:
  /// 4 MiB. cuBLAS recommends 32 MiB on Hopper for split-K algorithms, but with 32 MiB allowed the
  /// algorithms chosen for every pi0.5 shape needed at most 400 KiB (H100, session 36: bf16 and
  /// int8 packages); each lane holds one workspace, so 28 MiB a lane went unused.
  static constexpr uint64_t kDefaultWorkspaceBytes = 4ull << 20;
  /// kDefaultWorkspaceBytes, or VLAC_GEMM_WORKSPACE_KIB (e.g. 32768 for cuBLAS's 32 MiB).
  static uint64_t default_workspace_bytes();
  /// A cuBLASLt handle whose plans may use up to `workspace_bytes` of the caller's workspace.
  static Result<GemmRunner> create(uint64_t workspace_bytes = default_workspace_bytes());
  GemmRunner(GemmRunner&&) noexcept;
  GemmRunner& operator=(GemmRunner&&) noexcept;
  ~GemmRunner();

  /// Chooses and caches the algorithm of `d` (run() does this on first use; call it before a
  /// graph capture so the capture records no planning).
  Status plan(const GemmDesc& d);
  /// Enqueues the GEMM. Device pointers, 16-byte aligned; bias null iff the epilogue has none;
  /// workspace at least workspace_bytes() (may be null when that is 0).
  Status run(cudaStream_t stream, const GemmDesc& d, const void* x, const void* w, const void* bias, void* y,
             void* workspace);
  /// The FP8 GEMM (d.in = F8_E4M3, sm_89 and later): x and w e4m3 codes, x_scales one fp32 per
  /// row of x (d.m), w_scales one per row of W (d.n), 16-byte aligned like every pointer.
  /// plan() of such a desc fails (Unsupported) where cuBLASLt has no algorithm for it.
  Status run_scaled(cudaStream_t stream, const GemmDesc& d, const void* x, const float* x_scales, const void* w,
                    const float* w_scales, const void* bias, void* y, void* workspace);
  uint64_t workspace_bytes() const;
  /// The most workspace any planned shape's chosen algorithm needs (cuBLASLt's own figure; the
  /// skinny kernel's partials), over shapes of at most max_m rows (0: all; 64: the expert's): how
  /// much of workspace_bytes() is used, in the memory breakdown.
  uint64_t chosen_workspace_max(int64_t max_m = 0) const;
  /// Shapes whose cuBLASLt candidates were timed at their first run, and those where another
  /// candidate than the heuristic's first won (VLAC_GEMM_TUNE=0: none).
  uint64_t tuned_shapes() const;
  uint64_t switched_shapes() const;
  /// Shapes that run the skinny kernel (skinny_gemm.h) instead of cuBLASLt.
  uint64_t skinny_shapes() const;
  /// Shapes whose choice came from the on-disk tuning cache (VLAC_GEMM_CACHE) instead of timing.
  uint64_t cached_shapes() const;
  /// Number of cached plans (shapes seen).
  /// Plans whose inputs, output and TF32 switch are these: cuBLASLt builds host heap once per such
  /// kind (session 37: ~89 MB for bf16 -> bf16, +42 MB bf16 -> f32, +99 MB f32, +18 MB TF32).
  size_t plans_of_kind(DType in, DType out, bool tf32 = false) const;
  size_t plans() const;
  /// Programmatic edges into cuBLASLt's kernels inside captures (capture_edge.h), on or off for
  /// this runner; without a call, VLAC_GEMM_PDL=1 (=2: the edge leaves at the predecessor's launch
  /// completion instead of its end) as read at each plan's first run after its tuning, outside a
  /// capture, off by default. Each such plan's chosen kernel is probed once for whether it waits
  /// for its predecessor itself; only plans whose probe passed are then captured on a programmatic
  /// edge. Plans probed keep their verdict.
  void set_programmatic_edges(bool on);
  /// Plans probed, and those whose kernel was seen to wait (so captured on a programmatic edge).
  uint64_t pdl_probed_shapes() const;
  uint64_t pdl_safe_shapes() const;
  /// Read-only device memory the cold timing (VLAC_GEMM_TUNE_COLD=1) may read to evict the L2
  /// cache between timed runs: the uploaded weight blocks register here and leave before they
  /// are freed. The largest registered is used.
  static void add_flush_region(const void* p, uint64_t bytes);
  static void remove_flush_region(const void* p);

 private:
  struct Impl;
  explicit GemmRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlac::cuda
