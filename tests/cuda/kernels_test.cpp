// CUDA elementwise, norm, RoPE and embedding kernels against the CPU backend's kernels, at pi0.5's
// real shapes and at odd ones. Tolerances (max |Δ| / max |ref| over the tensor):
//   fp32 out: 2e-5 — same formulas in fp32; the differences are summation order (block reductions
//     vs the CPU's double sums), FMA contraction, expf/sincosf vs glibc (≤ 2 ulp) and the CPU's
//     polynomial exp in GELU;
//   bf16 out: 8e-3 — one rounding to bf16 (≤ 2^-9 relative) on top of the above, where a value
//     next to a rounding boundary may round the other way (one bf16 ulp, 2^-8 relative).
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>

#include "backends/cpu/kernels.h"
#include "cuda_test_util.h"

namespace vlac::cuda::testing {
namespace {

constexpr double kTolF32 = 2e-5;
constexpr double kTolBf16 = 8e-3;

class CudaKernels : public CudaTest {};

TEST_F(CudaKernels, CastsRoundLikeTheHost) {
  std::vector<float> x = randn(100003, 1, 3.0f);
  // Ties, NaN, infinities, denormals and overflow past bf16's max.
  const float specials[] = {1.00390625f, 1.01171875f, -1.00390625f, NAN, INFINITY, -INFINITY, 1e-40f, 3.4e38f, 0.0f, -0.0f};
  for (size_t i = 0; i < std::size(specials); ++i) x[i] = specials[i];
  DevBuf dx(x.size() * 4), dy(x.size() * 2), dz(x.size() * 4);
  upload(dx, x);
  VLAC_CUDA_OK(cast(stream_, dx.get(), DType::F32, dy.get(), DType::BF16, int64_t(x.size())));
  VLAC_CUDA_OK(cast(stream_, dy.get(), DType::BF16, dz.get(), DType::F32, int64_t(x.size())));
  sync();
  const auto y = download<uint16_t>(dy, x.size());
  const auto z = download<float>(dz, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(y[i])));
      continue;
    }
    ASSERT_EQ(y[i], f32_to_bf16(x[i])) << "element " << i << " = " << x[i];
    ASSERT_EQ(f32_bits(z[i]), f32_bits(bf16_to_f32(y[i])));
  }
}

struct NormCase { int64_t rows, d; };
// 2048 / 1024 / 1152 / 1000: one run of 4 columns a thread (norm4_kernel), 6144: two, 8200 and 3:
// the scalar kernels.
const NormCase kNormCases[] = {{968, 2048}, {50, 1024}, {256, 1152}, {7, 1000}, {1, 3}, {5, 6144}, {2, 8200}};

// Runs fn(xt, yt) for the four input/output dtype pairs; returns the tolerance for yt.
double tol_for(DType yt) { return yt == DType::F32 ? kTolF32 : kTolBf16; }

TEST_F(CudaKernels, NormsMatchCpu) {
  uint32_t seed = 10;
  for (const auto& c : kNormCases) {
    const size_t n = size_t(c.rows * c.d);
    for (DType xt : {DType::F32, DType::BF16})
      for (DType yt : {DType::F32, DType::BF16}) {
        // Inputs as xt holds them; the CPU reference reads the same values in fp32.
        auto x = randn(n, ++seed, 2.0f);
        if (xt == DType::BF16) x = bf16_values(x);
        const auto w = randn(size_t(c.d), ++seed, 0.5f), b = randn(size_t(c.d), ++seed, 0.5f);
        const auto mod = randn(size_t(3 * c.d), ++seed, 0.5f);
        auto dx = xt == DType::F32 ? to_device(x) : to_device(to_bf16(x));
        auto dw = to_device(w), db = to_device(b), dmod = to_device(mod);
        DevBuf dy(n * 4);
        for (int kind = 0; kind < 3; ++kind) {
          std::vector<float> ref(n), gate(size_t(c.d));
          dy.poison();
          if (kind == 0) {
            cpu::rms_norm(x.data(), w.data(), ref.data(), c.rows, c.d, 1e-6f);
            VLAC_CUDA_OK(rms_norm(stream_, dx->get(), xt, dw->as<float>(), dy.get(), yt, c.rows, c.d, 1e-6f));
          } else if (kind == 1) {
            cpu::ada_rms_norm(x.data(), mod.data(), ref.data(), gate.data(), c.rows, c.d, 1e-6f);
            VLAC_CUDA_OK(ada_rms_norm(stream_, dx->get(), xt, dmod->as<float>(), dy.get(), yt, c.rows, c.d, 1e-6f));
          } else {
            cpu::layer_norm(x.data(), w.data(), b.data(), ref.data(), c.rows, c.d, 1e-6f);
            VLAC_CUDA_OK(layer_norm(stream_, dx->get(), xt, dw->as<float>(), db->as<float>(), dy.get(), yt, c.rows,
                                    c.d, 1e-6f));
          }
          sync();
          const auto y = yt == DType::F32 ? download<float>(dy, n) : from_bf16(download<uint16_t>(dy, n));
          EXPECT_LT(rel_err(y, ref), tol_for(yt)) << "norm " << kind << " [" << c.rows << ", " << c.d << "] "
                                                  << dtype_name(xt) << "->" << dtype_name(yt);
        }
      }
  }
}

