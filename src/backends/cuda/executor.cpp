// CUDA graph executor (executor.h): planning, the memo, and the per-op dispatch.
#include "backends/cuda/executor.h"

#include <algorithm>
#include <atomic>
#include <tuple>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fnmatch.h>
#include <string>

#include "backends/cuda/env.h"
#include "backends/cuda/expert_mlp.h"
#include "backends/cuda/op_profile.h"
#include "backends/cuda/skinny_gemm.h"
#include "core/bytes.h"
#include "core/mapped_file.h"
#include "core/quant.h"
#include "exec/arena_plan.h"
#include "ir/serialize.h"
#include "ir/walk.h"

namespace vlac::cuda {

using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;
using ir::ValueInfo;

namespace {

constexpr uint64_t kScratchAlign = 256;
uint64_t al(uint64_t v) { return exec::align_up(v, kScratchAlign); }
int64_t last_dim(const ValueInfo& v) { return v.shape.empty() ? 1 : v.shape.back(); }

// Rows of an 8-bit [n, k] matrix widened at once (quant.cu): all of it up to 32 MiB of bf16 (every
// matrix of the expert and SigLIP), else equal slices of a multiple of 64 rows under that, each
// widened and multiplied in turn (the LM's gate|up, 134 MB in bf16, in 4 slices). The scratch
// holds one slice, and a slice this size stays in the H200's 50 MB L2 between the widening
// kernel's writes and the GEMM's reads. VLAC_DEQUANT_SLICE_MIB=0: whole matrices (A/B).
uint64_t dequant_cap() {
  const int64_t v = env_count("VLAC_DEQUANT_SLICE_MIB", -1);
  return v < 0 ? 32ull << 20 : v == 0 ? UINT64_MAX : uint64_t(v) << 20;
}
// Rows of x per GEMM whose fp32 sums land in the scratch before scale_columns finishes them
// (VLAC_QUANT_EXACT): all of them up to 8 MiB of sums (VLAC_QUANT_SUM_MIB), else a multiple of 64
// under that.
uint64_t quant_sum_cap() {
  const int64_t v = env_count("VLAC_QUANT_SUM_MIB", 0);
  return v > 0 ? uint64_t(v) << 20 : 8ull << 20;
}
int64_t quant_sum_rows(int64_t m, int64_t n) {
  const uint64_t cap = quant_sum_cap();
  if (uint64_t(m) * uint64_t(n) * 4 <= cap) return m;
  const int64_t r = std::max<int64_t>(1, int64_t(cap / (uint64_t(n) * 4)));
  return r >= 64 ? r / 64 * 64 : r;
}
int64_t dequant_slice_rows(int64_t n, int64_t k) {
  const uint64_t cap = dequant_cap();
  const uint64_t bytes = uint64_t(n) * uint64_t(k) * 2;
  if (bytes <= cap || n <= 64) return n;
  const int64_t slices = int64_t((bytes + cap - 1) / cap);
  const int64_t rows = ((n + slices - 1) / slices + 63) / 64 * 64;
  return std::min(rows, n);
}

}  // namespace

// An embedding over a table kept on the host: the host function gathers the looked-up rows into
// page-locked memory (in stream order, so it also runs inside a recorded graph), a copy uploads
// them, and the embedding kernel scales them on the device. Rows are read from the file with
// pread where there is one: a kernel that keeps file data in large folios maps a whole folio at
// the first touch of a mapped row (323 MB resident for 200 prompt tokens on the H200 machine,
// with MADV_NOHUGEPAGE too), and pread maps nothing. A row whose id is the one gathered into the
// same position last time is still in place (the same prompt, chunk after chunk): not read again.
struct HostGather {
  const uint8_t* table = nullptr;
  DType table_dtype = DType::F32;
  bool rounds = false;     // F32 table run as BF16: rows rounded to bf16 here
  DType rows_dtype = DType::F32;
  int64_t vocab = 0, d = 0, t = 0;
  int fd = -1;             // the table's file, or -1: copied from the mapping
  uint64_t file_offset = 0;
  const void* const* ids = nullptr;  // -> Input::host_src of the ids input
  void* rows_host = nullptr;
  std::vector<int64_t> last;         // by position: the id whose row is in rows_host, or -1
  std::vector<uint8_t> f32_row;      // a row read before rounding (or an 8-bit row's codes)
  uint64_t scales_at = 0;            // an 8-bit table (core/quant.h): where its row scales start
  std::atomic<int> bad{0};       // 1 + position of the first id outside the table (its row is zeros)
  std::atomic<int> io_error{0};  // errno of a failed read (its row is zeros)
};

namespace {

void CUDART_CB gather_rows(void* p) {
  auto* g = static_cast<HostGather*>(p);
  const auto* ids = static_cast<const int64_t*>(*g->ids);
  const uint64_t row = uint64_t(g->d) * dtype_size(g->rows_dtype);
  const uint64_t src_row = uint64_t(g->d) * dtype_size(g->table_dtype);
  auto* out = static_cast<uint8_t*>(g->rows_host);
  if (g->last.size() != size_t(g->t)) g->last.assign(size_t(g->t), -1);
  for (int64_t i = 0; i < g->t; ++i) {
    const int64_t id = ids ? ids[i] : -1;
    uint8_t* dst = out + uint64_t(i) * row;
    if (id < 0 || id >= g->vocab) {
      std::memset(dst, 0, row);
      g->last[size_t(i)] = -1;
      if (!g->bad) g->bad = int(i) + 1;
      continue;
    }
    if (g->last[size_t(i)] == id) continue;  // still there from the last gather
    if (is_quant_dtype(g->table_dtype)) {  // codes and the row's scale, decoded into f32
      uint8_t* codes = g->f32_row.data();
      float scale = 0.0f;
      const uint64_t at = uint64_t(id) * uint64_t(g->d), sat = g->scales_at + uint64_t(id) * 4;
      if (g->fd >= 0) {
        if (!read_at(g->fd, codes, uint64_t(g->d), g->file_offset + at) ||
            !read_at(g->fd, reinterpret_cast<uint8_t*>(&scale), 4, g->file_offset + sat)) {
          if (!g->io_error) g->io_error = errno ? errno : EIO;
          std::memset(dst, 0, row);
          g->last[size_t(i)] = -1;
          continue;
        }
      } else {
        std::memcpy(codes, g->table + at, size_t(g->d));
        std::memcpy(&scale, g->table + sat, 4);
      }
      const float* table = quant_table(g->table_dtype);
      auto* df = reinterpret_cast<float*>(dst);
      for (int64_t j = 0; j < g->d; ++j) df[j] = table[codes[j]] * scale;
      g->last[size_t(i)] = id;
      continue;
    }
    const uint64_t at = uint64_t(id) * src_row;
    const uint8_t* src = g->table + at;
    if (g->fd >= 0) {
      uint8_t* into = g->rounds ? g->f32_row.data() : dst;
      if (!read_at(g->fd, into, src_row, g->file_offset + at)) {
        if (!g->io_error) g->io_error = errno ? errno : EIO;
        std::memset(dst, 0, row);
        g->last[size_t(i)] = -1;
        continue;
      }
      src = into;
    }
    if (!g->rounds) {
      if (src != dst) std::memcpy(dst, src, row);
    } else {
      auto* d16 = reinterpret_cast<uint16_t*>(dst);
      for (int64_t j = 0; j < g->d; ++j) {
        float v;
        std::memcpy(&v, src + 4 * j, 4);
        d16[j] = f32_to_bf16(v);
      }
    }
    g->last[size_t(i)] = id;
  }
}

}  // namespace

CudaExecutable::~CudaExecutable() {
  for (void* p : {own_arena_, own_scratch_, const_storage_, iota_, memo_storage_, static_cast<void*>(quant_counters_)})
    device_free(p);
  for (void* p : own_blocks_) device_free(p);
  for (auto& in : inputs_) device_free(in.own);
  for (auto& g : gathers_) host_free(g->rows_host);
}

std::string CudaExecutable::where(const Node& n) const {
  return "cuda: engine '" + (options_.label.empty() ? std::string("?") : options_.label) + "' node '" + n.name +
         "' (" + ir::op_name(n.op) + ")";
}

Result<std::unique_ptr<CudaExecutable>> CudaExecutable::create(CudaContext& ctx, ir::Graph graph,
                                                               const CudaWeights& weights, const ExecOptions& options) {
  VLAC_RETURN_IF_ERROR(ctx.ensure());
  std::unique_ptr<CudaExecutable> ex(new CudaExecutable());
  ex->ctx_ = &ctx;
  ex->graph_ = std::move(graph);
  ex->options_ = options;
  VLAC_RETURN_IF_ERROR(ex->plan(weights));
  return ex;
}

Status CudaExecutable::plan(const CudaWeights& weights) {
  const ir::Graph& g = graph_;
  VLAC_ASSIGN_OR_RETURN(order_, ir::schedule(g));
  const size_t nv = g.values().size();
  root_ = exec::storage_roots(g, order_);
  ptr_.assign(nv, nullptr);
  plans_.assign(g.nodes().size(), NodePlan{});
  plan_slice_views();
  weight_dtype_.assign(nv, DType::F32);
  weight_entry_.assign(nv, nullptr);
  quant_src_.assign(nv, nullptr);
  eight_bit_weights_ = false;
  slice_rows_.assign(nv, 0);
  dequant_bytes_ = 0;
  inputs_.assign(g.inputs().size(), Input{});
  const std::string label = options_.label.empty() ? std::string("?") : options_.label;

  auto in_info = [&](const Node& n, size_t i) -> const ValueInfo& { return g.info(n.inputs[i]); };
  auto is_weight = [&](const Node& n, size_t i) { return from_weight(n.inputs[i]); };
  auto need_f32 = [&](const Node& n, size_t i) -> Status {
    if (in_info(n, i).dtype != DType::F32) return unsupported(where(n) + ": input " + std::to_string(i) + " must be f32");
    if (is_weight(n, i) && weight_dtype(n.inputs[i]) != DType::F32)
      return unsupported(where(n) + ": weight input " + std::to_string(i) + " must run in f32");
    return Status::ok();
  };
  int64_t max_t = 1;
  uint64_t scratch = 0, const_bytes = 0;
  // Weights first (a weight's node may come after its reshape consumer's check in the schedule).
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op != OpKind::Weight) continue;
    const ir::WeightRef& r = g.weights()[size_t(n.weight)];
    const CudaWeights::Entry* e = weights.find(r.name);
    if (!e) return internal_error(where(n) + ": weight '" + r.name + "' was not bound");
    if (e->shape != r.shape) return internal_error(where(n) + ": weight '" + r.name + "' bound with another shape");
    ptr_[size_t(n.outputs[0])] = const_cast<void*>(e->data);
    weight_dtype_[size_t(n.outputs[0])] = e->dtype;
    weight_entry_[size_t(n.outputs[0])] = e;
    if (is_quant_dtype(e->dtype)) eight_bit_weights_ = true;
    if (is_quant_dtype(e->dtype) && !e->host_table) {
      // An 8-bit matrix is widened to bf16 in the scratch before its GEMM (quant.cu): every plan
      // below sees a bf16 weight there (bind_memory points the value at it).
      if (r.shape.size() != 2) return invalid_format(where(n) + ": 8-bit weight '" + r.name + "' is not a matrix");
      weight_dtype_[size_t(n.outputs[0])] = DType::BF16;
      quant_src_[size_t(n.outputs[0])] = e->data;
      ptr_[size_t(n.outputs[0])] = nullptr;  // the scratch's, in bind_memory
      const int64_t rows = dequant_slice_rows(r.shape[0], r.shape[1]);
      slice_rows_[size_t(n.outputs[0])] = rows;
      dequant_bytes_ = std::max(dequant_bytes_, al(uint64_t(rows * r.shape[1]) * 2));
    }
  }
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    // A host table may only be read by an Embedding, an 8-bit matrix only as a Linear's weight
    // (a package can say anything: nothing else reads the codes as floats).
    if (n.op != OpKind::Embedding && n.op != OpKind::Weight && n.op != OpKind::Reshape)
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (is_weight(n, i) && weight_entry_[size_t(root_[size_t(n.inputs[i])])]->host_table)
          return unsupported(where(n) + ": reads a host-mapped gather-only table");
    if (n.op != OpKind::Weight && n.op != OpKind::Reshape)
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (is_weight(n, i) && widened(root_[size_t(n.inputs[i])]) && !(n.op == OpKind::Linear && i == 1))
          return invalid_format(where(n) + ": input " + std::to_string(i) +
                                " is an 8-bit weight, which only a linear's weight can be on the GPU");
    switch (n.op) {
      case OpKind::Input:
      case OpKind::Weight:
      case OpKind::Reshape:
        break;
      case OpKind::Constant:
        if (g.info(n.outputs[0]).dtype != DType::F32) return unsupported(where(n) + ": only f32 constants");
        const_bytes += al(g.info(n.outputs[0]).bytes());
        break;
      case OpKind::Linear: {
        const ValueInfo& x = in_info(n, 0);
        const ValueInfo& w = in_info(n, 1);
        if (w.shape.size() != 2) return unsupported(where(n) + ": weight must be 2-D");
        const DType wd = is_weight(n, 1) ? weight_dtype(n.inputs[1]) : w.dtype;
        if (x.dtype != DType::F32 && x.dtype != DType::BF16) return unsupported(where(n) + ": x must be f32 or bf16");
        if (wd != DType::F32 && wd != DType::BF16) return unsupported(where(n) + ": weight must be f32 or bf16");
        if (x.dtype == DType::BF16 && wd == DType::F32) return unsupported(where(n) + ": bf16 x with an f32 weight");
        const DType od = g.info(n.outputs[0]).dtype;
        if (n.inputs.size() == 3) {
          const DType bd = is_weight(n, 2) ? weight_dtype(n.inputs[2]) : in_info(n, 2).dtype;
          if (bd != od) return unsupported(where(n) + ": the bias must have the output's dtype");
        }
        p.gemm.k = w.shape[1];
        p.gemm.n = w.shape[0];
        p.gemm.m = x.numel() / p.gemm.k;
        p.gemm.in = wd;
        p.gemm.out = od;
        p.gemm.epilogue = n.inputs.size() == 3 ? Epilogue::Bias : Epilogue::None;
        p.weight_dtype = wd;
        p.bf16 = wd == DType::BF16 && x.dtype == DType::F32;  // x rounded to bf16 on the way in
        p.gemm.tf32 = options_.fast_vision && wd == DType::F32 && x.dtype == DType::F32;
        // (its x's bf16 copy in the scratch is sized after plan_bf16_stores: none where x is stored in bf16)
        if (p.gemm.m > 0) {
          Status st = ctx_->gemm().plan(p.gemm);
          if (!st.is_ok()) return Status(st.code(), where(n) + ": " + st.message());
        }
        break;
      }
      case OpKind::PatchEmbed: {
        const auto& shape = in_info(n, 0).shape;
        const auto& w = in_info(n, 1).shape;
        VLAC_RETURN_IF_ERROR(need_f32(n, 0));
        if ((shape.size() != 3 && shape.size() != 4) || w.size() != 4)
          return unsupported(where(n) + ": image [N?,C,Y,X], weight [O,C,kh,kw]");
        // [N,C,Y,X]: the N images' im2col rows one after another, then one GEMM over all of them.
        const std::vector<int64_t> img(shape.end() - 3, shape.end());
        const int64_t images = shape.size() == 4 ? shape[0] : 1;
        const DType wd = is_weight(n, 1) ? weight_dtype(n.inputs[1]) : DType::F32;
        p.weight_dtype = wd;
        p.gemm.m = images * (img[1] / w[2]) * (img[2] / w[3]);
        p.gemm.k = w[1] * w[2] * w[3];
        p.gemm.n = w[0];
        p.gemm.in = wd;
        p.gemm.out = DType::F32;
        p.gemm.epilogue = n.inputs.size() == 3 ? Epilogue::Bias : Epilogue::None;
        if (n.inputs.size() == 3) VLAC_RETURN_IF_ERROR(need_f32(n, 2));
        // fast_vision: vlac's tiled fp32 kernel (exact fp32 still), so that no fp32 GEMM is planned by cuBLASLt.
        p.gemm.own_f32 = options_.fast_vision && wd == DType::F32;
        scratch = std::max(scratch, al(uint64_t(p.gemm.m * p.gemm.k) * dtype_size(wd)));
        Status st = ctx_->gemm().plan(p.gemm);
        if (!st.is_ok()) return Status(st.code(), where(n) + ": " + st.message());
        break;
      }
      case OpKind::Attention: {
        const auto& q = in_info(n, 0).shape;
        const auto& k = in_info(n, 1).shape;
        const auto& v = in_info(n, 2).shape;
        for (size_t i = 0; i < 3; ++i) VLAC_RETURN_IF_ERROR(need_f32(n, i));
        if (n.inputs.size() == 4) {
          const DType md = in_info(n, 3).dtype;
          if (md != DType::BOOL && md != DType::U8 && md != DType::F32)
            return unsupported(where(n) + ": mask must be bool, u8 or f32");
        }
        AttentionShape s;
        s.t = q[0], s.h = q[1], s.dh = q[2], s.s = k[0], s.hk = k[1], s.dv = v[2];
        s.kv_block = n.attrs.get_int("kv_block", 0);
        s.lean = eight_bit_weights_;  // an 8-bit package's engine: no cuDNN unless asked (cudnn_attention.h)
        p.att = s;
        p.bf16 = options_.bf16_mqa_attention && s.hk == 1 && s.h > 1 && s.dh == s.dv && (s.dh == 72 || s.dh == 256);
        // fast_vision: SigLIP's fp32 attention (16 heads of 72) in the bf16 tensor-core kernel too.
        if (options_.fast_vision && s.dh == s.dv && (s.dh == 72 || s.dh == 256)) p.bf16 = true;
        const DType io = p.bf16 ? DType::BF16 : DType::F32;
        p.splits = attention_splits(s, io, ctx_->sms());
        // Its scratch (bf16 copies of q/k/v not stored in bf16, then the split partials) is laid
        // out after plan_bf16_stores.
        p.split_bytes = attention_scratch_bytes(s, io, p.splits);
        break;
      }
      case OpKind::Embedding: {
        const ValueInfo& table = in_info(n, 0);
        if (in_info(n, 1).dtype != DType::I64) return unsupported(where(n) + ": ids must be i64");
        const DType od = g.info(n.outputs[0]).dtype;
        if (od != DType::F32 && od != DType::BF16) return unsupported(where(n) + ": output must be f32 or bf16");
        if (!is_weight(n, 0)) return unsupported(where(n) + ": the table must be a weight");
        const CudaWeights::Entry* e = weight_entry_[size_t(root_[size_t(n.inputs[0])])];
        const int64_t t = in_info(n, 1).numel();
        max_t = std::max(max_t, t);
        if (is_quant_dtype(e->dtype) && !e->host_table)
          return unsupported(where(n) + ": an 8-bit table is gathered on the host only (a gather-only package weight)");
        if (e->host_table) {
          // The ids come from the host (write_input): the input keeps a host copy to check them.
          const ValueId ids = n.inputs[1];
          const Node& prod = g.node(g.value(root_[size_t(ids)]).producer);
          int idx = -1;
          for (size_t i = 0; i < g.inputs().size(); ++i)
            if (g.inputs()[i] == prod.outputs[0]) idx = int(i);
          if (idx < 0) return unsupported(where(n) + ": a host-mapped table needs its ids as an engine input");
          inputs_[size_t(idx)].keep_shadow = true;
          auto hg = std::make_unique<HostGather>();
          hg->table = static_cast<const uint8_t*>(e->data);
          hg->table_dtype = e->dtype;
          hg->rounds = e->rounds_to_bf16;
          hg->rows_dtype = e->rounds_to_bf16 ? DType::BF16 : is_quant_dtype(e->dtype) ? DType::F32 : e->dtype;
          hg->vocab = table.shape[0];
          hg->d = table.shape[1];
          hg->t = t;
          hg->ids = &inputs_[size_t(idx)].host_src;
          hg->fd = e->fd;
          hg->file_offset = e->file_offset;
          if (hg->rounds) hg->f32_row.resize(size_t(hg->d) * 4);
          if (is_quant_dtype(e->dtype)) {
            hg->f32_row.resize(size_t(hg->d));
            hg->scales_at = quant_scales_offset(hg->vocab, hg->d);
          }
          const uint64_t rows = uint64_t(t) * uint64_t(hg->d) * dtype_size(hg->rows_dtype);
          VLAC_ASSIGN_OR_RETURN(hg->rows_host, host_alloc(rows, "engine '" + label + "': embedding rows"));
          p.cast_off = 0;
          scratch = std::max(scratch, al(rows));
          p.gather = hg.get();
          gathers_.push_back(std::move(hg));
        }
        break;
      }
      case OpKind::Cast: {
        const DType a = in_info(n, 0).dtype, o = g.info(n.outputs[0]).dtype;
        if ((a != DType::F32 && a != DType::BF16) || (o != DType::F32 && o != DType::BF16))
          return unsupported(where(n) + ": casts between f32 and bf16 only");
        break;
      }
      case OpKind::RoPE:
        VLAC_RETURN_IF_ERROR(need_f32(n, 0));
        if (in_info(n, 1).dtype != DType::I64) return unsupported(where(n) + ": positions must be i64");
        if (in_info(n, 0).shape.size() != 3) return unsupported(where(n) + ": x must be [T, H, Dh]");
        break;
      case OpKind::Add:
      case OpKind::Sub:
      case OpKind::Mul: {
        VLAC_RETURN_IF_ERROR(need_f32(n, 0));
        VLAC_RETURN_IF_ERROR(need_f32(n, 1));
        const int64_t na = in_info(n, 0).numel(), nb = in_info(n, 1).numel(), no = g.info(n.outputs[0]).numel();
        if (na <= 0 || nb <= 0 || no % na != 0 || no % nb != 0 || (na != no && nb != no))
          return unsupported(where(n) + ": broadcast of " + ir::to_string(in_info(n, 0)) + " and " +
                             ir::to_string(in_info(n, 1)) + " (only a repeated operand)");
        break;
      }
      case OpKind::Concat:
      case OpKind::Slice:
        break;
      case OpKind::Scale:
      case OpKind::LayerNorm:
      case OpKind::RMSNorm:
      case OpKind::AdaRMSNorm:
      case OpKind::GeluTanh:
      case OpKind::GeGLU:
      case OpKind::SiLU:
      case OpKind::TimeEmbedding:
      case OpKind::EulerStep:
        for (size_t i = 0; i < n.inputs.size(); ++i) VLAC_RETURN_IF_ERROR(need_f32(n, i));
        for (ValueId o : n.outputs)
          if (g.info(o).dtype != DType::F32) return unsupported(where(n) + ": f32 outputs only");
        break;
      case OpKind::Softmax:
      case OpKind::MatMul:
      case OpKind::Transpose:
        return unsupported(where(n) + ": not implemented on the CUDA backend");
    }
  }
  scratch_bytes_ = scratch;

  // Constants: one device block, filled now.
  if (const_bytes > 0) {
    VLAC_ASSIGN_OR_RETURN(const_storage_, device_alloc(const_bytes, "engine '" + label + "': constants"));
    std::vector<float> host(const_bytes / 4, 0.0f);
    uint64_t at = 0;
    for (NodeId id : order_) {
      const Node& n = g.node(id);
      if (n.op != OpKind::Constant) continue;
      const ValueInfo& o = g.info(n.outputs[0]);
      std::fill_n(host.data() + at / 4, o.numel(), float(n.attrs.get_float("value")));
      ptr_[size_t(n.outputs[0])] = static_cast<uint8_t*>(const_storage_) + at;
      at += al(o.bytes());
    }
    const cudaError_t e = cudaMemcpy(const_storage_, host.data(), const_bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return cuda_error("engine '" + label + "': constants", e);
  }
  if (!gathers_.empty()) {
    std::vector<int64_t> iota(static_cast<size_t>(max_t));
    for (int64_t i = 0; i < max_t; ++i) iota[size_t(i)] = i;
    VLAC_ASSIGN_OR_RETURN(iota_, device_alloc(uint64_t(max_t) * 8, "engine '" + label + "': embedding ids"));
    const cudaError_t e = cudaMemcpy(iota_, iota.data(), uint64_t(max_t) * 8, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return cuda_error("engine '" + label + "': embedding ids", e);
  }

  // Stable inputs (ExecOptions::stable_inputs): a Concat along axis 0 with pieces read from them
  // keeps its output between runs in a buffer of its own, so those pieces (pi0.5's prefix K/V, the
  // bulk of every denoising step's keys and values) are copied, and rounded to bf16, once per
  // change instead of in every run.
  stable_input_.assign(g.inputs().size(), 0);
  std::vector<uint8_t> stable_root(nv, 0), outside(nv, 0);
  std::vector<std::pair<ValueId, int64_t>> inplace_views;  // (value, element offset in its Concat)
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const std::string name = ir::input_name(g, g.inputs()[i]);
    for (const std::string& s : options_.stable_inputs)
      if (s == name) stable_input_[i] = 1, stable_root[size_t(g.inputs()[i])] = 1;
  }
  {
    std::vector<uint8_t> is_out(nv, 0);
    for (ValueId o : g.outputs()) is_out[size_t(root_[size_t(o)])] = 1;
    for (NodeId id : order_) {
      const Node& n = g.node(id);
      if (n.op != OpKind::Concat || n.inputs.size() > 32) continue;
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += int64_t(g.info(n.outputs[0]).shape.size());
      const ValueId o = n.outputs[0];
      if (axis != 0 || root_[size_t(o)] != o || is_out[size_t(o)]) continue;
      uint32_t mask = 0;
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (stable_root[size_t(root_[size_t(n.inputs[i])])]) mask |= 1u << i;
      if (!mask) continue;
      plans_[size_t(id)].stable_pieces = mask;
      outside[size_t(o)] = 1;
      // The other pieces' producers write their rows of the output themselves when this Concat
      // is their only reader: a RoPE (the step's own keys), a column Slice of a fused GEMM (its
      // values, converted by cast_rows). Their values become views into the output.
      int64_t elem = 0;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ValueId r = root_[size_t(n.inputs[i])];
        const int64_t cnt = g.info(n.inputs[i]).numel();
        const NodeId pid = g.value(r).producer;
        const Node& pn = g.node(pid);
        bool ok = !((mask >> i) & 1u) && !is_out[size_t(r)] && g.info(r).dtype == DType::F32;
        if (ok && pn.op == OpKind::Slice) {
          const ValueInfo& xi = g.info(pn.inputs[0]);
          int64_t ax = pn.attrs.get_int("axis", 0);
          if (ax < 0) ax += int64_t(xi.shape.size());
          ok = xi.shape.size() == 2 && ax == 1 && xi.dtype == DType::F32 && !plans_[size_t(pid)].view;
        } else if (pn.op != OpKind::RoPE) {
          ok = false;
        }
        int readers = 0;
        for (NodeId rid : order_) {
          const Node& rn = g.node(rid);
          if (rn.op == OpKind::Reshape) continue;
          for (ValueId in : rn.inputs)
            if (root_[size_t(in)] == r) readers += rid == id ? 1 : 2;
        }
        if (ok && readers == 1) {
          plans_[size_t(id)].inplace_pieces |= 1u << i;
          if (pn.op == OpKind::Slice) plans_[size_t(pid)].into_concat = true;
          for (size_t v = 0; v < nv; ++v)
            if (root_[v] == r) {
              root_[v] = o;
              inplace_views.push_back({ValueId(v), elem});
            }
        }
        elem += cnt;
      }
    }
  }

  // Memo of the nodes that depend on the memo inputs alone (exec/memo_plan): planned before the
  // arena, since what is stored in bf16 (below) depends on it and sizes the arena's blocks.
  if (options_.memo_slots > 0) memo_ = exec::plan_memo(g, order_, root_, options_.memo_inputs);
  if (!memo_.enabled()) {
    memo_ = {};
    memo_.node.assign(g.nodes().size(), 0);
    memo_.results.assign(g.nodes().size(), {});
  }
  // Weights left in the file for the memo (CudaWeights::fetch) go through a few device buffers,
  // one per weight a node reads. Read outside the memo they would be fetched at every run.
  weights_ = &weights;
  reads_on_demand_.assign(g.nodes().size(), 0);
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op == OpKind::Weight || n.op == OpKind::Reshape) continue;
    for (ValueId v : n.inputs) {
      const CudaWeights::Entry* e = weight_entry_[size_t(root_[size_t(v)])];
      if (!e || !e->on_demand) continue;
      if (reads_on_demand_[size_t(id)]++ == CudaWeights::kFetchSlots)
        return internal_error(where(n) + ": reads more weights left in the file than there are fetch buffers");
      if (!memo_.node[size_t(id)])
        return internal_error(where(n) + ": reads weight '" + e->name + "', left in the file for the memo, outside it");
    }
  }
  VLAC_RETURN_IF_ERROR(plan_bf16_gemm_outputs());
  VLAC_RETURN_IF_ERROR(plan_gemm_gelu());
  VLAC_RETURN_IF_ERROR(plan_qkv_attention_views());
  VLAC_RETURN_IF_ERROR(plan_geglu_in_place());
  plan_bf16_stores();
  plan_k_parts();
  VLAC_RETURN_IF_ERROR(plan_quant_skinny());
  VLAC_RETURN_IF_ERROR(plan_expert_mlp());
  VLAC_RETURN_IF_ERROR(plan_quant_fp8());
  // The scratch holds a bf16 copy of a bf16 Linear's x only where x is not stored in bf16 already
  // (the LM's down_proj reads GeGLU's bf16 output: no 32 MB copy), and an attention's copies only
  // of the q/k/v it must round itself, then its split partials.
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    if (n.op == OpKind::Linear && p.bf16 && p.gemm.m > 0 && !p.qfp8 && !bf16_stored(n.inputs[0]))  // (FP8: codes)
      scratch_bytes_ = std::max(scratch_bytes_, al(uint64_t(g.info(n.inputs[0]).numel()) * 2));
    if (n.op != OpKind::Attention) continue;
    const AttentionShape& sh = p.att;
    uint64_t at = 0;
    if (p.bf16) {
      uint64_t* offs[3] = {&p.cast_off, &p.k_off, &p.v_off};
      const int64_t counts[3] = {sh.t * sh.h * sh.dh, sh.s * sh.hk * sh.dh, sh.s * sh.hk * sh.dv};
      for (size_t i = 0; i < 3; ++i) {
        if (bf16_stored(n.inputs[i])) continue;
        *offs[i] = at;
        at += al(uint64_t(counts[i]) * 2);
      }
    }
    p.split_off = at;
    scratch_bytes_ = std::max(scratch_bytes_, at + al(p.split_bytes));
  }

  plan_dequant_groups();
  // The widened 8-bit weight of the GEMM about to run: behind everything else in the scratch
  // (a node's own scratch use, e.g. its x's bf16 copy, lies before it), then its fp32 sums.
  if (dequant_bytes_) {
    dequant_off_ = al(scratch_bytes_);
    scratch_bytes_ = dequant_off_ + dequant_bytes_;
  }
  plan_quant_exact();
  if (qsum_bytes_) {
    qsum_off_ = al(scratch_bytes_);
    scratch_bytes_ = qsum_off_ + qsum_bytes_;
  }
  if (qfp8_bytes_) {
    qfp8_off_ = al(scratch_bytes_);
    scratch_bytes_ = qfp8_off_ + qfp8_bytes_;
  }

  // Activations: one arena from liveness (exec/arena_plan), the CPU executor's plan, each block
  // sized for what is stored there (bf16 values take half their f32 size).
  std::vector<uint64_t> stored(nv, 0);
  for (size_t v = 0; v < nv; ++v)
    if (bf16_store_[v] || k_parts_[v] > 1) stored[v] = stored_bytes(ValueId(v));
  std::vector<int64_t> lifetimes = residual_norm_lifetimes();
  rope_attention_lifetimes(lifetimes);
  exec::ArenaPlan arena = exec::plan_arena(g, order_, root_, outside, lifetimes, stored);
  arena_bytes_ = arena.bytes;
  arena_blocks_ = std::move(arena.blocks);
  if (!options_.shared_memory) {
    VLAC_ASSIGN_OR_RETURN(own_arena_, device_alloc(arena_bytes_, "engine '" + label + "': the activation arena"));
    VLAC_ASSIGN_OR_RETURN(own_scratch_, device_alloc(scratch_bytes_, "engine '" + label + "': the kernel scratch"));
    bind_memory(own_arena_, own_scratch_);
  }

  // Memo slots on the device.
  if (memo_.enabled()) {
    VLAC_ASSIGN_OR_RETURN(memo_storage_, device_alloc(memo_.slot_bytes * uint64_t(options_.memo_slots),
                                                      "engine '" + label + "': memo slots"));
    memo_keys_.assign(size_t(options_.memo_slots), std::vector<uint8_t>(memo_.key_bytes));
    memo_valid_.assign(size_t(options_.memo_slots), 0);
    for (int i : memo_.key_inputs) inputs_[size_t(i)].keep_shadow = true;
  }
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].keep_shadow) inputs_[i].shadow.resize(g.info(g.inputs()[i]).bytes());
  for (NodeId id : order_)
    if (plans_[size_t(id)].view && memo_.node[size_t(id)])
      return internal_error(where(g.node(id)) + ": a slice view cannot be a memo result");
  plan_residual_norms();
  keep_fused_k_parts();
  plan_fp8_fused_codes();
  plan_rope_pairs();
  plan_prefix_qkv();
  VLAC_RETURN_IF_ERROR(plan_rope_attention());
  plan_timing_skip();
  plan_prefetches();
  // The Concats kept between runs (pi0.5's prefix keys and values, each with the step's own rows
  // after them) share one block, so one L2 window covers them all (plan_kv_window).
  {
    std::vector<std::pair<ValueId, uint64_t>> kept;  // (output, offset in the block)
    uint64_t total = 0;
    for (NodeId id : order_) {
      if (!plans_[size_t(id)].stable_pieces) continue;
      const ValueId o = g.node(id).outputs[0];
      kept.push_back({o, total});
      total += exec::align_up(uint64_t(g.info(o).numel()) * (bf16_stored(o) ? 2 : dtype_size(g.info(o).dtype)), 256);
    }
    if (total) {
      VLAC_ASSIGN_OR_RETURN(void* b, device_alloc(total, "engine '" + label + "': the Concat outputs kept between runs"));
      own_blocks_.push_back(b);
      for (const auto& [o, off] : kept) ptr_[size_t(o)] = static_cast<uint8_t*>(b) + off;
      plan_kv_window(b, total);
    }
  }
  for (const auto& [v, elem] : inplace_views)
    view_off_[size_t(v)] = uint64_t(elem) * (bf16_stored(v) ? 2 : dtype_size(g.info(v).dtype));
  plan_attention_early();
  // Memo results read in place from their slot (point_memo_results): those that own their
  // arena block (not graph outputs, whose pointers callers may keep).
  arena_off_.assign(nv, -1);
  for (const auto& [v, off] : arena_blocks_) arena_off_[size_t(v)] = int64_t(off);
  if (memo_.enabled()) {
    memo_in_slot_.assign(nv, 0);
    std::vector<uint8_t> out(nv, 0);
    for (ValueId o : g.outputs()) out[size_t(root_[size_t(o)])] = 1;
    for (NodeId id : order_)
      for (const auto& [v, off] : memo_.results[size_t(id)]) {
        const size_t r = size_t(root_[size_t(v)]);
        if (ValueId(r) == v && !out[r] && arena_off_[r] >= 0) memo_in_slot_[r] = 1;
        else if (op_profile_level() >= 2)  // why a hit will copy it (the profile's "result copied")
          std::fprintf(stderr, "vlac cuda profile: engine '%s': memo result of '%s' is copied at hits (%s)\n",
                       options_.label.c_str(), g.node(id).name.c_str(),
                       ValueId(r) != v ? "a view" : out[r] ? "an engine output" : "no arena block of its own");
      }
    // An adaRMS gate (mod[2D:3D]) of a modulation kept in the slot is a view there, not a copy.
    for (NodeId id : order_) {
      const Node& n = g.node(id);
      if (n.op != OpKind::AdaRMSNorm || n.outputs.size() < 2 || memo_.node[size_t(id)]) continue;
      const ValueId gr = n.outputs[1], mr = root_[size_t(n.inputs[1])];
      if (root_[size_t(gr)] != gr || out[size_t(gr)] || arena_off_[size_t(gr)] < 0 || !memo_in_slot_[size_t(mr)]) continue;
      gate_views_.push_back({gr, mr, last_dim(g.info(n.inputs[0]))});
    }
  }
  plan_input_waits();
  return Status::ok();
}

