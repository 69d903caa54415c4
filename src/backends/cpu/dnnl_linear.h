// A linear layer y = x·Wᵀ + b through oneDNN's matmul (AVX-512 for fp32, AMX for bf16; where
// oneDNN has no bf16 matmul, vlac's blocked bf16→fp32 kernels, see dnnl_linear.cpp), with W
// used in place in its stored row-major [N,K] layout: nothing is copied or repacked, so weights
// mapped from a package stay shared with the page cache. The primitive is created once for a
// fixed M; run() takes the caller's scratch (staging for bf16 activations + oneDNN's scratchpad)
// and makes no allocation of its own. No oneDNN header leaks out (pimpl); no exception escapes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cpu {

/// How W is stored: NK = row-major [N,K] (a Linear weight, PyTorch's layout); KN = row-major
/// [K,N] (e.g. attention's V [S,Dv] in probs·V).
enum class WeightLayout { NK, KN };

class DnnlLinear {
 public:
  /// Plans y[M,N] = x[M,K] · W[N,K]ᵀ (+ b[N]) with W in `w_dtype` (F32 or BF16) stored as `layout`.
  /// With BF16 weights the activations are rounded to bf16 on the way in (a bf16×bf16 matmul with
  /// fp32 accumulation and output), which is what lerobot's bf16 mode computes in its Linear layers.
  /// Uses the OpenMP thread count current at creation (set_num_threads).
  /// With `pack_from` (the weights, read now only) W is reordered once into the primitive's
  /// preferred blocked layout and owned (packed_bytes()); run() then ignores its `w`. Faster for
  /// few rows (the expert's M = 50), at the cost of that copy.
  /// `e4m3_activations` (F8_E4M3 weights only; ExecOptions::fp8_activations): x is rounded per row
  /// to e4m3 after its bf16 rounding, as a W8A8 FP8 GEMM reads it (also with VLAC_CPU_FP8_ACT=1).
  static Result<DnnlLinear> create(int64_t m, int64_t k, int64_t n, DType w_dtype, bool has_bias,
                                   WeightLayout layout = WeightLayout::NK, const void* pack_from = nullptr,
                                   bool e4m3_activations = false);
  DnnlLinear(DnnlLinear&&) noexcept;
  DnnlLinear& operator=(DnnlLinear&&) noexcept;
  ~DnnlLinear();

  /// Bytes of scratch run() needs (any alignment; run() aligns inside).
  uint64_t scratch_bytes() const;
  /// x [M,K] fp32, w [N,K] in the planned dtype, b [N] fp32 (null iff planned without bias),
  /// y [M,N] fp32. Borrowed pointers.
  Status run(const float* x, const void* w, const float* b, float* y, void* scratch) const;
  /// run() with x already rounded to bf16 (planned with BF16 weights and M > 1).
  Status run_bf16_src(const uint16_t* x, const void* w, const float* b, float* y, void* scratch) const;
  /// oneDNN's implementation name, e.g. "brg:avx512_core_amx_bf16".
  const std::string& impl() const;
  /// Bytes of the owned packed weights (0 when W is used in place).
  uint64_t packed_bytes() const;
  /// Whether bf16 weights run on vlac's blocked bf16→fp32 path (or, packed, widened to fp32)
  /// because oneDNN has no bf16 matmul on this CPU (see cpu_isa.h).
  bool bf16_fallback() const;

 private:
  struct Impl;
  explicit DnnlLinear(std::unique_ptr<Impl> impl);
  Status execute(void* src, const void* w, const float* b, float* y, uint8_t* base) const;
  static void plan_blocked(Impl& p);
  Status run_blocked(const float* xr, const void* w, const float* b, float* y, uint8_t* base) const;
  std::unique_ptr<Impl> impl_;
};

/// Attention with one KV head shared by H query heads (pi0.5's Gemma and expert) with its two
/// matmuls in bf16 (AMX/AVX-512), as lerobot's bf16 mode computes them: q, k, v and the
/// probabilities are rounded to bf16, scores and softmax stay fp32 (scale and mask applied in
/// fp32). Where oneDNN has no bf16 matmul the same rounding is done in fp32 staging and the two
/// matmuls run in fp32 (exact products of bf16 values, fp32 accumulation). All T·H query rows in
/// one block: scratch holds the [T·H, S] scores.
class DnnlAttention {
 public:
  static Result<DnnlAttention> create(int64_t t, int64_t h, int64_t s, int64_t dh, int64_t dv);
  /// Bytes of scratch run() needs (any alignment).
  uint64_t scratch_bytes() const;
  /// q [T,H,Dh], k [S,1,Dh], v [S,1,Dv] fp32, mask as attention(), out [T,H,Dv] fp32.
  Status run(const float* q, const float* k, const float* v, const uint8_t* allow, const float* add,
             float* out, float scale, void* scratch) const;
  /// Whether it runs as fp32 matmuls over bf16-rounded operands (no oneDNN bf16 matmul here).
  bool bf16_fallback() const;

 private:
  DnnlAttention(DnnlLinear qk, DnnlLinear pv) : qk_(std::move(qk)), pv_(std::move(pv)) {}
  DnnlLinear qk_, pv_;
  int64_t t_ = 0, h_ = 0, s_ = 0, dh_ = 0, dv_ = 0;
  bool fallback_ = false;
};

}  // namespace vlac::cpu
