// f32 -> bf16 and f32 -> f16 rounding (core/dtype.h, used by io/convert) against an independent
// reference that rounds in double arithmetic: the two neighbouring representable values, the
// nearer one, ties to even. bf16: all 2^32 patterns (a strong sample under AddressSanitizer);
// f16: a strong sample (every tie neighbourhood, subnormals, overflow boundary, NaN, Inf).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "io/convert.h"

#if defined(__SANITIZE_ADDRESS__)
#define VLAC_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VLAC_TEST_ASAN 1
#endif
#endif
#ifndef VLAC_TEST_ASAN
#define VLAC_TEST_ASAN 0
#endif

namespace vlac {
namespace {

float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// Rounds |a| (finite, from a float) to a multiple of 2^ulp_exp, nearest, ties to even, in
// double arithmetic: a * 2^-ulp_exp < 2^53 exactly, split into integer and fraction parts.
double round_to_ulp(double a, int ulp_exp) {
  double scaled = std::ldexp(a, -ulp_exp);  // exact (power-of-two scaling, no underflow here)
  double q = std::floor(scaled);
  double frac = scaled - q;                 // exact
  if (frac > 0.5 || (frac == 0.5 && std::fmod(q, 2.0) != 0.0)) q += 1.0;
  return std::ldexp(q, ulp_exp);
}

// Unbiased exponent of a finite non-zero double (a = m * 2^e, 1 <= m < 2).
int exponent_of(double a) {
  int e = 0;
  std::frexp(a, &e);
  return e - 1;
}

// Reference: bf16 bits for float bits x (NaN handled by the caller). Same method as
// round_to_ulp, with the scaling and floor done by table lookup and integer truncation so that
// all 2^32 patterns take seconds; the float's exponent field only picks the spacing.
struct Pow2Table {
  double v[400];
  Pow2Table() { for (int i = 0; i < 400; ++i) v[i] = std::ldexp(1.0, i - 200); }
  double operator()(int e) const { return v[e + 200]; }
};
const Pow2Table kPow2;

const double kMaxBf16 = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127

// Returns 0x10000 (matches nothing) if the reference itself went wrong.
uint32_t ref_bf16(uint32_t x) {
  const uint32_t sign = static_cast<uint32_t>((x >> 16) & 0x8000u);
  const int field = static_cast<int>((x >> 23) & 0xFF);
  if (field == 0xFF) return sign | 0x7F80;  // Inf (NaN is the caller's)
  double a = std::fabs(static_cast<double>(from_bits(x)));
  if (a == 0) return sign;
  // bf16: 8 significant bits; normal exponents -126..127; subnormal spacing 2^-133.
  const int e = std::max(field, 1) - 127;
  const double scaled = a * kPow2(7 - e);  // exact; < 256
  int64_t q = static_cast<int64_t>(scaled);  // floor (positive)
  const double frac = scaled - static_cast<double>(q);
  if (frac > 0.5 || (frac == 0.5 && (q & 1) != 0)) ++q;
  const double r = static_cast<double>(q) * kPow2(e - 7);
  if (r > kMaxBf16) return sign | 0x7F80;  // Inf
  // r is exactly a bf16 value; its float encoding must have 16 zero low bits.
  uint32_t rb;
  float rf = static_cast<float>(r);
  std::memcpy(&rb, &rf, 4);
  if (static_cast<double>(rf) != r || (rb & 0xFFFFu) != 0) return 0x10000u;
  return sign | (rb >> 16);
}

// Reference: the value of f16 bits h, as a double (NaN -> NaN).
double f16_value(uint16_t h) {
  int exp = (h >> 10) & 0x1F;
  int mant = h & 0x3FF;
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1F) return mant ? std::nan("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Reference: the rounded f16 value (as a double, Inf on overflow) of a non-NaN float.
double ref_f16_value(float f) {
  if (std::isinf(f)) return f;
  double a = std::fabs(static_cast<double>(f));
  double sign = std::signbit(f) ? -1.0 : 1.0;
  if (a == 0) return sign * 0.0;
  if (a >= 65536.0) return sign * INFINITY;
  // f16: 11 significant bits; normal exponents -14..15; subnormal spacing 2^-24.
  int e = std::max(exponent_of(a), -14);
  double r = round_to_ulp(a, e - 10);
  if (r > 65504.0) return sign * INFINITY;
  return sign * r;
}

void parallel_for(uint64_t n, const std::function<void(uint64_t, uint64_t)>& body) {
  unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  std::vector<std::thread> pool;
  const uint64_t per = (n + threads - 1) / threads;
  for (unsigned t = 0; t < threads; ++t) {
    uint64_t b = t * per, e = std::min(n, b + per);
    if (b < e) pool.emplace_back(body, b, e);
  }
  for (auto& th : pool) th.join();
}

// Checks one pattern; returns true if it matches the reference.
bool bf16_ok(uint32_t x) {
  uint16_t got = f32_to_bf16(from_bits(x));
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: stays a NaN with its sign, quiet
    return (got & 0x7F80) == 0x7F80 && (got & 0x7F) != 0 && (got & 0x40) != 0 && (got >> 15) == (x >> 31);
  }
  return static_cast<uint32_t>(got) == ref_bf16(x);
}

bool f16_ok(uint32_t x) {
  float f = from_bits(x);
  uint16_t got = f32_to_f16(f);
  if (std::isnan(f))
    return (got & 0x7C00) == 0x7C00 && (got & 0x3FF) != 0 && (got & 0x200) != 0 && (got >> 15) == (x >> 31);
  double want = ref_f16_value(f);
  double have = f16_value(got);
  return have == want && std::signbit(have) == std::signbit(want);
}

TEST(Bf16Rounding, ReferenceSanity) {
  EXPECT_EQ(ref_bf16(0x3F800000u), 0x3F80);                         // 1.0
  EXPECT_EQ(ref_bf16(0x3F808000u), 0x3F80);                         // tie -> even (down)
  EXPECT_EQ(ref_bf16(0x3F818000u), 0x3F82);                         // tie -> even (up)
  EXPECT_EQ(ref_bf16(0x3F808001u), 0x3F81);                         // above tie
  EXPECT_EQ(ref_bf16(0x7F7FFFFFu), 0x7F80);                         // FLT_MAX -> Inf
  EXPECT_EQ(ref_bf16(0x00000001u), 0x0000);                         // tiny denormal -> 0
  EXPECT_EQ(ref_bf16(0x00008000u), 0x0000);                         // tie at the smallest -> even 0
  EXPECT_EQ(ref_bf16(0x00018000u), 0x0002);
  EXPECT_EQ(ref_bf16(0x80000000u), 0x8000);                         // -0
  EXPECT_EQ(f16_value(0x7BFF), 65504.0);
  EXPECT_EQ(ref_f16_value(65519.0f), 65504.0);
  EXPECT_EQ(ref_f16_value(65520.0f), INFINITY);
  EXPECT_EQ(ref_f16_value(std::ldexp(1.0f, -25)), 0.0);              // tie at the smallest subnormal
  EXPECT_EQ(ref_f16_value(std::ldexp(3.0f, -25)), std::ldexp(1.0, -23));
}

TEST(Bf16Rounding, AllFloat32Patterns) {
  std::atomic<uint64_t> bad{0}, first_bad{UINT64_MAX}, checked{0};
  auto check = [&](uint32_t x) {
    if (!bf16_ok(x)) {
      if (bad.fetch_add(1) == 0) first_bad = x;
    }
  };
  if (!VLAC_TEST_ASAN) {
    parallel_for(1ull << 32, [&](uint64_t b, uint64_t e) {
      for (uint64_t x = b; x < e; ++x) check(static_cast<uint32_t>(x));
      checked += e - b;
    });
    EXPECT_EQ(checked.load(), 1ull << 32);
  } else {
    // Sanitizer build: every upper half with the low halves around the rounding point (all
    // ties, their neighbours, truncation values), every 4099th pattern, and all specials.
    const uint32_t lows[] = {0x0000, 0x0001, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF};
    parallel_for(1ull << 16, [&](uint64_t b, uint64_t e) {
      uint64_t n = 0;
      for (uint64_t hi = b; hi < e; ++hi)
        for (uint32_t lo : lows) { check(static_cast<uint32_t>(hi << 16) | lo); ++n; }
      checked += n;
    });
    parallel_for((1ull << 32) / 4099, [&](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) check(static_cast<uint32_t>(i * 4099));
      checked += e - b;
    });
    // All denormals' rounding region is covered above; add every denormal with a stride too.
    for (uint32_t x = 0; x < 0x00800000u; x += 97) { check(x); check(x | 0x80000000u); }
  }
  // Specials, always (NaN payloads, both signs, Inf, zeros, extremes).
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
                               0x7F800001u, 0xFF800001u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F7FFFFFu,
                               0xFF7FFFFFu, 0x7F7F7FFFu, 0x7F7F8000u, 0x00800000u, 0x007FFFFFu, 0x00000001u};
  for (uint32_t x : specials) EXPECT_TRUE(bf16_ok(x)) << std::hex << x;
  EXPECT_EQ(bad.load(), 0u) << "first mismatch at float bits 0x" << std::hex << first_bad.load();
}

