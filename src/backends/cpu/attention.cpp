// Scaled dot-product attention with grouped/multi-query KV heads and a boolean or additive mask,
// in blocks of query tokens per head (two sgemm calls per block). (head, block) pairs run on the
// OpenMP threads, each with its own scores block and single-threaded sgemm calls (oneDNN runs
// sequentially inside a parallel region). Never allocates.
#include <omp.h>

#include <algorithm>

#include <dnnl.h>

#include "backends/cpu/kernels.h"

namespace vlac::cpu {
namespace {

constexpr int64_t kBlockTokens = 128;  // query tokens per block: scratch = block * S floats per worker

}  // namespace

int64_t attention_scratch_floats(int64_t t, int64_t s, int64_t workers) {
  return std::max<int64_t>(1, workers) * std::max<int64_t>(1, std::min(t, kBlockTokens)) *
         std::max<int64_t>(s, 1);
}

void attention(const float* q, const float* k, const float* v, AttentionMask mask, float* out,
               int64_t t, int64_t h, int64_t hk, int64_t s, int64_t dh, int64_t dv, float scale,
               float* scratch, int64_t scratch_floats) {
  VLAC_CHECK(hk > 0 && h % hk == 0 && s > 0 && scratch_floats >= s);
  const int64_t group = h / hk;
  const int64_t block = std::min<int64_t>({t, kBlockTokens, std::max<int64_t>(1, scratch_floats / s)});
  const int64_t blocks = (t + block - 1) / block;
  const int64_t tasks = h * blocks;
  const int64_t workers =
      std::clamp<int64_t>(scratch_floats / (block * s), 1, std::min<int64_t>(tasks, omp_get_max_threads()));
  bool ok = true;
#pragma omp parallel for schedule(dynamic, 1) num_threads(int(workers)) if (workers > 1) reduction(&& : ok)
  for (int64_t task = 0; task < tasks; ++task) {
    float* scores = scratch + int64_t(omp_get_thread_num()) * block * s;
    const int64_t hi = task / blocks, t0 = (task % blocks) * block;
    const int64_t bt = std::min(block, t - t0);
    const float* kh = k + (hi / group) * dh;  // rows of stride hk*dh
    const float* vh = v + (hi / group) * dv;
    // scores[bt, S] = scale · q_h[t0:t0+bt] · k_hᵀ
    ok = ok && dnnl_sgemm('N', 'T', bt, s, dh, scale, q + (t0 * h + hi) * dh, h * dh, kh, hk * dh, 0.0f,
                          scores, s) == dnnl_success;
    for (int64_t r = 0; r < bt; ++r) {
      float* row = scores + r * s;
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
    softmax(scores, bt, s);  // runs serially here (nested region)
    // out_h[t0:t0+bt] = probs[bt, S] · v_h[S, Dv]
    ok = ok && dnnl_sgemm('N', 'N', bt, dv, s, 1.0f, scores, s, vh, hk * dv, 0.0f, out + (t0 * h + hi) * dv,
                          h * dv) == dnnl_success;
  }
  VLAC_CHECK(ok);
}

}  // namespace vlac::cpu
