// CUDA kernels of the pi0.5 forward, below the backend seam: plain launchers over device pointers
// and sizes that enqueue on the caller's stream and return without waiting. They never allocate:
// what needs scratch says how much (*_scratch_bytes) and takes it from the caller, so an engine can
// plan one device arena at load and capture a chunk in a CUDA graph.
//
// Semantics mirror the CPU kernels in backends/cpu/kernels.h function by function (the op-by-op
// harness in tests/cuda checks each against them). Activations are F32 or BF16 (vlac::DType); the
// math is fp32 everywhere, and a BF16 output is rounded to nearest-even once at the point where
// lerobot's bf16 mode rounds (each function says where). Weights of norms are fp32, as lerobot
// keeps them in its bf16 mode. Shapes are row-major, outermost first.
//
// Errors are values: bad sizes or dtypes return InvalidArgument/Unsupported before anything is
// launched; a failed launch returns Backend "<kernel>: <CUDA error string>". A launch error can
// also be a sticky error of an earlier asynchronous failure (CUDA reports those late).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cuda {

/// Whether vlac's kernels launch with programmatic dependent launch (common.cuh's launch()):
/// sm_90 and later, unless VLAC_CUDA_PDL=0.
bool pdl_enabled();

// An L2 access-policy window that the launches made while it is set carry (a launch attribute,
// so recorded graphs keep it): what they read inside it is kept in L2's persisting part, which
// the streaming of other data does not evict. The executor sets it around the expert attention
// (VLAC_KV_PERSIST_MIB, executor.cpp): the prefix keys and values every step reads again.
struct L2Window {
  const void* base = nullptr;
  size_t bytes = 0;  // 0: no window
  float hit_ratio = 1.0f;
};
const L2Window& current_l2_window();
/// Sets the window for this thread's launches; returns the one it replaces.
L2Window set_l2_window(const L2Window& w);
/// Sets w (when it has bytes) for the launches of its lifetime, then restores the one before.
class ScopedL2Window {
 public:
  explicit ScopedL2Window(const L2Window& w) : set_(w.bytes != 0) {
    if (set_) was_ = set_l2_window(w);
  }
  ~ScopedL2Window() {
    if (set_) set_l2_window(was_);
  }
  ScopedL2Window(const ScopedL2Window&) = delete;
  ScopedL2Window& operator=(const ScopedL2Window&) = delete;

 private:
  L2Window was_;
  bool set_;
};
/// Launches that carried a window so far (for tests).
uint64_t l2_window_launches();
void note_l2_window_launch();

/// lerobot/openpi's additive mask value (the CPU backend's kMaskValue).
constexpr float kMaskValue = -2.3819763e38f;

/// Ok when a CUDA device can be used; otherwise Backend "no CUDA device: <cudaGetErrorString>".
Status device_status();
/// Multiprocessors of the current device (attention_splits wants it); 0 when there is no device.
int device_sm_count();
/// The current device's compute capability as 10·major + minor (90 for sm_90); 0 without one.
int device_compute_capability();

// ---------------------------------------------------------------------------------------------
// Casts and small elementwise ops (n elements; in place allowed where the dtypes agree)

/// y = x converted (F32 <-> BF16, or a copy); F32 -> BF16 rounds to nearest even, NaN stays NaN.
Status cast(cudaStream_t stream, const void* x, DType xt, void* y, DType yt, int64_t n);
/// Rows [row0, row0 + rows) of an 8-bit weight blob (core/quant.h) of [n, k] widened for a bf16
/// GEMM: out[(r - row0)·k + c] = bf16(decode(code[r][c]) · scale[r]). I8 and F8_E4M3. With
/// scaled = false the codes alone (exact in bf16: |int8| ≤ 127, e4m3 has 4 significant bits), for
/// a GEMM whose fp32 sums scale_columns multiplies by the row scales.
Status dequant_bf16(cudaStream_t stream, const void* blob, DType dt, int64_t n, int64_t k, int64_t row0, int64_t rows,
                    void* out, bool scaled = true);