// h += branch ⊙ gate, then the norm of h: the residual stream exactly as the host computes it
// (fp32, or bf16 with torch's two roundings), the norm within the norm tolerances.
TEST_F(CudaKernels, ResidualNormMatchesCpu) {
  uint32_t seed = 100;
  for (const auto& c : kNormCases) {
    const size_t n = size_t(c.rows * c.d);
    for (DType ht : {DType::F32, DType::BF16})
      for (int kind = 0; kind < 4; ++kind)
        for (bool gated : {false, true}) {
          auto h = randn(n, ++seed, 2.0f), br = randn(n, ++seed);
          if (ht == DType::BF16) h = bf16_values(h), br = bf16_values(br);
          const auto w = randn(size_t(c.d), ++seed, 0.5f), b = randn(size_t(c.d), ++seed, 0.5f);
          const auto mod = randn(size_t(3 * c.d), ++seed, 0.5f), g = randn(size_t(c.d), ++seed);
          auto dh = ht == DType::F32 ? to_device(h) : to_device(to_bf16(h));
          auto dbr = ht == DType::F32 ? to_device(br) : to_device(to_bf16(br));
          auto dw = to_device(w), db = to_device(b), dmod = to_device(mod), dg = to_device(g);
          DevBuf dy(n * 2);  // bf16 output
          dy.poison();
          NormArgs na;
          na.kind = NormKind(kind);
          na.w = dw->as<float>(), na.b = db->as<float>(), na.mod = dmod->as<float>();
          VLAC_CUDA_OK(residual_norm(stream_, dh->get(), ht, dbr->get(), ht, gated ? dg->as<float>() : nullptr, na,
                                     dy.get(), DType::BF16, c.rows, c.d));
          sync();
          std::vector<float> href(h);
          for (size_t i = 0; i < n; ++i) {
            const float gi = g[i % size_t(c.d)];
            if (ht == DType::F32) {
              href[i] = h[i] + (gated ? br[i] * gi : br[i]);
            } else {
              const float add = gated ? bf16_to_f32(f32_to_bf16(br[i] * bf16_to_f32(f32_to_bf16(gi)))) : br[i];
              href[i] = bf16_to_f32(f32_to_bf16(h[i] + add));
            }
          }
          const auto hgot = ht == DType::F32 ? download<float>(*dh, n) : from_bf16(download<uint16_t>(*dh, n));
          EXPECT_LT(rel_err(hgot, href), ht == DType::F32 ? 1e-6 : 1e-7)
              << "residual [" << c.rows << ", " << c.d << "] " << dtype_name(ht) << " gated " << gated;
          if (kind == 0) continue;
          std::vector<float> ref(n), gate(size_t(c.d));
          if (na.kind == NormKind::Rms) cpu::rms_norm(href.data(), w.data(), ref.data(), c.rows, c.d, 1e-6f);
          if (na.kind == NormKind::AdaRms) cpu::ada_rms_norm(href.data(), mod.data(), ref.data(), gate.data(), c.rows, c.d, 1e-6f);
          if (na.kind == NormKind::Layer) cpu::layer_norm(href.data(), w.data(), b.data(), ref.data(), c.rows, c.d, 1e-6f);
          EXPECT_LT(rel_err(from_bf16(download<uint16_t>(dy, n)), ref), kTolBf16)
              << "norm " << kind << " after residual [" << c.rows << ", " << c.d << "] " << dtype_name(ht);
        }
  }
}

