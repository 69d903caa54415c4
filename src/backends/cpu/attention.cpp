// Scaled dot-product attention with grouped/multi-query KV heads and a boolean or additive mask.
// One KV head (MQA): all query heads of a block of tokens in two GEMMs. Otherwise blocks of query
// tokens per head (two sgemm calls per block); (head, block) pairs run on the OpenMP threads, each
// with its own scores block and single-threaded sgemm calls (oneDNN runs sequentially inside a
// parallel region). Never allocates.
#include <omp.h>

#include <algorithm>

#include <dnnl.h>

#include "backends/cpu/kernels.h"

namespace vlac::cpu {
namespace {

constexpr int64_t kBlockTokens = 128;  // query tokens per block: scratch = block * S floats per worker
constexpr int64_t kMqaBlockTokens = 256;  // one KV head: tokens per block of all heads' score rows

}  // namespace

int64_t attention_scratch_floats(int64_t t, int64_t s, int64_t workers, int64_t h) {
  const int64_t per_head = std::max<int64_t>(1, workers) * std::max<int64_t>(1, std::min(t, kBlockTokens));
  const int64_t all_heads = std::max<int64_t>(1, std::min(t, kMqaBlockTokens)) * std::max<int64_t>(1, h);
  return std::max(per_head, all_heads) * std::max<int64_t>(s, 1);
}

namespace {

// softmax(row + mask row ti), in place.
void mask_softmax(const AttentionMask& mask, int64_t ti, int64_t s, float* row) {
  masked_softmax_row(row, s, 1.0f, mask.allow ? mask.allow + ti * s : nullptr, mask.add ? mask.add + ti * s : nullptr);
}

// One KV head shared by all query heads (pi0.5's Gemma and expert): q [T,H,Dh] is a [T·H, Dh]
// matrix, so a block of tokens is two large GEMMs (threaded inside oneDNN) around a threaded
// mask + softmax over its T·H score rows, and the output [T,H,Dv] is written in place.
void attention_one_kv_head(const float* q, const float* k, const float* v, const AttentionMask& mask, float* out,
                           int64_t t, int64_t h, int64_t s, int64_t dh, int64_t dv, float scale, float* scores,
                           int64_t block) {
  for (int64_t t0 = 0; t0 < t; t0 += block) {
    const int64_t rows = std::min(block, t - t0) * h;
    VLAC_CHECK(dnnl_sgemm('N', 'T', rows, s, dh, scale, q + t0 * h * dh, dh, k, dh, 0.0f, scores, s) == dnnl_success);
#pragma omp parallel for schedule(static) if (rows * s >= kParallelMinElems)
    for (int64_t r = 0; r < rows; ++r) mask_softmax(mask, t0 + r / h, s, scores + r * s);
    VLAC_CHECK(dnnl_sgemm('N', 'N', rows, dv, s, 1.0f, scores, s, v, dv, 0.0f, out + t0 * h * dv, dv) == dnnl_success);
  }
}

}  // namespace

void attention(const float* q, const float* k, const float* v, AttentionMask mask, float* out,
               int64_t t, int64_t h, int64_t hk, int64_t s, int64_t dh, int64_t dv, float scale,
               float* scratch, int64_t scratch_floats) {
  VLAC_CHECK(hk > 0 && h % hk == 0 && s > 0 && scratch_floats >= s);
  if (hk == 1 && h > 1 && scratch_floats >= h * s) {
    const int64_t block = std::min(t, scratch_floats / (h * s));
    attention_one_kv_head(q, k, v, mask, out, t, h, s, dh, dv, scale, scratch, block);
    return;
  }
  const int64_t group = h / hk;
  const int64_t block = std::min<int64_t>({t, kBlockTokens, std::max<int64_t>(1, scratch_floats / s)});
  const int64_t blocks = (t + block - 1) / block;
  const int64_t tasks = h * blocks;
  [[maybe_unused]] const int64_t workers =  // used by the OpenMP clause only
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
    for (int64_t r = 0; r < bt; ++r) mask_softmax(mask, t0 + r, s, scores + r * s);
    // out_h[t0:t0+bt] = probs[bt, S] · v_h[S, Dv]
    ok = ok && dnnl_sgemm('N', 'N', bt, dv, s, 1.0f, scores, s, vh, hk * dv, 0.0f, out + (t0 * h + hi) * dv,
                          h * dv) == dnnl_success;
  }
  VLAC_CHECK(ok);
}

}  // namespace vlac::cpu
