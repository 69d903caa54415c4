// CPU kernels against naive double-precision references written here, on random inputs;
// mask semantics per the pi0.5 spec (masked keys contribute exact zeros).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/dtype.h"

namespace vlac::cpu {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// max |a - b| / max(max |b|, tiny): a relative error over the whole tensor.
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

std::vector<double> ref_linear(const std::vector<float>& x, const std::vector<float>& w,
                               const float* b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = b ? b[j] : 0.0;
      for (int64_t l = 0; l < k; ++l) s += double(x[size_t(i * k + l)]) * w[size_t(j * k + l)];
      y[size_t(i * n + j)] = s;
    }
  return y;
}

TEST(CpuMatmul, LinearF32MatchesReference) {
  set_num_threads(2);
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 33, 5}, {50, 64, 96}, {129, 17, 3}}) {
    auto x = randn(size_t(m * k), 1), w = randn(size_t(n * k), 2), b = randn(size_t(n), 3);
    std::vector<float> y(static_cast<size_t>(m * n));
    linear_f32(x.data(), w.data(), b.data(), y.data(), m, k, n);
    EXPECT_LT(rel_err(y, ref_linear(x, w, b.data(), m, k, n)), 1e-5) << m << "x" << k << "x" << n;
    linear_f32(x.data(), w.data(), nullptr, y.data(), m, k, n);
    EXPECT_LT(rel_err(y, ref_linear(x, w, nullptr, m, k, n)), 1e-5);
  }
}

TEST(CpuKernels, ThreadCountDoesNotChangeElementwiseResults) {
  // Large enough to be split across threads (kParallelMinElems); each element is computed the
  // same way, so 1 and 2 threads give identical bits.
  const int64_t rows = 64, d = 1024, n = rows * d;
  auto x = randn(size_t(n), 21), w = randn(size_t(d), 22), b = randn(size_t(d), 23);
  auto mod = randn(size_t(3 * d), 24), row = randn(size_t(d), 25);
  auto run_all = [&](int threads) {
    set_num_threads(threads);
    std::vector<float> out;
    std::vector<float> y(static_cast<size_t>(n)), g(static_cast<size_t>(d));
    auto take = [&] { out.insert(out.end(), y.begin(), y.end()); };
    layer_norm(x.data(), w.data(), b.data(), y.data(), rows, d, 1e-6f), take();
    rms_norm(x.data(), w.data(), y.data(), rows, d, 1e-6f), take();
    ada_rms_norm(x.data(), mod.data(), y.data(), g.data(), rows, d, 1e-6f), take();
    gelu_tanh(x.data(), y.data(), n), take();
    geglu(x.data(), x.data(), y.data(), n), take();
    silu(x.data(), y.data(), n), take();
    binary_op(BinaryOp::Add, x.data(), n, row.data(), d, y.data(), n), take();
    binary_op(BinaryOp::Mul, row.data(), d, x.data(), n, y.data(), n), take();
    scale(x.data(), 0.5f, y.data(), n), take();
    y = x, softmax(y.data(), rows, d), take();
    std::vector<uint16_t> h(static_cast<size_t>(n));
    round_to_bf16(x.data(), h.data(), n);
    for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(h[i], f32_to_bf16(x[i]));
    return out;
  };
  const auto one = run_all(1), two = run_all(2);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * 4), 0);
  // Broadcast semantics: a row vector repeats over rows; Sub keeps operand order.
  std::vector<float> y(static_cast<size_t>(n));
  binary_op(BinaryOp::Sub, row.data(), d, x.data(), n, y.data(), n);
  EXPECT_EQ(y[size_t(3 * d + 5)], row[5] - x[size_t(3 * d + 5)]);
  set_num_threads(2);
}