// Pointers that are not aligned for 4 elements (one element past an allocation's start) take the
// scalar kernels instead of norm4_kernel: the same results within the tolerances.
TEST_F(CudaKernels, ResidualNormOffTheVectorAlignmentMatchesCpu) {
  const int64_t rows = 50, d = 1024;
  const size_t n = size_t(rows * d);
  for (DType ht : {DType::F32, DType::BF16}) {
    auto h = randn(n + 1, 301, 2.0f), br = randn(n + 1, 302);
    if (ht == DType::BF16) h = bf16_values(h), br = bf16_values(br);
    const auto mod = randn(size_t(3 * d), 303, 0.5f), g = randn(size_t(d), 304);
    auto dh = ht == DType::F32 ? to_device(h) : to_device(to_bf16(h));
    auto dbr = ht == DType::F32 ? to_device(br) : to_device(to_bf16(br));
    auto dmod = to_device(mod), dg = to_device(g);
    DevBuf dy((n + 1) * 2);
    dy.poison();
    const size_t es = dtype_size(ht);
    uint8_t* hp = static_cast<uint8_t*>(dh->get()) + es;  // element 1: off the 8/16-byte alignment
    const uint8_t* bp = static_cast<const uint8_t*>(dbr->get()) + es;
    uint16_t* yp = dy.as<uint16_t>() + 1;
    NormArgs na;
    na.kind = NormKind::AdaRms;
    na.mod = dmod->as<float>();
    VLAC_CUDA_OK(residual_norm(stream_, hp, ht, bp, ht, dg->as<float>(), na, yp, DType::BF16, rows, d));
    sync();
    std::vector<float> href(n);
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i % size_t(d)];
      if (ht == DType::F32) {
        href[i] = h[i + 1] + br[i + 1] * gi;
      } else {
        const float add = bf16_to_f32(f32_to_bf16(br[i + 1] * bf16_to_f32(f32_to_bf16(gi))));
        href[i] = bf16_to_f32(f32_to_bf16(h[i + 1] + add));
      }
    }
    std::vector<float> hgot;
    if (ht == DType::F32) {
      hgot = download<float>(*dh, n + 1);
    } else {
      hgot = from_bf16(download<uint16_t>(*dh, n + 1));
    }
    hgot.erase(hgot.begin());
    EXPECT_LT(rel_err(hgot, href), ht == DType::F32 ? 1e-6 : 1e-7) << dtype_name(ht);
    std::vector<float> ref(n), gate(static_cast<size_t>(d));
    cpu::ada_rms_norm(href.data(), mod.data(), ref.data(), gate.data(), rows, d, 1e-6f);
    auto y = from_bf16(download<uint16_t>(dy, n + 1));
    y.erase(y.begin());
    EXPECT_LT(rel_err(y, ref), kTolBf16) << dtype_name(ht);
  }
}

