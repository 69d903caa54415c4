// Element types as safetensors names them, their sizes, and exact float conversions
// (round to nearest, ties to even; NaN stays NaN, Inf stays Inf, overflow rounds to Inf).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace vlac {

enum class DType : uint8_t {
  F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8, BOOL,
};

/// Parses a safetensors dtype name ("F32", "BF16", ...); nullopt if unknown.
std::optional<DType> dtype_from_name(std::string_view name);
/// The safetensors name of a dtype.
const char* dtype_name(DType dt);
/// Bytes per element.
uint32_t dtype_size(DType dt);
/// True for F64, F32, F16, BF16 and the F8 types.
bool dtype_is_float(DType dt);

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

/// float32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN with its sign.
inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

/// float32 -> IEEE half, round to nearest even; overflow -> Inf; NaN stays quiet NaN.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
float f8e4m3_to_f32(uint8_t v);
float f8e5m2_to_f32(uint8_t v);
/// float32 -> FP8 E4M3 ("fn": bias 7, no Inf, max 448, S.1111.111 NaN), round to nearest even,
/// saturating: |f| beyond 448 gives ±448 (what FP8 weights with per-channel scales need: the
/// scale maps a row's largest magnitude to 448, and rounding must never make it a NaN). NaN stays
/// NaN; subnormals (2^-9 steps below 2^-6) are kept. f8e4m3_to_f32 inverts it on every finite code.
uint8_t f32_to_f8e4m3(float f);
/// double -> float rounded to odd, so that a second rounding to bf16/f16 is exact RNE.
float f64_to_f32_round_odd(double d);

}  // namespace vlac
