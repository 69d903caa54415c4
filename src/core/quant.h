// 8-bit weight matrices with one fp32 scale per output row (issue 14's INT8 and FP8 engines).
//
// A quantized matrix W[N,K] is stored as one blob: N·K codes (row-major, one byte each), zero
// padding to the next 64 bytes, then N fp32 scales. Its value is W[n,k] = decode(code[n,k]) ·
// scale[n]. The scale is chosen from the row alone (symmetric, absmax maps to the code's largest
// magnitude), so a compile streams a weight row by row and never needs the whole tensor, and the
// rows of a fused weight (q|k|v, gate|up) keep their own scales. Codes:
//   I8       signed integers -127..127 (−128 unused: the range stays symmetric); round to
//            nearest even.
//   F8_E4M3  FP8 "e4m3fn" (max 448; f32_to_f8e4m3: nearest even, saturating).
// Every code is exact in bf16 (|q| ≤ 127 has 7 significant bits; e4m3 has 4), so a GEMM over
// bf16 activations and codes widened to bf16 has exact products; the scale is applied to the
// fp32 sum, once per output.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace vlac {

/// I8 and F8_E4M3: the weight dtypes stored with per-row scales.
bool is_quant_dtype(DType dt);
/// A weight stored as a quantized blob: a quantized dtype and rank 2.
bool is_quant_matrix(DType dt, const std::vector<int64_t>& shape);
/// Largest code magnitude: 127 (I8), 448 (F8_E4M3).
float quant_max(DType dt);
/// Byte offset of the scales inside the blob of a [rows, cols] matrix (codes padded to 64).
uint64_t quant_scales_offset(int64_t rows, int64_t cols);
/// Bytes a weight takes in an engine: the blob for a quantized matrix, numel · size otherwise;
/// UINT64_MAX when that overflows (a corrupt shape).
uint64_t stored_weight_bytes(DType dt, const std::vector<int64_t>& shape);
/// The unscaled value of a code (exact in fp32 and in bf16).
float quant_decode(DType dt, uint8_t code);
/// The 256 decoded values of dt's codes, for table lookups.
const float* quant_table(DType dt);
/// Quantizes one row of k values into `codes`; returns its scale (0 for an all-zero row: its
/// codes are then 0). NaN or Inf in the row gives a NaN scale: callers refuse the weight.
float quantize_row(const float* row, int64_t k, DType dt, uint8_t* codes);
/// quantize_row's scale of a row: max|row| / quant_max(dt); 0 for a zero row, NaN when the row
/// holds NaN or Inf.
float quant_row_scale(const float* row, int64_t k, DType dt);
/// The code of one value already divided by its row's scale (quantize_row's rounding: I8 clamped
/// to ±127 and rounded to nearest even, F8_E4M3 by f32_to_f8e4m3).
uint8_t quant_code(float q, DType dt);

}  // namespace vlac