// NormArgs::codes (FP8 W8A8's x straight from the norm): the same codes and row scales, bit for
// bit, as the norm's output in its dtype followed by quantize_rows_e4m3, and the same residual
// stream h; each norm kind, bf16 and f32 outputs, K parts and a gate, one and two runs a thread.
// Where the 4-column kernel cannot run (d no multiple of 4) codes are refused, not approximated.
TEST_F(CudaKernels, ResidualNormWritesTheFp8GemmsCodes) {
  struct C { int64_t rows, d; int parts; };
  uint32_t seed = 700;
  for (C c : {C{50, 1024, 1}, C{7, 2048, 2}, C{5, 6144, 1}, C{3, 1152, 1}})
    for (DType yt : {DType::BF16, DType::F32})
      for (NormKind kind : {NormKind::Rms, NormKind::AdaRms, NormKind::Layer}) {
        const size_t n = size_t(c.rows * c.d);
        auto h = bf16_values(randn(n, ++seed, 2.0f)), br = randn(n * size_t(c.parts), ++seed);
        if (c.rows > 3) h[size_t(c.d)] = 300.0f;  // row 1: one large value
        const auto w = randn(size_t(c.d), ++seed, 0.5f), b = randn(size_t(c.d), ++seed, 0.5f);
        const auto mod = randn(size_t(3 * c.d), ++seed, 0.5f), g = randn(size_t(c.d), ++seed);
        auto dw = to_device(w), db = to_device(b), dmod = to_device(mod), dg = to_device(g), dbr = to_device(br);
        NormArgs na;
        na.kind = kind;
        na.w = dw->as<float>(), na.b = db->as<float>(), na.mod = dmod->as<float>();
        // Two kernels: the norm's output, then quantize_rows_e4m3.
        auto dh1 = to_device(to_bf16(h)), dh2 = to_device(to_bf16(h));
        DevBuf dy(n * 4), codes1(n), scales1(size_t(c.rows) * 4), codes2(n), scales2(size_t(c.rows) * 4);
        codes2.poison();
        scales2.poison();
        VLAC_CUDA_OK(residual_norm_to(stream_, dh1->get(), dh1->get(), DType::BF16, dbr->get(), DType::F32,
                                      dg->as<float>(), na, dy.get(), yt, c.rows, c.d, c.parts, int64_t(n)));
        VLAC_CUDA_OK(quantize_rows_e4m3(stream_, dy.get(), yt, c.rows, c.d, c.d, codes1.get(), scales1.as<float>()));
        // One: the codes from the norm kernel.
        NormArgs nc = na;
        nc.codes = codes2.as<uint8_t>();
        nc.code_scales = scales2.as<float>();
        VLAC_CUDA_OK(residual_norm_to(stream_, dh2->get(), dh2->get(), DType::BF16, dbr->get(), DType::F32,
                                      dg->as<float>(), nc, nullptr, yt, c.rows, c.d, c.parts, int64_t(n)));
        sync();
        char what[96];
        std::snprintf(what, sizeof what, "[%lld, %lld] norm %d -> %s, %d K parts", static_cast<long long>(c.rows),
                      static_cast<long long>(c.d), int(kind), dtype_name(yt), c.parts);
        EXPECT_EQ(download<uint16_t>(*dh1, n), download<uint16_t>(*dh2, n)) << what << ": h";
        EXPECT_EQ(download<uint8_t>(codes1, n), download<uint8_t>(codes2, n)) << what << ": codes";
        EXPECT_EQ(download<float>(scales1, size_t(c.rows)), download<float>(scales2, size_t(c.rows))) << what << ": scales";
      }
  EXPECT_TRUE(residual_norm_codes_fit(1024));
  EXPECT_FALSE(residual_norm_codes_fit(1026));
  DevBuf h(64 * 4), codes(64), scales(16);
  NormArgs na;
  na.kind = NormKind::Rms;
  auto w = to_device(std::vector<float>(64, 0.0f));
  na.w = w->as<float>();
  na.codes = codes.as<uint8_t>();
  na.code_scales = scales.as<float>();
  EXPECT_EQ(residual_norm_to(stream_, h.get(), h.get(), DType::F32, h.get(), DType::F32, nullptr, na, nullptr, DType::BF16,
                             2, 30)
                .code(),
            StatusCode::Unsupported);
}