TEST(F16Rounding, StrongSample) {
  std::atomic<uint64_t> bad{0}, first_bad{UINT64_MAX};
  auto check = [&](uint32_t x) {
    if (!f16_ok(x)) {
      if (bad.fetch_add(1) == 0) first_bad = x;
    }
  };
  // (1) Every pattern's top 19 bits with the low 13 bits around the f16 normal rounding point.
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x0800, 0x1800};
  parallel_for(1ull << 19, [&](uint64_t b, uint64_t e) {
    for (uint64_t hi = b; hi < e; ++hi)
      for (uint32_t lo : lows) check(static_cast<uint32_t>(hi << 13) | lo);
  });
  // (2) The f16 subnormal and underflow region (float exponents 2^-26 .. 2^-14), every pattern
  // in release, every 61st under the sanitizer; both signs.
  const uint32_t step = VLAC_TEST_ASAN ? 61 : 1;
  const uint32_t lo_bits = 101u << 23, hi_bits = 114u << 23;
  parallel_for((hi_bits - lo_bits) / step, [&](uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) {
      uint32_t x = lo_bits + static_cast<uint32_t>(i) * step;
      check(x);
      check(x | 0x80000000u);
    }
  });
  // (3) Every subnormal tie (k + 1/2) * 2^-24 and its float neighbours.
  for (int k = 0; k < 2100; ++k) {
    float t = std::ldexp(static_cast<float>(2 * k + 1), -25);
    for (float v : {t, std::nextafter(t, 0.0f), std::nextafter(t, 1.0f)}) {
      uint32_t x;
      std::memcpy(&x, &v, 4);
      check(x);
      check(x | 0x80000000u);
    }
  }
  // (4) The overflow boundary, NaN, Inf, zeros, extremes.
  const float values[] = {65504.0f, 65505.0f, 65519.0f, std::nextafter(65520.0f, 0.0f), 65520.0f,
                          std::nextafter(65520.0f, 1e9f), 65536.0f, 1e10f, 3.4e38f, INFINITY,
                          std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.0f, -14), 0.0f};
  for (float v : values) {
    uint32_t x;
    std::memcpy(&x, &v, 4);
    check(x);
    check(x | 0x80000000u);
  }
  for (uint32_t x : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7FBFE000u, 0x7F802000u})
    check(x);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xFC00);
  EXPECT_EQ(bad.load(), 0u) << "first mismatch at float bits 0x" << std::hex << first_bad.load();
}