/// One 8-bit matrix to widen whole (dequant_bf16_many).
struct DequantJob {
  const void* blob = nullptr;
  DType dt = DType::I8;
  int64_t n = 0, k = 0;
  void* out = nullptr;
  bool scaled = true;  // false: the codes alone (dequant_bf16's scaled)
};
inline constexpr int kMaxDequantJobs = 8;
/// Up to kMaxDequantJobs matrices widened as dequant_bf16 does, in one launch where each has
/// k % 16 == 0 and 16-byte aligned pointers (else one launch each).
Status dequant_bf16_many(cudaStream_t stream, const DequantJob* jobs, int count);
/// The fp32 sums t[m, n] (row stride ldt) of a GEMM over unscaled codes, finished as the GEMM's
/// epilogue would: y[i·ldy + j] = [gelu](scale[j]·t[i·ldt + j] + (accumulate ? y[i·ldy + j] : 0)
/// + bias[j]), rounded once to yt (BF16 or F32; the bias has yt too, null for none). t may be y
/// itself (in place, same strides). scale = the blob's per-row scales of the slice's rows.
Status scale_columns(cudaStream_t stream, const float* t, int64_t ldt, int64_t m, int64_t n, const float* scale,
                     const void* bias, bool gelu, bool accumulate, void* y, DType yt, int64_t ldy);
/// FP8 W8A8's activations: each row i < m of x (F32 or BF16, row stride ldx elements) as e4m3
/// codes (codes[i·k + c], nearest even, saturating) times scales[i] = max|row| / 448: codes =
/// e4m3(x · (448 / max|row|)), as f32_to_f8e4m3 on the host. A zero row: zero codes and scale 0;
/// a row holding NaN: scale NaN. One block a row.
Status quantize_rows_e4m3(cudaStream_t stream, const void* x, DType xt, int64_t m, int64_t k, int64_t ldx, void* codes,
                          float* scales);
/// The per-row scales of an 8-bit blob of [n, k] (core/quant.h: after the codes).
const float* quant_row_scales(const void* blob, int64_t n, int64_t k);
/// The same over rows: y[r·y_stride + c] = x[r·x_stride + c] for r < rows, c < cols (a column
/// slice of a fused output written into a concatenation, converted on the way).
Status cast_rows(cudaStream_t stream, const void* x, DType xt, int64_t x_stride, void* y, DType yt, int64_t y_stride,
                 int64_t rows, int64_t cols);
/// y = gelu_tanh(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), rounded once to yt.
Status gelu_tanh(cudaStream_t stream, const void* x, DType xt, void* y, DType yt, int64_t n);
/// y[R,F] = gelu_tanh(gate) ⊙ up, where gate and up rows are `in_stride` elements apart (a fused
/// gate+up GEMM output [R, 2F] is gate = p, up = p + F, in_stride = 2F). With BF16 inputs the
/// GELU is rounded to bf16 before the product, as torch computes it in bf16. y rows are `y_stride`
/// elements apart (0: f). y may be gate itself (in place: y_stride = in_stride, yt = it): each
/// element is read and written by one thread only.
Status geglu(cudaStream_t stream, const void* gate, const void* up, DType it, int64_t in_stride, void* y,
             DType yt, int64_t rows, int64_t f, int64_t y_stride = 0);
/// GeGLU as geglu (y rounded as yt would store it) straight into an FP8 GEMM's x: e4m3 codes
/// [rows, f] and one scale a row, the same bits as geglu then quantize_rows_e4m3, y not written.
/// Where geglu_codes_fit(f, in_stride) and gate/up are 16-byte, codes 8-byte aligned
/// (Unsupported otherwise).
Status geglu_e4m3(cudaStream_t stream, const void* gate, const void* up, DType it, int64_t in_stride, DType yt,
                  int64_t rows, int64_t f, void* codes, float* scales);
