// DnnlLinear: oneDNN matmul over plain-layout weights (format "ba" = W[N,K] row-major seen as
// Wᵀ[K,N]). Executed through the C API with a fixed argument array whose handles are rebound per
// call, so run() builds no containers. dnnl::error is caught here (no exceptions escape src/).
#include "backends/cpu/dnnl_linear.h"

#include <algorithm>

#include <dnnl.hpp>

#include "backends/cpu/kernels.h"

namespace vlac::cpu {
namespace {

constexpr uint64_t kAlign = 64;

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

struct DnnlLinear::Impl {
  int64_t m = 0, k = 0, n = 0;
  bool bf16 = false, bias = false;
  bool gemv = false;  // M = 1 (the expert's time modulations): our own GEMV, see create()
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
                                      WeightLayout layout, const void* pack_from) {
  if (w_dtype != DType::F32 && w_dtype != DType::BF16)
    return unsupported(std::string("dnnl linear: weight dtype ") + dtype_name(w_dtype));
  if (m <= 0 || k <= 0 || n <= 0) return invalid_argument("dnnl linear: empty shape");
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
    const dt in_dt = p->bf16 ? dt::bf16 : dt::f32;
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
      dnnl::memory user(user_wei_md, p->eng, const_cast<void*>(pack_from));
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
    p->staging_bytes = p->bf16 ? align_up(uint64_t(m * k) * 2) : 0;
    return DnnlLinear(std::move(p));
  } catch (const dnnl::error& e) {
    return Status(StatusCode::Backend, std::string("dnnl linear: ") + e.what());
  }
}

uint64_t DnnlLinear::scratch_bytes() const { return kAlign + impl_->staging_bytes + impl_->pad_bytes; }

Status DnnlLinear::run(const float* x, const void* w, const float* b, float* y, void* scratch) const {
  const Impl& p = *impl_;
  auto* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(scratch)));
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
  VLAC_CHECK(p.bf16 && !p.gemv);
  return execute(const_cast<uint16_t*>(x), w, b, y,
                 reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(scratch))));
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
uint64_t DnnlLinear::packed_bytes() const { return impl_->packed_bytes; }

// ---------------------------------------------------------------------------------------------
// DnnlAttention: scratch = [scores f32 T·H×S][k bf16 S×Dh][v bf16 S×Dv][matmul scratch], each
// 64-byte aligned.

Result<DnnlAttention> DnnlAttention::create(int64_t t, int64_t h, int64_t s, int64_t dh, int64_t dv) {
  VLAC_ASSIGN_OR_RETURN(DnnlLinear qk, DnnlLinear::create(t * h, dh, s, DType::BF16, false, WeightLayout::NK));
  VLAC_ASSIGN_OR_RETURN(DnnlLinear pv, DnnlLinear::create(t * h, s, dv, DType::BF16, false, WeightLayout::KN));
  DnnlAttention a(std::move(qk), std::move(pv));
  a.t_ = t, a.h_ = h, a.s_ = s, a.dh_ = dh, a.dv_ = dv;
  return a;
}

uint64_t DnnlAttention::scratch_bytes() const {
  return kAlign + align_up(uint64_t(t_ * h_ * s_) * 4) + align_up(uint64_t(t_ * h_ * s_) * 2) +
         align_up(uint64_t(s_ * dh_) * 2) + align_up(uint64_t(s_ * dv_) * 2) +
         std::max(qk_.scratch_bytes(), pv_.scratch_bytes());
}

Status DnnlAttention::run(const float* q, const float* k, const float* v, const uint8_t* allow, const float* add,
                          float* out, float scale, void* scratch) const {
  auto* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(scratch)));
  const int64_t rows = t_ * h_, s = s_;
  auto* scores = reinterpret_cast<float*>(base);
  auto* probs = reinterpret_cast<uint16_t*>(base + align_up(uint64_t(rows * s) * 4));
  auto* kb = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(probs) + align_up(uint64_t(rows * s) * 2));
  auto* vb = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(kb) + align_up(uint64_t(s * dh_) * 2));
  void* mm_scratch = reinterpret_cast<uint8_t*>(vb) + align_up(uint64_t(s * dv_) * 2);
  round_to_bf16(k, kb, s * dh_);
  round_to_bf16(v, vb, s * dv_);
  VLAC_RETURN_IF_ERROR(qk_.run(q, kb, nullptr, scores, mm_scratch));
  const int64_t h = h_;
  // Softmax and the rounding of the probabilities to bf16 per row, while the row is in L1: one
  // pass over the scores instead of two.
#pragma omp parallel for schedule(static) if (rows * s >= kParallelMinElems)
  for (int64_t r = 0; r < rows; ++r)
    masked_softmax_row_bf16(scores + r * s, probs + r * s, s, scale, allow ? allow + (r / h) * s : nullptr,
                            add ? add + (r / h) * s : nullptr);
  return pv_.run_bf16_src(probs, vb, nullptr, out, mm_scratch);
}

}  // namespace vlac::cpu