TEST(CpuNorm, LayerNormRmsNormAdaRms) {
  const int64_t rows = 5, d = 72;
  auto x = randn(size_t(rows * d), 7, 3.0f), w = randn(size_t(d), 8), b = randn(size_t(d), 9);
  auto mod = randn(size_t(3 * d), 10);
  for (int64_t i = 0; i < d; ++i) x[size_t(i)] += 100.0f;  // a row with a large mean
  std::vector<double> ln(x.size()), rms(x.size()), ada(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0, ss = 0;
    for (int64_t i = 0; i < d; ++i) mean += x[size_t(r * d + i)];
    mean /= double(d);
    for (int64_t i = 0; i < d; ++i) {
      double v = x[size_t(r * d + i)];
      var += (v - mean) * (v - mean);
      ss += v * v;
    }
    var /= double(d);
    double rinv = 1.0 / std::sqrt(ss / double(d) + 1e-6);
    for (int64_t i = 0; i < d; ++i) {
      size_t j = size_t(r * d + i);
      ln[j] = (x[j] - mean) / std::sqrt(var + 1e-6) * w[size_t(i)] + b[size_t(i)];
      rms[j] = x[j] * rinv * (1.0 + w[size_t(i)]);
      ada[j] = x[j] * rinv * (1.0 + mod[size_t(i)]) + mod[size_t(d + i)];
    }
  }
  std::vector<float> y(x.size()), gate(static_cast<size_t>(d));
  layer_norm(x.data(), w.data(), b.data(), y.data(), rows, d, 1e-6f);
  EXPECT_LT(rel_err(y, ln), 2e-6);
  rms_norm(x.data(), w.data(), y.data(), rows, d, 1e-6f);
  EXPECT_LT(rel_err(y, rms), 2e-6);
  ada_rms_norm(x.data(), mod.data(), y.data(), gate.data(), rows, d, 1e-6f);
  EXPECT_LT(rel_err(y, ada), 2e-6);
  for (int64_t i = 0; i < d; ++i) EXPECT_EQ(gate[size_t(i)], mod[size_t(2 * d + i)]);
}

TEST(CpuElementwise, GeluGegluSilu) {
  auto x = randn(4000, 11, 4.0f), up = randn(4000, 12);
  std::vector<double> g(x.size()), gg(x.size()), s(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double v = x[i];
    g[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    gg[i] = g[i] * up[i];
    s[i] = v / (1.0 + std::exp(-v));
  }
  std::vector<float> y(x.size());
  gelu_tanh(x.data(), y.data(), int64_t(x.size()));
  EXPECT_LT(rel_err(y, g), 1e-6);
  geglu(x.data(), up.data(), y.data(), int64_t(x.size()));
  EXPECT_LT(rel_err(y, gg), 1e-6);
  silu(x.data(), y.data(), int64_t(x.size()));
  EXPECT_LT(rel_err(y, s), 1e-6);
  y = x;  // in place
  gelu_tanh(y.data(), y.data(), int64_t(y.size()));
  EXPECT_LT(rel_err(y, g), 1e-6);
  // Far tails and non-finite inputs: the exp inside saturates or underflows, never yields a NaN
  // from a finite input, and a NaN stays a NaN.
  const std::vector<float> ext = {-1e30f, -200.0f, -90.0f, -20.0f, 20.0f, 90.0f, 200.0f, 1e30f, NAN};
  std::vector<float> ge(ext.size()), si(ext.size());
  gelu_tanh(ext.data(), ge.data(), int64_t(ext.size()));
  silu(ext.data(), si.data(), int64_t(ext.size()));
  for (size_t i = 0; i + 1 < ext.size(); ++i) {
    const double v = ext[i];
    EXPECT_NEAR(ge[i], v > 0 ? v : 0.0, 1e-6 * std::abs(v)) << v;
    EXPECT_NEAR(si[i], v > 0 ? v : 0.0, 1e-6 * std::abs(v)) << v;
  }
  EXPECT_TRUE(std::isnan(ge.back()) && std::isnan(si.back()));
}

TEST(CpuRope, RotateHalfPairsAndPositions) {
  const int64_t t = 6, h = 3, dh = 16;
  auto x = randn(size_t(t * h * dh), 13);
  std::vector<int64_t> pos = {0, 1, 2, 7, 100, 200};
  std::vector<double> ref(x.size());
  for (int64_t ti = 0; ti < t; ++ti)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t i = 0; i < dh / 2; ++i) {
        double a = double(pos[size_t(ti)]) * std::pow(10000.0, -2.0 * double(i) / double(dh));
        size_t j0 = size_t((ti * h + hi) * dh + i), j1 = j0 + size_t(dh / 2);
        ref[j0] = x[j0] * std::cos(a) - x[j1] * std::sin(a);
        ref[j1] = x[j1] * std::cos(a) + x[j0] * std::sin(a);
      }
  std::vector<float> y = x;
  rope(y.data(), pos.data(), t, h, dh, 10000.0f);
  EXPECT_LT(rel_err(y, ref), 5e-5);  // fp32 angles, as HF computes them
  for (int64_t i = 0; i < h * dh; ++i) EXPECT_EQ(y[size_t(i)], x[size_t(i)]);  // position 0
  // Table + apply (the executor's path for many tensors at the same positions): the same bits.
  std::vector<float> cs(static_cast<size_t>(t * dh)), z = x;
  rope_table(pos.data(), t, dh, 10000.0f, cs.data());
  rope_apply(z.data(), z.data(), cs.data(), t, h, dh);
  EXPECT_EQ(std::memcmp(y.data(), z.data(), y.size() * 4), 0);
}