// Where a run waits for an input's mark (wait_input): before the first launch that reads it.
// A node's work launches at its own place except where a plan pass runs it from an earlier
// node's launch (the second RoPE of a pair, the v copy, the prefix q|k|v launch, the expert MLP),
// so each reader counts at the place its work is launched from. A Reshape or view counts as a
// reader: waiting earlier than needed is only slower.
void CudaExecutable::plan_input_waits() {
  const ir::Graph& g = graph_;
  std::vector<size_t> launch_pos(g.nodes().size(), order_.size());
  for (size_t i = 0; i < order_.size(); ++i) launch_pos[size_t(order_[i])] = i;
  for (size_t i = 0; i < order_.size(); ++i) {
    const NodePlan& p = plans_[size_t(order_[i])];
    for (int64_t moved : {p.rope_pair, p.rope_copy, p.qkv_k, p.qkv_v})
      if (moved >= 0) launch_pos[size_t(moved)] = std::min(launch_pos[size_t(moved)], i);
    if (p.mlp >= 0)
      for (NodeId moved : {mlps_[size_t(p.mlp)].geglu, mlps_[size_t(p.mlp)].down})
        launch_pos[size_t(moved)] = std::min(launch_pos[size_t(moved)], i);
  }
  std::vector<size_t> first(g.values().size(), order_.size());
  for (NodeId id : order_)
    for (ValueId in : g.node(id).inputs) first[size_t(in)] = std::min(first[size_t(in)], launch_pos[size_t(id)]);
  input_first_pos_.clear();
  for (ValueId v : g.inputs()) input_first_pos_.push_back(first[size_t(v)]);
  input_wait_.assign(g.inputs().size(), -1);
}

void CudaExecutable::wait_input(int i, int mark) {
  if (i >= 0 && size_t(i) < input_wait_.size()) input_wait_[size_t(i)] = mark;
}

// L2 prefetches of the latency-bound GEMMs' weights (l2_prefetch.h): GEMMs with at most
// max_rows rows of x whose weight is resident in bf16 (not left in the file, not widened from
// 8 bits, not a memo node, which a hit skips).
void CudaExecutable::plan_prefetches() {
  prefetches_.clear();
  const L2PrefetchSettings s = l2_prefetch_settings();
  if (s.cap == 0) return;
  prefetch_blocks_ = s.blocks;
  std::vector<PrefetchGemm> gemms;
  for (size_t i = 0; i < order_.size(); ++i) {
    const NodeId id = order_[i];
    const Node& n = graph_.node(id);
    const NodePlan& p = plans_[size_t(id)];
    if (n.op != OpKind::Linear || n.inputs.size() < 2 || p.gemm.m == 0 || p.gemm.m > s.max_rows || p.qskinny ||
        p.qexact || memo_.node[size_t(id)] || !from_weight(n.inputs[1]))
      continue;
    const size_t r = size_t(root_[size_t(n.inputs[1])]);
    const CudaWeights::Entry* e = weight_entry_[r];
    if (!e || e->on_demand || e->host_table || widened(ValueId(r))) continue;
    const ValueInfo& w = graph_.info(n.inputs[1]);
    gemms.push_back({i, L2Range{ptr(n.inputs[1]), uint64_t(w.numel()) * dtype_size(weight_dtype_[r])}});
  }
  prefetches_ = plan_l2_prefetch(gemms, s.cap, s.batch);
  for (size_t i = 0; i < prefetches_.size(); ++i) {  // at most kMaxL2Ranges per launch: split the rest off
    std::vector<L2Range>& r = prefetches_[i].ranges;
    if (r.size() <= size_t(kMaxL2Ranges)) continue;
    PrefetchLaunch more{prefetches_[i].before, std::vector<L2Range>(r.begin() + kMaxL2Ranges, r.end())};
    r.resize(kMaxL2Ranges);
    prefetches_.push_back(std::move(more));
  }
  std::erase_if(prefetches_, [&](const PrefetchLaunch& l) { return l.before >= order_.size(); });
  uint64_t bytes = 0;
  for (const PrefetchLaunch& l : prefetches_)
    for (const L2Range& r : l.ranges) bytes += r.bytes;
  note_l2_prefetch_plan(prefetches_.size(), bytes);
  std::stable_sort(prefetches_.begin(), prefetches_.end(),
                   [](const PrefetchLaunch& a, const PrefetchLaunch& b) { return a.before < b.before; });
}