bool geglu_codes_fit(int64_t f, int64_t in_stride);
/// x[N] += dt · v[N] (Euler step, fp32).
Status euler_step(cudaStream_t stream, float* x, const float* v, float dt, int64_t n);
/// y[N] = x + dt · v (the same step out of place: no copy of x first).
Status euler_step_to(cudaStream_t stream, const float* x, const float* v, float dt, float* y, int64_t n);

enum class BinaryKind { Add, Sub, Mul };
/// y[N] = a ∘ b with a [na], b [nb] repeated over y (the CPU's binary_op: each operand is the whole
/// tensor or a block it repeats, e.g. a bias or gate row; fp32, one rounding per element).
Status binary_op(cudaStream_t stream, BinaryKind op, const float* a, int64_t na, const float* b, int64_t nb, float* y,
                 int64_t n);
/// y = x · s (fp32).
Status scale(cudaStream_t stream, const float* x, float s, float* y, int64_t n);
/// y = x / (1 + exp(−x)) (fp32).
Status silu(cudaStream_t stream, const float* x, float* y, int64_t n);
/// out[dim] = sin | cos of t[0] (a device scalar) at periods min_period·(max/min)^(i/(dim/2−1)),
/// in double as the CPU's time_embedding, rounded to fp32.
Status time_embedding(cudaStream_t stream, const float* t, float* out, int64_t dim, double min_period,
                      double max_period);

// ---------------------------------------------------------------------------------------------
// Normalization (one block per row; statistics in fp32, row = last dim)

/// y = x · rsqrt(mean(x²) + eps) · (1 + w)   (Gemma RMSNorm; stored w is an offset).
Status rms_norm(cudaStream_t stream, const void* x, DType xt, const float* w, void* y, DType yt, int64_t rows,
                int64_t d, float eps);
/// Adaptive RMSNorm (pi0.5 expert): mod[3D] = [scale | shift | gate] broadcast over rows,
/// y = n·(1 + scale) + shift with n = x · rsqrt(mean(x²) + eps). The gate is mod + 2D (no copy).
Status ada_rms_norm(cudaStream_t stream, const void* x, DType xt, const float* mod, void* y, DType yt,
                    int64_t rows, int64_t d, float eps);
/// y = (x − mean)/sqrt(var + eps) · w + b   (biased variance; SigLIP LayerNorm).
Status layer_norm(cudaStream_t stream, const void* x, DType xt, const float* w, const float* b, void* y,
                  DType yt, int64_t rows, int64_t d, float eps);

/// The norm that follows a residual add in residual_norm.
enum class NormKind { None, Rms, AdaRms, Layer };
struct NormArgs {
  NormKind kind = NormKind::None;
  const float* w = nullptr;    // Rms, Layer: weight [D]
  const float* b = nullptr;    // Layer: bias [D]
  const float* mod = nullptr;  // AdaRms: [3D] = scale | shift | gate
  float eps = 1e-6f;
  // Set (both): y is not written; each row of norm(h), rounded as yt stores it, goes out as e4m3
  // codes [rows, d] and one scale a row, quantize_rows_e4m3's arithmetic and bits (an FP8 GEMM's
  // x). Where residual_norm_codes_fit(d) and codes is 4-byte aligned; Unsupported otherwise.
  uint8_t* codes = nullptr;
  float* code_scales = nullptr;
};
/// Whether residual_norm_to can write e4m3 codes for rows of d elements (NormArgs::codes).
bool residual_norm_codes_fit(int64_t d);
/// The gated residual with the next norm fused: h[R,D] += branch ⊙ gate (gate [D] fp32 broadcast
/// over rows; null: plain h += branch), then y = norm(h) (nothing for NormKind::None). With a BF16
/// residual stream h, gate·branch and the sum are each rounded to bf16 (torch in bf16: the gate is
/// cast to the activation dtype, then `h + y * gate`); F32 h keeps fp32.
Status residual_norm(cudaStream_t stream, void* h, DType ht, const void* branch, DType bt, const float* gate,
                     const NormArgs& norm, void* y, DType yt, int64_t rows, int64_t d);