TEST(CpuTime, SinCosEmbeddingAndEuler) {
  const int64_t dim = 32;
  std::vector<float> e(dim);
  for (double t : {0.0, 0.1, 0.9, 1.0}) {
    time_embedding(t, e.data(), dim, 4e-3, 4.0);
    std::vector<double> ref(dim);
    for (int64_t i = 0; i < dim / 2; ++i) {
      double period = 4e-3 * std::pow(1000.0, double(i) / double(dim / 2 - 1));
      ref[size_t(i)] = std::sin(2 * M_PI * t / period);
      ref[size_t(dim / 2 + i)] = std::cos(2 * M_PI * t / period);
    }
    for (int64_t i = 0; i < dim; ++i) EXPECT_NEAR(e[size_t(i)], ref[size_t(i)], 1e-6) << t << " " << i;
  }
  std::vector<float> x = {1.0f, 2.0f}, v = {10.0f, -10.0f};
  euler_step(x.data(), v.data(), -0.1f, 2);
  EXPECT_FLOAT_EQ(x[0], 0.0f);
  EXPECT_FLOAT_EQ(x[1], 3.0f);
}

TEST(CpuSoftmax, MatchesReferenceAndMaskedEntriesAreExactZero) {
  const int64_t rows = 4, n = 300;
  auto x = randn(size_t(rows * n), 14, 5.0f);
  std::vector<double> ref(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -1e300, sum = 0;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[size_t(r * n + i)]));
    for (int64_t i = 0; i < n; ++i) sum += std::exp(x[size_t(r * n + i)] - mx);
    for (int64_t i = 0; i < n; ++i) ref[size_t(r * n + i)] = std::exp(x[size_t(r * n + i)] - mx) / sum;
  }
  std::vector<float> y = x;
  softmax(y.data(), rows, n);
  EXPECT_LT(rel_err(y, ref), 1e-5);
  y = x;
  for (int64_t i = 0; i < n; i += 3) y[size_t(i)] += kMaskValue;
  softmax(y.data(), 1, n);
  for (int64_t i = 0; i < n; i += 3) EXPECT_EQ(y[size_t(i)], 0.0f);
}

// The bf16 probabilities of the attention path (AVX-512 where present, up to 4096 keys; the
// portable loops otherwise): within one bf16 step of the fp32 softmax rounded, masked keys exactly
// zero, for row lengths around the 16-lane boundaries and beyond the AVX-512 limit.
TEST(CpuSoftmax, Bf16RowMatchesRoundedFp32Softmax) {
  for (int64_t n : {1, 7, 15, 16, 17, 560, 610, 5000}) {
    auto x = randn(size_t(n), uint32_t(20 + n), 4.0f);
    std::vector<uint8_t> allow(size_t(n), 1);
    std::vector<float> add(size_t(n), 0.0f);
    for (int64_t i = 2; i < n; i += 5) allow[size_t(i)] = 0;  // key 0 always allowed
    for (int64_t i = 0; i < n; ++i) add[size_t(i)] = allow[size_t(i)] ? 0.25f * float(i % 3) : kMaskValue;
    for (int mode = 0; mode < 3; ++mode) {
      const uint8_t* al = mode == 1 ? allow.data() : nullptr;
      const float* ad = mode == 2 ? add.data() : nullptr;
      std::vector<float> ref = x, row = x;
      masked_softmax_row(ref.data(), n, 0.125f, al, ad);
      std::vector<uint16_t> out(size_t(n), 0xFFFF);
      masked_softmax_row_bf16(row.data(), out.data(), n, 0.125f, al, ad);
      for (int64_t i = 0; i < n; ++i) {
        const float got = bf16_to_f32(out[size_t(i)]), want = bf16_to_f32(f32_to_bf16(ref[size_t(i)]));
        EXPECT_LE(std::abs(got - want), std::abs(want) * (1.0f / 128.0f) + 1e-30f) << n << " " << mode << " " << i;
        if ((mode == 1 && !allow[size_t(i)]) || (mode == 2 && add[size_t(i)] == kMaskValue)) {
          EXPECT_EQ(got, 0.0f);
        }
      }
    }
  }
}

