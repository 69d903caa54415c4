// Attention kernels against the CPU: the fp32 kernel against cpu::attention (all rows), the bf16
// tensor-core kernel against a host emulation of lerobot's bf16 mode (fp32 scores of bf16 q·k,
// the CPU's fp32 masked softmax, probabilities rounded to bf16, P·V accumulated in double) on
// every row, or on every 8th token (and every padded one) of the 968-token prefix.
// Tolerances (max |Δ| / max |ref| over the checked rows):
//   fp32: 2e-5 — online vs two-pass softmax and expf vs the CPU's exp, fp32 sums in another order;
//   bf16, fp32 out: 4e-3 — the kernel rounds exp(s − running max) to bf16 before dividing by the
//     sum, the reference rounds the normalized probability: each p differs by up to 2^-8 relative;
//   bf16 out: 1e-2 — plus one rounding of the output.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backends/cpu/kernels.h"
#include "backends/cuda/cudnn_attention.h"
#include "cuda_test_util.h"

namespace vlac::cuda::testing {
namespace {

enum class MaskKind { None, Allow, Add };

struct Case {
  const char* what;
  int64_t t, h, hk, s, d;
  MaskKind mask;
  bool strided;    // q/k/v/out with padded row strides (slices of fused buffers)
  int64_t valid;   // keys [valid, pad_end) are padding (masked); query tokens >= valid_q fully masked
  int64_t pad_end;
  int64_t valid_q;
};

const Case kCases[] = {
    {"prefix 968 (3 cameras, 200 slots)", 968, 8, 1, 968, 256, MaskKind::Allow, true, 900, 968, 900},
    {"expert 50 vs 968 + 50", 50, 8, 1, 1018, 256, MaskKind::Allow, true, 900, 968, 50},
    {"siglip 256 x 16 heads x 72", 256, 16, 16, 256, 72, MaskKind::None, false, 256, 256, 256},
    {"odd MQA 37 vs 131, additive mask", 37, 8, 1, 131, 256, MaskKind::Add, true, 100, 120, 30},
    {"odd GQA 5 x 4 heads / 2 kv vs 70", 5, 4, 2, 70, 72, MaskKind::Allow, true, 40, 65, 4},
    {"one token one key", 1, 8, 1, 1, 256, MaskKind::None, false, 1, 1, 1},
};

struct Data {
  AttentionShape shape;
  std::vector<float> q, k, v;  // strided host copies (the device layout)
  std::vector<uint8_t> allow;
  std::vector<float> add;
};

Data make(const Case& c, uint32_t seed, bool bf) {
  Data dd;
  AttentionShape& a = dd.shape;
  a.t = c.t, a.h = c.h, a.hk = c.hk, a.s = c.s, a.dh = c.d, a.dv = c.d;
  if (c.strided) {
    a.q_stride = c.h * c.d + 64;
    a.k_stride = a.v_stride = 2 * c.hk * c.d;  // one [S, K | V] cache row per key
    a.o_stride = c.h * c.d + 16;
  } else {
    a.q_stride = c.h * c.d, a.k_stride = a.v_stride = c.hk * c.d, a.o_stride = c.h * c.d;
  }
  dd.q = randn(size_t(c.t * a.q_stride), seed, 1.5f);
  dd.k = randn(size_t(c.s * a.k_stride), seed + 1);
  dd.v = randn(size_t(c.s * a.v_stride), seed + 2);
  if (bf) dd.q = bf16_values(dd.q), dd.k = bf16_values(dd.k), dd.v = bf16_values(dd.v);
  const size_t tm = size_t(c.t * c.s);
  std::mt19937 rng(seed + 3);
  if (c.mask == MaskKind::Allow) {
    dd.allow.assign(tm, 1);
    for (int64_t i = 0; i < c.t; ++i)
      for (int64_t j = 0; j < c.s; ++j)
        if (i >= c.valid_q || (j >= c.valid && j < c.pad_end)) dd.allow[size_t(i * c.s + j)] = 0;
  } else if (c.mask == MaskKind::Add) {
    dd.add.assign(tm, 0.0f);
    for (int64_t i = 0; i < c.t; ++i)
      for (int64_t j = 0; j < c.s; ++j) {
        float& m = dd.add[size_t(i * c.s + j)];
        if (i >= c.valid_q || (j >= c.valid && j < c.pad_end)) m = kMaskValue;
        else m = float(int(rng() % 5)) - 2.0f;  // a soft bias too
      }
  }
  return dd;
}

// Dense [T,H,D] q, [S,Hk,D] k/v out of the strided layout (k at column 0 of a cache row, v after it).
std::vector<float> dense(const std::vector<float>& x, int64_t rows, int64_t width, int64_t stride, int64_t offset) {
  std::vector<float> y(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) y[size_t(r * width + i)] = x[size_t(r * stride + offset + i)];
  return y;
}

// lerobot's bf16 mode on the host for the rows of `tokens`: fp32 scores of bf16 q·k, the CPU's
// fp32 masked softmax, probabilities rounded to bf16, P·V accumulated in double. ref is [T, H·D].
void bf16_reference(const Case& c, const Data& dd, const std::vector<float>& qd, const std::vector<float>& kd,
                    const std::vector<float>& vd, const std::vector<int64_t>& tokens, float scale,
                    std::vector<float>* ref) {
  std::vector<float> row(static_cast<size_t>(c.s));
  for (int64_t i : tokens)
    for (int64_t hh = 0; hh < c.h; ++hh) {
      const int64_t g = hh / (c.h / c.hk);
      for (int64_t j = 0; j < c.s; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < c.d; ++e)
          dot += double(qd[size_t((i * c.h + hh) * c.d + e)]) * kd[size_t((j * c.hk + g) * c.d + e)];
        row[size_t(j)] = float(dot);
      }
      cpu::masked_softmax_row(row.data(), c.s, scale, dd.allow.empty() ? nullptr : &dd.allow[size_t(i * c.s)],
                              dd.add.empty() ? nullptr : &dd.add[size_t(i * c.s)]);
      for (int64_t e = 0; e < c.d; ++e) {
        double o = 0;
        for (int64_t j = 0; j < c.s; ++j)
          o += double(bf16_to_f32(f32_to_bf16(row[size_t(j)]))) * vd[size_t((j * c.hk + g) * c.d + e)];
        (*ref)[size_t((i * c.h + hh) * c.d + e)] = float(o);
      }
    }
}

// The own kernels unless a test asks for cuDNN (VLAC_CUDNN_ATTN is on by default where cuDNN is).
class CudaAttention : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    setenv("VLAC_CUDNN_ATTN", "0", 1);
  }
  void TearDown() override {
    unsetenv("VLAC_CUDNN_ATTN");
    CudaTest::TearDown();
  }
};

