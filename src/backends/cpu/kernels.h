// CPU reference kernels: plain functions over pointers + shapes, fp32 math (bf16 weights are
// widened to fp32, fp32 accumulation). They never allocate: callers pass scratch sized by the
// *_scratch_floats() helpers, so an engine can plan every buffer once at load time.
//
// Pointer parameters are borrowed for the duration of the call; nothing is retained. Inputs and
// outputs must not overlap unless a function says "in place". Shapes are row-major, outermost
// first. Sizes come from our own graph (validated at build time), so bad sizes are VLAC_CHECKed;
// values read from files (token ids) return a Status instead.
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_isa.h"
#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cpu {

/// lerobot/openpi's additive mask value (not -inf): masked logits get exactly zero probability
/// when the row has at least one allowed key; a fully masked row becomes uniform, as in lerobot.
constexpr float kMaskValue = -2.3819763e38f;

/// Threads for everything below (OpenMP: oneDNN's matmuls and the loops here) on the calling
/// thread. Kernels split work only past kParallelMinElems elements, and every element is computed
/// the same way whatever the split, so results do not depend on the thread count except through
/// oneDNN's GEMM blocking.
void set_num_threads(int n);
constexpr int64_t kParallelMinElems = 16384;

// ---------------------------------------------------------------------------------------------
// Matmul (the executor's Linear nodes use DnnlLinear, see dnnl_linear.h)

/// y[M,N] = x[M,K] · W[N,K]ᵀ (+ b[N]); oneDNN's sgemm. b may be null.
void linear_f32(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n);
/// y[N] = W[N,K] · x[K] (+ b[N]) with W fp32 or bf16 (`w_bf16`), fp32 accumulation in a fixed
/// order per output (rows split across threads).
void gemv(const float* x, const void* w, bool w_bf16, const float* b, float* y, int64_t k, int64_t n);
/// y[i] = bf16(x[i]) (round to nearest even), threaded.
void round_to_bf16(const float* x, uint16_t* y, int64_t n);
/// y[i] = fp32(bf16(x[i])): the same rounding kept in fp32 (y may be x), threaded; and the
/// single-threaded form for use inside a parallel region.
void round_to_bf16_f32(const float* x, float* y, int64_t n);
void round_to_bf16_f32_1t(const float* x, float* y, int64_t n);
/// y[i] = fp32(x[i]) for bf16 x (exact), single-threaded.
void widen_bf16(const uint16_t* x, float* y, int64_t n);

/// The ISA whose elementwise/softmax/GEMV kernels run ("avx512", "avx2", "scalar", "neon"):
/// cpu_isa().active, chosen at the first kernel call.
const char* kernel_isa();
/// For tests: switch those kernels to `isa` (an ISA this CPU has); Unsupported names what is
/// missing otherwise.
Status set_kernel_isa(CpuIsa isa);

// ---------------------------------------------------------------------------------------------
// Normalization (statistics in fp32 or better; row = last dim)

/// y[R,D] = (x - mean) / sqrt(var + eps) * w + b   (biased variance, SigLIP LayerNorm).
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t d,
                float eps);
/// y[R,D] = x * rsqrt(mean(x²) + eps) * (1 + w)   (Gemma RMSNorm; stored w is an offset).
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t d, float eps);
/// Adaptive RMSNorm (pi0.5 expert). mod[3D] = [scale | shift | gate] (one vector, broadcast over
/// rows): y[R,D] = n * (1 + scale) + shift with n = x * rsqrt(mean(x²) + eps); gate[D] = mod[2D:3D].
void ada_rms_norm(const float* x, const float* mod, float* y, float* gate, int64_t rows, int64_t d,
                  float eps);

// ---------------------------------------------------------------------------------------------
// Elementwise (in place allowed: y may equal x)

/// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
void gelu_tanh(const float* x, float* y, int64_t n);
/// y = gelu_tanh(gate) * up   (y may equal gate or up)
void geglu(const float* gate, const float* up, float* y, int64_t n);
/// y = x * sigmoid(x)
void silu(const float* x, float* y, int64_t n);
enum class BinaryOp { Add, Sub, Mul };
/// y[n] = a ∘ b with numpy broadcasting of a trailing block: a[i % na], b[i % nb] (na, nb divide n).
void binary_op(BinaryOp op, const float* a, int64_t na, const float* b, int64_t nb, float* y, int64_t n);
/// y = x * s
void scale(const float* x, float s, float* y, int64_t n);

// ---------------------------------------------------------------------------------------------
// Position and time

