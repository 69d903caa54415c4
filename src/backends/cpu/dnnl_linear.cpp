// DnnlLinear: oneDNN matmul over plain-layout weights (format "ba" = W[N,K] row-major seen as
// Wᵀ[K,N]). Executed through the C API with a fixed argument array whose handles are rebound per
// call, so run() builds no containers. dnnl::error is caught here (no exceptions escape src/).
//
// bf16 weights where oneDNN has no bf16 matmul (AVX2, arm64; use_bf16_fallback()): the
// activations are rounded to bf16 and kept in fp32 (the same rounding point as the bf16 matmul),
// W stays bf16 in memory (half the bytes read) and products and sums are fp32. On AVX2 and above
// (weights [N,K]) the register-blocked kernel of bf16_gemm.h widens W in registers. Elsewhere
// (the scalar cap, arm64, weights [K,N]) the blocked path: W is walked in blocks of nb output
// rows, each thread widens its block to fp32 (exact) in its own scratch, sized to stay in L2,
// and multiplies it with a single-threaded fp32 sgemm.
#include "backends/cpu/dnnl_linear.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include <dnnl.h>
#include <dnnl.hpp>

#include "backends/cpu/bf16_gemm.h"
#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/quant_gemm.h"
#include "core/quant.h"
#include "core/dtype.h"

