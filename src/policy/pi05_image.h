// Camera-frame preparation for pi0.5 exactly as lerobot does it: uint8 -> float/255, HWC -> CHW,
// resize-with-pad (aspect kept, bilinear, half-pixel centres, no antialias, clamp to [0,1],
// centred zero padding). Pure functions on host buffers; no file access, no policy knowledge.
#pragma once

#include <cstdint>
#include <vector>

namespace vlac {

/// torch.nn.functional.interpolate(mode="bilinear", align_corners=False, antialias=False) of a
/// float CHW image to [C, out_h, out_w], computed in float32 as PyTorch's CPU kernel does
/// (source index = (dst + 0.5)·in/out − 0.5 clamped at 0, index and weight per axis, the four
/// weights multiplied first). An axis whose size does not change is copied exactly.
std::vector<float> resize_bilinear_chw(const float* src, int64_t channels, int64_t in_h, int64_t in_w, int64_t out_h,
                                       int64_t out_w);

/// The size lerobot's resize_with_pad_torch resizes an in_h × in_w image to before padding
/// it to out_h × out_w: ratio = max(in_w/out_w, in_h/out_h) (double), int(in/ratio) per axis.
void resize_with_pad_size(int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w, int64_t* resized_h,
                          int64_t* resized_w);

/// lerobot's resize_with_pad_torch on a float32 CHW image: bilinear resize to the aspect-kept
/// size, clamp to [0, 1], zero padding centred (top/left = floor(pad/2), bottom/right the rest).
/// Returns [C, out_h, out_w].
std::vector<float> resize_with_pad_chw(const float* src, int64_t channels, int64_t in_h, int64_t in_w, int64_t out_h,
                                       int64_t out_w);

}  // namespace vlac