// Slice views: the fused q|k|v and gate|up GEMMs (ir/fuse) write one [R, W] output that the
// graph cuts into column Slices. Where every reader of a slice takes strided rows (RoPE reads
// x_stride, GeGLU reads in_stride), the slice is not copied: its value becomes a view into the
// fused output (same storage root, so the arena keeps that block alive until the last reader),
// and the readers get the fused width as their row stride. A Reshape between slice and reader
// may only split the last dimension (rows unchanged). Graph outputs and memo results keep their
// own contiguous block. Same bits as the copy, one kernel and 2 x the slice's bytes fewer.
void CudaExecutable::plan_slice_views() {
  const ir::Graph& g = graph_;
  const size_t nv = g.values().size();
  view_off_.assign(nv, 0);
  view_stride_.assign(nv, 0);
  const std::vector<uint8_t> is_out = output_roots();
  const auto readers = readers_by_root();  // Reshapes see through
  auto slice_of = [&](ValueId v) -> const Node* {  // the Slice producing v's root, if any
    const Node& n = g.node(g.value(root_[size_t(v)]).producer);
    return n.op == OpKind::Slice ? &n : nullptr;
  };
  auto viewable = [&](const Node& sl) {
    if (sl.inputs.size() != 1 || sl.outputs.size() != 1) return false;
    const ValueId in = sl.inputs[0], out = sl.outputs[0];
    const ValueInfo& xi = g.info(in);
    if (xi.shape.size() != 2 || xi.dtype != DType::F32 || root_[size_t(in)] != in) return false;
    const OpKind pop = g.node(g.value(in).producer).op;
    if (pop != OpKind::Linear) return false;  // an arena activation, never an input or a weight
    int64_t axis = sl.attrs.get_int("axis", 0);
    if (axis < 0) axis += 2;
    if (axis != 1 || is_out[size_t(out)] || root_[size_t(out)] != out) return false;
    // Every alias keeps the rows: a Reshape may split only the last dimension.
    for (size_t v = 0; v < nv; ++v)
      if (root_[v] == out && ValueId(v) != out) {
        const ValueInfo& a = g.info(ValueId(v));
        if (a.shape.empty() || a.shape[0] != xi.shape[0] || is_out[v]) return false;
      }
    for (const auto& [r, i] : readers[size_t(out)]) {
      const Node& rn = g.node(r);
      if (rn.op == OpKind::RoPE && i == 0) continue;
      if (rn.op == OpKind::GeGLU && i < 2) {
        // GeGLU takes one stride for both: gate and up must be slices of the same fused output.
        const Node* a = slice_of(rn.inputs[0]);
        const Node* b = slice_of(rn.inputs[1]);
        if (a && b && a->inputs[0] == b->inputs[0]) continue;
      }
      return false;
    }
    return !readers[size_t(out)].empty();
  };
  std::vector<NodeId> views;
  for (NodeId id : order_)
    if (g.node(id).op == OpKind::Slice && viewable(g.node(id))) views.push_back(id);
  // GeGLU: both of its slices must be views, or neither.
  std::vector<uint8_t> chosen(g.nodes().size(), 0);
  for (NodeId id : views) chosen[size_t(id)] = 1;
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op != OpKind::GeGLU) continue;
    const ValueId a = g.value(root_[size_t(n.inputs[0])]).producer, b = g.value(root_[size_t(n.inputs[1])]).producer;
    const bool both = chosen[size_t(a)] && chosen[size_t(b)];
    if (!both) chosen[size_t(a)] = 0, chosen[size_t(b)] = 0;
  }
  for (NodeId id : views) {
    if (!chosen[size_t(id)]) continue;
    const Node& sl = g.node(id);
    const ValueId in = sl.inputs[0], out = sl.outputs[0];
    const int64_t w = g.info(in).shape[1];
    const uint64_t off = uint64_t(sl.attrs.get_int("start", 0)) * 4;
    for (size_t v = 0; v < nv; ++v)
      if (root_[v] == out) {
        root_[v] = in;
        view_off_[v] = off;
        view_stride_[v] = w;
      }
    plans_[size_t(id)].view = true;
  }
}

std::vector<std::vector<std::pair<NodeId, size_t>>> CudaExecutable::readers_by_root() const {
  std::vector<std::vector<std::pair<NodeId, size_t>>> readers(graph_.values().size());
  for (NodeId id : order_) {
    const Node& n = graph_.node(id);
    if (n.op == OpKind::Reshape) continue;
    for (size_t i = 0; i < n.inputs.size(); ++i) readers[size_t(root_[size_t(n.inputs[i])])].push_back({id, i});
  }
  return readers;
}

std::vector<uint8_t> CudaExecutable::output_roots() const {
  std::vector<uint8_t> is_out(graph_.values().size(), 0);
  for (ValueId o : graph_.outputs()) is_out[size_t(root_[size_t(o)])] = 1;
  return is_out;
}

int64_t CudaExecutable::heads_stride(ValueId v) const {
  const ValueInfo& x = graph_.info(v);  // [T, H, D]
  return view_stride_[size_t(v)] ? view_stride_[size_t(v)] : x.shape[1] * x.shape[2];
}

int64_t CudaExecutable::row_stride(ValueId v) const {
  return view_stride_[size_t(v)] ? view_stride_[size_t(v)] : last_dim(graph_.info(v));
}

// Residual + norm: h' = Add(h, branch) (branch = Mul(x, gate[D]) read by that Add alone, or any
// same-shape f32 value) and y = RMSNorm | AdaRMSNorm | LayerNorm(h') become one residual_norm_to
// kernel at the norm's place in the schedule (the Mul and Add are skipped). That moves reads of
// h, x and gate later, so it is done only where the arena says it is safe: every node scheduled
// between the first folded node and the norm writes no block that a folded input lives in, and
// neither output (h', y) overlaps a folded input. Inputs outside the arena must be weights or
// constants. Same bits as the unfused nodes (see residual_norm_kernel).
// RoPE pairs: the expert's q and k RoPEs read the same fused q|k|v output at the same positions
// and follow each other with only views and reshapes between them (no kernel): the first runs
// both in one rope_pair_to launch, the second is skipped. The second's output is written earlier
// than its place, which is safe here: the nodes in between run nothing, and what the first reads
// (the fused output, alive until the second reads it, and the positions, an input) cannot share
// the second's storage. The bits are the two launches'.
void CudaExecutable::plan_rope_pairs() {
  const ir::Graph& g = graph_;
  for (size_t i = 0; i < order_.size(); ++i) {
    const NodeId a = order_[i];
    const Node& na = g.node(a);
    if (na.op != OpKind::RoPE || memo_.node[size_t(a)] || plans_[size_t(a)].skip) continue;
    size_t j = i + 1;
    while (j < order_.size() && runs_nothing(order_[j])) ++j;
    if (j >= order_.size()) continue;
    const NodeId b = order_[j];
    const Node& nb = g.node(b);
    if (nb.op != OpKind::RoPE || memo_.node[size_t(b)] || plans_[size_t(b)].skip) continue;
    const ValueInfo& xa = g.info(na.inputs[0]);
    const ValueInfo& xb = g.info(nb.inputs[0]);
    if (root_[size_t(na.inputs[1])] != root_[size_t(nb.inputs[1])] || xa.shape[0] != xb.shape[0] ||
        xa.shape[2] != xb.shape[2] || na.attrs.get_float("base", 10000.0) != nb.attrs.get_float("base", 10000.0) ||
        bf16_stored(na.outputs[0]) != bf16_stored(nb.outputs[0]))
      continue;
    // Only the fused output (through views) and the positions are read at a's place.
    if (root_[size_t(na.inputs[0])] != root_[size_t(nb.inputs[0])]) continue;
    plans_[size_t(a)].rope_pair = int64_t(b);
    plans_[size_t(b)].skip = true;
    // The v of the same fused output, a column Slice written as rows into its K/V buffer
    // (into_concat), joins the launch when only nodes that run nothing or stable Concats into
    // other buffers come between: it reads the fused output (written before a) and writes rows
    // of its own buffer (outside the arena), which nothing in between reads or writes.
    std::vector<ValueId> between;
    for (size_t k = j + 1; k < order_.size() && k <= j + 8; ++k) {
      const NodeId c = order_[k];
      const Node& nc = g.node(c);
      if (runs_nothing(c)) continue;
      if (nc.op == OpKind::Concat && plans_[size_t(c)].stable_pieces) {
        between.push_back(root_[size_t(nc.outputs[0])]);
        continue;
      }
      const NodePlan& pc = plans_[size_t(c)];
      if (nc.op != OpKind::Slice || !pc.into_concat || pc.view || pc.skip || memo_.node[size_t(c)]) break;
      const ValueInfo& ci = g.info(nc.inputs[0]);
      int64_t ax = nc.attrs.get_int("axis", 0);
      if (ax < 0) ax += int64_t(ci.shape.size());
      if (root_[size_t(nc.inputs[0])] != root_[size_t(na.inputs[0])] || ci.shape.size() != 2 || ax != 1 ||
          ci.shape[0] != xa.shape[0] || ci.dtype != DType::F32 || bf16_stored(nc.inputs[0]) ||
          bf16_stored(nc.outputs[0]) != bf16_stored(na.outputs[0]))
        break;
      const ValueId cr = root_[size_t(nc.outputs[0])];
      if (std::find(between.begin(), between.end(), cr) != between.end()) break;
      plans_[size_t(a)].rope_copy = int64_t(c);
      plans_[size_t(c)].skip = true;
      break;
    }
    ++i;  // b is taken
  }
}

// The prefix LM's q, k and v in one launch (VLAC_PREFIX_QKV=0 turns it off): each layer rotates
// k (an f32 graph output, the expert's K cache), copies v out of the fused q|k|v (an f32 graph
// output too) and rotates q (stored in bf16), and its bf16 attention then casts k and v into its
// scratch: five launches. At the q RoPE's place one rope_qkv_to launch writes all of them, the k
// and v copies in bf16 straight into the attention's scratch, when only nodes that run nothing
// come between the three producers and from the q RoPE to the attention (the scratch is
// untouched in between, and the f32 outputs are written later than their place, which nothing in
// between reads). The same bits as the five launches.
void CudaExecutable::plan_prefix_qkv() {
  if (env_off("VLAC_PREFIX_QKV")) return;
  const ir::Graph& g = graph_;
  std::vector<int64_t> at(g.nodes().size(), -1);
  for (size_t i = 0; i < order_.size(); ++i) at[size_t(order_[i])] = int64_t(i);
  auto producer = [&](ValueId v) -> NodeId { return g.value(root_[size_t(v)]).producer; };
  auto plain = [&](const Node& nn) {  // one output, its own root, not a view, not memoized
    const ValueId o = nn.outputs[0];
    return nn.outputs.size() == 1 && root_[size_t(o)] == o && view_off_[size_t(o)] == 0 && view_stride_[size_t(o)] == 0;
  };
  for (NodeId aid : order_) {
    const Node& an = g.node(aid);
    NodePlan& ap = plans_[size_t(aid)];
    if (an.op != OpKind::Attention || !ap.bf16 || memo_.node[size_t(aid)] || ap.kv_ready || an.inputs.size() < 3) continue;
    const NodeId rq = producer(an.inputs[0]), rk = producer(an.inputs[1]), sv = producer(an.inputs[2]);
    const Node &qn = g.node(rq), &kn = g.node(rk), &vn = g.node(sv);
    if (qn.op != OpKind::RoPE || kn.op != OpKind::RoPE || vn.op != OpKind::Slice) continue;
    bool ok = true;
    for (NodeId m : {rq, rk, sv}) {
      const NodePlan& mp = plans_[size_t(m)];
      ok = ok && !memo_.node[size_t(m)] && !mp.skip && mp.rope_pair < 0 && mp.rope_copy < 0 && !mp.view &&
           !mp.into_concat && mp.qkv_att < 0 && plain(g.node(m)) && !bf16_stored(g.node(m).inputs[0]) &&
           g.info(g.node(m).inputs[0]).dtype == DType::F32;
    }
    if (!ok || !bf16_stored(an.inputs[0]) || bf16_stored(an.inputs[1]) || bf16_stored(an.inputs[2])) continue;
    const ValueInfo &xq = g.info(qn.inputs[0]), &xk = g.info(kn.inputs[0]), &vi = g.info(vn.inputs[0]);
    if (xq.shape.size() != 3 || xk.shape.size() != 3 || vi.shape.size() != 2) continue;
    const int64_t t = xq.shape[0], dh = xq.shape[2];
    int64_t ax = vn.attrs.get_int("axis", 0);
    if (ax < 0) ax += 2;
    const int64_t vc = vn.attrs.get_int("end", vi.shape[1]) - vn.attrs.get_int("start", 0);
    const AttentionShape& sh = ap.att;
    if (ax != 1 || xk.shape[0] != t || xk.shape[2] != dh || vi.shape[0] != t || sh.s != t || sh.hk != xk.shape[1] ||
        sh.dh != dh || vc != sh.hk * sh.dv || root_[size_t(qn.inputs[1])] != root_[size_t(kn.inputs[1])] ||
        qn.attrs.get_float("base", 10000.0) != kn.attrs.get_float("base", 10000.0))
      continue;
    // Schedule: k and v before q, q before the attention, and nothing that runs in between.
    const int64_t first = std::min(at[size_t(rk)], at[size_t(sv)]);
    if (first < 0 || at[size_t(rq)] <= std::max(at[size_t(rk)], at[size_t(sv)]) || at[size_t(aid)] <= at[size_t(rq)]) continue;
    for (int64_t i = first + 1; i < at[size_t(aid)] && ok; ++i) {
      const NodeId m = order_[size_t(i)];
      ok = m == rk || m == sv || m == rq || runs_nothing(m);
    }
    if (!ok) continue;
    NodePlan& qp = plans_[size_t(rq)];
    qp.qkv_k = int64_t(rk), qp.qkv_v = int64_t(sv), qp.qkv_att = int64_t(aid);
    plans_[size_t(rk)].skip = true;
    plans_[size_t(sv)].skip = true;
    ap.kv_ready = true;
  }
}

// The expert's RoPE inside its attention. Each expert layer's q and k RoPEs read the fused q|k|v
// GEMM's f32 rows and run as one launch (plan_rope_pairs) that also copies v; the attention then
// reads q (bf16) and K/V, Concats [prefix | the step's own rows] in buffers of their own whose
// last rows that launch wrote. Here the attention reads those f32 rows instead (AttentionRope):
// q and the fresh keys rotated as they load, the fresh values rounded, with the angles from a
// table that the first such attention of a run fills (rope_sincos: one launch a step instead of
// one a layer). Taken where every reader of q's and K/V's storage is that attention (and the
// Concats themselves), only nodes that launch nothing, or the two Concats (which copy their
// stable pieces only), run between the RoPE and the attention, and the fresh rows are the
// Concats' last. The same bits as the separate launches (one rotation and rounding per element).
// Opt-in (VLAC_ROPE_ATTENTION=1): on an H100 a recorded chunk took 0.7 ms longer with it (session
// 23). The rope launch overlaps its neighbours under PDL, while the attention's plain loads of
// the f32 rows sit on its critical path.
void CudaExecutable::rope_attention_lifetimes(std::vector<int64_t>& at) const {
  if (!env_on("VLAC_ROPE_ATTENTION")) return;
  const ir::Graph& g = graph_;
  for (size_t i = 0; i < order_.size(); ++i) {
    const Node& an = g.node(order_[i]);
    if (an.op != OpKind::Attention || an.inputs.size() != 3) continue;
    const Node& qn = g.node(g.value(root_[size_t(an.inputs[0])]).producer);
    const Node& kc = g.node(g.value(root_[size_t(an.inputs[1])]).producer);
    if (qn.op != OpKind::RoPE || kc.op != OpKind::Concat) continue;
    // The fused rows are read at the attention's place: they must outlive the Concats in between.
    int64_t& life = at[size_t(root_[size_t(qn.inputs[0])])];
    life = std::max(life, int64_t(i));
  }
}

Status CudaExecutable::plan_rope_attention() {
  if (!env_on("VLAC_ROPE_ATTENTION")) return Status::ok();
  const ir::Graph& g = graph_;
  std::vector<int64_t> at(g.nodes().size(), -1);
  for (size_t i = 0; i < order_.size(); ++i) at[size_t(order_[i])] = int64_t(i);
  const auto readers = readers_by_root();
  const auto through_reshapes = [&](ValueId v) {
    NodeId pid = g.value(v).producer;
    while (g.node(pid).op == OpKind::Reshape) pid = g.value(g.node(pid).inputs[0]).producer;
    return pid;
  };
  bool first = true;
  ValueId pos_root = 0;
  int64_t t0 = 0, dh0 = 0;
  double base0 = 0;
  for (NodeId aid : order_) {
    const Node& an = g.node(aid);
    NodePlan& ap = plans_[size_t(aid)];
    if (an.op != OpKind::Attention || !ap.bf16 || memo_.node[size_t(aid)] || ap.kv_ready || an.inputs.size() != 3 ||
        ap.att.kv_block > 0)
      continue;
    const NodeId rq = g.value(root_[size_t(an.inputs[0])]).producer;
    const Node& qn = g.node(rq);
    const NodePlan& qp = plans_[size_t(rq)];
    if (qn.op != OpKind::RoPE || qp.rope_pair < 0 || qp.rope_copy < 0 || qp.skip || memo_.node[size_t(rq)]) continue;
    const NodeId rk = NodeId(qp.rope_pair), sv = NodeId(qp.rope_copy);
    const Node &kn = g.node(rk), &vn = g.node(sv);
    const ValueId kr = root_[size_t(an.inputs[1])], vr = root_[size_t(an.inputs[2])];
    const NodeId kc = g.value(kr).producer, vc = g.value(vr).producer;
    if (g.node(kc).op != OpKind::Concat || g.node(vc).op != OpKind::Concat || root_[size_t(kn.outputs[0])] != kr ||
        root_[size_t(vn.outputs[0])] != vr || through_reshapes(g.node(kc).inputs.back()) != rk ||
        through_reshapes(g.node(vc).inputs.back()) != sv)
      continue;
    // Stored in bf16 where the attention reads them; the fused rows in f32.
    if (!bf16_stored(an.inputs[0]) || !bf16_stored(an.inputs[1]) || !bf16_stored(an.inputs[2]) ||
        bf16_stored(qn.inputs[0]) || bf16_stored(kn.inputs[0]) || bf16_stored(vn.inputs[0]) ||
        g.info(qn.inputs[0]).dtype != DType::F32 || g.info(kn.inputs[0]).dtype != DType::F32 ||
        g.info(vn.inputs[0]).dtype != DType::F32)
      continue;
    const ValueInfo &xq = g.info(qn.inputs[0]), &xk = g.info(kn.inputs[0]), &vi = g.info(vn.inputs[0]);
    const AttentionShape& sh = ap.att;
    if (xq.shape.size() != 3 || xk.shape.size() != 3 || vi.shape.size() != 2) continue;
    const int64_t t = xq.shape[0], dh = xq.shape[2];
    const int64_t vstart = vn.attrs.get_int("start", 0), vcols = vn.attrs.get_int("end", vi.shape[1]) - vstart;
    const int64_t qs = heads_stride(qn.inputs[0]), ks = heads_stride(kn.inputs[0]);
    if (sh.t != t || sh.h != xq.shape[1] || sh.hk != xk.shape[1] || xk.shape[0] != t || xk.shape[2] != dh ||
        sh.dh != dh || sh.dv != dh || (dh != 256 && dh != 72) || sh.s < t || vi.shape[0] != t ||
        vcols != sh.hk * sh.dv || qs % 4 || ks % 4 || vi.shape[1] % 4 || vstart % 4 ||
        view_off_[size_t(qn.inputs[0])] % 16 || view_off_[size_t(kn.inputs[0])] % 16)
      continue;
    // Only the attention (and the Concats) read q's and K/V's storage.
    bool ok = true;
    for (const auto& [r, i] : readers[size_t(root_[size_t(an.inputs[0])])]) ok = ok && r == aid;
    for (const auto& [r, i] : readers[size_t(kr)]) ok = ok && (r == aid || r == kc);
    for (const auto& [r, i] : readers[size_t(vr)]) ok = ok && (r == aid || r == vc);
    // Between the RoPE and the attention: nothing that launches, but the two Concats.
    for (int64_t i = at[size_t(rq)] + 1; ok && i < at[size_t(aid)]; ++i) {
      const NodeId m = order_[size_t(i)];
      ok = m == rk || m == sv || m == kc || m == vc || runs_nothing(m);
    }
    if (!ok || at[size_t(rq)] < 0 || at[size_t(aid)] <= at[size_t(rq)]) continue;
    // One table for every folded attention: the same positions, tokens, head dim and base.
    const double base = qn.attrs.get_float("base", 10000.0);
    if (first) {
      pos_root = root_[size_t(qn.inputs[1])], t0 = t, dh0 = dh, base0 = base;
      VLAC_ASSIGN_OR_RETURN(void* b, device_alloc(uint64_t(t) * uint64_t(dh) * 4, where(an) + ": the RoPE angles"));
      own_blocks_.push_back(b);
      rope_table_ = static_cast<float*>(b);
      ap.rope_table = true;
      first = false;
    } else if (root_[size_t(qn.inputs[1])] != pos_root || t != t0 || dh != dh0 || base != base0) {
      continue;
    }
    ap.rope_q = int64_t(rq);
    plans_[size_t(rq)].skip = true;  // its pair and copy were skipped already (plan_rope_pairs)
    ++rope_folds_;
  }
  if (rope_folds_) note_rope_attention_folds(uint64_t(rope_folds_));
  return Status::ok();
}