/// The same with the sum written to another buffer: h = h_in + branch ⊙ gate (h may be h_in;
/// otherwise no overlap), y = norm(h). The executor's fused Mul? + Add + norm. With
/// branch_parts > 1 the branch is that many partial sums `part_stride` elements apart (a GEMM's
/// K parts, GemmDesc::k_parts), added in order before the gate.
Status residual_norm_to(cudaStream_t stream, const void* h_in, void* h, DType ht, const void* branch, DType bt,
                        const float* gate, const NormArgs& norm, void* y, DType yt, int64_t rows, int64_t d,
                        int branch_parts = 1, int64_t part_stride = 0);

// ---------------------------------------------------------------------------------------------
// Position embedding

/// Rotary embedding in place, rotate-half layout, on t tokens × h heads × dh, token rows
/// `row_stride` elements apart (a fused QKV output [T, 2560] holds q (8 heads) and k (1 head)
/// side by side: h = 9, row_stride = 2560). pos [T] int64 on the device. Angles as the CPU's
/// rope_table: inv_freq_i = 1/float(base^(2i/dh)) (double), a = float(pos)·inv_freq_i (fp32);
/// the rotation in fp32, rounded once to xt.
Status rope(cudaStream_t stream, void* x, DType xt, int64_t row_stride, const int64_t* pos, int64_t t, int64_t h,
            int64_t dh, float base);
/// The same rotation out of place: x rows `x_stride` apart in xt, y rows `y_stride` apart in yt
/// (y = x is in place; otherwise they must not overlap). Rounded once to yt, so an F32 x written
/// as BF16 y equals rope in F32 followed by a cast.
Status rope_to(cudaStream_t stream, const void* x, DType xt, int64_t x_stride, void* y, DType yt, int64_t y_stride,
               const int64_t* pos, int64_t t, int64_t h, int64_t dh, float base);

/// One rotation of rope_pair_to: rows of x `x_stride` apart, h heads, into y rows `y_stride` apart.
struct RopeJob {
  const void* x = nullptr;
  int64_t x_stride = 0;
  void* y = nullptr;
  int64_t y_stride = 0;
  int64_t h = 0;
};
/// t rows of `cols` elements, x rows `x_stride` apart into y rows `y_stride` apart (cast_rows).
struct RowCopyJob {
  const void* x = nullptr;
  int64_t x_stride = 0;
  void* y = nullptr;
  int64_t y_stride = 0;
  int64_t cols = 0;
};
/// Two rope_to calls with the same positions, token count, head dim and dtypes in one launch (the
/// expert's q and k, both read from the fused q|k|v output): the same bits as the two calls.
/// `copy` (may be null) adds a cast_rows of t rows in the same dtypes to the launch (the
/// expert's v, from the same fused output into its K/V buffer).
/// `early_dependents`: the next kernel in the stream may launch as soon as this one's blocks have
/// all started (griddepcontrol.launch_dependents), for a successor with loads that do not depend
/// on it (an attention with AttentionShape::stable_keys); it still waits for this one's results.
Status rope_pair_to(cudaStream_t stream, const RopeJob& a, const RopeJob& b, DType xt, DType yt, const int64_t* pos,
                    int64_t t, int64_t dh, float base, const RowCopyJob* copy = nullptr, bool early_dependents = false);