TEST_F(CudaAttention, MatchesCpuOnPi05ShapesAndOddOnes) {
  const int sms = device_sm_count();
  uint32_t seed = 1000;
  for (const Case& c : kCases) {
    for (DType io : {DType::F32, DType::BF16}) {
      const bool bf = io == DType::BF16;
      Data dd = make(c, seed += 10, bf);
      const AttentionShape& a = dd.shape;
      const bool strided = c.strided;
      const int64_t v_off = strided ? c.hk * c.d : 0;
      const auto qd = dense(dd.q, c.t, c.h * c.d, a.q_stride, 0);
      const auto kd = dense(dd.k, c.s, c.hk * c.d, a.k_stride, 0);
      const auto vd = dense(dd.v, c.s, c.hk * c.d, a.v_stride, v_off);
      // The device copies: k and v share one buffer when strided (a K|V cache).
      std::vector<float> kv = dd.k;
      if (strided)
        for (int64_t j = 0; j < c.s; ++j)
          for (int64_t i = 0; i < c.hk * c.d; ++i) kv[size_t(j * a.k_stride + v_off + i)] = dd.v[size_t(j * a.v_stride + v_off + i)];
      auto dq = bf ? to_device(to_bf16(dd.q)) : to_device(dd.q);
      auto dk = bf ? to_device(to_bf16(kv)) : to_device(kv);
      auto dv = strided ? nullptr : (bf ? to_device(to_bf16(dd.v)) : to_device(dd.v));
      const size_t es = bf ? 2 : 4;
      const void* kp = dk->get();
      const void* vp = strided ? static_cast<const void*>(static_cast<const uint8_t*>(dk->get()) + size_t(v_off) * es) : dv->get();
      auto dallow = dd.allow.empty() ? nullptr : to_device(dd.allow);
      auto dadd = dd.add.empty() ? nullptr : to_device(dd.add);
      AttentionMask mask{dallow ? dallow->as<uint8_t>() : nullptr, dadd ? dadd->as<float>() : nullptr};
      const float scale = 1.0f / std::sqrt(float(c.d));

      // Reference rows.
      const int64_t hd = c.h * c.d;
      std::vector<float> ref(static_cast<size_t>(c.t * hd));
      std::vector<int64_t> check_tokens;
      for (int64_t i = 0; i < c.t; ++i)
        if (c.t <= 256 || i % 8 == 0 || i >= c.valid_q) check_tokens.push_back(i);
      if (!bf) {
        std::vector<float> scratch(static_cast<size_t>(cpu::attention_scratch_floats(c.t, c.s, 1, c.h)));
        cpu::attention(qd.data(), kd.data(), vd.data(), cpu::AttentionMask{dd.allow.empty() ? nullptr : dd.allow.data(),
                                                                           dd.add.empty() ? nullptr : dd.add.data()},
                       ref.data(), c.t, c.h, c.hk, c.s, c.d, c.d, scale, scratch.data(), int64_t(scratch.size()));
      } else {
        bf16_reference(c, dd, qd, kd, vd, check_tokens, scale, &ref);
      }
      const int auto_splits = attention_splits(a, io, sms);
      // Key groups per block (VLAC_ATTN_SUB): the default choice, one, and two wherever a block
      // has two key tiles or more (the bf16 kernel's kSub; the fp32 kernel ignores it).
      for (const char* sub : {"", "1", "2"})
      for (int splits : {1, auto_splits, 3, 16})
        for (DType ot : {DType::F32, DType::BF16}) {
          if (*sub && !bf) continue;
          const uint64_t sb = attention_scratch_bytes(a, io, splits);
          DevBuf scratch(sb), dout(size_t(c.t * a.o_stride) * 4);
          dout.poison();
          if (*sub) setenv("VLAC_ATTN_SUB", sub, 1); else unsetenv("VLAC_ATTN_SUB");
          const Status st = attention(stream_, a, io, dq->get(), kp, vp, mask, dout.get(), ot, scale, splits, scratch.get(), sb);
          unsetenv("VLAC_ATTN_SUB");
          VLAC_CUDA_OK(st);
          sync();
          const size_t on = size_t(c.t * a.o_stride);
          const auto out = ot == DType::F32 ? download<float>(dout, on) : from_bf16(download<uint16_t>(dout, on));
          std::vector<float> got, want;
          for (int64_t i : check_tokens)
            for (int64_t e = 0; e < hd; ++e) {
              got.push_back(out[size_t(i * a.o_stride + e)]);
              want.push_back(ref[size_t(i * hd + e)]);
            }
          const double tol = !bf ? (ot == DType::F32 ? 2e-5 : 8e-3) : (ot == DType::F32 ? 4e-3 : 1e-2);
          const double err = rel_err(got, want);
          EXPECT_LT(err, tol) << c.what << " " << dtype_name(io) << "->" << dtype_name(ot) << " splits " << splits
                              << " key groups '" << sub << "'";
          std::printf("[attention] %-36s %s->%s splits %d (auto %d) groups '%s': rel err %.3g (tol %.0e)\n", c.what,
                      dtype_name(io), dtype_name(ot), splits, auto_splits, sub, err, tol);
        }
    }
  }
}