int64_t CudaExecutable::stable_rows(ValueId v) const {
  const ir::Graph& g = graph_;
  const ValueId r = root_[size_t(v)];
  const Node& c = g.node(g.value(r).producer);
  const uint32_t stable = c.op == OpKind::Concat ? plans_[size_t(g.value(r).producer)].stable_pieces : 0u;
  if (!stable || !bf16_stored(v) || view_off_[size_t(v)] != 0) return 0;
  int64_t rows = 0;  // the leading pieces that are stable (axis 0: a piece's rows are keys)
  for (size_t i = 0; i < c.inputs.size() && ((stable >> i) & 1u); ++i) rows += g.info(c.inputs[i]).shape[0];
  return rows;
}

// VLAC_ATTN_EARLY (bits; off by default): 1 the early loads, 2 the RoPE pair's early trigger. On an
// H100 (session 33) both together cost 0.3-0.45 ms a chunk.
void CudaExecutable::plan_attention_early() {
  const int64_t mode = env_count("VLAC_ATTN_EARLY", 0);
  if (mode <= 0) return;
  const ir::Graph& g = graph_;
  uint64_t early = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    const NodeId id = order_[i];
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    if (n.op != OpKind::Attention || !p.bf16 || p.rope_q >= 0 || p.att.kv_block > 0 || p.skip) continue;
    const int64_t keys = std::min(stable_rows(n.inputs[1]), stable_rows(n.inputs[2]));
    if (keys <= 0) continue;
    if (mode & 1) p.stable_keys = keys, ++early;
    if (!(mode & 2)) continue;
    // The launch before it in a run that keeps the stable pieces: the Concats then run nothing,
    // nor do views, reshapes and the nodes another launch took over (skip).
    for (size_t j = i; j-- > 0;) {
      const NodeId m = order_[j];
      const NodePlan& pm = plans_[size_t(m)];
      if (runs_nothing(m) || pm.skip || (g.node(m).op == OpKind::Concat && pm.stable_pieces)) continue;
      if (g.node(m).op == OpKind::RoPE && pm.rope_pair >= 0 && !memo_.node[size_t(m)])
        plans_[size_t(m)].early_dependents = true;
      break;
    }
  }
  if (early) note_attention_early_loads(early);
}

// What plan_residual_norms may fold into a norm (h + gate·branch, then the norm of the sum) is
// read by the one fused kernel at the norm's place: those values stay alive until there, so the
// arena never gives their storage to the sum or the norm's output (the planner would otherwise
// reuse the branch's block, dead after the Mul, for the sum, and the fusion would not apply).
// Structural only (before the arena and the memo exist): a candidate that plan_residual_norms
// then rejects only costs its values a few nodes of extra life.
std::vector<int64_t> CudaExecutable::residual_norm_lifetimes() const {
  const ir::Graph& g = graph_;
  std::vector<int64_t> at(g.values().size(), -1);
  for (size_t i = 0; i < order_.size(); ++i) {
    const Node& nn = g.node(order_[i]);
    if (nn.op != OpKind::RMSNorm && nn.op != OpKind::AdaRMSNorm && nn.op != OpKind::LayerNorm) continue;
    const Node& an = g.node(g.value(root_[size_t(nn.inputs[0])]).producer);
    if (an.op != OpKind::Add) continue;
    std::vector<ValueId> ins = {an.inputs[0], an.inputs[1]};
    const Node& mn = g.node(g.value(root_[size_t(an.inputs[1])]).producer);
    if (mn.op == OpKind::Mul) ins.insert(ins.end(), mn.inputs.begin(), mn.inputs.end());
    for (size_t k = 1; k < nn.inputs.size(); ++k) ins.push_back(nn.inputs[k]);
    for (ValueId v : ins) at[size_t(root_[size_t(v)])] = std::max(at[size_t(root_[size_t(v)])], int64_t(i));
  }
  return at;
}

void CudaExecutable::plan_residual_norms() {
  const ir::Graph& g = graph_;
  const size_t nv = g.values().size();
  std::vector<int64_t> pos(g.nodes().size(), -1);
  for (size_t i = 0; i < order_.size(); ++i) pos[size_t(order_[i])] = int64_t(i);
  // Readers of every root (Reshapes see through), and the arena range of every placed root.
  std::vector<std::vector<NodeId>> readers(nv);
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op == OpKind::Reshape) continue;
    for (ValueId in : n.inputs) readers[size_t(root_[size_t(in)])].push_back(id);
  }
  std::vector<uint8_t> is_out(nv, 0);
  for (ValueId o : g.outputs()) is_out[size_t(root_[size_t(o)])] = 1;
  std::vector<int64_t> off(nv, -1);
  for (const auto& [v, o] : arena_blocks_) off[size_t(v)] = int64_t(o);
  auto range = [&](ValueId v, int64_t* a, int64_t* b) {
    const size_t r = size_t(root_[size_t(v)]);
    if (off[r] < 0) return false;
    *a = off[r];
    *b = off[r] + int64_t(exec::align_up(std::max<uint64_t>(stored_bytes(ValueId(r)), 1)));
    return true;
  };
  auto overlaps = [&](ValueId u, ValueId v) {
    int64_t a0, a1, b0, b1;
    if (!range(u, &a0, &a1) || !range(v, &b0, &b1)) return false;
    return a0 < b1 && b0 < a1;
  };
  auto producer_op = [&](ValueId v) { return g.node(g.value(root_[size_t(v)]).producer).op; };
  static const bool fuse_inputs = !env_off("VLAC_FUSE_INPUT_RESIDUALS");  // =0: as before (A/B)
  auto in_arena = [&](const std::vector<ValueId>& vs) {
    int64_t a, b;
    return std::all_of(vs.begin(), vs.end(), [&](ValueId v) { return range(v, &a, &b); });
  };
  auto const_like = [&](ValueId v) {
    const OpKind op = producer_op(v);
    return op == OpKind::Weight || op == OpKind::Constant;
  };
  for (NodeId nid : order_) {
    const Node& nn = g.node(nid);
    if (nn.op != OpKind::RMSNorm && nn.op != OpKind::AdaRMSNorm && nn.op != OpKind::LayerNorm) continue;
    if (memo_.node[size_t(nid)]) continue;
    const ValueId sum = nn.inputs[0];
    const ValueId sr = root_[size_t(sum)];
    const Node& an = g.node(g.value(sr).producer);
    const NodeId aid = g.value(sr).producer;
    if (an.op != OpKind::Add || memo_.node[size_t(aid)] || plans_[size_t(aid)].skip) continue;
    const ValueInfo& so = g.info(sr);
    if (so.dtype != DType::F32 || g.info(an.inputs[0]).dtype != DType::F32 || g.info(an.inputs[1]).dtype != DType::F32)
      continue;
    if (g.info(an.inputs[0]).numel() != so.numel() || g.info(an.inputs[1]).numel() != so.numel()) continue;
    if (g.info(sum).shape != so.shape || so.shape.empty()) continue;
    const int64_t d = so.shape.back();
    // Every other reader of the sum comes after the norm.
    bool ok = true;
    for (NodeId r : readers[size_t(sr)])
      if (r != nid && pos[size_t(r)] <= pos[size_t(nid)]) ok = false;
    if (!ok) continue;
    ValueId h = an.inputs[0], branch = an.inputs[1], gate = 0;
    bool has_gate = false;
    NodeId mid = aid;
    {
      const ValueId br = root_[size_t(branch)];
      const NodeId m = g.value(br).producer;
      const Node& mn = g.node(m);
      if (mn.op == OpKind::Mul && !memo_.node[size_t(m)] && !is_out[size_t(br)] && readers[size_t(br)].size() == 1 &&
          g.info(mn.inputs[0]).numel() == so.numel() && g.info(mn.inputs[1]).numel() == d &&
          g.info(mn.inputs[0]).dtype == DType::F32 && g.info(mn.inputs[1]).dtype == DType::F32) {
        branch = mn.inputs[0];
        gate = mn.inputs[1];
        has_gate = true;
        mid = m;
      }
    }
    // Folded inputs: h, branch, gate and the norm's parameters. One outside the arena must be a
    // weight, a constant or an engine input: an input's buffer (another engine's output, copied
    // out of the shared arena, or the caller's) is another allocation than the arena blocks the
    // fused kernel writes, so it cannot overlap them (the first residual of every engine after
    // the first: 9 of the prefix LM's 18 and one per expert step ran unfused before).
    std::vector<ValueId> ins = {h, branch};
    if (has_gate) ins.push_back(gate);
    for (size_t i = 1; i < nn.inputs.size(); ++i) ins.push_back(nn.inputs[i]);
    const std::vector<ValueId> outs = {sum, nn.outputs[0]};
    for (ValueId v : ins) {
      int64_t a, b;
      if (!range(v, &a, &b) && !const_like(v) && !(fuse_inputs && producer_op(v) == OpKind::Input && in_arena(outs))) ok = false;
      if (bf16_stored(v)) ok = false;
    }
    if (!ok) continue;
    for (ValueId o : outs)
      for (ValueId v : ins)
        if (overlaps(o, v)) ok = false;
    if (nn.outputs.size() > 1)  // AdaRMS's gate copy reads mod: it must not overlap the outputs either
      for (ValueId v : ins)
        if (overlaps(nn.outputs[1], v)) ok = false;
    const int64_t first = std::min(pos[size_t(mid)], pos[size_t(aid)]);
    for (int64_t i = first + 1; ok && i < pos[size_t(nid)]; ++i) {
      const NodeId other = order_[size_t(i)];
      if (other == aid || other == mid) continue;
      for (ValueId o : g.node(other).outputs)
        for (ValueId v : ins)  // (a node in between that produces one of them, e.g. adaRMS's modulation, is fine)
          if (root_[size_t(o)] != root_[size_t(v)] && overlaps(o, v)) ok = false;
    }
    if (!ok) continue;
    plans_[size_t(aid)].skip = true;
    if (has_gate) plans_[size_t(mid)].skip = true;
    NodePlan& p = plans_[size_t(nid)];
    p.fused = true;
    p.f_h = h;
    p.f_branch = branch;
    p.f_sum = sum;
    p.f_gate = gate;
    p.f_has_gate = has_gate;
  }
}

// GEMM outputs read only by GeGLU (the fused gate|up, through its two slice views) are written
// in bf16 by the GEMM itself: a bf16 Linear (bf16 weight, fp32 accumulation) with no bias or
// accumulation rounds its fp32 sum once at the store, as torch's bf16 mode rounds gate_proj and
// up_proj. This is a rounding point the f32 graph does not have (lerobot's bf16 mode has it; the
// CPU backend keeps f32 there), so it is limited to bf16 Linears and can be turned off
// (VLAC_GEMM_BF16_OUT=0). It halves the largest activation of the LM (the [968, 32768] gate|up
// output: 127 -> 63 MB of arena) and the traffic of GeGLU, its reader. Graph outputs and memo
// nodes keep f32.
// VLAC_GEMM_BF16_OUT=large|small limits it to GEMMs of more / at most 64 rows (a measurement knob).
static int gemm_bf16_out_mode() {  // 0 off, 1 all, 2 large only, 3 small only
  static const int m = [] {
    const std::string v = env_str("VLAC_GEMM_BF16_OUT");
    return v == "0" ? 0 : v == "large" ? 2 : v == "small" ? 3 : 1;
  }();
  return m;
}

Status CudaExecutable::plan_bf16_gemm_outputs() {
  const ir::Graph& g = graph_;
  const size_t nv = g.values().size();
  bf16_gemm_out_.assign(nv, 0);
  const int mode = gemm_bf16_out_mode();
  if (mode == 0) return Status::ok();
  const std::vector<uint8_t> is_out = output_roots();
  const auto readers = readers_by_root();
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    if (n.op != OpKind::Linear || memo_.node[size_t(id)] || p.gemm.m <= 0 || p.gemm.in != DType::BF16 ||
        p.gemm.out != DType::F32 || p.gemm.epilogue != Epilogue::None || p.gemm.accumulate ||
        (mode == 2 && p.gemm.m <= 64) || (mode == 3 && p.gemm.m > 64))
      continue;
    const ValueId o = n.outputs[0];
    if (root_[size_t(o)] != o || is_out[size_t(o)]) continue;
    bool ok = false;
    for (const auto& [r, i] : readers[size_t(o)]) {
      const Node& rn = g.node(r);
      if (rn.op == OpKind::Slice && plans_[size_t(r)].view) continue;  // runs nothing: its readers read o
      if (rn.op == OpKind::GeGLU && i < 2 && !memo_.node[size_t(r)]) {
        ok = true;
        continue;
      }
      ok = false;
      break;
    }
    if (!ok) continue;
    p.gemm.out = DType::BF16;
    Status st = ctx_->gemm().plan(p.gemm);
    if (!st.is_ok()) return Status(st.code(), where(n) + ": " + st.message());
    bf16_gemm_out_[size_t(o)] = 1;
    for (size_t v = 0; v < nv; ++v)  // the slice views' offsets were counted in f32 elements
      if (root_[v] == o) view_off_[v] /= 2;
  }
  return Status::ok();
}

// GeGLU in place: over a bf16 gate|up output (plan_bf16_gemm_outputs) that it alone reads, GeGLU
// writes its [R, F] result over the gate half (each element is read and written by one thread),
// and its readers, bf16 Linears, read it as rows 2F apart (GemmDesc::ldx). Same bits; the LM's
// [968, 16384] GeGLU output (32 MB) needs no block of its own.
Status CudaExecutable::plan_geglu_in_place() {
  const ir::Graph& g = graph_;
  const size_t nv = g.values().size();
  const std::vector<uint8_t> is_out = output_roots();
  const auto readers = readers_by_root();
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op != OpKind::GeGLU || memo_.node[size_t(id)]) continue;
    const ValueId r = root_[size_t(n.inputs[0])], o = n.outputs[0];
    if (r != root_[size_t(n.inputs[1])] || !bf16_gemm_out_[size_t(r)] || root_[size_t(o)] != o || is_out[size_t(o)])
      continue;
    int geglus = 0;  // distinct GeGLU nodes (this one lists r once per input)
    for (size_t k = 0; k < readers[size_t(r)].size(); ++k) {
      const NodeId rd = readers[size_t(r)][k].first;
      if (g.node(rd).op == OpKind::GeGLU && (k == 0 || readers[size_t(r)][k - 1].first != rd)) ++geglus;
    }
    const ValueInfo& oi = g.info(o);
    if (geglus != 1 || oi.shape.size() != 2 || view_off_[size_t(n.inputs[0])] != 0) continue;
    bool ok = !readers[size_t(o)].empty();
    for (const auto& [rd, i] : readers[size_t(o)]) {
      const NodePlan& rp = plans_[size_t(rd)];
      ok = ok && g.node(rd).op == OpKind::Linear && i == 0 && rp.bf16 && rp.gemm.m > 0 && !memo_.node[size_t(rd)] &&
           rp.gemm.k == oi.shape[1] && rp.gemm.m == oi.shape[0];
    }
    if (!ok) continue;
    const int64_t w = view_stride_[size_t(n.inputs[0])];
    for (size_t v = 0; v < nv; ++v)
      if (root_[v] == o) root_[v] = r, view_off_[v] = 0, view_stride_[v] = w;
    for (const auto& [rd, i] : readers[size_t(o)]) {
      NodePlan& rp = plans_[size_t(rd)];
      rp.gemm.ldx = w;
      Status st = ctx_->gemm().plan(rp.gemm);
      if (!st.is_ok()) return Status(st.code(), where(g.node(rd)) + ": " + st.message());
    }
  }
  return Status::ok();
}

// Nodes that run nothing: views, reshapes and the graph's leaves (the depth-first schedule puts
// the next layer's prefix K input between the expert's two RoPEs).
bool CudaExecutable::runs_nothing(NodeId m) const {
  const OpKind op = graph_.node(m).op;
  return op == OpKind::Reshape || op == OpKind::Input || op == OpKind::Weight || op == OpKind::Constant ||
         (op == OpKind::Slice && plans_[size_t(m)].view);
}

bool CudaExecutable::from_weight(ValueId v) const {
  return graph_.node(graph_.value(root_[size_t(v)]).producer).op == OpKind::Weight;
}

bool CudaExecutable::replan_gemm(NodeId id, const GemmDesc& before) {
  NodePlan& p = plans_[size_t(id)];
  if (ctx_->gemm().plan(p.gemm).is_ok()) return true;
  p.gemm = before;
  return false;
}

Status CudaExecutable::bf16_bias_copy(NodeId id) {
  const Node& n = graph_.node(id);
  NodePlan& p = plans_[size_t(id)];
  if (!from_weight(n.inputs[2]))
    return internal_error(where(n) + ": a bf16 bias copy of a value that is not a weight");
  const int64_t cnt = graph_.info(n.inputs[2]).numel();
  VLAC_ASSIGN_OR_RETURN(void* b, device_alloc(uint64_t(cnt) * 2, where(n) + ": its bias in bf16 (constants)"));
  own_blocks_.push_back(b);
  VLAC_RETURN_IF_ERROR(cast(ctx_->stream(), ptr(n.inputs[2]), DType::F32, b, DType::BF16, cnt));
  const cudaError_t e = cudaStreamSynchronize(ctx_->stream());
  if (e != cudaSuccess) return cuda_error(where(n) + ": its bias in bf16", e);
  p.bias_bf16 = b;
  return Status::ok();
}

// A bf16-weight Linear with an f32 output and no epilogue but its bias (a bound weight), not
// memoized: what plan_gemm_gelu and plan_qkv_attention_views may give another epilogue or output.
bool CudaExecutable::bf16_gemm_rewritable(NodeId id) const {
  const Node& n = graph_.node(id);
  const NodePlan& p = plans_[size_t(id)];
  const bool bias_is_weight = n.inputs.size() < 3 || from_weight(n.inputs[2]);
  return n.op == OpKind::Linear && !memo_.node[size_t(id)] && p.gemm.m > 0 && p.gemm.in == DType::BF16 &&
         p.gemm.out == DType::F32 && (p.gemm.epilogue == Epilogue::None || p.gemm.epilogue == Epilogue::Bias) &&
         !p.gemm.accumulate && p.gemm.k_parts <= 1 && bias_is_weight;
}