namespace vlac::cpu {
namespace {

constexpr uint64_t kAlign = 64;

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

struct DnnlLinear::Impl {
  int64_t m = 0, k = 0, n = 0;
  bool bf16 = false, bias = false;
  bool gemv = false;  // M = 1 (the expert's time modulations): our own GEMV, see create()
  // bf16 weights without a oneDNN bf16 matmul: `blocked` (the file comment) or, with packed
  // weights, an fp32 matmul over W widened once (`f32_src`: x is rounded to bf16 in fp32).
  bool blocked = false, f32_src = false;
  bool micro = false;  // blocked on bf16_gemm_nk (AVX2): x staged in its layout, no W blocks
  // 8-bit weights (core/quant.h): I8 or F8_E4M3 codes + per-row scales, gemv or blocked.
  DType quant = DType::F32;  // F32: none
  bool e4m3_x = false;       // F8_E4M3 weights: x rounded per row to e4m3 first (W8A8, see create())
  WeightLayout layout = WeightLayout::NK;
  int64_t nb = 0, threads = 1;   // blocked: W rows per block, threads planned at create
  uint64_t block_bytes = 0;      // blocked: one thread's widened block (aligned)
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, bias_mem, dst, scratchpad;
  uint64_t staging_bytes = 0, pad_bytes = 0, packed_bytes = 0;
  std::string impl;
};

DnnlLinear::DnnlLinear(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DnnlLinear::DnnlLinear(DnnlLinear&&) noexcept = default;
DnnlLinear& DnnlLinear::operator=(DnnlLinear&&) noexcept = default;
DnnlLinear::~DnnlLinear() = default;

Result<DnnlLinear> DnnlLinear::create(int64_t m, int64_t k, int64_t n, DType w_dtype, bool has_bias,
                                      WeightLayout layout, const void* pack_from, bool e4m3_activations) {
  VLAC_RETURN_IF_ERROR(cpu_isa_status());
  if (w_dtype != DType::F32 && w_dtype != DType::BF16 && !is_quant_dtype(w_dtype))
    return unsupported(std::string("dnnl linear: weight dtype ") + dtype_name(w_dtype));
  if (m <= 0 || k <= 0 || n <= 0) return invalid_argument("dnnl linear: empty shape");
  if (is_quant_dtype(w_dtype)) {
    // W8A16: the activations rounded to bf16 like the bf16 Linear's, codes widened per block of
    // rows (exact), fp32 sums scaled per output. Weights stay 8-bit in place (never packed).
    if (layout != WeightLayout::NK) return unsupported("dnnl linear: 8-bit weights must be [N, K]");
    auto p = std::make_unique<Impl>();
    p->m = m, p->k = k, p->n = n, p->bias = has_bias, p->quant = w_dtype;
    p->e4m3_x = w_dtype == DType::F8_E4M3 && (e4m3_activations || emulate_fp8_activations());
    if (m == 1) {
      p->gemv = true;
      p->impl = std::string("vlac:") + dtype_name(w_dtype) + " gemv";
      p->staging_bytes = align_up(uint64_t(k) * 4);
      return DnnlLinear(std::move(p));
    }
    plan_blocked(*p);
    return DnnlLinear(std::move(p));
  }
  try {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    auto p = std::make_unique<Impl>();
    p->m = m, p->k = k, p->n = n, p->bias = has_bias;
    p->bf16 = w_dtype == DType::BF16;
    if (m == 1 && layout == WeightLayout::NK) {
      // oneDNN's matmul runs a single row at a few GFLOP/s (it packs B for one use); a GEMV
      // streams W once at memory speed instead.
      p->gemv = true;
      p->impl = "vlac:gemv";
      p->staging_bytes = align_up(uint64_t(k) * 4);
      return DnnlLinear(std::move(p));
    }
    p->layout = layout;
    if (p->bf16 && use_bf16_fallback()) {
      if (!pack_from) {
        plan_blocked(*p);
        return DnnlLinear(std::move(p));
      }
      p->f32_src = true;  // packed: widen W once below and reorder it like fp32 weights
    }
    const dt in_dt = p->bf16 && !p->f32_src ? dt::bf16 : dt::f32;
    dnnl::memory::desc src_md({m, k}, in_dt, tag::ab);
    dnnl::memory::desc user_wei_md({k, n}, in_dt, layout == WeightLayout::NK ? tag::ba : tag::ab);
    dnnl::memory::desc wei_md = pack_from ? dnnl::memory::desc({k, n}, in_dt, tag::any) : user_wei_md;
    dnnl::memory::desc dst_md({m, n}, dt::f32, tag::ab);
    dnnl::memory::desc bias_md({1, n}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto desc = has_bias ? dnnl::matmul::desc(src_md, wei_md, bias_md, dst_md)
                         : dnnl::matmul::desc(src_md, wei_md, dst_md);
    dnnl::matmul::primitive_desc pd(desc, attr, p->eng);
    p->impl = pd.impl_info_str();
    p->prim = dnnl::matmul(pd);
    // Handles are bound in run(); DNNL_MEMORY_NONE would allocate, so start from null handles.
    p->src = dnnl::memory(src_md, p->eng, nullptr);
    if (pack_from) {  // reorder once into the primitive's blocked layout, owned here
      p->wei = dnnl::memory(pd.weights_desc(), p->eng);
      std::vector<float> widened;  // f32_src: the bf16 weights widened (exact) for the reorder
      if (p->f32_src) {
        widened.resize(size_t(k * n));
        widen_bf16(static_cast<const uint16_t*>(pack_from), widened.data(), k * n);
      }
      dnnl::memory user(user_wei_md, p->eng, p->f32_src ? widened.data() : const_cast<void*>(pack_from));
      dnnl::reorder(user, p->wei).execute(p->strm, user, p->wei);
      p->strm.wait();
      p->packed_bytes = pd.weights_desc().get_size();
    } else {
      p->wei = dnnl::memory(wei_md, p->eng, nullptr);
    }
    p->dst = dnnl::memory(dst_md, p->eng, nullptr);
    if (has_bias) p->bias_mem = dnnl::memory(bias_md, p->eng, nullptr);
    p->pad_bytes = pd.scratchpad_desc().get_size();
    p->scratchpad = dnnl::memory(pd.scratchpad_desc(), p->eng, nullptr);
    p->staging_bytes = p->f32_src ? align_up(uint64_t(m * k) * 4) : p->bf16 ? align_up(uint64_t(m * k) * 2) : 0;
    if (p->f32_src) p->impl = "vlac:bf16 widened+packed, " + p->impl;
    return DnnlLinear(std::move(p));
  } catch (const dnnl::error& e) {
    return Status(StatusCode::Backend, std::string("dnnl linear: ") + e.what());
  }
}

uint64_t DnnlLinear::scratch_bytes() const { return kAlign + impl_->staging_bytes + impl_->pad_bytes; }

Status DnnlLinear::run(const float* x, const void* w, const float* b, float* y, void* scratch) const {
  const Impl& p = *impl_;
  auto* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(scratch)));
  if (p.gemv && p.quant != DType::F32) {
    auto* xr = reinterpret_cast<float*>(base);
    round_to_bf16_f32(x, xr, p.k);
    if (p.e4m3_x) round_rows_e4m3(xr, 1, p.k);
    const auto* codes = static_cast<const uint8_t*>(w);
    quant_gemv(xr, codes, reinterpret_cast<const float*>(codes + quant_scales_offset(p.n, p.k)), p.quant, b, y, p.k, p.n);
    return Status::ok();
  }
  if (p.gemv) {
    const float* xv = x;
    if (p.bf16) {  // the same bf16 rounding of the activations as the matmul path
      auto* xr = reinterpret_cast<float*>(base);
      for (int64_t i = 0; i < p.k; ++i) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
      xv = xr;
    }
    gemv(xv, w, p.bf16, b, y, p.k, p.n);
    return Status::ok();
  }
  if (p.micro) {
    auto* xs = reinterpret_cast<float*>(base);
    bf16_gemm_stage(x, xs, p.m, p.k);
    bf16_gemm_nk(xs, static_cast<const uint16_t*>(w), b, y, p.m, p.k, p.n, int(p.threads));
    return Status::ok();
  }
  if (p.blocked || p.f32_src) {
    auto* xr = reinterpret_cast<float*>(base);
    round_to_bf16_f32(x, xr, p.m * p.k);
    if (p.e4m3_x) round_rows_e4m3(xr, p.m, p.k);
    return p.blocked ? run_blocked(xr, w, b, y, base) : execute(xr, w, b, y, base);
  }
  void* src = const_cast<float*>(x);
  if (p.bf16) {
    auto* staged = reinterpret_cast<uint16_t*>(base);
    round_to_bf16(x, staged, p.m * p.k);
    src = staged;
  }
  return execute(src, w, b, y, base);
}

Status DnnlLinear::run_bf16_src(const uint16_t* x, const void* w, const float* b, float* y, void* scratch) const {
  const Impl& p = *impl_;
  VLAC_CHECK((p.bf16 || p.quant != DType::F32) && !p.gemv);
  auto* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(scratch)));
  if (p.micro) {
    auto* xs = reinterpret_cast<float*>(base);
    bf16_gemm_stage_bf16(x, xs, p.m, p.k);
    bf16_gemm_nk(xs, static_cast<const uint16_t*>(w), b, y, p.m, p.k, p.n, int(p.threads));
    return Status::ok();
  }
  if (p.blocked || p.f32_src) {  // widen the (already rounded) activations
    auto* xr = reinterpret_cast<float*>(base);
    for (int64_t i = 0; i < p.m; ++i) widen_bf16(x + i * p.k, xr + i * p.k, p.k);
    if (p.e4m3_x) round_rows_e4m3(xr, p.m, p.k);
    return p.blocked ? run_blocked(xr, w, b, y, base) : execute(xr, w, b, y, base);
  }
  return execute(const_cast<uint16_t*>(x), w, b, y, base);
}