// geglu_e4m3 (the FP8 down_proj's x straight from GeGLU): the same codes and scales, bit for bit,
// as geglu into y then quantize_rows_e4m3, over gate|up rows 2F apart, at the expert's and the
// LM's F and odd ones, in both input and output dtypes; shapes it cannot run are refused.
TEST_F(CudaKernels, GegluWritesTheFp8GemmsCodes) {
  uint32_t seed = 800;
  struct C { int64_t rows, f; };
  for (C c : {C{50, 4096}, C{9, 16384}, C{5, 1000}, C{3, 4304}})
    for (DType it : {DType::BF16, DType::F32})
      for (DType yt : {DType::BF16, DType::F32}) {
        const size_t n = size_t(c.rows * 2 * c.f);
        auto gu = randn(n, ++seed, 1.5f);
        if (c.rows > 2) gu[size_t(2 * 2 * c.f + 5)] = NAN;  // row 2: a NaN gate
        if (it == DType::BF16) gu = bf16_values(gu);
        auto dgu = it == DType::BF16 ? to_device(to_bf16(gu)) : to_device(gu);
        const size_t es = dtype_size(it);
        const uint8_t* gate = static_cast<const uint8_t*>(dgu->get());
        const uint8_t* up = gate + size_t(c.f) * es;
        DevBuf y(size_t(c.rows * c.f) * 4), codes1(size_t(c.rows * c.f)), scales1(size_t(c.rows) * 4);
        DevBuf codes2(size_t(c.rows * c.f)), scales2(size_t(c.rows) * 4);
        codes2.poison();
        scales2.poison();
        VLAC_CUDA_OK(geglu(stream_, gate, up, it, 2 * c.f, y.get(), yt, c.rows, c.f));
        VLAC_CUDA_OK(quantize_rows_e4m3(stream_, y.get(), yt, c.rows, c.f, c.f, codes1.get(), scales1.as<float>()));
        VLAC_CUDA_OK(geglu_e4m3(stream_, gate, up, it, 2 * c.f, yt, c.rows, c.f, codes2.get(), scales2.as<float>()));
        sync();
        char what[80];
        std::snprintf(what, sizeof what, "geglu [%lld, %lld] %s -> %s", static_cast<long long>(c.rows),
                      static_cast<long long>(c.f), dtype_name(it), dtype_name(yt));
        EXPECT_EQ(download<uint8_t>(codes1, size_t(c.rows * c.f)), download<uint8_t>(codes2, size_t(c.rows * c.f)))
            << what << ": codes";
        const auto s1 = download<float>(scales1, size_t(c.rows)), s2 = download<float>(scales2, size_t(c.rows));
        for (size_t r = 0; r < s1.size(); ++r) {
          if (std::isnan(s1[r])) EXPECT_TRUE(std::isnan(s2[r])) << what << ": scale of row " << r;
          else EXPECT_EQ(s1[r], s2[r]) << what << ": scale of row " << r;
        }
      }
  EXPECT_FALSE(geglu_codes_fit(1004, 2008)) << "f no multiple of 8";
  EXPECT_FALSE(geglu_codes_fit(16392, 32784)) << "f above 16384";
  DevBuf b(1 << 12);
  EXPECT_EQ(geglu_e4m3(stream_, b.get(), b.get(), DType::BF16, 20, DType::BF16, 2, 10, b.get(), b.as<float>()).code(),
            StatusCode::Unsupported);
}

TEST_F(CudaKernels, GeluAndGegluMatchCpu) {
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{968, 16384}, {50, 4096}, {256, 4304}, {3, 77}, {70000, 8}}) {
    const size_t n = size_t(rows * f);
    auto gu = randn(2 * n, uint32_t(rows + f), 2.0f);  // fused [rows, 2F]: gate | up per row
    for (DType it : {DType::F32, DType::BF16})
      for (DType yt : {DType::F32, DType::BF16}) {
        auto in = it == DType::BF16 ? bf16_values(gu) : gu;
        auto din = it == DType::F32 ? to_device(in) : to_device(to_bf16(in));
        const size_t es = it == DType::F32 ? 4 : 2;
        DevBuf dy(n * 4);
        dy.poison();
        const auto* base = static_cast<const uint8_t*>(din->get());
        VLAC_CUDA_OK(geglu(stream_, base, base + size_t(f) * es, it, 2 * f, dy.get(), yt, rows, f));
        sync();
        std::vector<float> gate(n), up(n), ref(n);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < f; ++j) {
            gate[size_t(r * f + j)] = in[size_t(r * 2 * f + j)];
            up[size_t(r * f + j)] = in[size_t(r * 2 * f + f + j)];
          }
        if (it == DType::BF16) {  // torch in bf16: gelu rounded, then the product
          cpu::gelu_tanh(gate.data(), ref.data(), int64_t(n));
          for (size_t i = 0; i < n; ++i) ref[i] = bf16_to_f32(f32_to_bf16(ref[i])) * up[i];
        } else {
          cpu::geglu(gate.data(), up.data(), ref.data(), int64_t(n));
        }
        const auto y = yt == DType::F32 ? download<float>(dy, n) : from_bf16(download<uint16_t>(dy, n));
        EXPECT_LT(rel_err(y, ref), tol_for(yt) * (it == DType::BF16 ? 2 : 1))
            << "geglu [" << rows << ", " << f << "] " << dtype_name(it) << "->" << dtype_name(yt);
        if (it == yt) {  // in place over the gate half, rows 2F apart: the same values
          VLAC_CUDA_OK(geglu(stream_, base, base + size_t(f) * es, it, 2 * f, din->get(), yt, rows, f, 2 * f));
          sync();
          std::vector<float> yi(n);
          if (it == DType::F32) {
            const auto all = download<float>(*din, 2 * n);
            for (size_t r = 0; r < size_t(rows); ++r)
              std::copy_n(all.begin() + long(r * 2 * size_t(f)), size_t(f), yi.begin() + long(r * size_t(f)));
          } else {
            const auto all = from_bf16(download<uint16_t>(*din, 2 * n));
            for (size_t r = 0; r < size_t(rows); ++r)
              std::copy_n(all.begin() + long(r * 2 * size_t(f)), size_t(f), yi.begin() + long(r * size_t(f)));
          }
          EXPECT_EQ(yi, y) << "geglu in place [" << rows << ", " << f << "] " << dtype_name(it);
        }
        // Plain GELU on the gate half.
        auto dg = to_device(gate);
        dy.poison();
        VLAC_CUDA_OK(gelu_tanh(stream_, dg->get(), DType::F32, dy.get(), DType::F32, int64_t(n)));
        sync();
        cpu::gelu_tanh(gate.data(), ref.data(), int64_t(n));
        EXPECT_LT(rel_err(download<float>(dy, n), ref), kTolF32);
      }
  }
}

