// cuDNN's fused attention (the graph API's SDPA forward operation, cuDNN >= 9.13) as an
// alternative to the own bf16 kernel for unmasked bf16 attention: pi0.5's prefix (968 queries x 8
// heads on one K/V head, head dim 256) and SigLIP (images batched, head dim 72). On sm_90 cuDNN
// runs it with wgmma and TMA where the own kernel is mma.sync (docs/cuda-sessions.md, session 27).
//
// cuDNN is loaded with dlopen at the first call, so the backend neither links it nor needs it: a
// machine without libcudnn.so.9, an older cuDNN or a shape no engine takes answers Unsupported and
// the caller runs its own kernel. Plans are built once per shape, outside stream capture.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace vlac::cuda {

/// The attention's layout in the own kernel's terms: b batches of sq query tokens against skv
/// keys, h query heads sharing hk K/V heads, head dim d; each token's heads side by side in a row
/// of *_stride elements; batches one after another (batch stride = tokens × row stride).
struct CudnnAttentionShape {
  int64_t b = 1, h = 0, hk = 1, sq = 0, skv = 0, d = 0;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, o_stride = 0;
};

/// VLAC_CUDNN_ATTN: 1 = unmasked bf16 attention without key splits (the prefix, SigLIP); 0 = never;
/// 2 = the expert's split attention too (a measurement knob). Unset: 1, or 0 for a `lean` call
/// (AttentionShape::lean: the engines of 8-bit packages, whose 3.5 GiB budget has no room for the
/// ~55 MB of host memory cuDNN's libraries take). Read at every call (host code a recorded chunk
/// does not run again), so one process can take both paths.
int cudnn_attention_setting(bool lean);

/// Enqueues O = softmax(scale · Q·Kᵀ)·V with bf16 q, k, v, out (16-byte aligned) on `stream`:
/// fp32 scores and softmax, probabilities in bf16 for P·V, fp32 sums (lerobot's bf16 mode, as the
/// own kernel). Unsupported when cuDNN is not there or no engine takes the shape; a shape's first
/// call may not run inside a stream capture (its plan is built then).
Status cudnn_attention(cudaStream_t stream, const CudnnAttentionShape& shape, const void* q, const void* k,
                       const void* v, void* out, float scale);

/// "cuDNN 9.19.0" when it loaded, else why not (for logs and test skips).
std::string cudnn_attention_library();

}  // namespace vlac::cuda