// The expert's RoPE inside its attention (AttentionRope): q and the step's own keys rotated from
// the fused q|k|v GEMM's f32 rows as they load, the own values rounded there too. The reference is
// what the executor ran before: rope_pair_to (q into bf16, k and a v copy into the last rows of
// bf16 K/V buffers), then the attention. Bit for bit, for every split, key-group setting and
// output dtype; the fused run's q and the fresh K/V rows it must not read are NaN.
TEST_F(CudaAttention, FusedRopeEqualsTheRopeLaunchesBitForBit) {
  struct R { const char* what; int64_t t, h, hk, prefix, d; };
  const R cases[] = {{"expert 50 x 8 heads vs 968 + 50", 50, 8, 1, 968, 256},
                     {"odd 37 x 2 heads of 72 vs 45 + 37", 37, 2, 1, 45, 72},
                     {"GQA 5 x 4 heads / 2 kv of 72 vs 70 + 5", 5, 4, 2, 70, 72},
                     {"own keys only, 20 x 8 heads", 20, 8, 1, 0, 256}};
  const int sms = device_sm_count();
  uint32_t seed = 4000;
  for (const R& c : cases) {
    const int64_t s = c.prefix + c.t, qw = c.h * c.d, kw = c.hk * c.d, w = qw + 2 * kw + 8;  // + padding
    const auto fused = randn(size_t(c.t * w), seed += 10, 1.5f);
    std::vector<int64_t> pos(size_t(c.t));
    for (int64_t i = 0; i < c.t; ++i) pos[size_t(i)] = c.prefix + 3 * i + 1;
    const auto prefix_k = to_bf16(randn(size_t(c.prefix * kw), seed + 1));
    const auto prefix_v = to_bf16(randn(size_t(c.prefix * kw), seed + 2));
    auto dfused = to_device(fused);
    auto dpos = to_device(pos);
    const float* fq = dfused->as<float>();
    // K/V [s, hk·d] bf16: the prefix rows, then the step's own (written by the rope launch, or NaN).
    DevBuf kb(size_t(s * kw) * 2), vb(size_t(s * kw) * 2), kf(size_t(s * kw) * 2), vf(size_t(s * kw) * 2);
    DevBuf qb(size_t(c.t * qw) * 2), qnan(size_t(c.t * qw) * 2), table(size_t(c.t * c.d) * 4);
    for (DevBuf* b : {&kb, &vb, &kf, &vf, &qb, &qnan, &table}) b->poison();
    for (DevBuf* b : {&kb, &kf, &vb, &vf}) {
      const auto& src = b == &kb || b == &kf ? prefix_k : prefix_v;
      if (c.prefix) {
        ASSERT_EQ(cudaMemcpy(b->get(), src.data(), src.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
      }
    }
    const RopeJob jq{fq, w, qb.get(), qw, c.h};
    const RopeJob jk{fq + qw, w, kb.as<uint16_t>() + c.prefix * kw, kw, c.hk};
    const RowCopyJob cv{fq + qw + kw, w, vb.as<uint16_t>() + c.prefix * kw, kw, kw};
    VLAC_CUDA_OK(rope_pair_to(stream_, jq, jk, DType::F32, DType::BF16, dpos->as<int64_t>(), c.t, c.d, 1e4f, &cv));
    VLAC_CUDA_OK(rope_sincos(stream_, dpos->as<int64_t>(), c.t, c.d, 1e4f, table.as<float>()));
    AttentionRope rope;
    rope.q = fq, rope.q_stride = w, rope.k = fq + qw, rope.k_stride = w, rope.v = fq + qw + kw, rope.v_stride = w;
    rope.sc = table.as<float>();
    AttentionShape a;
    a.t = c.t, a.h = c.h, a.hk = c.hk, a.s = s, a.dh = a.dv = c.d;
    const float scale = 1.0f / std::sqrt(float(c.d));
    const int auto_splits = attention_splits(a, DType::BF16, sms);
    int runs = 0;
    for (const char* sub : {"", "1", "2"})
      for (int splits : {1, auto_splits, 3})
        for (DType ot : {DType::F32, DType::BF16}) {
          const uint64_t sb = attention_scratch_bytes(a, DType::BF16, splits);
          DevBuf scratch(sb), want(size_t(c.t * qw) * 4), got(size_t(c.t * qw) * 4);
          want.poison(), got.poison();
          if (*sub) setenv("VLAC_ATTN_SUB", sub, 1); else unsetenv("VLAC_ATTN_SUB");
          const Status s1 = attention(stream_, a, DType::BF16, qb.get(), kb.get(), vb.get(), {}, want.get(), ot, scale,
                                      splits, scratch.get(), sb);
          const Status s2 = attention(stream_, a, DType::BF16, qnan.get(), kf.get(), vf.get(), {}, got.get(), ot, scale,
                                      splits, scratch.get(), sb, &rope);
          unsetenv("VLAC_ATTN_SUB");
          VLAC_CUDA_OK(s1);
          VLAC_CUDA_OK(s2);
          sync();
          const size_t bytes = size_t(c.t * qw) * (ot == DType::F32 ? 4 : 2);
          const auto hw = download<uint8_t>(want, bytes), hg = download<uint8_t>(got, bytes);
          ASSERT_EQ(hw.size(), bytes);
          EXPECT_EQ(hw, hg) << c.what << " splits " << splits << " groups '" << sub << "' -> " << dtype_name(ot);
          ++runs;
        }
    std::printf("[attention] fused RoPE, %s: %d settings bit for bit (auto splits %d)\n", c.what, runs, auto_splits);
  }
}

// AttentionShape::stable_keys: key splits inside the stable rows load them before they wait, and
// the RoPE pair launch before them lets them launch early (rope_pair_to's early_dependents). The
// RoPE writes q and the step's own K/V rows just before, as in a denoising step; the output is
// the same bits as with every load after the wait, whatever the splits, groups and out dtype.
TEST_F(CudaAttention, StableKeysLoadedEarlyChangeNoBit) {
  struct R { const char* what; int64_t t, h, hk, prefix, d; };
  const R cases[] = {{"expert 50 x 8 heads vs 968 + 50", 50, 8, 1, 968, 256},
                     {"odd 37 x 2 heads of 72 vs 300 + 37", 37, 2, 1, 300, 72}};
  const int sms = device_sm_count();
  uint32_t seed = 5000;
  for (const R& c : cases) {
    const int64_t s = c.prefix + c.t, qw = c.h * c.d, kw = c.hk * c.d, w = qw + 2 * kw + 8;
    const auto fused = randn(size_t(c.t * w), seed += 10, 1.5f);
    std::vector<int64_t> pos(size_t(c.t));
    for (int64_t i = 0; i < c.t; ++i) pos[size_t(i)] = c.prefix + 2 * i;
    const auto prefix_k = to_bf16(randn(size_t(c.prefix * kw), seed + 1));
    const auto prefix_v = to_bf16(randn(size_t(c.prefix * kw), seed + 2));
    auto dfused = to_device(fused);
    auto dpos = to_device(pos);
    const float* fq = dfused->as<float>();
    DevBuf kb(size_t(s * kw) * 2), vb(size_t(s * kw) * 2), qb(size_t(c.t * qw) * 2);
    for (DevBuf* b : {&kb, &vb, &qb}) b->poison();
    ASSERT_EQ(cudaMemcpy(kb.get(), prefix_k.data(), prefix_k.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(vb.get(), prefix_v.data(), prefix_v.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    AttentionShape a;
    a.t = c.t, a.h = c.h, a.hk = c.hk, a.s = s, a.dh = a.dv = c.d;
    const float scale = 1.0f / std::sqrt(float(c.d));
    const int auto_splits = attention_splits(a, DType::BF16, sms);
    int runs = 0;
    for (const char* sub : {"", "1"})
      for (int splits : {auto_splits, 5})
        for (DType ot : {DType::F32, DType::BF16}) {
          const uint64_t sb = attention_scratch_bytes(a, DType::BF16, splits);
          DevBuf scratch(sb), out[2] = {DevBuf(size_t(c.t * qw) * 4), DevBuf(size_t(c.t * qw) * 4)};
          if (*sub) setenv("VLAC_ATTN_SUB", sub, 1); else unsetenv("VLAC_ATTN_SUB");
          for (int early = 0; early < 2; ++early) {
            out[early].poison();
            // The step: q and the own keys rotated, the own values copied, then the attention.
            const RopeJob jq{fq, w, qb.get(), qw, c.h};
            const RopeJob jk{fq + qw, w, kb.as<uint16_t>() + c.prefix * kw, kw, c.hk};
            const RowCopyJob cv{fq + qw + kw, w, vb.as<uint16_t>() + c.prefix * kw, kw, kw};
            VLAC_CUDA_OK(rope_pair_to(stream_, jq, jk, DType::F32, DType::BF16, dpos->as<int64_t>(), c.t, c.d, 1e4f,
                                      &cv, early == 1));
            AttentionShape b = a;
            b.stable_keys = early ? c.prefix : 0;
            VLAC_CUDA_OK(attention(stream_, b, DType::BF16, qb.get(), kb.get(), vb.get(), {}, out[early].get(), ot,
                                   scale, splits, scratch.get(), sb));
            // The next step's RoPE rewrites the rows the attention just read: they must be its own.
            VLAC_CUDA_OK(rope_pair_to(stream_, jq, jk, DType::F32, DType::BF16, dpos->as<int64_t>(), c.t, c.d, 1e4f,
                                      &cv, early == 1));
          }
          unsetenv("VLAC_ATTN_SUB");
          sync();
          const size_t bytes = size_t(c.t * qw) * (ot == DType::F32 ? 4 : 2);
          const auto h0 = download<uint8_t>(out[0], bytes), h1 = download<uint8_t>(out[1], bytes);
          ASSERT_EQ(h0.size(), bytes);
          EXPECT_EQ(h0, h1) << c.what << " splits " << splits << " groups '" << sub << "' -> " << dtype_name(ot);
          ++runs;
        }
    std::printf("[attention] stable keys loaded early, %s: %d settings bit for bit (auto splits %d)\n", c.what, runs,
                auto_splits);
  }
}

TEST_F(CudaAttention, FusedRopeRefusesWhatItCannotRun) {
  AttentionShape a;
  a.t = 4, a.h = 2, a.hk = 1, a.s = 8, a.dh = a.dv = 72;
  DevBuf buf(1 << 16);
  AttentionRope rope;
  rope.q = rope.k = rope.v = rope.sc = buf.as<float>();
  rope.q_stride = rope.k_stride = rope.v_stride = 4 * 72;
  const void* p = buf.get();
  // fp32 attention, an unaligned row stride, fewer keys than tokens.
  EXPECT_EQ(attention(stream_, a, DType::F32, p, p, p, {}, buf.get(), DType::F32, 1.0f, 1, nullptr, 0, &rope).code(),
            StatusCode::InvalidArgument);
  rope.k_stride = 4 * 72 + 2;
  EXPECT_EQ(attention(stream_, a, DType::BF16, p, p, p, {}, buf.get(), DType::F32, 1.0f, 1, nullptr, 0, &rope).code(),
            StatusCode::InvalidArgument);
  rope.k_stride = 4 * 72;
  a.s = 3;
  EXPECT_EQ(attention(stream_, a, DType::BF16, p, p, p, {}, buf.get(), DType::F32, 1.0f, 1, nullptr, 0, &rope).code(),
            StatusCode::InvalidArgument);
}

// cuDNN's fused attention (VLAC_CUDNN_ATTN, cudnn_attention.h) on the unmasked shapes against the
// same host reference as the own kernel, bf16 out (tolerance 1e-2 as above): pi0.5's prefix
// without padding, the expert's keys, SigLIP's 72-wide heads as one image and as three images of
// 256 tokens batched (kv_block, the own kernel's block-diagonal layout), and odd GQA. Through
// attention() with the setting on, the cuDNN path must give the same rows. Skipped only where
// libcudnn.so.9 (>= 9.13) is not there; a shape no engine takes is reported and left to the own kernel.
TEST_F(CudaAttention, CudnnMatchesTheReference) {
  const std::string libname = cudnn_attention_library();
  if (libname.rfind("cuDNN ", 0) != 0) GTEST_SKIP() << "cuDNN attention not available: " << libname;
  const Case cases[] = {
      {"prefix 968, no padding", 968, 8, 1, 968, 256, MaskKind::None, true, 968, 968, 968},
      {"expert 50 vs 1018", 50, 8, 1, 1018, 256, MaskKind::None, true, 1018, 1018, 50},
      {"siglip 256 x 16 heads x 72", 256, 16, 16, 256, 72, MaskKind::None, false, 256, 256, 256},
      {"siglip 3 images batched", 768, 16, 16, 768, 72, MaskKind::None, true, 768, 768, 768},
      {"odd GQA 37 x 4 heads / 2 kv vs 70", 37, 4, 2, 70, 72, MaskKind::None, true, 70, 70, 37},
  };
  uint32_t seed = 7000;
  int ran = 0;
  for (const Case& c : cases) {
    const bool batched = std::string(c.what) == "siglip 3 images batched";
    Data dd = make(c, seed += 10, true);
    AttentionShape a = dd.shape;
    if (batched) a.kv_block = 256;
    const int64_t v_off = c.strided ? c.hk * c.d : 0;
    const auto qd = dense(dd.q, c.t, c.h * c.d, a.q_stride, 0);
    const auto kd = dense(dd.k, c.s, c.hk * c.d, a.k_stride, 0);
    const auto vd = dense(dd.v, c.s, c.hk * c.d, a.v_stride, v_off);
    std::vector<float> kv = dd.k;
    if (c.strided)
      for (int64_t j = 0; j < c.s; ++j)
        for (int64_t i = 0; i < c.hk * c.d; ++i) kv[size_t(j * a.k_stride + v_off + i)] = dd.v[size_t(j * a.v_stride + v_off + i)];
    auto dq = to_device(to_bf16(dd.q));
    auto dk = to_device(to_bf16(kv));
    auto dv = c.strided ? nullptr : to_device(to_bf16(dd.v));
    const void* kp = dk->get();
    const void* vp = c.strided ? static_cast<const void*>(static_cast<const uint8_t*>(dk->get()) + size_t(v_off) * 2) : dv->get();
    const float scale = 1.0f / std::sqrt(float(c.d));
    const int64_t hd = c.h * c.d;
    std::vector<int64_t> tokens;
    for (int64_t i = 0; i < c.t; ++i)
      if (c.t <= 256 || i % 8 == 0) tokens.push_back(i);
    std::vector<float> ref(static_cast<size_t>(c.t * hd));
    if (!batched) {
      bf16_reference(c, dd, qd, kd, vd, tokens, scale, &ref);
    } else {  // each image's tokens against its own 256 keys
      for (int64_t b0 = 0; b0 < c.t; b0 += 256) {
        Case cb = c;
        cb.t = cb.s = 256;
        Data db;
        std::vector<float> qb(qd.begin() + b0 * hd, qd.begin() + (b0 + 256) * hd);
        std::vector<float> kb(kd.begin() + b0 * c.hk * c.d, kd.begin() + (b0 + 256) * c.hk * c.d);
        std::vector<float> vb(vd.begin() + b0 * c.hk * c.d, vd.begin() + (b0 + 256) * c.hk * c.d);
        std::vector<int64_t> tb;
        for (int64_t i : tokens)
          if (i >= b0 && i < b0 + 256) tb.push_back(i - b0);
        std::vector<float> rb(static_cast<size_t>(256 * hd));
        bf16_reference(cb, db, qb, kb, vb, tb, scale, &rb);
        for (int64_t i : tb)
          for (int64_t e = 0; e < hd; ++e) ref[size_t((b0 + i) * hd + e)] = rb[size_t(i * hd + e)];
      }
    }
    CudnnAttentionShape cs;
    cs.b = batched ? c.t / 256 : 1, cs.sq = batched ? 256 : c.t, cs.skv = batched ? 256 : c.s;
    cs.h = c.h, cs.hk = c.hk, cs.d = c.d;
    cs.q_stride = a.q_stride, cs.k_stride = a.k_stride, cs.v_stride = a.v_stride, cs.o_stride = a.o_stride;
    const size_t on = size_t(c.t * a.o_stride);
    DevBuf direct(on * 2), through(on * 2);
    direct.poison(), through.poison();
    const Status st = cudnn_attention(stream_, cs, dq->get(), kp, vp, direct.get(), scale);
    if (st.code() == StatusCode::Unsupported) {
      std::printf("[attention] cuDNN declines %s: %s\n", c.what, st.message().c_str());
      continue;
    }
    VLAC_CUDA_OK(st);
    setenv("VLAC_CUDNN_ATTN", "2", 1);
    const Status st2 = attention(stream_, a, DType::BF16, dq->get(), kp, vp, {}, through.get(), DType::BF16, scale, 1,
                                 nullptr, 0);
    setenv("VLAC_CUDNN_ATTN", "0", 1);
    VLAC_CUDA_OK(st2);
    sync();
    const auto out = from_bf16(download<uint16_t>(direct, on));
    std::vector<float> got, want;
    for (int64_t i : tokens)
      for (int64_t e = 0; e < hd; ++e) {
        got.push_back(out[size_t(i * a.o_stride + e)]);
        want.push_back(ref[size_t(i * hd + e)]);
      }
    const double err = rel_err(got, want);
    EXPECT_LT(err, 1e-2) << c.what;
    EXPECT_EQ(download<uint16_t>(direct, on), download<uint16_t>(through, on)) << c.what << ": attention() with the setting";
    std::printf("[attention] cuDNN (%s) %-36s rel err %.3g (tol 1e-2)\n", libname.c_str(), c.what, err);
    ++ran;
  }
  // The prefix shape is the one it is for: it must be taken.
  EXPECT_GT(ran, 0) << "cuDNN took none of the shapes";
}

// Who gets cuDNN's attention: by default every call but the lean ones (8-bit packages' engines);
// VLAC_CUDNN_ATTN=1 or 2 asks for it everywhere, 0 nowhere; other values are the default.
TEST(CudaAttentionPlan, CudnnSettingLeavesLeanCallsOnTheOwnKernel) {
  unsetenv("VLAC_CUDNN_ATTN");
  EXPECT_EQ(cudnn_attention_setting(false), 1);
  EXPECT_EQ(cudnn_attention_setting(true), 0);
  for (const char* v : {"0", "1", "2"}) {
    setenv("VLAC_CUDNN_ATTN", v, 1);
    EXPECT_EQ(cudnn_attention_setting(false), std::atoi(v)) << v;
    EXPECT_EQ(cudnn_attention_setting(true), std::atoi(v)) << v;
  }
  setenv("VLAC_CUDNN_ATTN", "7", 1);
  EXPECT_EQ(cudnn_attention_setting(false), 1);
  EXPECT_EQ(cudnn_attention_setting(true), 0);
  unsetenv("VLAC_CUDNN_ATTN");
}

TEST(CudaAttentionPlan, ExpertShapeSplitsTheKeys) {
  AttentionShape a;
  a.t = 50, a.h = 8, a.hk = 1, a.s = 1018, a.dh = a.dv = 256;
  EXPECT_GT(attention_splits(a, DType::BF16, 132), 1);
  EXPECT_GT(attention_scratch_bytes(a, DType::BF16, attention_splits(a, DType::BF16, 132)), 0u);
  EXPECT_EQ(attention_splits(a, DType::F32, 132), 1);  // the fp32 kernel never splits
  a.t = 968 * 4, a.s = 968;
  EXPECT_EQ(attention_splits(a, DType::BF16, 132), 1);  // 484 row tiles fill the GPU already
}

// Head dim 256 runs two key groups per block, so the expert's 1018 keys (16 tiles) are cut into 8
// splits of 2 tiles; with the groups off (VLAC_ATTN_SUB=1), 16 splits of one tile as before.
TEST(CudaAttentionPlan, TwoKeyGroupsHalveTheExpertSplits) {
  AttentionShape a;
  a.t = 50, a.h = 8, a.hk = 1, a.s = 1018, a.dh = a.dv = 256;
  unsetenv("VLAC_ATTN_SUB");
  EXPECT_EQ(attention_splits(a, DType::BF16, 132), 8);
  setenv("VLAC_ATTN_SUB", "1", 1);
  EXPECT_EQ(attention_splits(a, DType::BF16, 132), 16);
  unsetenv("VLAC_ATTN_SUB");
}

TEST(CudaAttentionPlan, UnsupportedHeadDimIsAStatus) {
  AttentionShape a;
  a.t = 4, a.h = 2, a.hk = 1, a.s = 4, a.dh = a.dv = 64;
  const Status s = attention(nullptr, a, DType::BF16, nullptr, nullptr, nullptr, {}, nullptr, DType::F32, 1.0f, 1, nullptr, 0);
  EXPECT_EQ(s.code(), StatusCode::Unsupported) << s.message();
}

}  // namespace
}  // namespace vlac::cuda::testing