TEST_F(CudaKernels, RopeMatchesCpuInsideAFusedQkvRow) {
  // Prefix positions with pad gaps (repeated positions), as the pad-mask cumsum makes them.
  for (auto [t, h, dh] : {std::tuple<int64_t, int64_t, int64_t>{968, 8, 256}, {50, 8, 256}, {13, 3, 72}}) {
    const int64_t stride = (h + 2) * dh;  // q heads, then k, then v: rotate q and k (h + 1 heads)
    std::vector<int64_t> pos(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) pos[size_t(i)] = i < t / 2 ? i : t / 2 + (i - t / 2) / 3 + 7;
    auto x = randn(size_t(t * stride), uint32_t(t * h));
    for (DType xt : {DType::F32, DType::BF16}) {
      auto xin = xt == DType::BF16 ? bf16_values(x) : x;
      auto dx = xt == DType::F32 ? to_device(xin) : to_device(to_bf16(xin));
      auto dpos = to_device(pos);
      VLAC_CUDA_OK(rope(stream_, dx->get(), xt, stride, dpos->as<int64_t>(), t, h + 1, dh, 10000.0f));
      sync();
      // CPU: rope on the dense [T, h+1, dh] part, v untouched.
      std::vector<float> dense(static_cast<size_t>(t * (h + 1) * dh));
      for (int64_t i = 0; i < t; ++i)
        std::memcpy(&dense[size_t(i * (h + 1) * dh)], &xin[size_t(i * stride)], size_t((h + 1) * dh) * 4);
      cpu::rope(dense.data(), pos.data(), t, h + 1, dh, 10000.0f);
      std::vector<float> ref(xin);
      for (int64_t i = 0; i < t; ++i)
        std::memcpy(&ref[size_t(i * stride)], &dense[size_t(i * (h + 1) * dh)], size_t((h + 1) * dh) * 4);
      const size_t n = x.size();
      const auto y = xt == DType::F32 ? download<float>(*dx, n) : from_bf16(download<uint16_t>(*dx, n));
      EXPECT_LT(rel_err(y, ref), tol_for(xt)) << "rope [" << t << ", " << h << ", " << dh << "] " << dtype_name(xt);
    }
  }
}