void DnnlLinear::plan_blocked(Impl& p) {
  // Few rows (the expert's M = 50: memory-bound): a block of nb rows widened to fp32 takes
  // nb·K·4 bytes, at most kBlockBytes (half of a 512 KiB L2, the smallest of the x86 and arm cores
  // we target), in multiples of 16 rows. Many rows (the prefix: compute-bound): each block's
  // sgemm packs all of x again, so blocks get at least kWideRows rows to keep that cost a small
  // fraction of the block's flops (the block then sits in L2/L3, and sgemm packs it for itself;
  // 512 rows matched the fp32 matmul on AVX2 where 256 ran 10-15% slower), up to kWideBytes a
  // thread. At least one block per thread.
  constexpr int64_t kBlockBytes = 256 * 1024, kWideRows = 512, kWideBytes = 4 << 20, kFewRows = 64;
  p.blocked = true;
  p.threads = std::max(1, omp_get_max_threads());
  if (p.layout == WeightLayout::NK && p.quant == DType::F32 && bf16_gemm_available()) {
    p.micro = true;
    p.staging_bytes = align_up(bf16_gemm_x_bytes(p.m, p.k));
    p.impl = "vlac:bf16 avx2 register-blocked";
    return;
  }
  int64_t nb = std::max<int64_t>(16, kBlockBytes / (p.k * 4) / 16 * 16);
  if (p.m > kFewRows) nb = std::max(nb, std::min<int64_t>(kWideRows, kWideBytes / (p.k * 4) / 16 * 16));
  const int64_t per_thread = (p.n + p.threads - 1) / p.threads;
  nb = std::min(nb, std::max<int64_t>(16, (per_thread + 15) / 16 * 16));
  p.nb = std::min(nb, p.n);
  p.block_bytes = align_up(uint64_t(p.nb * p.k) * 4);
  p.staging_bytes = align_up(uint64_t(p.m * p.k) * 4) + uint64_t(p.threads) * p.block_bytes;
  p.impl = std::string("vlac:") + (p.quant == DType::F32 ? "bf16" : dtype_name(p.quant)) + " blocked(nb=" +
           std::to_string(p.nb) + ")+sgemm";
}

