// dtype names, sizes and conversions.
#include "core/dtype.h"

#include <cmath>

namespace vlac {

namespace {
struct DTypeInfo { DType dt; const char* name; uint32_t size; bool is_float; };
constexpr DTypeInfo kDTypes[] = {
    {DType::F64, "F64", 8, true},         {DType::F32, "F32", 4, true},
    {DType::F16, "F16", 2, true},         {DType::BF16, "BF16", 2, true},
    {DType::F8_E4M3, "F8_E4M3", 1, true}, {DType::F8_E5M2, "F8_E5M2", 1, true},
    {DType::I64, "I64", 8, false},        {DType::I32, "I32", 4, false},
    {DType::I16, "I16", 2, false},        {DType::I8, "I8", 1, false},
    {DType::U64, "U64", 8, false},        {DType::U32, "U32", 4, false},
    {DType::U16, "U16", 2, false},        {DType::U8, "U8", 1, false},
    {DType::BOOL, "BOOL", 1, false},
};
const DTypeInfo& info(DType dt) { return kDTypes[static_cast<int>(dt)]; }
}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kDTypes)
    if (name == i.name) return i.dt;
  return std::nullopt;
}
const char* dtype_name(DType dt) { return info(dt).name; }
uint32_t dtype_size(DType dt) { return info(dt).size; }
bool dtype_is_float(DType dt) { return info(dt).is_float; }

uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: Inf
  if (a >= 0x38800000u) {                                               // normal half
    a += 0xC8000FFFu + ((a >> 13) & 1u);  // rebias exponent by -112, add rounding bias
    return static_cast<uint16_t>(sign | (a >> 13));
  }
  // Subnormal half or zero: adding 0.5f aligns the ulp to 2^-24, and the FPU rounds to even.
  float t = f32_from_bits(a) + 0.5f;
  return static_cast<uint16_t>(sign | (f32_bits(t) - 0x3F000000u));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

float f8e4m3_to_f32(uint8_t v) {  // e4m3fn: bias 7, no Inf, S.1111.111 is NaN
  float sign = (v & 0x80) ? -1.0f : 1.0f;
  int exp = (v >> 3) & 0xF;
  int mant = v & 0x7;
  if (exp == 0xF && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
}

uint8_t f32_to_f8e4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7F;
  const double a = std::fabs(static_cast<double>(f));  // exact; every step below is exact in double
  if (a >= 448.0) return sign | 0x7E;                   // saturate (includes Inf)
  if (a < std::ldexp(1.0, -6)) {                        // subnormal: multiples of 2^-9
    const double q = std::nearbyint(std::ldexp(a, 9));  // ties to even (the default rounding mode)
    return sign | static_cast<uint8_t>(q);              // q == 8 is the smallest normal, code 0x08
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m · 2^e, m in [0.5, 1)
  double q = std::nearbyint((m * 2.0 - 1.0) * 8.0);  // mantissa in eighths, ties to even
  int exp = e - 1 + 7;
  if (q == 8.0) q = 0.0, ++exp;                       // rounded up into the next binade
  if (exp > 15 || (exp == 15 && q == 7.0)) return sign | 0x7E;  // above 448: saturate, never the NaN code
  return sign | static_cast<uint8_t>((exp << 3) | static_cast<int>(q));
}

float f8e5m2_to_f32(uint8_t v) {  // IEEE-like: bias 15, Inf and NaN
  return f16_to_f32(static_cast<uint16_t>(v) << 8);
}

float f64_to_f32_round_odd(double d) {
  if (std::isnan(d)) return static_cast<float>(d);
  float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || std::isinf(d)) return f;
  // Step toward zero if the nearest float overshot, then set the sticky (odd) bit.
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return f32_from_bits(f32_bits(f) | 1u);
}

}  // namespace vlac