// GELU in the GEMM (VLAC_GEMM_GELU=0 turns it off): a bf16-weight Linear read only by a GeluTanh
// (SigLIP's fc1) runs cuBLASLt's GELU(+bias) epilogue and writes the GELU's value itself, in
// bf16 where every reader of that value rounds it to bf16 (fc2). GELU is applied to the fp32 sum
// and rounded once, as in the unfused nodes, but with two differences: cuBLASLt's bf16-output
// epilogues take the bias in bf16 (rounded once at plan time: |Δb| <= 2^-9 |b|, the size of the
// output's own rounding), and the GELU is cuBLASLt's tanh form, not vlac's kernel. So this is an
// opt-out rewrite of SigLIP under fast vision (whose distance from lerobot the benchmark
// measures), never of lerobot's rounding mode, where SigLIP's weights are fp32 and nothing here
// applies. One launch and the fp32 [rows, 4304] round trip fewer per SigLIP layer.
Status CudaExecutable::plan_gemm_gelu() {
  if (env_off("VLAC_GEMM_GELU")) return Status::ok();
  const ir::Graph& g = graph_;
  const size_t nv = g.values().size();
  const std::vector<uint8_t> is_out = output_roots();
  const auto readers = readers_by_root();
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    if (!bf16_gemm_rewritable(id)) continue;
    const ValueId o = n.outputs[0];
    if (root_[size_t(o)] != o || is_out[size_t(o)] || readers[size_t(o)].size() != 1) continue;
    const NodeId gid = readers[size_t(o)][0].first;
    const Node& gn = g.node(gid);
    if (gn.op != OpKind::GeluTanh || memo_.node[size_t(gid)]) continue;
    const ValueId go = gn.outputs[0];
    if (root_[size_t(go)] != go || is_out[size_t(go)] || g.info(go).numel() != g.info(o).numel()) continue;
    bool rounds = !readers[size_t(go)].empty();
    for (const auto& [rd, i] : readers[size_t(go)]) {
      const NodePlan& rp = plans_[size_t(rd)];
      rounds = rounds && g.node(rd).op == OpKind::Linear && i == 0 && rp.bf16 && rp.gemm.m > 0 && !memo_.node[size_t(rd)];
    }
    const GemmDesc before = p.gemm;
    const bool bias = p.gemm.epilogue == Epilogue::Bias;
    p.gemm.epilogue = bias ? Epilogue::BiasGelu : Epilogue::Gelu;
    if (rounds) p.gemm.out = DType::BF16;
    if (!replan_gemm(id, before)) continue;
    if (rounds && bias) VLAC_RETURN_IF_ERROR(bf16_bias_copy(id));
    plans_[size_t(gid)].gelu_in_gemm = true;
    for (size_t v = 0; v < nv; ++v)  // the GEMM writes the GELU's block
      if (root_[v] == o) root_[v] = go;
    if (rounds) bf16_gemm_out_[size_t(go)] = 1;
  }
  return Status::ok();
}

// q|k|v views for the bf16 attention (VLAC_QKV_VIEWS=0 turns it off): a bf16-weight Linear whose
// output is read only through column Slices, each read only as the q, k or v of bf16 attentions
// (SigLIP's fused q|k|v under fast vision), writes bf16 itself (one rounding of the fp32 sum + bias,
// as the slices' cast_rows did; the bias in bf16, as in plan_gemm_gelu), and the slices become
// views that the attention reads with the fused width as its row stride. Three launches and the
// fp32 [rows, 3·1152] round trip fewer per SigLIP layer.
Status CudaExecutable::plan_qkv_attention_views() {
  if (env_off("VLAC_QKV_VIEWS")) return Status::ok();
  const ir::Graph& g = graph_;
  const size_t nv = g.values().size();
  const std::vector<uint8_t> is_out = output_roots();
  const auto readers = readers_by_root();
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    if (!bf16_gemm_rewritable(id)) continue;
    const ValueId o = n.outputs[0];
    const ValueInfo& oi = g.info(o);
    if (root_[size_t(o)] != o || is_out[size_t(o)] || oi.shape.size() != 2 || readers[size_t(o)].empty()) continue;
    const int64_t rows = oi.shape[0], w = oi.shape[1];
    bool ok = true;
    for (const auto& [sid, si] : readers[size_t(o)]) {
      const Node& sl = g.node(sid);
      const NodePlan& sp = plans_[size_t(sid)];
      int64_t axis = sl.op == OpKind::Slice ? sl.attrs.get_int("axis", 0) : -1;
      if (axis < 0) axis += 2;
      ok = sl.op == OpKind::Slice && si == 0 && axis == 1 && !sp.view && !sp.into_concat && !memo_.node[size_t(sid)] &&
           sl.outputs.size() == 1 && root_[size_t(sl.outputs[0])] == sl.outputs[0] && !is_out[size_t(sl.outputs[0])] &&
           (sl.attrs.get_int("start", 0) * 2) % 16 == 0;
      if (!ok) break;
      const ValueId so = sl.outputs[0];
      for (size_t v = 0; v < nv && ok; ++v)  // every alias keeps the rows (a Reshape splits the last dim)
        if (root_[v] == so) ok = !g.info(ValueId(v)).shape.empty() && g.info(ValueId(v)).shape[0] == rows && !is_out[v];
      ok = ok && !readers[size_t(so)].empty();
      for (const auto& [rd, i] : readers[size_t(so)])
        ok = ok && g.node(rd).op == OpKind::Attention && i < 3 && plans_[size_t(rd)].bf16 && !memo_.node[size_t(rd)];
      if (!ok) break;
    }
    if (!ok || (w * 2) % 16 != 0) continue;
    const GemmDesc before = p.gemm;
    p.gemm.out = DType::BF16;
    if (!replan_gemm(id, before)) continue;
    if (p.gemm.epilogue == Epilogue::Bias) VLAC_RETURN_IF_ERROR(bf16_bias_copy(id));
    bf16_gemm_out_[size_t(o)] = 1;
    for (const auto& [sid, si] : readers[size_t(o)]) {
      const Node& sl = g.node(sid);
      const ValueId so = sl.outputs[0];
      const uint64_t off = uint64_t(sl.attrs.get_int("start", 0)) * 2;
      for (size_t v = 0; v < nv; ++v)
        if (root_[v] == so) root_[v] = o, view_off_[v] = off, view_stride_[v] = w;
      plans_[size_t(sid)].view = true;
    }
  }
  return Status::ok();
}

// An F32 activation whose every reader rounds it to bf16 on the way in (a Linear with a bf16
// weight, the bf16 attention's q/k/v) is written in bf16 by its producer, when that producer can
// round at its store (norms, GeGLU/GELU, RoPE, attention, an axis-0 concat, a column slice of
// a fused GEMM output): the rounding is the
// same (round to nearest even of the same fp32 value), so results are bit-identical to casting
// in the reader, minus the cast kernel and half the traffic. The block stays sized for F32.
// Graph outputs, memoized nodes and values read any other way keep F32.
void CudaExecutable::plan_bf16_stores() {
  const ir::Graph& g = graph_;
  const size_t nv = g.values().size();
  bf16_store_.assign(nv, 0);
  std::vector<uint8_t> ok(nv, 0), seen(nv, 0);
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (memo_.node[size_t(id)]) continue;
    bool producer = false;
    switch (n.op) {
      case OpKind::RMSNorm:
      case OpKind::LayerNorm:
      case OpKind::GeGLU:
      case OpKind::GeluTanh:
      case OpKind::RoPE:
      case OpKind::Attention:
        producer = true;
        break;
      case OpKind::Concat: {
        int64_t axis = n.attrs.get_int("axis", 0);
        if (axis < 0) axis += int64_t(g.info(n.outputs[0]).shape.size());
        producer = axis == 0;
        for (ValueId in : n.inputs) producer = producer && g.info(in).dtype == DType::F32;
        break;
      }
      case OpKind::AdaRMSNorm:  // output 0 only (the gate is read by an fp32 Mul)
        producer = true;
        break;
      case OpKind::Slice: {  // a column slice of a 2-D fp32 value: cast_rows rounds at its store
        const ValueInfo& xi = g.info(n.inputs[0]);
        int64_t axis = n.attrs.get_int("axis", 0);
        if (axis < 0) axis += int64_t(xi.shape.size());
        producer = xi.shape.size() == 2 && axis == 1 && xi.dtype == DType::F32 && !plans_[size_t(id)].view;
        break;
      }
      default:
        break;
    }
    if (!producer || n.outputs.empty()) continue;
    const ValueId o = n.outputs[0];
    if (root_[size_t(o)] != o || g.info(o).dtype != DType::F32) continue;
    ok[size_t(o)] = 1;
  }
  for (ValueId o : g.outputs()) ok[size_t(root_[size_t(o)])] = 0;
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op == OpKind::Reshape) continue;
    const NodePlan& p = plans_[size_t(id)];
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const size_t r = size_t(root_[size_t(n.inputs[i])]);
      if (!ok[r]) continue;
      if ((p.inplace_pieces >> i) & 1u) continue;  // its own rows, written by their producer
      seen[r] = 1;
      const bool rounds = (n.op == OpKind::Linear && i == 0 && p.bf16 && p.gemm.m > 0) ||
                          (n.op == OpKind::Attention && i < 3 && p.bf16);
      if (!rounds) ok[r] = 0;
    }
  }
  for (size_t v = 0; v < nv; ++v) bf16_store_[v] = (ok[v] && seen[v]) || bf16_gemm_out_[v];
}

uint64_t CudaExecutable::stored_bytes(ValueId r) const {
  const ValueInfo& i = graph_.info(r);
  const uint64_t b = bf16_store_[size_t(r)] ? uint64_t(i.numel()) * 2 : i.bytes();
  return k_parts_.empty() || k_parts_[size_t(r)] <= 1 ? b : b * uint64_t(k_parts_[size_t(r)]);
}

// VLAC_DOWN_KPARTS=S (2..16): the expert's down_proj (K >= 4096: not o_proj) writes S partial products that the next
// fused residual norm sums (GemmDesc::k_parts) instead of cuBLASLt's split-K GEMM + reduce kernel
// (~4 us and a launch per layer and step on the H200). Off by default until measured.
static int k_parts_setting() {
  static const int v = [] {
    const int64_t n = env_count("VLAC_DOWN_KPARTS", 0);
    return n >= 2 && n <= 16 ? int(n) : 0;
  }();
  return v;
}

void CudaExecutable::plan_k_parts() {
  const ir::Graph& g = graph_;
  k_parts_.assign(g.values().size(), 0);
  const int parts = k_parts_setting();
  if (parts < 2) return;
  const auto readers = readers_by_root();
  const auto is_out = output_roots();
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    if (n.op != OpKind::Linear || n.inputs.size() != 2 || memo_.node[size_t(id)] || !p.bf16 || p.gemm.m <= 0 ||
        p.gemm.m > 64 || p.gemm.k < 4096 || p.gemm.out != DType::F32 || p.gemm.epilogue != Epilogue::None ||
        p.gemm.accumulate || p.gemm.k % (8 * parts) != 0)
      continue;
    const ValueId o = n.outputs[0];
    if (root_[size_t(o)] != o || is_out[size_t(o)] || bf16_stored(o) || readers[size_t(o)].size() != 1) continue;
    const OpKind rop = g.node(readers[size_t(o)][0].first).op;
    if (rop != OpKind::Mul && rop != OpKind::Add) continue;  // the gated residual's product or sum
    k_parts_[size_t(o)] = parts;
    p.gemm.k_parts = parts;
  }
}

void CudaExecutable::keep_fused_k_parts() {
  const ir::Graph& g = graph_;
  std::vector<uint8_t> summed(g.values().size(), 0);
  for (NodeId id : order_) {
    NodePlan& p = plans_[size_t(id)];
    if (!p.fused) continue;
    const size_t r = size_t(root_[size_t(p.f_branch)]);
    if (k_parts_[r] < 2 || p.f_branch != ValueId(r)) continue;
    p.f_branch_parts = k_parts_[r];
    p.f_part_stride = g.info(ValueId(r)).numel();
    summed[r] = 1;
  }
  for (NodeId id : order_) {  // not fused after all: one whole product again (the block stays larger)
    const Node& n = g.node(id);
    if (n.op != OpKind::Linear || plans_[size_t(id)].gemm.k_parts < 2) continue;
    if (!summed[size_t(root_[size_t(n.outputs[0])])]) plans_[size_t(id)].gemm.k_parts = 0;
  }
}

void CudaExecutable::plan_kv_window(void* base, uint64_t bytes) {
  kv_window_ = {};
  const int64_t mib = env_count("VLAC_KV_PERSIST_MIB", 0);  // read per executable: tests take both ways
  if (mib <= 0) return;
  int dev = 0, max_persist = 0, max_window = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  const uint64_t limit = std::min<uint64_t>(uint64_t(mib) << 20, uint64_t(std::max(max_persist, 0)));
  if (limit == 0 || max_window <= 0 || cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, limit) != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "vlac cuda: engine '%s': VLAC_KV_PERSIST_MIB: no persisting L2 on this GPU (max %d bytes)\n",
                 options_.label.c_str(), max_persist);
    return;
  }
  kv_window_.base = base;
  kv_window_.bytes = size_t(std::min<uint64_t>(bytes, uint64_t(max_window)));
  // The set-aside is shared by every engine's window; a window larger than it persists a part.
  kv_window_.hit_ratio = float(std::min(1.0, double(limit) / double(kv_window_.bytes)));
  std::fprintf(stderr, "vlac cuda: engine '%s': L2 window over %.2f MiB kept between runs, set-aside %.2f MiB, hit ratio %.2f\n",
               options_.label.c_str(), double(kv_window_.bytes) / 1048576.0, double(limit) / 1048576.0,
               double(kv_window_.hit_ratio));
}

MemoryPlan CudaExecutable::memory() const {
  MemoryPlan m;
  m.kind = MemoryKind::Device;
  m.arena_bytes = arena_bytes_;
  m.scratch_bytes = scratch_bytes_;
  m.input_bytes = input_bytes_;
  m.memo_bytes = memo_.enabled() ? memo_.slot_bytes * uint64_t(options_.memo_slots) : 0;
  return m;
}

void CudaExecutable::bind_memory(void* arena, void* scratch) {
  for (const auto& [v, off] : arena_blocks_) ptr_[size_t(v)] = static_cast<uint8_t*>(arena) + off;
  arena_base_ = static_cast<uint8_t*>(arena);
  scratch_ = scratch;
  for (size_t v = 0; v < quant_src_.size(); ++v)
    if (widened(ValueId(v))) ptr_[v] = static_cast<uint8_t*>(scratch) + dequant_off_ + widen_off_[v];
}

// Memo results that are not graph outputs live in the slot of the current key while a run uses
// it: a hit then reads them there (no copy back into the arena), a miss computes them there.
// Without a slot (the key is not on the host) they are back in their arena blocks.
void CudaExecutable::point_memo_results(int slot) {
  if (memo_in_slot_.empty()) return;
  uint8_t* base = slot >= 0 ? static_cast<uint8_t*>(memo_storage_) + uint64_t(slot) * memo_.slot_bytes : nullptr;
  for (NodeId id : order_)
    for (const auto& [v, off] : memo_.results[size_t(id)]) {
      const size_t r = size_t(root_[size_t(v)]);
      if (!memo_in_slot_[r]) continue;
      ptr_[r] = base ? base + off : arena_base_ + arena_off_[r];
    }
  for (const GateView& gv : gate_views_)
    ptr_[size_t(gv.gate)] = base ? static_cast<uint8_t*>(ptr_[size_t(gv.mod)]) + uint64_t(2 * gv.d) * 4
                                 : arena_base_ + arena_off_[size_t(gv.gate)];
}

int CudaExecutable::input_index(std::string_view name) const {
  for (size_t i = 0; i < graph_.inputs().size(); ++i)
    if (graph_.node(graph_.value(graph_.inputs()[i]).producer).name == name) return int(i);
  return -1;
}

Status CudaExecutable::ensure_input(int i) {
  Input& in = inputs_[size_t(i)];
  if (in.own) return Status::ok();
  const uint64_t bytes = graph_.info(graph_.inputs()[size_t(i)]).bytes();
  VLAC_ASSIGN_OR_RETURN(in.own, device_alloc(bytes, "engine '" + options_.label + "': input '" +
                                                        ir::input_name(graph_, graph_.inputs()[size_t(i)]) + "'"));
  input_bytes_ += exec::align_up(bytes);
  if (!in.external) ptr_[size_t(graph_.inputs()[size_t(i)])] = in.own;
  return Status::ok();
}

void* CudaExecutable::input_data(int i) {
  if (i < 0 || size_t(i) >= inputs_.size() || !ensure_input(i).is_ok()) return nullptr;
  return inputs_[size_t(i)].own;
}

void CudaExecutable::bind_input(int i, const void* external) {
  Input& in = inputs_[size_t(i)];
  in.external = external != nullptr;
  in.shadow_valid = false;
  void* p = external ? const_cast<void*>(external) : in.own;
  if (stable_input_[size_t(i)] && ptr_[size_t(graph_.inputs()[size_t(i)])] != p) stable_dirty_ = true;
  ptr_[size_t(graph_.inputs()[size_t(i)])] = p;
}

Status CudaExecutable::write_input(int i, const void* src, uint64_t bytes) {
  if (i < 0 || size_t(i) >= inputs_.size()) return internal_error("cuda: write_input: input index out of range");
  const ValueId v = graph_.inputs()[size_t(i)];
  const std::string name = "engine '" + options_.label + "': input '" + ir::input_name(graph_, v) + "'";
  if (bytes != graph_.info(v).bytes())
    return internal_error("cuda: " + name + ": " + std::to_string(bytes) + " bytes written, " +
                          std::to_string(graph_.info(v).bytes()) + " expected");
  VLAC_RETURN_IF_ERROR(ensure_input(i));
  Input& in = inputs_[size_t(i)];
  in.external = false;
  ptr_[size_t(v)] = in.own;
  if (stable_input_[size_t(i)]) stable_dirty_ = true;
  if (ctx_->capturing()) {
    // Inside a recording the copy node reads `src` at every replay: it must be page-locked memory
    // of this backend (a Host BackendBuffer), not memory the host may have reused.
    cudaPointerAttributes pa{};
    if (cudaPointerGetAttributes(&pa, src) != cudaSuccess || pa.type == cudaMemoryTypeUnregistered) {
      (void)cudaGetLastError();
      return invalid_argument("cuda: " + name + ": written from pageable memory inside a recorded sequence "
                              "(use a Host buffer of the backend)");
    }
  }
  if (in.keep_shadow) {
    std::memcpy(in.shadow.data(), src, bytes);
    in.shadow_valid = true;
    for (const auto& hg : gathers_)
      if (hg->ids == &in.host_src) VLAC_RETURN_IF_ERROR(check_token_ids(static_cast<const int64_t*>(src), hg->t, hg->vocab));
  }
  in.host_src = src;
  if (bytes == 0) return Status::ok();
  const cudaError_t e = cudaMemcpyAsync(in.own, src, bytes, cudaMemcpyHostToDevice, ctx_->stream());
  if (e != cudaSuccess) return cuda_error(name + " (" + std::to_string(bytes) + " bytes)", e);
  return Status::ok();
}

void CudaExecutable::set_memo_key(const void* key, uint64_t bytes) {
  // Slots keyed by the inputs are not comparable with slots keyed by the caller's bytes.
  if (given_key_.empty() != (bytes == 0)) std::fill(memo_valid_.begin(), memo_valid_.end(), 0);
  const uint8_t* k = static_cast<const uint8_t*>(key);
  given_key_.assign(k, k + bytes);
}

int CudaExecutable::memo_lookup(bool* hit) {
  *hit = false;
  if (!memo_.enabled()) return -1;
  // This run's key: the caller's (set_memo_key), else the memo inputs' host copies.
  if (!given_key_.empty()) {
    run_key_ = given_key_;
  } else {
    run_key_.clear();
    for (int i : memo_.key_inputs) {
      const Input& in = inputs_[size_t(i)];
      if (!in.shadow_valid || in.external) return -1;  // key not on the host: compute
      run_key_.insert(run_key_.end(), in.shadow.begin(), in.shadow.end());
    }
  }
  for (size_t s = 0; s < memo_valid_.size(); ++s)
    if (memo_valid_[s] && memo_keys_[s] == run_key_) {
      *hit = true;
      ++memo_hits_;
      return int(s);
    }
  const size_t s = memo_next_;
  memo_next_ = (memo_next_ + 1) % memo_valid_.size();
  memo_valid_[s] = 0;
  memo_keys_[s] = run_key_;
  return int(s);
}