Status DnnlLinear::run_blocked(const float* xr, const void* w, const float* b, float* y, uint8_t* base) const {
  const Impl& p = *impl_;
  const auto* wb = static_cast<const uint16_t*>(w);
  uint8_t* blocks_base = base + align_up(uint64_t(p.m * p.k) * 4);
  const int64_t blocks = (p.n + p.nb - 1) / p.nb;
  const int64_t m = p.m, k = p.k, n = p.n;
  bool ok = true;
  // oneDNN's sgemm runs single-threaded inside this parallel region; the static schedule keeps
  // each block's math the same whatever the thread count.
#pragma omp parallel for schedule(static) num_threads(int(p.threads)) if (p.threads > 1 && blocks > 1) reduction(&& : ok)
  for (int64_t bi = 0; bi < blocks; ++bi) {
    const int64_t n0 = bi * p.nb, nb = std::min(p.nb, n - n0);
    auto* wf = reinterpret_cast<float*>(blocks_base + uint64_t(omp_get_thread_num()) * p.block_bytes);
    if (p.quant != DType::F32) {  // codes of rows n0..n0+nb, then each column times its scale
      const auto* codes = static_cast<const uint8_t*>(w);
      const auto* scales = reinterpret_cast<const float*>(codes + quant_scales_offset(n, k));
      widen_codes(codes + n0 * k, p.quant, wf, nb * k);
      ok = ok && dnnl_sgemm('N', 'T', m, nb, k, 1.0f, xr, k, wf, k, 0.0f, y + n0, n) == dnnl_success;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = n0; j < n0 + nb; ++j) y[r * n + j] *= scales[j];
    } else if (p.layout == WeightLayout::NK) {  // rows n0..n0+nb of W[N,K] are contiguous
      widen_bf16(wb + n0 * k, wf, nb * k);
      ok = ok && dnnl_sgemm('N', 'T', m, nb, k, 1.0f, xr, k, wf, k, 0.0f, y + n0, n) == dnnl_success;
    } else {  // columns n0..n0+nb of W[K,N]: one strided run per k
      for (int64_t kk = 0; kk < k; ++kk) widen_bf16(wb + kk * n + n0, wf + kk * nb, nb);
      ok = ok && dnnl_sgemm('N', 'N', m, nb, k, 1.0f, xr, k, wf, nb, 0.0f, y + n0, n) == dnnl_success;
    }
    if (b)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = n0; j < n0 + nb; ++j) y[r * n + j] += b[j];
  }
  if (!ok)
    return Status(StatusCode::Backend, "dnnl linear: bf16 blocked sgemm " + std::to_string(m) + "x" + std::to_string(k) +
                                           "x" + std::to_string(n) + " failed");
  return Status::ok();
}

Status DnnlLinear::execute(void* src, const void* w, const float* b, float* y, uint8_t* base) const {
  const Impl& p = *impl_;
  dnnl_memory_set_data_handle(p.src.get(), src);
  if (p.packed_bytes == 0) dnnl_memory_set_data_handle(p.wei.get(), const_cast<void*>(w));
  dnnl_memory_set_data_handle(p.dst.get(), y);
  dnnl_memory_set_data_handle(p.scratchpad.get(), base + p.staging_bytes);
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, p.src.get()},
                             {DNNL_ARG_WEIGHTS, p.wei.get()},
                             {DNNL_ARG_DST, p.dst.get()},
                             {DNNL_ARG_SCRATCHPAD, p.scratchpad.get()},
                             {DNNL_ARG_BIAS, nullptr}};
  int nargs = 4;
  if (p.bias) {
    dnnl_memory_set_data_handle(p.bias_mem.get(), const_cast<float*>(b));
    args[nargs++] = {DNNL_ARG_BIAS, p.bias_mem.get()};
  }
  if (dnnl_primitive_execute(p.prim.get(), p.strm.get(), nargs, args) != dnnl_success ||
      dnnl_stream_wait(p.strm.get()) != dnnl_success)
    return Status(StatusCode::Backend, "dnnl linear: matmul " + std::to_string(p.m) + "x" +
                                           std::to_string(p.k) + "x" + std::to_string(p.n) + " failed");
  return Status::ok();
}

const std::string& DnnlLinear::impl() const { return impl_->impl; }
bool DnnlLinear::bf16_fallback() const { return impl_->blocked || impl_->f32_src; }
uint64_t DnnlLinear::packed_bytes() const { return impl_->packed_bytes; }

