// Scaled dot-product attention with grouped/multi-query KV heads and a boolean or additive mask,
// in blocks of query tokens per head (two sgemm calls per block). Never allocates.
#include <cblas.h>

#include <algorithm>
#include <climits>

#include "backends/cpu/kernels.h"

namespace vlac::cpu {
namespace {

constexpr int64_t kBlockTokens = 128;  // query tokens per block: scratch = block * S floats

}  // namespace

int64_t attention_scratch_floats(int64_t t, int64_t s) {
  return std::max<int64_t>(1, std::min(t, kBlockTokens)) * std::max<int64_t>(s, 1);
}

void attention(const float* q, const float* k, const float* v, AttentionMask mask, float* out,
               int64_t t, int64_t h, int64_t hk, int64_t s, int64_t dh, int64_t dv, float scale,
               float* scratch, int64_t scratch_floats) {
  VLAC_CHECK(hk > 0 && h % hk == 0 && s > 0 && scratch_floats >= s);
  VLAC_CHECK(t < INT_MAX && s < INT_MAX && h * dh < INT_MAX && h * dv < INT_MAX);
  const int64_t group = h / hk;
  const int64_t block = std::min<int64_t>(t, std::max<int64_t>(1, scratch_floats / s));
  for (int64_t hi = 0; hi < h; ++hi) {
    const int64_t kv = hi / group;
    const float* kh = k + kv * dh;  // rows of stride hk*dh
    const float* vh = v + kv * dv;
    for (int64_t t0 = 0; t0 < t; t0 += block) {
      const int64_t bt = std::min(block, t - t0);
      // scores[bt, S] = scale · q_h[t0:t0+bt] · k_hᵀ
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(bt), int(s), int(dh), scale,
                  q + (t0 * h + hi) * dh, int(h * dh), kh, int(hk * dh), 0.0f, scratch, int(s));
      for (int64_t r = 0; r < bt; ++r) {
        float* row = scratch + r * s;
        const int64_t ti = t0 + r;
        if (mask.allow) {
          const uint8_t* m = mask.allow + ti * s;
          for (int64_t j = 0; j < s; ++j)
            if (!m[j]) row[j] += kMaskValue;
        } else if (mask.add) {
          const float* m = mask.add + ti * s;
          for (int64_t j = 0; j < s; ++j) row[j] += m[j];
        }
      }
      softmax(scratch, bt, s);
      // out_h[t0:t0+bt] = probs[bt, S] · v_h[S, Dv]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(bt), int(dv), int(s), 1.0f,
                  scratch, int(s), vh, int(hk * dv), 0.0f, out + (t0 * h + hi) * dv, int(h * dv));
    }
  }
}

}  // namespace vlac::cpu