// A timing probe, never a mode to run a policy in: VLAC_TIMING_SKIP=PATTERN[,PATTERN...] (shell
// globs over node names, e.g. "expert.*.attention,expert.*_proj"; '|' separates them too, for
// tools/device_cuda_ab.sh, whose settings are split at commas) leaves the matching nodes
// unlaunched, in eager runs and in recordings alike, so the difference from a run without it is
// what those nodes cost inside a recorded chunk, where the eager per-node profile (with an event
// pair around every node) overstates small kernels. Their outputs hold whatever was there before,
// so the actions are wrong; memoized nodes are never skipped (a hit launches nothing anyway).
void CudaExecutable::plan_timing_skip() {
  timing_skip_.clear();
  const std::string spec = env_str("VLAC_TIMING_SKIP");
  if (spec.empty()) return;
  std::vector<std::string> pats;
  for (size_t b = 0; b <= spec.size();) {
    const size_t e = std::min(spec.find_first_of(",|", b), spec.size());
    if (e > b) pats.push_back(spec.substr(b, e - b));
    b = e + 1;
  }
  const ir::Graph& g = graph_;
  timing_skip_.assign(g.nodes().size(), 0);
  int n_skipped = 0;
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (memo_.node[size_t(id)] || n.op == OpKind::Input || n.op == OpKind::Weight || n.op == OpKind::Constant) continue;
    for (const std::string& pat : pats)
      if (fnmatch(pat.c_str(), n.name.c_str(), 0) == 0) {
        timing_skip_[size_t(id)] = 1;
        ++n_skipped;
        break;
      }
  }
  std::fprintf(stderr, "vlac cuda: VLAC_TIMING_SKIP=%s: %d node(s) of engine '%s' are not launched "
               "(a timing probe: the results are wrong)\n", spec.c_str(), n_skipped, options_.label.c_str());
}

Status CudaExecutable::run_or_reuse(NodeId id, int slot, bool hit) {
  if (!timing_skip_.empty() && timing_skip_[size_t(id)]) return Status::ok();
  if (slot < 0 || !memo_.node[size_t(id)]) return run_node(id);
  uint8_t* base = static_cast<uint8_t*>(memo_storage_) + uint64_t(slot) * memo_.slot_bytes;
  if (!hit) VLAC_RETURN_IF_ERROR(run_node(id));
  for (const auto& [v, off] : memo_.results[size_t(id)]) {
    if (!memo_in_slot_.empty() && memo_in_slot_[size_t(root_[size_t(v)])]) continue;  // computed/read in the slot
    const uint64_t b = graph_.info(v).bytes();
    ++memo_copies_;
    const cudaError_t e = hit ? cudaMemcpyAsync(ptr(v), base + off, b, cudaMemcpyDeviceToDevice, ctx_->stream())
                              : cudaMemcpyAsync(base + off, ptr(v), b, cudaMemcpyDeviceToDevice, ctx_->stream());
    if (e != cudaSuccess) return Status(StatusCode::Backend, std::string("memo copy: ") + cudaGetErrorString(e));
  }
  return Status::ok();
}

Status CudaExecutable::run() {
  VLAC_RETURN_IF_ERROR(ctx_->ensure());
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (!ptr_[size_t(graph_.inputs()[i])])
      return internal_error("cuda: engine '" + options_.label + "': input '" +
                            ir::input_name(graph_, graph_.inputs()[i]) + "' was neither written nor bound");
  bool hit = false;
  const int slot = memo_lookup(&hit);
  point_memo_results(slot);
  // Profiled: eager runs after the first (which plans, tunes and uploads), never a capture.
  NodeTimer* timer = nullptr;
  if (op_profile_level() > 0 && !ctx_->capturing() && eager_runs_++ > 0) {
    if (!timer_) timer_ = std::make_unique<NodeTimer>();
    timer = timer_.get();
    VLAC_RETURN_IF_ERROR(timer->start(ctx_->stream(), order_.size()));
  }
  std::vector<uint8_t> memo_kind;  // profiled: 0 ran, 1 memo hit, 2 memo hit with a result copied
  if (timer) memo_kind.assign(order_.size(), 0);
  size_t next_prefetch = 0;
  // Inputs made on another lane (wait_input): this stream waits for each one's mark just before
  // the first launch that reads it, in run order like the prefetches.
  run_waits_.clear();
  for (size_t j = 0; j < input_wait_.size(); ++j)
    if (input_wait_[j] >= 0 && ctx_->mark_crosses(input_wait_[j])) run_waits_.push_back({input_first_pos_[j], input_wait_[j]});
  std::sort(run_waits_.begin(), run_waits_.end());
  size_t next_wait = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    const NodeId id = order_[i];
    const uint64_t copies = memo_copies_;
    Status st = Status::ok();
    for (; st.is_ok() && next_wait < run_waits_.size() && run_waits_[next_wait].first == i; ++next_wait) {
      st = ctx_->wait_mark(run_waits_[next_wait].second);
      note_lane_input_waits(1);
    }
    for (; st.is_ok() && next_prefetch < prefetches_.size() && prefetches_[next_prefetch].before == i; ++next_prefetch) {
      const PrefetchLaunch& l = prefetches_[next_prefetch];
      st = l2_prefetch(ctx_->stream(), l.ranges.data(), int(l.ranges.size()), prefetch_blocks_);
    }
    if (st.is_ok()) st = run_or_reuse(id, slot, hit);
    if (timer && hit && slot >= 0 && memo_.node[size_t(id)]) memo_kind[i] = memo_copies_ > copies ? 2 : 1;
    if (st.is_ok() && timer) st = timer->mark(ctx_->stream(), i);
    if (!st.is_ok()) {
      const Node& n = graph_.node(id);
      const std::string w = where(n);
      if (st.message().rfind("cuda: engine", 0) == 0) return st;
      return Status(st.code(), w + ": " + st.message());
    }
  }
  if (timer) {
    VLAC_ASSIGN_OR_RETURN(std::vector<float> ms, timer->finish());
    VLAC_RETURN_IF_ERROR(profile_run(ms, memo_kind));
  }
  if (slot >= 0 && !hit) {
    memo_valid_[size_t(slot)] = 1;
    // Every slot filled: the on-demand weights are not read again until a miss.
    if (std::all_of(memo_valid_.begin(), memo_valid_.end(), [](uint8_t x) { return x != 0; }) && !ctx_->capturing())
      weights_->drop_fetch_buffers();
  }
  stable_dirty_ = false;  // the stable pieces are in their buffers now
  for (const auto& hg : gathers_) VLAC_RETURN_IF_ERROR(gather_status(*hg));
  return Status::ok();
}

// What a host gather found (gather_rows), reported once.
Status CudaExecutable::gather_status(HostGather& hg) const {
  if (const int bad = hg.bad.exchange(0)) {
    return invalid_argument("cuda: engine '" + options_.label + "': token id at position " + std::to_string(bad - 1) +
                            " is outside the vocabulary of " + std::to_string(hg.vocab));
  }
  if (const int err = hg.io_error.exchange(0))
    return Status(StatusCode::IoError, "cuda: engine '" + options_.label + "': reading embedding rows from the file: " +
                                      std::strerror(err));
  return Status::ok();
}

// One profiled run's node times into the process's profile (op_profile.h); nodes that launch
// nothing (views, reshapes, folded Mul/Add) are left out.
Status CudaExecutable::profile_run(const std::vector<float>& ms, const std::vector<uint8_t>& memo_kind) {
  const ir::Graph& g = graph_;
  for (size_t i = 0; i < order_.size() && i < ms.size(); ++i) {
    const Node& n = g.node(order_[i]);
    const NodePlan& p = plans_[size_t(order_[i])];
    if (n.op == OpKind::Input || n.op == OpKind::Weight || n.op == OpKind::Constant || n.op == OpKind::Reshape ||
        p.skip || p.view)
      continue;
    std::string shape;
    if (op_profile_level() >= 2 && (n.op == OpKind::Linear || n.op == OpKind::PatchEmbed) && p.gemm.m > 0)
      shape = std::string(n.op == OpKind::Linear ? "linear " : "patch_embed ") + std::to_string(p.gemm.m) + "x" +
              std::to_string(p.gemm.k) + "x" + std::to_string(p.gemm.n) + (p.gemm.in == DType::BF16 ? " bf16" : " f32") +
              (p.mlp >= 0 ? " + geglu + down (expert_mlp)" : "");
    // Memo hits launch nothing but a copy of a result that is not read in its slot.
    const uint8_t mk = i < memo_kind.size() ? memo_kind[i] : 0;
    const std::string name = mk == 0 ? n.name : n.name + (mk == 1 ? " (memo hit)" : " (memo hit, result copied)");
    op_profile_add(ir::op_name(n.op), options_.label, name, mk ? std::string() : shape, double(ms[i]));
  }
  return Status::ok();
}

// 8-bit weights of few-row GEMMs (the expert's 50 tokens), opt-in (VLAC_QUANT_SKINNY=1): the
// skinny kernel reads the codes and widens them in registers (half a bf16 GEMM's bytes, no
// widened copy), where the GEMM kept no epilogue beyond a bias after the rewrites above. Off by
// default: on the H200 the int8 chunk took 26.98-27.20 ms with it against 25.87 ms widening into
// the scratch + cuBLASLt (fp8: 32.9 ms), the kernel's latency chain again (docs/quantization.md).
// 8-bit GEMMs that run one after another with nothing else widening in between (an expert
// layer's q|k|v, o, gate|up; a SigLIP layer's four) get their bf16 weights side by side in the
// scratch, up to the slice cap, widened in one launch before the first: 2 launches per expert
// layer instead of 4. A weight that another GEMM also reads, one read from the package at memo
// misses, a memoized GEMM (skipped on hits) and a sliced one widen at their own GEMM and end the
// run. VLAC_DEQUANT_GROUP=0: each at its own GEMM (A/B).
void CudaExecutable::plan_dequant_groups() {
  const ir::Graph& g = graph_;
  const size_t nv = g.values().size();
  dequant_groups_.clear();
  dequant_group_at_.assign(g.nodes().size(), -1);
  widen_off_.assign(nv, 0);
  in_group_.assign(nv, 0);
  if (env_off("VLAC_DEQUANT_GROUP")) return;
  auto widened_linear = [&](const Node& n) {
    return n.op == OpKind::Linear && n.inputs.size() > 1 && from_weight(n.inputs[1]) &&
           widened(root_[size_t(n.inputs[1])]);
  };
  std::vector<int> readers(nv, 0);
  for (NodeId id : order_)
    if (widened_linear(g.node(id))) ++readers[size_t(root_[size_t(g.node(id).inputs[1])])];
  const uint64_t cap = dequant_cap();
  int cur = -1;
  uint64_t used = 0;
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (!widened_linear(n)) continue;
    const ValueId r = root_[size_t(n.inputs[1])];
    const NodePlan& p = plans_[size_t(id)];
    if (p.qskinny || p.qfp8) continue;  // reads the codes: no scratch
    const CudaWeights::Entry* e = weight_entry_[size_t(r)];
    if (sliced(r) || readers[size_t(r)] != 1 || e->on_demand || memo_.node[size_t(id)]) {
      cur = -1;  // widens at its own GEMM, over the start of the region
      continue;
    }
    const uint64_t b = al(uint64_t(e->shape[0] * e->shape[1]) * 2);
    if (cur < 0 || used + b > cap || dequant_groups_[size_t(cur)].size() >= size_t(kMaxDequantJobs)) {
      cur = int(dequant_groups_.size());
      dequant_groups_.emplace_back();
      dequant_group_at_[size_t(id)] = cur;
      used = 0;
    }
    widen_off_[size_t(r)] = used;
    in_group_[size_t(r)] = 1;
    dequant_groups_[size_t(cur)].push_back(r);
    used += b;
    dequant_bytes_ = std::max(dequant_bytes_, used);
  }
}

// Which 8-bit GEMMs run exactly (qexact) and the scratch their sums need: with
// VLAC_QUANT_EXACT=1 every GEMM that widens; by default none (session 15 on the H200: 29.8 against
// 24.9 ms a chunk for max|Δ| 0.0292–0.0299 against 0.0309 from lerobot fp32, within what another
// cuBLASLt algorithm choice moves it; docs/quantization.md).
void CudaExecutable::plan_quant_exact() {
  const ir::Graph& g = graph_;
  const bool on = env_on("VLAC_QUANT_EXACT");
  qsum_bytes_ = 0;
  qexact_w_.assign(g.values().size(), 0);
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    p.qexact = 0;
    if (!on || n.op != OpKind::Linear || p.qskinny || p.qfp8 || p.gemm.m <= 0 || !from_weight(n.inputs[1])) continue;
    const ValueId r = root_[size_t(n.inputs[1])];
    if (!widened(r)) continue;
    const int64_t sn = sliced(r) ? slice_rows_[size_t(r)] : weight_entry_[size_t(r)]->shape[0];
    p.qexact = quant_sum_rows(p.gemm.m, sn);
    qexact_w_[size_t(r)] = 1;
    qsum_bytes_ = std::max(qsum_bytes_, al(uint64_t(p.qexact) * uint64_t(sn) * 4));
  }
}

// The expert's MLP as one launch (expert_mlp.h): a GeGLU over the two column halves (views) of a
// bf16-stored gate|up GEMM output, read by one down GEMM, all three small-M bf16 GEMMs with their
// weights on the device, nothing else scheduled between them. The fused kernel writes h and y at
// the gate|up node; y may share the block of the gate|up's x (dead after it), which the kernel
// reads whole before it writes y. Runs before the scratch is sized: it needs its partial sums there.
// Opt-in (VLAC_EXPERT_MLP=1): correct on the H200 but slower than the three launches (session 18:
// 33.5 against 16.9 µs a call, docs/cuda.md).
Status CudaExecutable::plan_expert_mlp() {
  if (!env_on("VLAC_EXPERT_MLP") || ctx_->sms() < 1) return Status::ok();
  const ir::Graph& g = graph_;
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return Status::ok();
  const auto readers = readers_by_root();
  const auto is_out = output_roots();
  std::vector<int64_t> pos(g.nodes().size(), -1);
  for (size_t i = 0; i < order_.size(); ++i) pos[size_t(order_[i])] = int64_t(i);
  auto plain_bf16_gemm = [&](NodeId id) {
    const Node& n = g.node(id);
    const NodePlan& p = plans_[size_t(id)];
    if (n.op != OpKind::Linear || n.inputs.size() != 2 || memo_.node[size_t(id)] || !p.bf16 || p.qskinny ||
        reads_on_demand_[size_t(id)] || !from_weight(n.inputs[1]) || widened(root_[size_t(n.inputs[1])]) ||
        weight_dtype(n.inputs[1]) != DType::BF16)
      return false;
    const GemmDesc& d = p.gemm;
    return d.m >= 1 && d.m <= 64 && !d.accumulate && d.k_parts <= 1 && d.epilogue == Epilogue::None;
  };
  for (NodeId ge : order_) {
    const Node& gn = g.node(ge);
    if (gn.op != OpKind::GeGLU || memo_.node[size_t(ge)] || gn.inputs.size() != 2) continue;
    const ValueId gate = gn.inputs[0], up = gn.inputs[1], h = gn.outputs[0];
    const NodeId sg = g.value(gate).producer, su = g.value(up).producer;
    if (g.node(sg).op != OpKind::Slice || g.node(su).op != OpKind::Slice || !plans_[size_t(sg)].view ||
        !plans_[size_t(su)].view || g.node(sg).inputs[0] != g.node(su).inputs[0])
      continue;
    const ValueId gu = g.node(sg).inputs[0];
    const NodeId l1 = g.value(gu).producer;
    // h in place over the gate|up output (plan_geglu_in_place): the arena places it from the gate|up
    // node on, where the fused kernel writes it. A block of its own could start after x's last
    // read, and so overlap x, which other blocks may still be reading while h is written.
    if (root_[size_t(gu)] != gu || root_[size_t(h)] != gu || !plain_bf16_gemm(l1) || !bf16_stored(gu) ||
        !bf16_stored(h) || is_out[size_t(gu)])
      continue;
    const GemmDesc& d1 = plans_[size_t(l1)].gemm;
    const int64_t f = d1.n / 2;
    if (d1.ldx != 0 && d1.ldx != d1.k) continue;
    if (g.node(sg).attrs.get_int("start", -1) != 0 || g.node(sg).attrs.get_int("end", -1) != f ||
        g.node(su).attrs.get_int("start", -1) != f || g.node(su).attrs.get_int("end", -1) != 2 * f)
      continue;
    // The block's readers: the two slices, GeGLU and one down GEMM reading h.
    NodeId l2 = NodeId(-1);
    bool only = true;
    for (const auto& [rd, i] : readers[size_t(gu)]) {
      if (rd == sg || rd == su || rd == ge) continue;
      if (g.node(rd).op == OpKind::Linear && i == 0 && g.node(rd).inputs[0] == h && l2 == NodeId(-1)) l2 = rd;
      else only = false;
    }
    if (!only || l2 == NodeId(-1) || !plain_bf16_gemm(l2)) continue;
    if (view_off_[size_t(g.node(l1).inputs[0])] % 16 != 0 || view_off_[size_t(h)] % 16 != 0) continue;  // 16-byte loads
    const GemmDesc& d2 = plans_[size_t(l2)].gemm;
    const ValueId y = g.node(l2).outputs[0];
    if (d2.m != d1.m || d2.k != f || d2.n != d1.k || d2.out != DType::F32 || bf16_stored(y) ||
        k_parts_[size_t(root_[size_t(y)])] > 1 || (d2.ldy != 0 && d2.ldy < d2.n))
      continue;
    // Nothing that launches between them.
    bool between = false;
    for (int64_t i = pos[size_t(l1)] + 1; i < pos[size_t(l2)]; ++i) {
      const NodeId m = order_[size_t(i)];
      if (m != ge && !runs_nothing(m)) between = true;
    }
    ExpertMlp plan;
    if (between || !expert_mlp_plan(d1.m, d1.k, f, ctx_->sms(), optin, &plan) || !expert_mlp_resident(plan)) continue;
    plans_[size_t(l1)].mlp = int(mlps_.size());
    plans_[size_t(ge)].skip = true;
    plans_[size_t(l2)].skip = true;
    // An f32 x is rounded into the scratch first (run_node's Linear); the partial sums go after it.
    const uint64_t off = bf16_stored(g.node(l1).inputs[0]) ? 0 : al(uint64_t(d1.m * d1.k) * 2);
    mlps_.push_back(MlpRun{plan, ge, l2, off, view_stride_[size_t(h)] ? view_stride_[size_t(h)] : f,
                           d2.ldy ? d2.ldy : d2.n});
    scratch_bytes_ = std::max(scratch_bytes_, off + al(expert_mlp_workspace_bytes(plan)));
  }
  if (!mlps_.empty() && !mlp_sync_) {
    const uint64_t bytes = uint64_t(kExpertMlpSyncWords) * sizeof(unsigned);
    VLAC_ASSIGN_OR_RETURN(void* c, device_alloc(bytes, "the expert MLP's barrier and flags"));
    own_blocks_.push_back(c);
    mlp_sync_ = static_cast<unsigned*>(c);
    const cudaError_t ce = cudaMemset(mlp_sync_, 0, bytes);
    if (ce != cudaSuccess) return cuda_error("zeroing the expert MLP's barrier and flags", ce);
  }
  return Status::ok();
}

Status CudaExecutable::plan_quant_skinny() {
  if (!env_on("VLAC_QUANT_SKINNY")) return Status::ok();
  const ir::Graph& g = graph_;
  bool any = false;
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    if (n.op != OpKind::Linear || !from_weight(n.inputs[1]) || !widened(root_[size_t(n.inputs[1])])) continue;
    const GemmDesc& d = p.gemm;
    if (!skinny_gemm_fits(d.m, d.n, d.k) || d.accumulate || d.k_parts > 1 || (d.ldx != 0 && d.ldx != d.k) ||
        (d.epilogue != Epilogue::None && d.epilogue != Epilogue::Bias) || (!p.bf16 && !bf16_stored(n.inputs[0])))
      continue;
    SkinnyGemm sg{d.m, d.n, d.k, d.out, d.epilogue == Epilogue::Bias, skinny_gemm_splits(d.n, d.k, ctx_->sms()).front()};
    sg.weights = weight_entry_[size_t(root_[size_t(n.inputs[1])])]->dtype;
    if (skinny_gemm_workspace_bytes(sg) > ctx_->gemm().workspace_bytes()) continue;
    p.qskinny = sg.splits;
    any = true;
  }
  if (any && !quant_counters_) {
    VLAC_ASSIGN_OR_RETURN(void* c, device_alloc(kSkinnyCounters * sizeof(unsigned), "the 8-bit GEMMs' tile counters"));
    quant_counters_ = static_cast<unsigned*>(c);
    const cudaError_t ce = cudaMemset(quant_counters_, 0, kSkinnyCounters * sizeof(unsigned));
    if (ce != cudaSuccess) return cuda_error("zeroing the 8-bit GEMMs' tile counters", ce);
  }
  return Status::ok();
}