/// The prefix LM's q, k and v of one layer in one launch: q's heads rotated into bf16 (what the
/// bf16 attention reads), k's rotated into f32 (the K cache the expert reads) and into a bf16
/// copy, v's rows copied into f32 (the V cache) and a bf16 copy. The same bits as rope_to (q),
/// rope_to + cast (k) and a slice copy + cast (v). All inputs f32 rows of a fused q|k|v output.
struct RopeQkvJob {
  const float* q = nullptr;  // q rows (hq heads), q_stride apart
  int64_t q_stride = 0;
  uint16_t* qo = nullptr;    // bf16, qo_stride apart
  int64_t qo_stride = 0;
  int64_t hq = 0;
  const float* k = nullptr;  // k rows (hk heads)
  int64_t k_stride = 0;
  float* ko = nullptr;       // f32, ko_stride apart
  int64_t ko_stride = 0;
  uint16_t* kb = nullptr;    // bf16 copy, kb_stride apart
  int64_t kb_stride = 0;
  int64_t hk = 0;
  const float* v = nullptr;  // v rows of vc columns
  int64_t v_stride = 0;
  float* vo = nullptr;
  int64_t vo_stride = 0;
  uint16_t* vb = nullptr;
  int64_t vb_stride = 0;
  int64_t vc = 0;
};
Status rope_qkv_to(cudaStream_t stream, const RopeQkvJob& job, const int64_t* pos, int64_t t, int64_t dh, float base);

/// The angles of rope_to for t tokens (pos [T] int64): sc[(t·dh/2 + i)·2] = sin, + 1 = cos, the
/// same bits the rotating kernels compute. The attention's fused RoPE (AttentionRope) reads them.
Status rope_sincos(cudaStream_t stream, const int64_t* pos, int64_t t, int64_t dh, float base, float* sc);

// ---------------------------------------------------------------------------------------------
// Embeddings

/// The im2col matrix of a stride = kernel conv (the CPU's im2col_patches): img [C,Y,X] fp32 ->
/// cols [(Y/kh)·(X/kw), C·kh·kw] in ct (BF16 rounds), each row one patch in (C, kh, kw) order.
/// The patch embedding is then one GEMM with the conv weight [O, C·kh·kw] (Gemm, bias epilogue).
Status im2col_patches(cudaStream_t stream, const float* img, void* cols, DType ct, int64_t c, int64_t y, int64_t x,
                      int64_t kh, int64_t kw);
/// out[T,D] = table[ids[t], :] · scale, the product in fp32 and rounded once to ot. table [V,D] in
/// tt (F32 or BF16) on the device (or host-mapped, readable by the device); ids [T] int64 on the
/// device. An id outside [0, V) writes a zero row and sets *bad (if not null) to 1 + its position;
/// check ids on the host with check_token_ids before uploading them, as the CPU does.
Status embedding(cudaStream_t stream, const void* table, DType tt, int64_t v, int64_t d, const int64_t* ids,
                 int64_t t, float scale, void* out, DType ot, int* bad);
/// InvalidArgument naming the position and value of the first id outside [0, V) (host ids).
Status check_token_ids(const int64_t* ids, int64_t t, int64_t v);

// ---------------------------------------------------------------------------------------------
// Attention

