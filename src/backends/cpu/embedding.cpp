// Embedding gather (fp32/bf16/8-bit tables) and patch embedding (conv stride = kernel as im2col +
// sgemm). Never allocates; token ids are checked because they come from observation files.
#include <string>

#include "backends/cpu/kernels.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace vlac::cpu {
namespace {

Status bad_id(int64_t pos, int64_t id, int64_t v) {
  return invalid_argument("token id " + std::to_string(id) + " at position " + std::to_string(pos) +
                          " is outside the vocabulary [0, " + std::to_string(v) + ")");
}

}  // namespace

Status embedding_f32(const float* table, int64_t v, int64_t d, const int64_t* ids, int64_t t,
                     float scale, float* out) {
  for (int64_t i = 0; i < t; ++i) {
    if (ids[i] < 0 || ids[i] >= v) return bad_id(i, ids[i], v);
    const float* row = table + ids[i] * d;
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = row[j] * scale;
  }
  return Status::ok();
}

Status embedding_bf16(const uint16_t* table, int64_t v, int64_t d, const int64_t* ids, int64_t t,
                      float scale, float* out) {
  for (int64_t i = 0; i < t; ++i) {
    if (ids[i] < 0 || ids[i] >= v) return bad_id(i, ids[i], v);
    const uint16_t* row = table + ids[i] * d;
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = bf16_to_f32(row[j]) * scale;
  }
  return Status::ok();
}

Status embedding_quant(const uint8_t* blob, DType dt, int64_t v, int64_t d, const int64_t* ids, int64_t t, float scale,
                       float* out) {
  const float* scales = reinterpret_cast<const float*>(blob + quant_scales_offset(v, d));
  const float* table = quant_table(dt);
  for (int64_t i = 0; i < t; ++i) {
    if (ids[i] < 0 || ids[i] >= v) return bad_id(i, ids[i], v);
    const uint8_t* row = blob + ids[i] * d;
    const float s = scales[ids[i]];
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = table[row[j]] * s * scale;
  }
  return Status::ok();
}

int64_t patch_embed_scratch_floats(int64_t c, int64_t y, int64_t x, int64_t kh, int64_t kw) {
  return (y / kh) * (x / kw) * c * kh * kw;
}

void im2col_patches(const float* img, float* cols, int64_t c, int64_t y, int64_t x, int64_t kh, int64_t kw) {
  const int64_t ny = y / kh, nx = x / kw, patch = c * kh * kw;
  // Row p = py*nx + px holds the patch in the weight's (C, kh, kw) order.
#pragma omp parallel for schedule(static) if (ny * nx * patch >= kParallelMinElems)
  for (int64_t p = 0; p < ny * nx; ++p) {
    const int64_t py = p / nx, px = p % nx;
    float* dst = cols + p * patch;
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t ky = 0; ky < kh; ++ky) {
        const float* src = img + (ci * y + py * kh + ky) * x + px * kw;
        for (int64_t kx = 0; kx < kw; ++kx) *dst++ = src[kx];
      }
  }
}

void patch_embed(const float* img, const float* w, const float* b, float* out, int64_t c,
                 int64_t y, int64_t x, int64_t o, int64_t kh, int64_t kw, float* scratch,
                 int64_t scratch_floats) {
  const int64_t ny = y / kh, nx = x / kw, patch = c * kh * kw;
  VLAC_CHECK(scratch_floats >= ny * nx * patch);
  im2col_patches(img, scratch, c, y, x, kh, kw);
  linear_f32(scratch, w, b, out, ny * nx, patch, o);
}

}  // namespace vlac::cpu
