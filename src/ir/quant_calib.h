// Activation statistics for 8-bit weights and the rounding that uses them (`vlac compile
// --dtype int8|fp8 --calibrate OBS`).
//
// Round-to-nearest makes each weight's error as small as it can be alone. What a Linear's output
// feels is x·(w − ŵ) over the inputs x it actually sees: errors along inputs that move together
// can cancel. GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative
// Pre-trained Transformers", 2022) rounds a row's entries in order and moves each rounding error
// onto the entries not yet rounded, weighted by the inverse of H = Σ x xᵀ over the observed x.
// The scale stays the row's own (max|row| / qmax), so the stored form (core/quant.h) and every
// kernel are unchanged; only which code each weight gets differs.
//
// Memory: H is kept block-diagonal (blocks of `block` inputs, errors move only inside a block):
// k·block floats per weight instead of k², so a full-size pi0.5 (k up to 16384) stays at a few
// hundred MiB of statistics; at k ≤ block it is exact GPTQ.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac::ir {

/// Σ x xᵀ of one Linear's inputs, block-diagonal: block b covers inputs [b·block, b·block + w_b)
/// with w_b = min(block, k − b·block), stored w_b × w_b row-major from float b·block·block.
struct InputStats {
  int64_t k = 0;
  int64_t block = 0;
  uint64_t rows = 0;  // input rows observed
  std::vector<float> h;
};

/// GPTQ's damping when the caller gives none: λ = damp · mean(diag H). int8 takes 1 and fp8 GPTQ's
/// usual 0.01 (session 21, docs/quantization.md): with the few observations a user calibrates on,
/// int8 at 0.01 overfits them on small models (tiny_a beyond 2x bf16's worst action in 2 of 6
/// calibration draws, none at 1), while at full size damp 1 costs int8 little (0.45-0.58x ->
/// 0.57-0.62x bf16-all's max |d|) and fp8 more (2.38x -> 3.19x on obs0).
double default_gptq_damp(DType weights);

class QuantCalibration {
 public:
  /// `damp`: GPTQ's damping, with no default here since it depends on the weight dtype
  /// (default_gptq_damp). `act_order`: gptq_factor's order for every weight (on by default: 15-25 %
  /// less RMS error at full size for int8 and fp8; docs/quantization.md).
  QuantCalibration(int64_t block, double damp, bool act_order = true, int threads = 1);
  /// Adds the rows x [rows, k] (fp32) a Linear over weight `weight` read. A weight seen at
  /// another k keeps its first k and ignores the rest (a graph never does that).
  void observe(const std::string& weight, const float* x, int64_t rows, int64_t k);
  /// The statistics of `weight`, nullptr when it was never observed.
  const InputStats* find(const std::string& weight) const;
  /// Every weight's statistics, by name.
  const std::map<std::string, InputStats>& all() const { return stats_; }
  /// Sets a weight's statistics (read back from a file: compile/calibration_file.h); the block must be
  /// this calibration's.
  void set(const std::string& weight, InputStats s) { stats_[weight] = std::move(s); }
  size_t size() const { return stats_.size(); }
  uint64_t bytes() const;
  int64_t block() const { return block_; }
  double damp() const { return damp_; }
  bool act_order() const { return act_order_; }
  /// Threads that round one weight's rows (write_quant_matrix); the rows are independent.
  int threads() const { return threads_; }
  /// Matrices quantized with these statistics (write_quant_matrix counts them; the compile logs it).
  void note_applied() const { ++applied_; }
  uint64_t applied() const { return applied_; }

 private:
  int64_t block_;
  double damp_;
  bool act_order_;
  int threads_;
  std::map<std::string, InputStats> stats_;
  mutable uint64_t applied_ = 0;
};

/// What GPTQ rounds with, per diagonal block (InputStats' layout): U upper-triangular with
/// (H_b + λI)⁻¹ = UᵀU, λ = damp · mean(diag H_b). An input never seen non-zero gets H_ii = 1
/// (its weights round to nearest and take no error). A block that stays indefinite after
/// raising λ ten-fold five times is an error naming `name`.
struct GptqFactor {
  int64_t k = 0;
  int64_t block = 0;
  std::vector<float> u;        // of the block's inputs taken in `order`
  std::vector<int32_t> order;  // per block, the offsets of its inputs in rounding order
};
/// `act_order`: each block's inputs are rounded largest H_ii first (GPTQ's "act-order": the
/// inputs that matter most take no error from others), else in index order.
Result<GptqFactor> gptq_factor(const InputStats& s, double damp, const std::string& name, bool act_order = false);

/// quantize_row (core/quant.h) with GPTQ's order: the same scale, then each entry rounded and its
/// error (w − ŵ)/U_ii subtracted, times U_ij, from the entries j after it in its block. `row` is
/// modified. Returns the scale: 0 for a zero row, NaN for a row holding NaN or Inf.
float quantize_row_gptq(float* row, int64_t k, DType dt, uint8_t* codes, const GptqFactor& f);

}  // namespace vlac::ir