// ---------------------------------------------------------------------------------------------
// DnnlAttention: scratch = [scores f32 T·H×S][k bf16 S×Dh][v bf16 S×Dv][matmul scratch], each
// 64-byte aligned. Without a oneDNN bf16 matmul (fallback_): [scores f32][q, k, v rounded to bf16
// in fp32][matmul scratch], two fp32 matmuls, the probabilities rounded in place in fp32.

Result<DnnlAttention> DnnlAttention::create(int64_t t, int64_t h, int64_t s, int64_t dh, int64_t dv) {
  const bool fallback = use_bf16_fallback();
  const DType dt = fallback ? DType::F32 : DType::BF16;
  VLAC_ASSIGN_OR_RETURN(DnnlLinear qk, DnnlLinear::create(t * h, dh, s, dt, false, WeightLayout::NK));
  VLAC_ASSIGN_OR_RETURN(DnnlLinear pv, DnnlLinear::create(t * h, s, dv, dt, false, WeightLayout::KN));
  DnnlAttention a(std::move(qk), std::move(pv));
  a.t_ = t, a.h_ = h, a.s_ = s, a.dh_ = dh, a.dv_ = dv;
  a.fallback_ = fallback;
  return a;
}

uint64_t DnnlAttention::scratch_bytes() const {
  const uint64_t rows = uint64_t(t_ * h_), s = uint64_t(s_);
  const uint64_t mm = std::max(qk_.scratch_bytes(), pv_.scratch_bytes());
  if (fallback_)
    return kAlign + align_up(rows * s * 4) + align_up(rows * uint64_t(dh_) * 4) + align_up(s * uint64_t(dh_) * 4) +
           align_up(s * uint64_t(dv_) * 4) + mm;
  return kAlign + align_up(rows * s * 4) + align_up(rows * s * 2) + align_up(s * uint64_t(dh_) * 2) +
         align_up(s * uint64_t(dv_) * 2) + mm;
}

Status DnnlAttention::run(const float* q, const float* k, const float* v, const uint8_t* allow, const float* add,
                          float* out, float scale, void* scratch) const {
  auto* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(scratch)));
  const int64_t rows = t_ * h_, s = s_;
  auto* scores = reinterpret_cast<float*>(base);
  const int64_t h = h_;
  if (fallback_) {
    auto* qf = reinterpret_cast<float*>(base + align_up(uint64_t(rows * s) * 4));
    auto* kf = qf + align_up(uint64_t(rows * dh_) * 4) / 4;
    auto* vf = kf + align_up(uint64_t(s * dh_) * 4) / 4;
    void* mm_scratch = vf + align_up(uint64_t(s * dv_) * 4) / 4;
    round_to_bf16_f32(q, qf, rows * dh_);
    round_to_bf16_f32(k, kf, s * dh_);
    round_to_bf16_f32(v, vf, s * dv_);
    VLAC_RETURN_IF_ERROR(qk_.run(qf, kf, nullptr, scores, mm_scratch));
#pragma omp parallel for schedule(static) if (rows * s >= kParallelMinElems)
    for (int64_t r = 0; r < rows; ++r)
      masked_softmax_row_bf16_f32(scores + r * s, s, scale, allow ? allow + (r / h) * s : nullptr,
                                  add ? add + (r / h) * s : nullptr);
    return pv_.run(scores, vf, nullptr, out, mm_scratch);
  }
  auto* probs = reinterpret_cast<uint16_t*>(base + align_up(uint64_t(rows * s) * 4));
  auto* kb = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(probs) + align_up(uint64_t(rows * s) * 2));
  auto* vb = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(kb) + align_up(uint64_t(s * dh_) * 2));
  void* mm_scratch = reinterpret_cast<uint8_t*>(vb) + align_up(uint64_t(s * dv_) * 2);
  round_to_bf16(k, kb, s * dh_);
  round_to_bf16(v, vb, s * dv_);
  VLAC_RETURN_IF_ERROR(qk_.run(q, kb, nullptr, scores, mm_scratch));
  // Softmax and the rounding of the probabilities to bf16 per row, while the row is in L1: one
  // pass over the scores instead of two.
#pragma omp parallel for schedule(static) if (rows * s >= kParallelMinElems)
  for (int64_t r = 0; r < rows; ++r)
    masked_softmax_row_bf16(scores + r * s, probs + r * s, s, scale, allow ? allow + (r / h) * s : nullptr,
                            add ? add + (r / h) * s : nullptr);
  return pv_.run_bf16_src(probs, vb, nullptr, out, mm_scratch);
}

bool DnnlAttention::bf16_fallback() const { return fallback_; }

}  // namespace vlac::cpu
