// DnnlLinear: oneDNN matmul with weights prepacked at create(); user-mode scratchpad so run()
// never allocates. Catches dnnl::error at this boundary (no exceptions escape src/).
#include "backends/cpu/dnnl_linear.h"

#include <omp.h>

#include <dnnl.hpp>
#include <unordered_map>
#include <vector>

namespace vlac::cpu {

struct DnnlLinear::Impl {
  int64_t m = 0, k = 0, n = 0;
  bool bf16 = false;
  int n_threads = 0;
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, bias, dst, scratch;
  std::vector<uint16_t> x_bf16;  // [M, K] staging for bf16 activations
  std::vector<float> bias_copy;  // [N]
  std::vector<uint8_t> scratch_bytes;
  std::unordered_map<int, dnnl::memory> args;  // built once; handles updated per run
  std::string impl;
  uint64_t bytes = 0;
};

DnnlLinear::DnnlLinear(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DnnlLinear::DnnlLinear(DnnlLinear&&) noexcept = default;
DnnlLinear& DnnlLinear::operator=(DnnlLinear&&) noexcept = default;
DnnlLinear::~DnnlLinear() = default;

Result<DnnlLinear> DnnlLinear::create(int64_t m, int64_t k, int64_t n, DType w_dtype,
                                      const void* w, const float* b, int n_threads) {
  if (w_dtype != DType::F32 && w_dtype != DType::BF16)
    return unsupported(std::string("dnnl linear: weight dtype ") + dtype_name(w_dtype));
  if (m <= 0 || k <= 0 || n <= 0) return invalid_argument("dnnl linear: empty shape");
  try {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    auto p = std::make_unique<Impl>();
    p->m = m, p->k = k, p->n = n, p->n_threads = n_threads;
    p->bf16 = w_dtype == DType::BF16;
    if (n_threads > 0) omp_set_num_threads(n_threads);
    const dt in_dt = p->bf16 ? dt::bf16 : dt::f32;
    dnnl::memory::desc src_md({m, k}, in_dt, tag::ab);
    dnnl::memory::desc wei_any({k, n}, in_dt, tag::any);
    dnnl::memory::desc dst_md({m, n}, dt::f32, tag::ab);
    dnnl::memory::desc bias_md({1, n}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto desc = b ? dnnl::matmul::desc(src_md, wei_any, bias_md, dst_md)
                  : dnnl::matmul::desc(src_md, wei_any, dst_md);
    dnnl::matmul::primitive_desc pd(desc, attr, p->eng);
    p->impl = pd.impl_info_str();
    // W [N,K] row-major is Wᵀ [K,N] in format "ba"; reorder once into the preferred layout.
    dnnl::memory user_w({{k, n}, in_dt, tag::ba}, p->eng, const_cast<void*>(w));
    p->wei = dnnl::memory(pd.weights_desc(), p->eng);
    dnnl::reorder(user_w, p->wei).execute(p->strm, user_w, p->wei);
    p->strm.wait();
    if (b) {
      p->bias_copy.assign(b, b + n);
      p->bias = dnnl::memory(bias_md, p->eng, p->bias_copy.data());
    }
    if (p->bf16) p->x_bf16.resize(size_t(m * k));
    p->src = dnnl::memory(src_md, p->eng, p->bf16 ? static_cast<void*>(p->x_bf16.data()) : nullptr);
    p->dst = dnnl::memory(dst_md, p->eng, nullptr);
    p->scratch_bytes.resize(pd.scratchpad_desc().get_size());
    p->scratch = dnnl::memory(pd.scratchpad_desc(), p->eng, p->scratch_bytes.data());
    p->prim = dnnl::matmul(pd);
    p->args = {{DNNL_ARG_SRC, p->src}, {DNNL_ARG_WEIGHTS, p->wei}, {DNNL_ARG_DST, p->dst},
               {DNNL_ARG_SCRATCHPAD, p->scratch}};
    if (b) p->args.emplace(DNNL_ARG_BIAS, p->bias);
    p->bytes = pd.weights_desc().get_size() + p->bias_copy.size() * 4 + p->x_bf16.size() * 2 +
               p->scratch_bytes.size();
    return DnnlLinear(std::move(p));
  } catch (const dnnl::error& e) {
    return Status(StatusCode::Backend, std::string("dnnl linear: ") + e.what());
  }
}

Status DnnlLinear::run(const float* x, float* y) {
  Impl& p = *impl_;
  try {
    if (p.n_threads > 0) omp_set_num_threads(p.n_threads);
    if (p.bf16) {
      const size_t count = p.x_bf16.size();
      for (size_t i = 0; i < count; ++i) p.x_bf16[i] = f32_to_bf16(x[i]);
    } else {
      p.src.set_data_handle(const_cast<float*>(x));
    }
    p.dst.set_data_handle(y);
    p.prim.execute(p.strm, p.args);  // the map holds handles to the same memory objects
    p.strm.wait();
    return Status::ok();
  } catch (const dnnl::error& e) {
    return Status(StatusCode::Backend, std::string("dnnl linear run: ") + e.what());
  }
}

uint64_t DnnlLinear::resident_bytes() const { return impl_->bytes; }
const std::string& DnnlLinear::impl() const { return impl_->impl; }

}  // namespace vlac::cpu
