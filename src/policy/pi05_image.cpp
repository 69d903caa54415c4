// Bilinear resize and padding, written to reproduce PyTorch's CPU upsample_bilinear2d bit for
// bit where the compiler does the same float operations (see docs/preprocessing.md).
#include "policy/pi05_image.h"

#include <algorithm>
#include <cmath>

namespace vlac {

namespace {

// Per output index along one axis: the two source indices and weights (PyTorch's
// compute_source_index_and_lambda with align_corners=False, opmath float).
struct AxisTap {
  int64_t i0 = 0, i1 = 0;
  float l0 = 1.0f, l1 = 0.0f;
};

std::vector<AxisTap> axis_taps(int64_t in, int64_t out) {
  std::vector<AxisTap> taps(size_t(std::max<int64_t>(out, 0)));
  if (in == out) {
    for (int64_t o = 0; o < out; ++o) taps[size_t(o)] = {o, o, 1.0f, 0.0f};
    return taps;
  }
  const float scale = float(in) / float(out);  // area_pixel_compute_scale (no scale_factor given)
  for (int64_t o = 0; o < out; ++o) {
    float src = scale * (float(o) + 0.5f) - 0.5f;
    if (src < 0.0f) src = 0.0f;
    AxisTap t;
    t.i0 = std::min<int64_t>(int64_t(std::floor(src)), in - 1);
    t.l1 = std::min(std::max(src - float(t.i0), 0.0f), 1.0f);
    t.i1 = t.i0 + (t.i0 < in - 1 ? 1 : 0);
    t.l0 = 1.0f - t.l1;
    taps[size_t(o)] = t;
  }
  return taps;
}

}  // namespace

std::vector<float> resize_bilinear_chw(const float* src, int64_t channels, int64_t in_h, int64_t in_w, int64_t out_h,
                                       int64_t out_w) {
  std::vector<float> out(size_t(channels * out_h * out_w));
  const std::vector<AxisTap> th = axis_taps(in_h, out_h), tw = axis_taps(in_w, out_w);
  for (int64_t c = 0; c < channels; ++c) {
    const float* s = src + c * in_h * in_w;
    float* d = out.data() + c * out_h * out_w;
    for (int64_t oh = 0; oh < out_h; ++oh) {
      const AxisTap& h = th[size_t(oh)];
      const float* r0 = s + h.i0 * in_w;
      const float* r1 = s + h.i1 * in_w;
      for (int64_t ow = 0; ow < out_w; ++ow) {
        const AxisTap& w = tw[size_t(ow)];
        const float w00 = h.l0 * w.l0, w01 = h.l0 * w.l1, w10 = h.l1 * w.l0, w11 = h.l1 * w.l1;
        // Same association as PyTorch's scalar loop: ((a·w00 + b·w01) + c·w10) + d·w11.
        float v = r0[w.i0] * w00;
        v = v + r0[w.i1] * w01;
        v = v + r1[w.i0] * w10;
        v = v + r1[w.i1] * w11;
        d[oh * out_w + ow] = v;
      }
    }
  }
  return out;
}

void resize_with_pad_size(int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w, int64_t* resized_h,
                          int64_t* resized_w) {
  const double ratio = std::max(double(in_w) / double(out_w), double(in_h) / double(out_h));
  *resized_h = int64_t(double(in_h) / ratio);
  *resized_w = int64_t(double(in_w) / ratio);
}

std::vector<float> resize_with_pad_chw(const float* src, int64_t channels, int64_t in_h, int64_t in_w, int64_t out_h,
                                       int64_t out_w) {
  int64_t rh = 0, rw = 0;
  resize_with_pad_size(in_h, in_w, out_h, out_w, &rh, &rw);
  // A tiny axis can round to 0 (e.g. 1×1000 into 224): PyTorch refuses an empty output; keep one
  // row/column so the image stays defined (callers reject such frames before they get here).
  rh = std::clamp<int64_t>(rh, 1, out_h);
  rw = std::clamp<int64_t>(rw, 1, out_w);
  std::vector<float> resized = resize_bilinear_chw(src, channels, in_h, in_w, rh, rw);
  for (float& v : resized) v = std::min(std::max(v, 0.0f), 1.0f);  // clamp (NaN stays NaN, as torch)
  const int64_t top = (out_h - rh) / 2, left = (out_w - rw) / 2;
  std::vector<float> out(size_t(channels * out_h * out_w), 0.0f);
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t y = 0; y < rh; ++y)
      std::copy_n(resized.data() + (c * rh + y) * rw, rw, out.data() + (c * out_h + top + y) * out_w + left);
  return out;
}

}  // namespace vlac