/// Sizes of out[T,H,Dv] = softmax(q·kᵀ·scale + mask) · v, with q [T,H,Dh], k [S,Hk,Dh], v [S,Hk,Dv]
/// and H % Hk == 0 (query head i reads KV head i / (H/Hk); pi0.5's Gemmas: Hk = 1, H = 8).
/// Strides are the elements between consecutive tokens' rows (0: dense, i.e. H·Dh, Hk·Dh, Hk·Dv,
/// H·Dv), so q/k/v can be slices of a fused QKV output and k/v a K/V cache with room for more keys.
struct AttentionShape {
  int64_t t = 0, h = 0, hk = 1, s = 0, dh = 0, dv = 0;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, o_stride = 0;
  /// > 0: block-diagonal (images batched along T = S, no mask): query t sees keys of its block
  /// [t/kv_block·kv_block, +kv_block) only.
  int64_t kv_block = 0;
  /// Memory before speed (an engine of 8-bit weights): cuDNN's attention only where
  /// VLAC_CUDNN_ATTN asks for it (cudnn_attention.h), since loading cuDNN costs host memory.
  bool lean = false;
  /// Keys [0, stable_keys) of k and v were written before the kernel that precedes this call in
  /// the stream (pi0.5's prefix keys at a denoising step): a key split that lies wholly inside
  /// them issues its K/V loads before it waits for that kernel (programmatic dependent launch),
  /// so they overlap it. 0: every load waits. No effect on the result.
  int64_t stable_keys = 0;
};
/// Mask as the CPU's AttentionMask: a boolean [T,S] (1 = may attend; 0 adds kMaskValue) or an
/// additive fp32 [T,S], device pointers; `allow` wins when both are given, as on the CPU. A fully
/// masked row becomes uniform over all S keys, exactly as with lerobot's additive mask.
struct AttentionMask {
  const uint8_t* allow = nullptr;
  const float* add = nullptr;
};
/// How the keys are split across blocks for this shape on a GPU with `num_sms` multiprocessors
/// (1 = no split). Few query rows (the expert's 50 tokens × 8 heads) get several splits so the
/// grid fills the GPU; their partial results are merged by a second small kernel.
int attention_splits(const AttentionShape& shape, DType io, int num_sms);
/// Scratch bytes attention() needs with `splits` (0 for splits = 1); 16-byte aligned.
uint64_t attention_scratch_bytes(const AttentionShape& shape, DType io, int splits);
/// io = BF16: q, k, v are bf16; tensor-core kernel (mma.sync m16n8k16), fp32 scores, scale and
/// mask in fp32, online softmax in fp32, probabilities rounded to bf16 before P·V, fp32
/// accumulation; needs dh == dv ∈ {72, 256}. All query heads sharing a KV head are packed as the
/// rows of one tile, so each K/V tile is read once for all of them.
/// io = F32: q, k, v fp32, all fp32 (exact-parity mode), any dh = dv ≤ 256.
/// out is [T,H,Dv] in ot (F32 or BF16). Row strides and pointers must be 16-byte aligned (BF16).
/// The bf16 kernel's shared-memory limit is raised once per process, i.e. for the device current
/// at the first call (one GPU per process today).
/// The expert's RoPE inside its attention (io = BF16, dh = dv even, no kv_block): q is read from
/// f32 rows before rotation and rotated as it loads, and key rows s - t .. s - 1 (the step's own
/// keys and values, token order) from f32 rows too, k rotated; the rows of k and v below come
/// from the bf16 K/V as usual, and the q/k/v pointers' rows of those tokens are never read. The
/// same bits as rope_to / rope_pair_to into bf16 followed by the attention on what they wrote.
struct AttentionRope {
  const float* q = nullptr;   // [t, h·dh] rows q_stride apart (16-byte aligned, stride % 4 == 0)
  int64_t q_stride = 0;
  const float* k = nullptr;   // [t, hk·dh] rows k_stride apart
  int64_t k_stride = 0;
  const float* v = nullptr;   // [t, hk·dv] rows v_stride apart
  int64_t v_stride = 0;
  const float* sc = nullptr;  // rope_sincos of the t tokens' positions
};
Status attention(cudaStream_t stream, const AttentionShape& shape, DType io, const void* q, const void* k,
                 const void* v, AttentionMask mask, void* out, DType ot, float scale, int splits, void* scratch,
                 uint64_t scratch_bytes, const AttentionRope* rope = nullptr);

/// Reads `bytes` at p (16-byte aligned device memory, read only) so that what was in the L2 cache
/// before is evicted: GEMM candidates are timed on weights coming from HBM, as in a chunk where
/// every layer's weights are read once (GemmRunner's cold timing). `sink` (4 bytes, may be null)
/// is never written in practice.
Status l2_flush(cudaStream_t stream, const void* p, uint64_t bytes, void* sink);
/// One thread that holds the stream until *flag (device view of host-mapped memory) is non-zero
/// or max_ns have passed (so a host that blocks meanwhile cannot deadlock): the profiler
/// (op_profile.h) enqueues a whole run behind it, so its events time the GPU, not the launches.
Status hold_stream(cudaStream_t stream, const int* flag, uint64_t max_ns);

}  // namespace vlac::cuda