// rope_pair_to: q (h heads) and k (1 head) of a fused q|k|v row, into separate outputs (q dense
// bf16, k into the rows of a longer buffer), in one launch: the bits of two rope_to calls.
TEST_F(CudaKernels, RopePairEqualsTwoRopes) {
  for (auto [t, h, dh] : {std::tuple<int64_t, int64_t, int64_t>{50, 8, 256}, {13, 3, 72}}) {
    const int64_t stride = (h + 2) * dh;
    std::vector<int64_t> pos(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) pos[size_t(i)] = 900 + i;
    auto dx = to_device(randn(size_t(t * stride), uint32_t(t + h)));
    auto dpos = to_device(pos);
    const float* x = dx->as<float>();
    for (DType yt : {DType::F32, DType::BF16}) {
      const size_t es = yt == DType::F32 ? 4 : 2;
      const size_t nq = size_t(t * h * dh), nk = size_t(t * dh);
      DevBuf q1(nq * es), k1(nk * es), q2(nq * es), k2(nk * es);
      q2.poison();
      k2.poison();
      VLAC_CUDA_OK(rope_to(stream_, x, DType::F32, stride, q1.get(), yt, h * dh, dpos->as<int64_t>(), t, h, dh, 1e4f));
      VLAC_CUDA_OK(rope_to(stream_, x + h * dh, DType::F32, stride, k1.get(), yt, dh, dpos->as<int64_t>(), t, 1, dh, 1e4f));
      const RopeJob a{x, stride, q2.get(), h * dh, h}, b{x + h * dh, stride, k2.get(), dh, 1};
      VLAC_CUDA_OK(rope_pair_to(stream_, a, b, DType::F32, yt, dpos->as<int64_t>(), t, dh, 1e4f));
      sync();
      EXPECT_EQ(download<uint8_t>(q1, nq * es), download<uint8_t>(q2, nq * es)) << "q " << dtype_name(yt);
      EXPECT_EQ(download<uint8_t>(k1, nk * es), download<uint8_t>(k2, nk * es)) << "k " << dtype_name(yt);
      // With v (the last dh columns) copied in the same launch into rows 2·dh apart: cast_rows' bits,
      // and the rotations unchanged.
      DevBuf v1(nk * 2 * es), v2(nk * 2 * es), q3(nq * es), k3(nk * es);
      v1.poison();
      v2.poison();
      VLAC_CUDA_OK(cast_rows(stream_, x + (h + 1) * dh, DType::F32, stride, v1.get(), yt, 2 * dh, t, dh));
      const RopeJob a3{x, stride, q3.get(), h * dh, h}, b3{x + h * dh, stride, k3.get(), dh, 1};
      const RowCopyJob cv{x + (h + 1) * dh, stride, v2.get(), 2 * dh, dh};
      VLAC_CUDA_OK(rope_pair_to(stream_, a3, b3, DType::F32, yt, dpos->as<int64_t>(), t, dh, 1e4f, &cv));
      sync();
      EXPECT_EQ(download<uint8_t>(q1, nq * es), download<uint8_t>(q3, nq * es)) << "q with copy " << dtype_name(yt);
      EXPECT_EQ(download<uint8_t>(k1, nk * es), download<uint8_t>(k3, nk * es)) << "k with copy " << dtype_name(yt);
      EXPECT_EQ(download<uint8_t>(v1, nk * 2 * es), download<uint8_t>(v2, nk * 2 * es)) << "v copy " << dtype_name(yt);
    }
  }
}

TEST_F(CudaKernels, Im2colMatchesCpuExactly) {
  for (auto [c, y, x, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 224, 224, 14}, {2, 31, 45, 7}}) {
    const auto img = randn(size_t(c * y * x), uint32_t(y + x));
    const int64_t cols_n = cpu::patch_embed_scratch_floats(c, y, x, k, k);
    std::vector<float> ref(static_cast<size_t>(cols_n));
    cpu::im2col_patches(img.data(), ref.data(), c, y, x, k, k);
    auto dimg = to_device(img);
    DevBuf dc(size_t(cols_n) * 4), dcb(size_t(cols_n) * 2);
    dc.poison();
    VLAC_CUDA_OK(im2col_patches(stream_, dimg->as<float>(), dc.get(), DType::F32, c, y, x, k, k));
    VLAC_CUDA_OK(im2col_patches(stream_, dimg->as<float>(), dcb.get(), DType::BF16, c, y, x, k, k));
    sync();
    EXPECT_EQ(rel_err(download<float>(dc, size_t(cols_n)), ref), 0.0);
    EXPECT_EQ(download<uint16_t>(dcb, size_t(cols_n)), to_bf16(ref));
  }
}

