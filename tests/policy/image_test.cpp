// Resize-with-pad against lerobot's own resize_with_pad_torch (fixture made by
// tools/make_resize_fixtures.py) and edge cases: upscale, downscale, non-square, no-op sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "io/safetensors.h"
#include "policy/pi05_image.h"

using namespace vlac;

namespace {

std::vector<float> synthetic(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(double((i * 37) % 101) / 100.0);
  return x;
}

}  // namespace

TEST(ResizeWithPad, MatchesLerobotTorch) {
  auto f = SafetensorsFile::open(std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/preprocessing/resize_with_pad.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  int cases = 0;
  for (const TensorInfo& t : f->tensors()) {
    int c, h, w, r;
    ASSERT_EQ(std::sscanf(t.name.c_str(), "out.%d.%d.%d.%d", &c, &h, &w, &r), 4) << t.name;
    std::vector<float> want(size_t(t.numel()));
    std::memcpy(want.data(), f->data(t), t.nbytes());
    const std::vector<float> x = synthetic(int64_t(c) * h * w);
    const std::vector<float> got = resize_with_pad_chw(x.data(), c, h, w, r, r);
    ASSERT_EQ(got.size(), want.size()) << t.name;
    double d = 0;
    size_t exact = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      d = std::max(d, double(std::fabs(got[i] - want[i])));
      exact += got[i] == want[i];
    }
    EXPECT_LE(d, 1e-6) << t.name;
    std::printf("[ resize   ] %s: max |d| %.3g, %zu of %zu bit-exact\n", t.name.c_str(), d, exact, got.size());
    ++cases;
  }
  EXPECT_EQ(cases, 5);
}

TEST(ResizeWithPad, SizesKeepAspectAndTruncate) {
  int64_t h, w;
  resize_with_pad_size(30, 50, 40, 40, &h, &w);  // wide: width fills, height int(30/1.25)
  EXPECT_EQ(h, 24);
  EXPECT_EQ(w, 40);
  resize_with_pad_size(64, 48, 40, 40, &h, &w);  // tall
  EXPECT_EQ(h, 40);
  EXPECT_EQ(w, 30);
  resize_with_pad_size(70, 90, 56, 56, &h, &w);  // int(70 / (90/56)) = int(43.55...)
  EXPECT_EQ(h, 43);
  EXPECT_EQ(w, 56);
  resize_with_pad_size(10, 10, 224, 224, &h, &w);  // upscale
  EXPECT_EQ(h, 224);
  EXPECT_EQ(w, 224);
}

TEST(ResizeWithPad, NonSquarePadsCentredWithZero) {
  // A constant 1.0 image 2 high x 8 wide into 8x8: resized 2x8, rows 0-2 and 5-7 are padding.
  std::vector<float> x(size_t(3 * 2 * 8), 1.0f);
  std::vector<float> y = resize_with_pad_chw(x.data(), 3, 2, 8, 8, 8);
  for (int c = 0; c < 3; ++c)
    for (int r = 0; r < 8; ++r)
      for (int col = 0; col < 8; ++col) EXPECT_EQ(y[size_t((c * 8 + r) * 8 + col)], (r == 3 || r == 4) ? 1.0f : 0.0f);
  // Odd padding: 3 high into 8 -> top 2, bottom 3 (floor on the top/left side, as lerobot).
  std::vector<float> x3(size_t(1 * 3 * 8), 1.0f);
  std::vector<float> y3 = resize_with_pad_chw(x3.data(), 1, 3, 8, 8, 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(y3[size_t(r * 8)], (r >= 2 && r <= 4) ? 1.0f : 0.0f) << r;
  // Tall: 8 high x 3 wide -> left 2, right 3.
  std::vector<float> y4 = resize_with_pad_chw(x3.data(), 1, 8, 3, 8, 8);
  for (int col = 0; col < 8; ++col) EXPECT_EQ(y4[size_t(col)], (col >= 2 && col <= 4) ? 1.0f : 0.0f) << col;
}

TEST(ResizeWithPad, ClampsAfterResizeAndCopiesSameSize) {
  // Values outside [0, 1] are clamped once the image is resized (lerobot clamps float images).
  std::vector<float> x{-0.5f, 2.0f, 0.25f, 0.75f};  // 1 channel, 2x2
  std::vector<float> up = resize_with_pad_chw(x.data(), 1, 2, 2, 4, 4);
  for (float v : up) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
  }
  // Same size on both axes: exact copy by the bilinear kernel itself.
  std::vector<float> same = resize_bilinear_chw(x.data(), 1, 2, 2, 2, 2);
  EXPECT_EQ(same, x);
  // Upscale 2x of a ramp: half-pixel centres give 0, 0.25, 0.75, 1 along the axis.
  std::vector<float> ramp{0.0f, 1.0f};
  std::vector<float> r4 = resize_bilinear_chw(ramp.data(), 1, 1, 2, 1, 4);
  EXPECT_EQ(r4, (std::vector<float>{0.0f, 0.25f, 0.75f, 1.0f}));
  // Downscale 4 -> 2 averages neighbour pairs (no antialias: only 2 taps).
  std::vector<float> d4{0.0f, 1.0f, 2.0f, 3.0f};
  std::vector<float> r2 = resize_bilinear_chw(d4.data(), 1, 1, 4, 1, 2);
  EXPECT_EQ(r2, (std::vector<float>{0.5f, 2.5f}));
}