// An 8-bit Linear with exact scaling (NodePlan::qexact): per slice of W's rows (sliced: widened
// here, else before the node), per block of x's rows, the unscaled GEMM's fp32 sums, then
// scale_columns writes that block of y as the planned GEMM would have (dtype, epilogue,
// accumulation, row stride). K parts (read summed by a residual norm) are scaled in place.
Status CudaExecutable::run_quant_linear(NodeId id, const void* xin, const void* bias, void* out) {
  const Node& n = graph_.node(id);
  const GemmDesc& pd = plans_[size_t(id)].gemm;
  cudaStream_t s = ctx_->stream();
  const size_t r = size_t(root_[size_t(n.inputs[1])]);
  const CudaWeights::Entry* e = weight_entry_[r];
  const int64_t nn = e->shape[0], k = e->shape[1];
  if (pd.in != DType::BF16 || pd.n != nn || pd.k != k)
    return internal_error(where(n) + ": 8-bit GEMM planned with another shape or input dtype");
  const bool slice = sliced(ValueId(r));
  const int64_t rows = slice ? slice_rows_[r] : nn;
  const float* scales = quant_row_scales(quant_src_[r], nn, k);
  const int64_t ldy = pd.ldy ? pd.ldy : pd.n, ldx = pd.ldx ? pd.ldx : pd.k;
  const uint64_t ye = dtype_size(pd.out);
  const bool gelu = pd.epilogue == Epilogue::Gelu || pd.epilogue == Epilogue::BiasGelu;
  auto* sums = reinterpret_cast<float*>(scratch_at(qsum_off_));
  for (int64_t n0 = 0; n0 < nn; n0 += rows) {
    const int64_t sn = std::min(rows, nn - n0);
    if (slice) VLAC_RETURN_IF_ERROR(dequant_bf16(s, quant_src_[r], e->dtype, nn, k, n0, sn, ptr_[r], false));
    uint8_t* y = static_cast<uint8_t*>(out) + uint64_t(n0) * ye;
    if (pd.k_parts > 1) {  // fp32 parts [k_parts][m][ldy]: no bias, epilogue or accumulation (GemmDesc)
      GemmDesc d = pd;
      d.n = sn;
      d.ldy = ldy;
      VLAC_RETURN_IF_ERROR(ctx_->gemm().run(s, d, xin, ptr_[r], nullptr, y, ctx_->workspace()));
      for (int part = 0; part < pd.k_parts; ++part) {
        float* t = reinterpret_cast<float*>(y) + int64_t(part) * ldy * pd.m;
        VLAC_RETURN_IF_ERROR(scale_columns(s, t, ldy, pd.m, sn, scales + n0, nullptr, false, false, t, DType::F32, ldy));
      }
      continue;
    }
    const void* b = bias ? static_cast<const uint8_t*>(bias) + uint64_t(n0) * ye : nullptr;
    const int64_t mc = plans_[size_t(id)].qexact;
    if (uint64_t(mc) * uint64_t(sn) * 4 > qsum_bytes_)
      return internal_error(where(n) + ": the 8-bit GEMM's sums outgrow their scratch");
    for (int64_t i0 = 0; i0 < pd.m; i0 += mc) {
      GemmDesc d = pd;
      d.m = std::min(mc, pd.m - i0);
      d.n = sn;
      d.out = DType::F32;
      d.epilogue = Epilogue::None;
      d.accumulate = false;
      d.ldy = 0;
      d.k_parts = 0;
      VLAC_RETURN_IF_ERROR(ctx_->gemm().run(s, d, static_cast<const uint8_t*>(xin) + uint64_t(i0 * ldx) * 2, ptr_[r],
                                            nullptr, sums, ctx_->workspace()));
      VLAC_RETURN_IF_ERROR(scale_columns(s, sums, sn, d.m, sn, scales + n0, b, gelu, pd.accumulate,
                                         y + uint64_t(i0 * ldy) * ye, pd.out, ldy));
    }
  }
  return Status::ok();
}

// FP8 W8A8 (a package compiled with e4m3 activations, ExecOptions::fp8_activations, or any fp8
// package with VLAC_FP8_GEMM=1; VLAC_FP8_GEMM=0 turns it off for A/B; docs/quantization.md): every
// Linear over an e4m3 weight whose FP8 GEMM cuBLASLt can plan (sm_89 and later, k a multiple of
// 16, its epilogue) quantizes its x per row into the scratch and runs on the weight's codes, with
// no widening; the rest widen as before, x in bf16 (a note names how many fell back). The widening
// scratch then only needs the weights some widening GEMM still reads.
// VLAC_FP8_BIAS_AFTER=1: an FP8 GEMM with an F32 output and a bias (none in cuBLASLt 13.1) runs
// without it and adds the bias after, instead of widening the weight. Opt-in: on an H100 (session
// 24) it made the W8A8 chunk slower, 21.63 against 21.33 ms widened (SigLIP's 55 such GEMMs:
// eager vision 2.94 against 2.66 ms), each GEMM then being three launches (x's codes, the FP8 GEMM,
// the add) against two.
static bool fp8_bias_after_enabled() {
  static const bool on = env_on("VLAC_FP8_BIAS_AFTER");
  return on;
}

Status CudaExecutable::plan_quant_fp8() {
  qfp8_bytes_ = 0;
  if (env_off("VLAC_FP8_GEMM") || !(options_.fp8_activations || env_on("VLAC_FP8_GEMM"))) return Status::ok();
  const ir::Graph& g = graph_;
  // VLAC_FP8_MIN_ROWS=N: only GEMMs of at least N rows of x in FP8 (the prefix's, not the
  // expert's 50), the rest widened, to measure where FP8 pays.
  const int64_t min_rows = env_count("VLAC_FP8_MIN_ROWS", 0);
  int64_t planned = 0, fell_back = 0;
  std::string why;
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    NodePlan& p = plans_[size_t(id)];
    if (n.op != OpKind::Linear || n.inputs.size() < 2 || !from_weight(n.inputs[1]) || p.gemm.m <= 0 || p.skip ||
        p.qskinny || p.mlp >= 0 || p.gemm.m < min_rows)
      continue;
    const ValueId r = root_[size_t(n.inputs[1])];
    if (!widened(r) || weight_entry_[size_t(r)]->dtype != DType::F8_E4M3) continue;
    GemmDesc fd = fp8_desc(p);
    Status st = ctx_->gemm().plan(fd);
    const bool gelu = fd.epilogue == Epilogue::Gelu || fd.epilogue == Epilogue::BiasGelu;
    if (!st.is_ok() && gelu && (fd.ldy == 0 || fd.ldy == fd.n) && !fd.accumulate) {
      // No FP8 GEMM with a GELU epilogue: the GEMM rounds y (as torch's bf16 Linear does before
      // its GELU), then the GELU runs over y in place.
      p.qfp8_gelu = true;
      fd = fp8_desc(p);
      st = ctx_->gemm().plan(fd);
      p.qfp8_gelu = st.is_ok();
    }
    if (!st.is_ok() && has_bias(p.gemm.epilogue) && fd.out == DType::F32 && !p.bias_bf16 && !fd.accumulate &&
        (fd.ldy == 0 || fd.ldy == fd.n) && fp8_bias_after_enabled()) {
      // No FP8 GEMM with an F32 output and a bias (cuBLASLt 13.1 on sm_90: SigLIP's out_proj and
      // fc2): the GEMM writes x·Wᵀ, then one broadcast add puts the fp32 bias on (then the GELU,
      // if any), the order and values of the epilogue's arithmetic.
      p.qfp8_bias_after = true;
      p.qfp8_gelu = gelu;
      fd = fp8_desc(p);
      st = ctx_->gemm().plan(fd);
      p.qfp8_bias_after = st.is_ok();
      p.qfp8_gelu = st.is_ok() && gelu;
    }
    if (!st.is_ok()) {
      ++fell_back;
      if (why.empty()) why = st.message();
      continue;
    }
    p.qfp8 = true;
    ++planned;
    qfp8_bytes_ = std::max(qfp8_bytes_, fp8_x_bytes(fd.m, fd.k));
  }
  static std::atomic<bool> noted{false};  // once a process: a package has tens of engines
  if (fell_back > 0 && !noted.exchange(true))
    std::fprintf(stderr,
                 "vlac: note: engine '%s': %lld of %lld e4m3 GEMMs widen to bf16 instead of running in FP8 (%s); "
                 "other engines are not reported\n",
                 options_.label.c_str(), static_cast<long long>(fell_back), static_cast<long long>(fell_back + planned),
                 why.c_str());
  if (planned == 0) return Status::ok();
  dequant_bytes_ = 0;
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op != OpKind::Linear || n.inputs.size() < 2 || !from_weight(n.inputs[1]) || plans_[size_t(id)].qfp8) continue;
    const ValueId r = root_[size_t(n.inputs[1])];
    if (!widened(r)) continue;
    dequant_bytes_ = std::max(dequant_bytes_, al(uint64_t(slice_rows_[size_t(r)] * weight_entry_[size_t(r)]->shape[1]) * 2));
  }
  return Status::ok();
}

// An FP8 GEMM whose x is read by it alone and comes from a fused residual norm or a GeGLU: that
// kernel writes x's codes and row scales itself (NormArgs::codes, geglu_e4m3: the same bits as
// quantize_rows_e4m3 of its output), one launch fewer a GEMM (the expert's q|k|v, gate|up and
// down; the LM's and SigLIP's). Only where no other FP8 GEMM runs between the two (they share the
// codes' scratch) and neither is a memo node. VLAC_FP8_FUSED_CODES=0 quantizes in the GEMM's own
// launch (A/B).
void CudaExecutable::plan_fp8_fused_codes() {
  if (qfp8_bytes_ == 0 || env_off("VLAC_FP8_FUSED_CODES")) return;
  const ir::Graph& g = graph_;
  const auto readers = readers_by_root();
  const auto is_out = output_roots();
  std::vector<int64_t> pos(g.nodes().size(), -1);
  for (size_t i = 0; i < order_.size(); ++i) pos[size_t(order_[i])] = int64_t(i);
  // Nodes reading each value itself (a GeGLU written in place over its gate half shares its
  // root with the gate|up output: readers_by_root would count the GeGLU too).
  std::vector<int> direct(g.values().size(), 0);
  for (NodeId id : order_)
    for (ValueId v : g.node(id).inputs) ++direct[size_t(v)];
  for (size_t i = 0; i < order_.size(); ++i) {
    const NodeId id = order_[i];
    NodePlan& p = plans_[size_t(id)];
    if (!p.qfp8 || memo_.node[size_t(id)]) continue;
    const ValueId xv = g.node(id).inputs[0];
    if (is_out[size_t(root_[size_t(xv)])] || direct[size_t(xv)] != 1) continue;
    const NodeId pid = g.value(xv).producer;
    const Node& pn = g.node(pid);
    NodePlan& pp = plans_[size_t(pid)];
    bool fits = false;
    if (pp.fused)  // its own block, read by this GEMM alone, rows contiguous
      fits = root_[size_t(xv)] == xv && readers[size_t(xv)].size() == 1 && (p.gemm.ldx == 0 || p.gemm.ldx == p.gemm.k) &&
             residual_norm_codes_fit(last_dim(g.info(xv)));
    else if (pn.op == OpKind::GeGLU)  // perhaps a view over its gate half (plan_geglu_in_place): y is not written
      fits = geglu_codes_fit(last_dim(g.info(xv)), row_stride(pn.inputs[0]));
    if (!fits || pp.skip || pn.outputs[0] != xv || memo_.node[size_t(pid)] || pos[size_t(pid)] < 0 ||
        pos[size_t(pid)] >= int64_t(i))
      continue;
    bool between = false;
    for (int64_t j = pos[size_t(pid)] + 1; j < int64_t(i) && !between; ++j) between = plans_[size_t(order_[size_t(j)])].qfp8;
    if (between) continue;
    pp.f_codes = true;
    p.qfp8_x_ready = true;
  }
}

// The FP8 GEMM of a Linear (plan_quant_fp8): its planned desc with e4m3 inputs, x's codes
// contiguous, and the GELU left to a kernel after it where no FP8 epilogue has one.
GemmDesc CudaExecutable::fp8_desc(const NodePlan& p) {
  GemmDesc fd = p.gemm;
  fd.in = DType::F8_E4M3;
  fd.ldx = 0;
  if (p.qfp8_gelu) fd.epilogue = fd.epilogue == Epilogue::BiasGelu ? Epilogue::Bias : Epilogue::None;
  if (p.qfp8_bias_after) fd.epilogue = Epilogue::None;
  return fd;
}

// x's e4m3 codes (m·k bytes) and then its m row scales, in the scratch at qfp8_off_.
uint64_t CudaExecutable::fp8_x_bytes(int64_t m, int64_t k) { return al(uint64_t(m * k)) + al(uint64_t(m) * 4); }
std::pair<uint8_t*, float*> CudaExecutable::fp8_x_codes(int64_t elems) const {
  auto* codes = static_cast<uint8_t*>(scratch_at(qfp8_off_));
  return {codes, reinterpret_cast<float*>(codes + al(uint64_t(elems)))};
}

Status CudaExecutable::run_fp8_linear(NodeId id, const void* bias, void* out) {
  const Node& n = graph_.node(id);
  const NodePlan& p = plans_[size_t(id)];
  const size_t r = size_t(root_[size_t(n.inputs[1])]);
  const CudaWeights::Entry* e = weight_entry_[r];
  const GemmDesc fd = fp8_desc(p);
  if (e->shape[0] != fd.n || e->shape[1] != fd.k)
    return internal_error(where(n) + ": FP8 GEMM planned with another shape than its weight");
  cudaStream_t s = ctx_->stream();
  const auto [codes, scales] = fp8_x_codes(fd.m * fd.k);
  const DType xt = bf16_stored(n.inputs[0]) ? DType::BF16 : DType::F32;
  if (!p.qfp8_x_ready)
    VLAC_RETURN_IF_ERROR(
        quantize_rows_e4m3(s, ptr(n.inputs[0]), xt, fd.m, fd.k, p.gemm.ldx ? p.gemm.ldx : fd.k, codes, scales));
  VLAC_RETURN_IF_ERROR(ctx_->gemm().run_scaled(s, fd, codes, scales, quant_src_[r],
                                               quant_row_scales(quant_src_[r], fd.n, fd.k),
                                               p.qfp8_bias_after ? nullptr : bias, out, ctx_->workspace()));
  if (p.qfp8_bias_after)
    VLAC_RETURN_IF_ERROR(binary_op(s, BinaryKind::Add, static_cast<const float*>(out), fd.m * fd.n,
                                   static_cast<const float*>(bias), fd.n, static_cast<float*>(out), fd.m * fd.n));
  return p.qfp8_gelu ? gelu_tanh(s, out, fd.out, out, fd.out, fd.m * fd.n) : Status::ok();
}

Status CudaExecutable::fetch_on_demand(NodeId id) {
  const Node& n = graph_.node(id);
  int slot = 0;
  for (ValueId v : n.inputs) {
    const size_t r = size_t(root_[size_t(v)]);
    const CudaWeights::Entry* e = weight_entry_[r];
    if (!e || !e->on_demand) continue;
    if (ctx_->capturing())
      return invalid_argument("cuda: engine '" + options_.label + "': the memo missed inside a recorded sequence, and "
                              "weight '" + e->name + "' is read from the package at a miss (run it once unrecorded)");
    VLAC_ASSIGN_OR_RETURN(const void* d, weights_->fetch(*e, slot++, ctx_->stream()));
    if (widened(ValueId(r))) quant_src_[r] = d;  // widened from there (run_node)
    else ptr_[r] = const_cast<void*>(d);
  }
  return Status::ok();
}