TEST_F(CudaKernels, EmbeddingMatchesCpuAndFlagsBadIds) {
  const int64_t v = 5003, d = 2048, t = 200;
  const auto table = randn(size_t(v * d), 7);
  const auto tb = to_bf16(table);
  std::vector<int64_t> ids(static_cast<size_t>(t));
  std::mt19937 rng(3);
  for (auto& id : ids) id = int64_t(rng() % uint32_t(v));
  ids[5] = v - 1, ids[6] = 0;
  const float scale = bf16_to_f32(f32_to_bf16(std::sqrt(2048.0f)));  // 45.25, rounded to the table dtype
  auto dtab = to_device(table), dtb = to_device(tb), dids = to_device(ids);
  DevBuf dy(size_t(t * d) * 4), dyb(size_t(t * d) * 2);
  dy.poison(), dyb.poison();
  VLAC_CUDA_OK(embedding(stream_, dtab->get(), DType::F32, v, d, dids->as<int64_t>(), t, scale, dy.get(), DType::F32, nullptr));
  sync();
  std::vector<float> ref(static_cast<size_t>(t * d));
  VLAC_CUDA_OK(cpu::embedding_f32(table.data(), v, d, ids.data(), t, scale, ref.data()));
  EXPECT_EQ(rel_err(download<float>(dy, size_t(t * d)), ref), 0.0);
  VLAC_CUDA_OK(embedding(stream_, dtb->get(), DType::BF16, v, d, dids->as<int64_t>(), t, scale, dyb.get(), DType::BF16, nullptr));
  sync();
  VLAC_CUDA_OK(cpu::embedding_bf16(tb.data(), v, d, ids.data(), t, scale, ref.data()));
  EXPECT_EQ(download<uint16_t>(dyb, size_t(t * d)), to_bf16(ref));  // one rounding of the same fp32 product

  // A bad id: the host check names it; the kernel writes a zero row and flags its position.
  ids[17] = v;
  const Status s = check_token_ids(ids.data(), t, v);
  EXPECT_EQ(s.code(), StatusCode::InvalidArgument);
  EXPECT_NE(s.message().find("position 17"), std::string::npos) << s.message();
  auto dids2 = to_device(ids);
  DevBuf dbad(sizeof(int));
  cudaMemset(dbad.get(), 0, sizeof(int));
  VLAC_CUDA_OK(embedding(stream_, dtab->get(), DType::F32, v, d, dids2->as<int64_t>(), t, scale, dy.get(), DType::F32,
                         dbad.as<int>()));
  sync();
  EXPECT_EQ(download<int>(dbad, 1)[0], 18);
  const auto y = download<float>(dy, size_t(t * d));
  for (int64_t j = 0; j < d; ++j) ASSERT_EQ(y[size_t(17 * d + j)], 0.0f);
}

TEST_F(CudaKernels, EulerStepMatchesCpu) {
  auto x = randn(1600, 1), vel = randn(1600, 2);
  auto dx = to_device(x), dv = to_device(vel);
  VLAC_CUDA_OK(euler_step(stream_, dx->as<float>(), dv->as<float>(), -0.1f, 1600));
  sync();
  cpu::euler_step(x.data(), vel.data(), -0.1f, 1600);
  EXPECT_LT(rel_err(download<float>(*dx, 1600), x), 1e-7);
}

TEST(CudaKernelArgs, BadArgumentsAreStatusesNotLaunches) {
  EXPECT_EQ(rms_norm(nullptr, nullptr, DType::F16, nullptr, nullptr, DType::F32, 1, 1, 1e-6f).code(), StatusCode::Unsupported);
  EXPECT_EQ(rope(nullptr, nullptr, DType::F32, 8, nullptr, 1, 1, 7, 1e4f).code(), StatusCode::InvalidArgument);
  EXPECT_EQ(geglu(nullptr, nullptr, nullptr, DType::F32, 3, nullptr, DType::F32, 1, 4).code(), StatusCode::InvalidArgument);
}

}  // namespace
}  // namespace vlac::cuda::testing