// F64 sources round once (round-to-odd f32 then RNE), never twice.
TEST(F64Rounding, NoDoubleRounding) {
  auto conv = [](double d, DType to) {
    uint8_t out[4] = {};
    EXPECT_TRUE(convert_elements(DType::F64, to, reinterpret_cast<const uint8_t*>(&d), out, 1).is_ok());
    uint16_t h;
    std::memcpy(&h, out, 2);
    return h;
  };
  // Just above a bf16 tie: plain double->float RNE would land on the tie and round to even (1.0).
  EXPECT_EQ(conv(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), DType::BF16), 0x3F81);
  EXPECT_EQ(conv(1.0 + std::ldexp(1.0, -8), DType::BF16), 0x3F80);            // exact tie -> even
  EXPECT_EQ(conv(1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -40), DType::BF16), 0x3F80);
  EXPECT_EQ(conv(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), DType::F16), 0x3C01);
  EXPECT_EQ(conv(1.0 + std::ldexp(1.0, -11), DType::F16), 0x3C00);
  EXPECT_EQ(conv(1e300, DType::BF16), 0x7F80);
  EXPECT_EQ(conv(-1e300, DType::F16), 0xFC00);
  EXPECT_EQ(conv(1e-300, DType::BF16), 0x0000);
  EXPECT_EQ(conv(-1e-300, DType::F16), 0x8000);
  uint16_t n = conv(std::nan(""), DType::BF16);
  EXPECT_TRUE((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);
  // A sample of doubles against the double reference (rounded straight from the double).
  uint64_t s = 12345;
  for (int i = 0; i < 200000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double d = std::ldexp(static_cast<double>(s >> 11) / 9007199254740992.0 + 0.5, static_cast<int>((s >> 3) % 60) - 30);
    uint16_t b = conv(d, DType::BF16);
    int e = exponent_of(d);
    EXPECT_EQ(bf16_to_f32(b), static_cast<float>(round_to_ulp(d, e - 7))) << d;
    uint16_t h = conv(d, DType::F16);
    double want = d >= 65520.0 ? INFINITY : round_to_ulp(d, std::max(e, -14) - 10);
    if (want > 65504.0) want = INFINITY;
    EXPECT_EQ(f16_value(h), want) << d;
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace vlac