/// Rotary embedding, rotate-half layout, in place on x[T,H,Dh] (Dh even): for i < Dh/2 with
/// θ_i = base^(-2i/Dh) and a = pos[t]·θ_i (fp32, as HF computes it):
///   x_i' = x_i·cos a − x_{i+Dh/2}·sin a,   x_{i+Dh/2}' = x_{i+Dh/2}·cos a + x_i·sin a.
void rope(float* x, const int64_t* pos, int64_t t, int64_t h, int64_t dh, float base);
/// The same in two steps, for many tensors at the same positions: rope_table fills
/// cs[T, Dh/2, 2] with (cos a, sin a), rope_apply rotates x with it; bit-identical to rope().
void rope_table(const int64_t* pos, int64_t t, int64_t dh, float base, float* cs);
/// y = x rotated (y may be x).
void rope_apply(const float* x, float* y, const float* cs, int64_t t, int64_t h, int64_t dh);
/// memcpy split across the OpenMP threads for large copies (256 KiB and more).
void parallel_copy(void* dst, const void* src, uint64_t bytes);
/// Sin-cos time embedding out[dim] = [sin(t·ω_0..), cos(t·ω_0..)], ω_i = 2π / period_i,
/// period_i = min_period·(max_period/min_period)^(i/(dim/2 − 1)); computed in double -> fp32.
void time_embedding(double t, float* out, int64_t dim, double min_period, double max_period);
/// x[N] += dt · v[N]   (Euler step of the flow-matching ODE, fp32).
void euler_step(float* x, const float* v, float dt, int64_t n);

// ---------------------------------------------------------------------------------------------
// Softmax and attention

/// In place over rows of x[R,N]: max-subtracted, fp32.
void softmax(float* x, int64_t rows, int64_t n);
/// One attention score row in place: softmax(row·scale + mask), the mask row being `allow`
/// (0 → kMaskValue added) or `add` (added) or neither (both null). Single-threaded.
void masked_softmax_row(float* row, int64_t n, float scale, const uint8_t* allow, const float* add);
/// The probabilities of masked_softmax_row rounded to bf16 into `out`, computed in one working
/// copy of the row in L1. `row` is scratch: afterwards it may hold intermediate values. Single-threaded.
void masked_softmax_row_bf16(float* row, uint16_t* out, int64_t n, float scale, const uint8_t* allow, const float* add);
/// The same probabilities rounded to bf16 but kept in fp32, in place (the bf16 attention's
/// fallback where oneDNN has no bf16 matmul). Single-threaded.
void masked_softmax_row_bf16_f32(float* row, int64_t n, float scale, const uint8_t* allow, const float* add);

/// Attention mask: either none, a boolean [T,S] (1 = may attend) or an additive fp32 [T,S].
/// The boolean form is applied as the additive kMaskValue, exactly as lerobot does.
struct AttentionMask {
  const uint8_t* allow = nullptr;  // [T, S] or null
  const float* add = nullptr;      // [T, S] or null
};
/// Scratch floats attention wants for t query tokens of h heads over s keys with `workers` threads
/// (each worker has its own block of scores; one KV head: blocks of all h heads' rows); any value
/// >= s works, fewer floats just mean smaller blocks or fewer workers.
int64_t attention_scratch_floats(int64_t t, int64_t s, int64_t workers = 1, int64_t h = 1);
/// out[T,H,Dv] = softmax(q·kᵀ·scale + mask) · v per query head h, reading KV head h / (H/Hk):
/// q [T,H,Dh], k [S,Hk,Dh], v [S,Hk,Dv]; H % Hk == 0 (pi0.5: Hk = 1, all heads share it).
/// Softmax in fp32; scratch >= attention_scratch_floats(t, s). (head, query block) pairs are
/// spread over min(threads, scratch / block) workers, each with single-threaded sgemm calls.
void attention(const float* q, const float* k, const float* v, AttentionMask mask, float* out,
               int64_t t, int64_t h, int64_t hk, int64_t s, int64_t dh, int64_t dv, float scale,
               float* scratch, int64_t scratch_floats);

// ---------------------------------------------------------------------------------------------
// Embeddings

/// Scratch floats patch_embed needs (the im2col matrix).
int64_t patch_embed_scratch_floats(int64_t c, int64_t y, int64_t x, int64_t kh, int64_t kw);
/// The im2col matrix of patch_embed: cols [Y/kh·X/kw, C·kh·kw], each row one patch in the
/// weight's (C, kh, kw) order. The executor multiplies it with a planned matmul.
void im2col_patches(const float* img, float* cols, int64_t c, int64_t y, int64_t x, int64_t kh, int64_t kw);
/// Conv2d with stride = kernel, no padding, as a matmul: img [C,Y,X], w [O,C,kh,kw], b [O] or null
/// -> out [(Y/kh)·(X/kw), O], patches in row-major order (patch row outer). Partial patches at
/// the bottom/right edge are dropped, like PyTorch.
void patch_embed(const float* img, const float* w, const float* b, float* out, int64_t c,
                 int64_t y, int64_t x, int64_t o, int64_t kh, int64_t kw, float* scratch,
                 int64_t scratch_floats);

/// out[T,D] = table[ids[t], :] · scale for a fp32 table [V,D]. An id outside [0, V) (ids come
/// from observation files) returns InvalidArgument naming its position and value.
Status embedding_f32(const float* table, int64_t v, int64_t d, const int64_t* ids, int64_t t,
                     float scale, float* out);
/// Same for a bf16 table, widened to fp32 before scaling.
Status embedding_bf16(const uint16_t* table, int64_t v, int64_t d, const int64_t* ids, int64_t t,
                      float scale, float* out);
/// The same from an 8-bit table (core/quant.h blob of [v, d]): each row decoded times its scale,
/// then times `scale` (all fp32).
Status embedding_quant(const uint8_t* blob, DType dt, int64_t v, int64_t d, const int64_t* ids, int64_t t, float scale,
                       float* out);

}  // namespace vlac::cpu