Status CudaExecutable::run_node(NodeId id) {
  const ir::Graph& g = graph_;
  const Node& n = g.node(id);
  const NodePlan& p = plans_[size_t(id)];
  if (reads_on_demand_[size_t(id)]) VLAC_RETURN_IF_ERROR(fetch_on_demand(id));
  cudaStream_t s = ctx_->stream();
  auto info = [&](ValueId v) -> const ValueInfo& { return g.info(v); };
  auto f = [&](size_t i) { return static_cast<float*>(ptr(n.inputs[i])); };
  void* out = n.outputs.empty() ? nullptr : ptr(n.outputs[0]);
  float* outf = static_cast<float*>(out);
  const DType od = !n.outputs.empty() && bf16_stored(n.outputs[0]) ? DType::BF16 : DType::F32;
  const ValueInfo& x = info(n.inputs.empty() ? n.outputs[0] : n.inputs[0]);
  if (p.skip) return Status::ok();  // folded into a later residual_norm_to (plan_residual_norms)
  if (n.op == OpKind::Linear && !p.qskinny && !p.qfp8 && n.inputs.size() > 1 && from_weight(n.inputs[1])) {
    const size_t r = size_t(root_[size_t(n.inputs[1])]);
    if (dequant_group_at_[size_t(id)] >= 0) {  // this GEMM's weight and the next ones' (plan_dequant_groups)
      DequantJob jobs[kMaxDequantJobs];
      const auto& grp = dequant_groups_[size_t(dequant_group_at_[size_t(id)])];
      for (size_t j = 0; j < grp.size(); ++j) {
        const CudaWeights::Entry* e = weight_entry_[size_t(grp[j])];
        jobs[j] = DequantJob{quant_src_[size_t(grp[j])], e->dtype, e->shape[0], e->shape[1], ptr_[size_t(grp[j])],
                             !qexact_w_[size_t(grp[j])]};
      }
      VLAC_RETURN_IF_ERROR(dequant_bf16_many(s, jobs, int(grp.size())));
    } else if (widened(ValueId(r)) && !sliced(ValueId(r)) && !in_group_[r]) {  // (sliced: in the Linear below)
      const ValueInfo& w = info(n.inputs[1]);
      VLAC_RETURN_IF_ERROR(dequant_bf16(s, quant_src_[r], weight_entry_[r]->dtype, w.shape[0], w.shape[1], 0,
                                        w.shape[0], ptr_[r], p.qexact == 0));
    }
  }
  if (p.fused) {
    const int64_t d = last_dim(x);
    NormArgs na;
    na.eps = float(n.attrs.get_float("eps", 1e-6));
    if (n.op == OpKind::RMSNorm) na.kind = NormKind::Rms, na.w = f(1);
    else if (n.op == OpKind::LayerNorm) na.kind = NormKind::Layer, na.w = f(1), na.b = f(2);
    else na.kind = NormKind::AdaRms, na.mod = f(1);
    if (p.f_codes) std::tie(na.codes, na.code_scales) = fp8_x_codes(x.numel());  // the FP8 GEMM's x
    VLAC_RETURN_IF_ERROR(residual_norm_to(s, ptr(p.f_h), ptr(p.f_sum), DType::F32, ptr(p.f_branch), DType::F32,
                                          p.f_has_gate ? static_cast<const float*>(ptr(p.f_gate)) : nullptr, na, out,
                                          od, x.numel() / d, d, p.f_branch_parts, p.f_part_stride));
    if (n.op != OpKind::AdaRMSNorm || ptr(n.outputs[1]) == f(1) + 2 * d) return Status::ok();  // a view (gate_views_)
    const cudaError_t e = cudaMemcpyAsync(ptr(n.outputs[1]), f(1) + 2 * d, uint64_t(d) * 4, cudaMemcpyDeviceToDevice, s);
    return e == cudaSuccess ? Status::ok() : cuda_error("copy", e);
  }
  auto memcpy_d2d = [&](void* dst, const void* src, uint64_t bytes) -> Status {
    if (bytes == 0 || dst == src) return Status::ok();
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
    return e == cudaSuccess ? Status::ok() : cuda_error("copy", e);
  };
  switch (n.op) {
    case OpKind::Input:
    case OpKind::Weight:
    case OpKind::Constant:
    case OpKind::Reshape:
      return Status::ok();
    case OpKind::Linear: {
      if (p.gemm.m == 0) return Status::ok();
      const void* bias = p.bias_bf16 ? p.bias_bf16 : n.inputs.size() == 3 ? ptr(n.inputs[2]) : nullptr;
      if (p.qfp8) return run_fp8_linear(id, bias, out);
      const void* xin = ptr(n.inputs[0]);
      if (p.bf16 && !bf16_stored(n.inputs[0])) {
        VLAC_RETURN_IF_ERROR(cast(s, xin, DType::F32, scratch_at(p.cast_off), DType::BF16, x.numel()));
        xin = scratch_at(p.cast_off);
      }
      if (p.mlp >= 0) {  // gate|up, GeGLU and down in one launch (plan_expert_mlp)
        const MlpRun& r = mlps_[size_t(p.mlp)];
        return expert_mlp(s, r.plan, xin, ptr(n.inputs[1]), ptr(g.node(r.down).inputs[1]),
                          ptr(g.node(r.geglu).outputs[0]), r.h_stride, static_cast<float*>(ptr(g.node(r.down).outputs[0])),
                          r.y_stride, scratch_at(r.ws_off), mlp_sync_);
      }
      if (p.qskinny) {
        const size_t r = size_t(root_[size_t(n.inputs[1])]);
        SkinnyGemm sg{p.gemm.m, p.gemm.n, p.gemm.k, p.gemm.out, bias != nullptr, p.qskinny};
        sg.weights = weight_entry_[r]->dtype;
        return skinny_gemm(s, sg, xin, quant_src_[r], bias, out, ctx_->workspace(), quant_counters_);
      }
      const size_t r = from_weight(n.inputs[1]) ? size_t(root_[size_t(n.inputs[1])]) : 0;
      if (p.qexact) return run_quant_linear(id, xin, bias, out);
      if (from_weight(n.inputs[1]) && sliced(ValueId(r))) {
        const ValueInfo& w = info(n.inputs[1]);
        // Widen a slice of W's rows, multiply it into the matching columns of y, next slice.
        const int64_t rows = slice_rows_[r], nn = w.shape[0];
        const uint64_t ye = dtype_size(p.gemm.out);
        for (int64_t n0 = 0; n0 < nn; n0 += rows) {
          GemmDesc d = p.gemm;
          d.n = std::min(rows, nn - n0);
          d.ldy = p.gemm.ldy ? p.gemm.ldy : p.gemm.n;
          VLAC_RETURN_IF_ERROR(dequant_bf16(s, quant_src_[r], weight_entry_[r]->dtype, nn, w.shape[1], n0, d.n, ptr_[r]));
          VLAC_RETURN_IF_ERROR(ctx_->gemm().run(s, d, xin, ptr_[r],
                                                bias ? static_cast<const uint8_t*>(bias) + uint64_t(n0) * ye : nullptr,
                                                static_cast<uint8_t*>(out) + uint64_t(n0) * ye, ctx_->workspace()));
        }
        return Status::ok();
      }
      return ctx_->gemm().run(s, p.gemm, xin, ptr(n.inputs[1]), bias, out, ctx_->workspace());
    }
    case OpKind::PatchEmbed: {
      const auto& w = info(n.inputs[1]).shape;
      const size_t r = x.shape.size();
      const int64_t c = x.shape[r - 3], y = x.shape[r - 2], xx = x.shape[r - 1];
      const int64_t images = r == 4 ? x.shape[0] : 1;
      const uint64_t per_image = uint64_t((y / w[2]) * (xx / w[3]) * p.gemm.k) * dtype_size(p.weight_dtype);
      for (int64_t i = 0; i < images; ++i)
        VLAC_RETURN_IF_ERROR(im2col_patches(s, f(0) + i * c * y * xx, static_cast<uint8_t*>(scratch_at(0)) + i * per_image,
                                            p.weight_dtype, c, y, xx, w[2], w[3]));
      return ctx_->gemm().run(s, p.gemm, scratch_at(0), ptr(n.inputs[1]),
                              n.inputs.size() == 3 ? ptr(n.inputs[2]) : nullptr, out, ctx_->workspace());
    }
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul: {
      const BinaryKind op = n.op == OpKind::Add ? BinaryKind::Add : n.op == OpKind::Sub ? BinaryKind::Sub : BinaryKind::Mul;
      return binary_op(s, op, f(0), info(n.inputs[0]).numel(), f(1), info(n.inputs[1]).numel(), outf,
                       info(n.outputs[0]).numel());
    }
    case OpKind::Scale:
      return scale(s, f(0), float(n.attrs.get_float("scale", 1.0)), outf, x.numel());
    case OpKind::LayerNorm: {
      const int64_t d = last_dim(x);
      return layer_norm(s, f(0), DType::F32, f(1), f(2), out, od, x.numel() / d, d,
                        float(n.attrs.get_float("eps", 1e-6)));
    }
    case OpKind::RMSNorm: {
      const int64_t d = last_dim(x);
      return rms_norm(s, f(0), DType::F32, f(1), out, od, x.numel() / d, d, float(n.attrs.get_float("eps", 1e-6)));
    }
    case OpKind::AdaRMSNorm: {
      const int64_t d = last_dim(x);
      VLAC_RETURN_IF_ERROR(ada_rms_norm(s, f(0), DType::F32, f(1), out, od, x.numel() / d, d,
                                        float(n.attrs.get_float("eps", 1e-6))));
      return memcpy_d2d(ptr(n.outputs[1]), f(1) + 2 * d, uint64_t(d) * 4);  // the gate: mod[2D:3D] (none if a view)
    }
    case OpKind::GeluTanh:
      if (p.gelu_in_gemm) return Status::ok();  // its Linear's epilogue wrote it (plan_gemm_gelu)
      return gelu_tanh(s, f(0), DType::F32, out, od, x.numel());
    case OpKind::SiLU:
      return silu(s, f(0), outf, x.numel());
    case OpKind::GeGLU: {  // gate and up: bf16 when their GEMM rounds at its store (plan_bf16_gemm_outputs)
      const int64_t d = last_dim(x);
      const DType it = bf16_stored(n.inputs[0]) ? DType::BF16 : DType::F32;
      if (p.f_codes) {  // the FP8 GEMM's x, where run_fp8_linear would have quantized it
        const auto [codes, scales] = fp8_x_codes(x.numel());
        return geglu_e4m3(s, ptr(n.inputs[0]), ptr(n.inputs[1]), it, row_stride(n.inputs[0]), od, x.numel() / d, d, codes,
                          scales);
      }
      return geglu(s, ptr(n.inputs[0]), ptr(n.inputs[1]), it, row_stride(n.inputs[0]), out, od, x.numel() / d, d,
                   view_stride_[size_t(n.outputs[0])]);  // in place over gate: rows 2F apart (plan_geglu_in_place)
    }
    case OpKind::RoPE: {
      const int64_t row = x.shape[1] * x.shape[2];  // out of place: no copy of x first
      const int64_t xs = view_stride_[size_t(n.inputs[0])] ? view_stride_[size_t(n.inputs[0])] : row;
      if (p.qkv_att >= 0) {  // plan_prefix_qkv: k, v and their bf16 copies for the attention too
        const Node& kn = g.node(NodeId(p.qkv_k));
        const Node& vn = g.node(NodeId(p.qkv_v));
        const NodePlan& ap = plans_[size_t(p.qkv_att)];
        const ValueInfo& xk = info(kn.inputs[0]);
        const ValueInfo& vi = info(vn.inputs[0]);
        const int64_t krow = xk.shape[1] * xk.shape[2];
        const int64_t vstart = vn.attrs.get_int("start", 0), vc = vn.attrs.get_int("end", vi.shape[1]) - vstart;
        RopeQkvJob j;
        j.q = f(0), j.q_stride = xs, j.qo = static_cast<uint16_t*>(out), j.qo_stride = row, j.hq = x.shape[1];
        j.k = static_cast<const float*>(ptr(kn.inputs[0]));
        j.k_stride = view_stride_[size_t(kn.inputs[0])] ? view_stride_[size_t(kn.inputs[0])] : krow;
        j.ko = static_cast<float*>(ptr(kn.outputs[0])), j.ko_stride = krow;
        j.kb = reinterpret_cast<uint16_t*>(scratch_at(ap.k_off)), j.kb_stride = krow, j.hk = xk.shape[1];
        j.v = static_cast<const float*>(ptr(vn.inputs[0])) + vstart, j.v_stride = vi.shape[1];
        j.vo = static_cast<float*>(ptr(vn.outputs[0])), j.vo_stride = vc;
        j.vb = reinterpret_cast<uint16_t*>(scratch_at(ap.v_off)), j.vb_stride = vc, j.vc = vc;
        return rope_qkv_to(s, j, static_cast<const int64_t*>(ptr(n.inputs[1])), x.shape[0], x.shape[2],
                           float(n.attrs.get_float("base", 10000.0)));
      }
      if (p.rope_pair >= 0) {  // plan_rope_pairs: the next RoPE too
        const Node& nb = g.node(NodeId(p.rope_pair));
        const ValueInfo& xb = info(nb.inputs[0]);
        const int64_t rowb = xb.shape[1] * xb.shape[2];
        const int64_t xsb = view_stride_[size_t(nb.inputs[0])] ? view_stride_[size_t(nb.inputs[0])] : rowb;
        const RopeJob ja{f(0), xs, out, row, x.shape[1]};
        const RopeJob jb{ptr(nb.inputs[0]), xsb, ptr(nb.outputs[0]), rowb, xb.shape[1]};
        RowCopyJob cv;
        if (p.rope_copy >= 0) {  // ... and the v slice's rows (plan_rope_pairs)
          const Node& nc = g.node(NodeId(p.rope_copy));
          const ValueInfo& ci = info(nc.inputs[0]);
          const int64_t dim = ci.shape[1], start = nc.attrs.get_int("start", 0), end = nc.attrs.get_int("end", dim);
          cv = {static_cast<const float*>(ptr(nc.inputs[0])) + start, dim, ptr(nc.outputs[0]), end - start, end - start};
        }
        return rope_pair_to(s, ja, jb, DType::F32, od, static_cast<const int64_t*>(ptr(n.inputs[1])), x.shape[0],
                            x.shape[2], float(n.attrs.get_float("base", 10000.0)), p.rope_copy >= 0 ? &cv : nullptr,
                            p.early_dependents && !stable_dirty_);
      }
      return rope_to(s, f(0), DType::F32, xs, out, od, row, static_cast<const int64_t*>(ptr(n.inputs[1])), x.shape[0],
                     x.shape[1], x.shape[2], float(n.attrs.get_float("base", 10000.0)));
    }
    case OpKind::Attention: {
      AttentionShape sh = p.att;  // q/k/v read as views of a fused output take its width as their row stride
      if (view_stride_[size_t(n.inputs[0])]) sh.q_stride = view_stride_[size_t(n.inputs[0])];
      if (view_stride_[size_t(n.inputs[1])]) sh.k_stride = view_stride_[size_t(n.inputs[1])];
      if (view_stride_[size_t(n.inputs[2])]) sh.v_stride = view_stride_[size_t(n.inputs[2])];
      // plan_attention_early: the kept prefix rows, unless this run copies them in (its Concats).
      if (!stable_dirty_) sh.stable_keys = p.stable_keys;
      AttentionMask mask;
      if (n.inputs.size() == 4) {
        if (info(n.inputs[3]).dtype == DType::F32) mask.add = f(3);
        else mask.allow = static_cast<const uint8_t*>(ptr(n.inputs[3]));
      }
      const float sc = float(n.attrs.get_float("scale", 1.0 / std::sqrt(double(sh.dh))));
      void* split = p.split_bytes ? scratch_at(p.split_off) : nullptr;
      // plan_kv_window: this engine's attentions read their kept K/V through a persisting window.
      const ScopedL2Window window_scope(kv_window_);
      if (p.bf16) {
        // lerobot's bf16 attention: q, k, v rounded to bf16, fp32 scores and softmax, the
        // probabilities rounded to bf16 before P·V, fp32 out (the CPU's DnnlAttention).
        // Inputs already stored in bf16 (plan_bf16_stores) are read in place.
        const void* qkv[3];
        const uint64_t offs[3] = {p.cast_off, p.k_off, p.v_off};
        const int64_t counts[3] = {sh.t * sh.h * sh.dh, sh.s * sh.hk * sh.dh, sh.s * sh.hk * sh.dv};
        for (size_t i = 0; i < 3; ++i) {
          if (bf16_stored(n.inputs[i])) {
            qkv[i] = ptr(n.inputs[i]);
            continue;
          }
          if (p.kv_ready && i > 0) {  // written in bf16 by the q RoPE's launch (plan_prefix_qkv)
            qkv[i] = scratch_at(offs[i]);
            continue;
          }
          VLAC_RETURN_IF_ERROR(cast(s, f(i), DType::F32, scratch_at(offs[i]), DType::BF16, counts[i]));
          qkv[i] = scratch_at(offs[i]);
        }
        if (p.rope_q >= 0) {  // plan_rope_attention: q and the fresh k, v from the fused f32 rows
          const Node& qn = g.node(NodeId(p.rope_q));
          const NodePlan& qp = plans_[size_t(p.rope_q)];
          const Node& kn = g.node(NodeId(qp.rope_pair));
          const Node& vn = g.node(NodeId(qp.rope_copy));
          const int64_t dh = sh.dh;
          if (p.rope_table)
            VLAC_RETURN_IF_ERROR(rope_sincos(s, static_cast<const int64_t*>(ptr(qn.inputs[1])), sh.t, dh,
                                             float(qn.attrs.get_float("base", 10000.0)), rope_table_));
          AttentionRope r;
          r.q = static_cast<const float*>(ptr(qn.inputs[0])), r.q_stride = heads_stride(qn.inputs[0]);
          r.k = static_cast<const float*>(ptr(kn.inputs[0])), r.k_stride = heads_stride(kn.inputs[0]);
          r.v = static_cast<const float*>(ptr(vn.inputs[0])) + vn.attrs.get_int("start", 0);
          r.v_stride = info(vn.inputs[0]).shape[1];
          r.sc = rope_table_;
          return attention(s, sh, DType::BF16, qkv[0], qkv[1], qkv[2], mask, out, od, sc, p.splits, split,
                           p.split_bytes, &r);
        }
        return attention(s, sh, DType::BF16, qkv[0], qkv[1], qkv[2], mask, out, od, sc, p.splits, split, p.split_bytes);
      }
      return attention(s, sh, DType::F32, f(0), f(1), f(2), mask, out, od, sc, p.splits, split, p.split_bytes);
    }
    case OpKind::Embedding: {
      const ValueInfo& ids = info(n.inputs[1]);
      const ValueId tv = root_[size_t(n.inputs[0])];
      const CudaWeights::Entry* e = weight_entry_[size_t(tv)];
      const bool bf16 = e->rounds_to_bf16 || e->dtype == DType::BF16 || is_quant_dtype(e->dtype);  // as the CPU's
      float mul = float(n.attrs.get_float("scale", 1.0));
      if (bf16 && n.attrs.get_int("round_scale_to_table", 0)) mul = bf16_to_f32(f32_to_bf16(mul));
      const DType eo = info(n.outputs[0]).dtype;
      const int64_t t = ids.numel(), d = x.shape[1];
      if (t == 0) return Status::ok();
      if (HostGather* hg = p.gather) {
        if (!hg->ids || !*hg->ids)
          return invalid_argument("the ids of a host-mapped table must be written from the host (write_input)");
        cudaError_t ce = cudaSuccess;
        if (ctx_->capturing() && !env_on("VLAC_GATHER_IN_GRAPH")) {
          // Recording: gather now (the stream is idle, CudaSequence) and before each replay, not
          // as a host node inside the graph (0.17-0.21 ms a chunk on the H200, session 16).
          gather_rows(hg);
          VLAC_RETURN_IF_ERROR(gather_status(*hg));
          ctx_->add_replay_hook([this, hg] {
            gather_rows(hg);
            return gather_status(*hg);
          });
        } else {
          ce = cudaLaunchHostFunc(s, gather_rows, hg);
        }
        const uint64_t rows = uint64_t(t * d) * dtype_size(hg->rows_dtype);
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(scratch_at(p.cast_off), hg->rows_host, rows, cudaMemcpyHostToDevice, s);
        if (ce != cudaSuccess) return cuda_error("gathering " + std::to_string(rows) + " bytes of embedding rows", ce);
        return embedding(s, scratch_at(p.cast_off), hg->rows_dtype, t, d, static_cast<const int64_t*>(iota_), t, mul, out,
                         eo, nullptr);
      }
      return embedding(s, ptr(n.inputs[0]), e->dtype, x.shape[0], d, static_cast<const int64_t*>(ptr(n.inputs[1])), t, mul,
                       out, eo, nullptr);
    }
    case OpKind::Cast:
      return cast(s, ptr(n.inputs[0]), x.dtype, out, info(n.outputs[0]).dtype, x.numel());
    case OpKind::Concat: {
      const ValueInfo& o = info(n.outputs[0]);
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += int64_t(o.shape.size());
      int64_t outer = 1;
      for (int64_t dd = 0; dd < axis; ++dd) outer *= o.shape[size_t(dd)];
      outer = std::max<int64_t>(outer, 1);
      uint8_t* dst = static_cast<uint8_t*>(out);
      // Pieces from unchanged stable inputs are in the output's own buffer already.
      auto keep = [&](size_t i) {
        return ((p.inplace_pieces >> i) & 1u) || (!stable_dirty_ && ((p.stable_pieces >> i) & 1u));
      };
      if (od == DType::BF16) {  // axis 0 of f32 pieces (plan_bf16_stores): one cast per piece
        uint64_t at = 0;
        for (size_t i = 0; i < n.inputs.size(); ++i) {
          const ValueId in = n.inputs[i];
          const int64_t cnt = info(in).numel();
          if (cnt > 0 && !keep(i)) VLAC_RETURN_IF_ERROR(cast(s, ptr(in), DType::F32, dst + at, DType::BF16, cnt));
          at += uint64_t(cnt) * 2;
        }
        return Status::ok();
      }
      const uint64_t es = dtype_size(o.dtype);
      const uint64_t out_row = uint64_t(o.numel() / outer) * es;
      uint64_t col = 0;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ValueId in = n.inputs[i];
        const uint64_t row = uint64_t(info(in).numel() / outer) * es;
        if (row > 0 && !keep(i)) {
          const cudaError_t e = outer == 1 ? cudaMemcpyAsync(dst + col, ptr(in), row, cudaMemcpyDeviceToDevice, s)
                                           : cudaMemcpy2DAsync(dst + col, out_row, ptr(in), row, row, size_t(outer),
                                                               cudaMemcpyDeviceToDevice, s);
          if (e != cudaSuccess) return cuda_error("concat copy", e);
        }
        col += row;
      }
      return Status::ok();
    }
    case OpKind::Slice: {
      if (p.view) return Status::ok();  // read in place by its readers (plan_slice_views)
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += int64_t(x.shape.size());
      int64_t outer = 1, inner = 1;
      for (int64_t dd = 0; dd < axis; ++dd) outer *= x.shape[size_t(dd)];
      for (size_t dd = size_t(axis) + 1; dd < x.shape.size(); ++dd) inner *= x.shape[dd];
      const int64_t dim = x.shape[size_t(axis)];
      const int64_t start = n.attrs.get_int("start", 0), end = n.attrs.get_int("end", dim);
      const uint64_t es = dtype_size(x.dtype);
      const uint64_t len = uint64_t((end - start) * inner) * es;
      if (len == 0 || outer == 0) return Status::ok();
      const uint8_t* src = static_cast<const uint8_t*>(ptr(n.inputs[0])) + uint64_t(start * inner) * es;
      // Rows of a concatenation, or a slice stored in bf16 (plan_bf16_stores): 2-D, last axis, F32.
      if (p.into_concat || od == DType::BF16)
        return cast_rows(s, src, DType::F32, dim, out, od, end - start, outer, end - start);
      const cudaError_t e = cudaMemcpy2DAsync(out, len, src, uint64_t(dim * inner) * es, len, size_t(outer),
                                              cudaMemcpyDeviceToDevice, s);
      return e == cudaSuccess ? Status::ok() : cuda_error("slice copy", e);
    }
    case OpKind::TimeEmbedding:
      return time_embedding(s, f(0), outf, info(n.outputs[0]).shape[0], n.attrs.get_float("min_period", 4e-3),
                            n.attrs.get_float("max_period", 4.0));
    case OpKind::EulerStep:
      return euler_step_to(s, f(0), f(1), float(n.attrs.get_float("dt", 0.0)), outf, x.numel());
    case OpKind::Softmax:
    case OpKind::MatMul:
    case OpKind::Transpose:
      break;
  }
  return internal_error(std::string("op ") + ir::op_name(n.op) + " not planned");
}

}  // namespace vlac::cuda