// Naive attention in double over allowed keys only.
std::vector<double> ref_attention(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const std::vector<uint8_t>& allow,
                                  int64_t t, int64_t h, int64_t hk, int64_t s, int64_t dh,
                                  double scale) {
  std::vector<double> out(static_cast<size_t>(t * h * dh));
  for (int64_t ti = 0; ti < t; ++ti)
    for (int64_t hi = 0; hi < h; ++hi) {
      int64_t kv = hi / (h / hk);
      std::vector<double> p(static_cast<size_t>(s));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < s; ++j) {
        if (!allow[size_t(ti * s + j)]) continue;
        double d = 0;
        for (int64_t c = 0; c < dh; ++c)
          d += double(q[size_t((ti * h + hi) * dh + c)]) * k[size_t((j * hk + kv) * dh + c)];
        p[size_t(j)] = d * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      for (int64_t j = 0; j < s; ++j)
        if (allow[size_t(ti * s + j)]) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      for (int64_t c = 0; c < dh; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < s; ++j)
          if (allow[size_t(ti * s + j)]) acc += p[size_t(j)] / sum * v[size_t((j * hk + kv) * dh + c)];
        out[size_t((ti * h + hi) * dh + c)] = acc;
      }
    }
  return out;
}

TEST(CpuAttention, PrefixLmMaskMqaAndExactZeros) {
  // Queries: 3 prefix tokens + 4 suffix tokens (pi0.5 denoising layout); keys: a prefix of 6 of
  // which 2 are padding, then the 4 suffix keys. Padding keys hold huge values that must not leak.
  const int64_t h = 4, dh = 8, np = 6, ns = 4, t = 7, s = np + ns;
  std::vector<uint8_t> pad = {1, 1, 0, 1, 0, 1};
  std::vector<uint8_t> allow(static_cast<size_t>(t * s), 0);
  for (int64_t ti = 0; ti < t; ++ti)
    for (int64_t j = 0; j < s; ++j) {
      bool prefix_key = j < np;
      bool query_is_prefix = ti < 3;
      allow[size_t(ti * s + j)] = prefix_key ? pad[size_t(j)] : !query_is_prefix;
    }
  for (int64_t hk : {int64_t{1}, int64_t{2}}) {
    auto q = randn(size_t(t * h * dh), 15), k = randn(size_t(s * hk * dh), 16), v = randn(size_t(s * hk * dh), 17);
    for (int64_t j = 0; j < np; ++j)
      if (!pad[size_t(j)])
        for (int64_t c = 0; c < hk * dh; ++c) {
          k[size_t(j * hk * dh + c)] = 1e3f;
          v[size_t(j * hk * dh + c)] = 1e30f;
        }
    const double scale = 1.0 / std::sqrt(double(dh));
    auto ref = ref_attention(q, k, v, allow, t, h, hk, s, dh, scale);
    std::vector<float> out(static_cast<size_t>(t * h * dh)), out_add(out.size());
    // Per head: blocks of 1, 3, all; 4 workers (2 threads used). One KV head also takes the
    // all-heads path: blocks of 1 and 2 tokens (h and 2h rows), and all tokens at once.
    for (int64_t scratch_floats : {s, 3 * s, attention_scratch_floats(t, s), attention_scratch_floats(t, s, 4),
                                   h * s, 2 * h * s + 1, attention_scratch_floats(t, s, 1, h)}) {
      std::vector<float> scratch(static_cast<size_t>(scratch_floats));
      attention(q.data(), k.data(), v.data(), {allow.data(), nullptr}, out.data(), t, h, hk, s, dh,
                dh, float(scale), scratch.data(), scratch_floats);
      EXPECT_LT(rel_err(out, ref), 1e-5) << "hk " << hk << " scratch " << scratch_floats;
    }
    // The additive form with lerobot's constant gives bit-identical results (same scratch as the
    // last boolean run, so the same path).
    std::vector<float> add(allow.size());
    for (size_t i = 0; i < add.size(); ++i) add[i] = allow[i] ? 0.0f : kMaskValue;
    std::vector<float> scratch(static_cast<size_t>(attention_scratch_floats(t, s, 1, h)));
    attention(q.data(), k.data(), v.data(), {nullptr, add.data()}, out_add.data(), t, h, hk, s, dh,
              dh, float(scale), scratch.data(), int64_t(scratch.size()));
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], out_add[i]);
  }
}

TEST(CpuAttention, FullyMaskedRowIsUniformLikeLerobot) {
  const int64_t t = 1, h = 1, s = 4, dh = 2;
  std::vector<float> q = {0.5f, -1.0f}, k = randn(size_t(s * dh), 18), v = {1, 0, 2, 0, 3, 0, 6, 0};
  std::vector<uint8_t> allow(static_cast<size_t>(s), 0);
  std::vector<float> out(2), scratch(static_cast<size_t>(s));
  attention(q.data(), k.data(), v.data(), {allow.data(), nullptr}, out.data(), t, h, 1, s, dh, dh,
            1.0f, scratch.data(), s);
  EXPECT_FLOAT_EQ(out[0], 3.0f);  // mean of 1, 2, 3, 6
  EXPECT_EQ(out[1], 0.0f);
}

TEST(CpuAttention, NoMaskMatchesReference) {
  const int64_t t = 20, h = 3, s = 20, dh = 12;
  auto q = randn(size_t(t * h * dh), 19), k = randn(size_t(s * h * dh), 20), v = randn(size_t(s * h * dh), 21);
  std::vector<uint8_t> allow(static_cast<size_t>(t * s), 1);
  auto ref = ref_attention(q, k, v, allow, t, h, h, s, dh, 0.3);
  std::vector<float> out(static_cast<size_t>(t * h * dh)), scratch(static_cast<size_t>(attention_scratch_floats(t, s)));
  attention(q.data(), k.data(), v.data(), {}, out.data(), t, h, h, s, dh, dh, 0.3f, scratch.data(),
            int64_t(scratch.size()));
  EXPECT_LT(rel_err(out, ref), 1e-5);
}

TEST(CpuEmbed, PatchEmbedIsStridedConvInRowMajorPatchOrder) {
  const int64_t c = 3, y = 30, x = 44, o = 5, kh = 14, kw = 14;  // 2 x 3 patches, edges dropped
  auto img = randn(size_t(c * y * x), 22), w = randn(size_t(o * c * kh * kw), 23), b = randn(size_t(o), 24);
  const int64_t ny = y / kh, nx = x / kw;
  std::vector<double> ref(static_cast<size_t>(ny * nx * o));
  for (int64_t py = 0; py < ny; ++py)
    for (int64_t px = 0; px < nx; ++px)
      for (int64_t oc = 0; oc < o; ++oc) {
        double s = b[size_t(oc)];
        for (int64_t ci = 0; ci < c; ++ci)
          for (int64_t ky = 0; ky < kh; ++ky)
            for (int64_t kx = 0; kx < kw; ++kx)
              s += double(img[size_t((ci * y + py * kh + ky) * x + px * kw + kx)]) *
                   w[size_t(((oc * c + ci) * kh + ky) * kw + kx)];
        ref[size_t((py * nx + px) * o + oc)] = s;
      }
  std::vector<float> scratch(static_cast<size_t>(patch_embed_scratch_floats(c, y, x, kh, kw))), out(ref.size());
  patch_embed(img.data(), w.data(), b.data(), out.data(), c, y, x, o, kh, kw, scratch.data(),
              int64_t(scratch.size()));
  EXPECT_LT(rel_err(out, ref), 1e-5);
}

TEST(CpuEmbed, GatherWithScaleAndBadIds) {
  const int64_t v = 10, d = 6;
  auto table = randn(size_t(v * d), 25);
  std::vector<uint16_t> table_bf(table.size());
  for (size_t i = 0; i < table.size(); ++i) table_bf[i] = f32_to_bf16(table[i]);
  std::vector<int64_t> ids = {3, 0, 9, 3};
  std::vector<float> out(ids.size() * size_t(d));
  ASSERT_TRUE(embedding_f32(table.data(), v, d, ids.data(), 4, 45.254834f, out.data()).is_ok());
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t j = 0; j < d; ++j)
      EXPECT_EQ(out[t * size_t(d) + size_t(j)], table[size_t(ids[t] * d + j)] * 45.254834f);
  ASSERT_TRUE(embedding_bf16(table_bf.data(), v, d, ids.data(), 4, 2.0f, out.data()).is_ok());
  EXPECT_EQ(out[0], bf16_to_f32(table_bf[size_t(3 * d)]) * 2.0f);
  ids[2] = 10;
  Status s = embedding_f32(table.data(), v, d, ids.data(), 4, 1.0f, out.data());
  EXPECT_EQ(s.code(), StatusCode::InvalidArgument);
  EXPECT_NE(s.message().find("position 2"), std::string::npos) << s.message();
  ids[2] = -1;
  EXPECT_FALSE(embedding_bf16(table_bf.data(), v, d, ids.data(), 4, 1.0f, out.data()).is_ok());
}

}  // namespace
}  // namespace vlac::cpu
