// CPU graph executor: weight binding, one-time buffer planning, and the per-op dispatch.
// run() must not allocate: every buffer is planned in create().
#include "backends/cpu/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "backends/cpu/dnnl_linear.h"
#include "backends/cpu/kernels.h"
#include "core/quant.h"
#include "exec/arena_plan.h"
#include "ir/walk.h"

namespace vlac::cpu {

using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;
using ir::ValueInfo;

namespace {

constexpr uint64_t kAlign = exec::kArenaAlign;

const uint8_t* src_of(const WeightFile& f, const ir::WeightRef& r) { return f.data + r.offset; }
uint64_t align_up(uint64_t v) { return exec::align_up(v); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t last_dim(const ValueInfo& v) { return v.shape.empty() ? 1 : v.shape.back(); }

// b broadcasts over a when b's shape (leading 1s dropped) is a suffix of a's shape.
bool trailing_broadcast(const ValueInfo& a, const ValueInfo& b) {
  std::vector<int64_t> bs = b.shape;
  while (!bs.empty() && bs.front() == 1) bs.erase(bs.begin());
  if (bs.size() > a.shape.size()) return false;
  return std::equal(bs.begin(), bs.end(), a.shape.end() - std::ptrdiff_t(bs.size()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Weights

Result<CpuWeights> CpuWeights::load(const std::vector<ir::WeightRef>& refs, const std::vector<DType>& run_dtypes,
                                    const std::vector<WeightFile>& files, const std::vector<bool>& gather_only) {
  if (run_dtypes.size() != refs.size()) return internal_error("CpuWeights: one run dtype per weight needed");
  CpuWeights w;
  for (size_t i = 0; i < refs.size(); ++i) {
    const ir::WeightRef& r = refs[i];
    if (w.entries_.count(r.name)) continue;
    if (r.file_id >= files.size()) return internal_error("weight '" + r.name + "': file id out of range");
    const WeightFile& f = files[r.file_id];
    uint64_t end = 0;
    if (__builtin_add_overflow(r.offset, r.bytes, &end) || end > f.size)
      return invalid_format(f.path + ": tensor '" + r.name + "' lies outside the file");
    const DType want = run_dtypes[i];
    if (is_quant_dtype(want)) {  // an 8-bit matrix from a package: codes and scales used in place
      if (r.dtype != want || !is_quant_matrix(r.dtype, r.shape) || r.bytes != stored_weight_bytes(r.dtype, r.shape))
        return internal_error("weight '" + r.name + "': " + dtype_name(want) + " weights are bound as compiled, not converted");
      if (reinterpret_cast<uintptr_t>(src_of(f, r)) % 4 != 0)  // the scales are floats
        return invalid_format(f.path + ": " + dtype_name(want) + " weight '" + r.name + "' is not 4-byte aligned");
      Entry e;
      e.dtype = want;
      e.shape = r.shape;
      e.data = src_of(f, r);
      w.mapped_bytes_ += r.bytes;
      w.entries_.emplace(r.name, std::move(e));
      continue;
    }
    if (want != DType::F32 && want != DType::BF16)
      return internal_error("weight '" + r.name + "': run dtype must be F32, BF16, I8 or F8_E4M3");
    if (r.dtype != DType::F32 && r.dtype != DType::BF16 && r.dtype != DType::F16)
      return unsupported(f.path + ": tensor '" + r.name + "' has dtype " + dtype_name(r.dtype) +
                         " (the CPU backend reads F32, BF16 and F16)");
    ir::ValueInfo vi{r.dtype, r.shape};
    const uint64_t n = uint64_t(vi.numel());
    const uint8_t* src = f.data + r.offset;
    Entry e;
    e.dtype = want;
    e.shape = r.shape;
    const bool aligned = reinterpret_cast<uintptr_t>(src) % dtype_size(want) == 0;
    const bool lazy_bf16 = i < gather_only.size() && gather_only[i] && want == DType::BF16 && r.dtype == DType::F32 &&
                           reinterpret_cast<uintptr_t>(src) % 4 == 0;
    if (lazy_bf16) {
      e.data = src;
      e.dtype = DType::F32;
      e.rounds_to_bf16 = true;
      w.mapped_bytes_ += r.bytes;
    } else if (r.dtype == want && aligned) {
      e.data = src;
      w.mapped_bytes_ += r.bytes;
    } else {
      const uint64_t bytes = n * dtype_size(want);
      std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[std::max<uint64_t>(bytes, 1)]);
      if (!buf) return Status(StatusCode::ResourceExhausted, "out of memory converting weight '" + r.name + "'");
      if (r.dtype == want) {
        std::memcpy(buf.get(), src, bytes);
      } else if (want == DType::BF16) {  // F32 -> BF16 (F16 stored runs as F32 below)
        if (r.dtype != DType::F32) return internal_error("weight '" + r.name + "': no F16 -> BF16 path");
        uint16_t* dst = reinterpret_cast<uint16_t*>(buf.get());
        for (uint64_t k = 0; k < n; ++k) {
          float v;
          std::memcpy(&v, src + 4 * k, 4);
          dst[k] = f32_to_bf16(v);
        }
      } else {  // BF16/F16 -> F32
        float* dst = reinterpret_cast<float*>(buf.get());
        for (uint64_t k = 0; k < n; ++k) {
          uint16_t h;
          std::memcpy(&h, src + 2 * k, 2);
          dst[k] = r.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
      }
      // The source bytes are not read again: give their pages back (memory rule 1).
      if (f.map) f.map->drop(r.offset, r.bytes);
      e.data = buf.get();
      e.owned = true;
      w.owned_bytes_ += bytes;
      w.storage_.push_back(std::move(buf));
    }
    w.entries_.emplace(r.name, std::move(e));
  }
  return w;
}

const CpuWeights::Entry* CpuWeights::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------
// Planning

Result<Executor> Executor::create(ir::Graph graph, const CpuWeights& weights, ExecutorOptions options) {
  Executor ex;
  ex.graph_ = std::move(graph);
  ex.options_ = options;
  set_num_threads(options.threads);  // before planning: oneDNN sizes its kernels for these threads
  VLAC_RETURN_IF_ERROR(ex.plan(weights));
  return ex;
}

Status Executor::plan(const CpuWeights& weights) {
  const ir::Graph& g = graph_;
  VLAC_ASSIGN_OR_RETURN(order_, ir::schedule(g));
  linear_.clear();
  linear_.resize(g.nodes().size());
  rope_tables_.clear();
  rope_table_of_.assign(g.nodes().size(), -1);
  packed_bytes_ = 0;
  attention_.clear();
  attention_.resize(g.nodes().size());

  const size_t nv = g.values().size();
  root_ = exec::storage_roots(g, order_);
  ptr_.assign(nv, nullptr);
  weight_dtype_.assign(nv, DType::F32);
  weight_rounds_bf16_.assign(nv, false);
  auto label = [&](const Node& n) { return std::string("cpu executor: node '") + n.name + "' (" + ir::op_name(n.op) + ")"; };

  // Check every op once here so run() needs no checks; collect scratch needs.
  int64_t scratch = 1;
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    auto in = [&](size_t i) -> const ValueInfo& { return g.info(n.inputs[i]); };
    auto is_weight = [&](size_t i) { return g.node(g.value(n.inputs[i]).producer).op == OpKind::Weight; };
    auto need_f32 = [&](size_t i) -> Status {
      if (in(i).dtype != DType::F32 && !(is_weight(i)))
        return unsupported(label(n) + ": input " + std::to_string(i) + " is " + ir::to_string(in(i)) + ", needs f32");
      return Status::ok();
    };
    // 8-bit weights are codes + scales (core/quant.h): only a Linear's W and a gathered table
    // read them; anything else would read the blob as floats (a package can say anything).
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (is_weight(i) && is_quant_dtype(weight_dtype_[size_t(root_[size_t(n.inputs[i])])]) &&
          !(n.op == OpKind::Linear && i == 1) && !(n.op == OpKind::Embedding && i == 0))
        return invalid_format(label(n) + ": input " + std::to_string(i) + " is an 8-bit weight, which only a linear's "
                              "weight or an embedding table can be");
    switch (n.op) {
      case OpKind::Weight: {
        const ir::WeightRef& r = g.weights()[size_t(n.weight)];
        const CpuWeights::Entry* e = weights.find(r.name);
        if (!e) return internal_error("cpu executor: weight '" + r.name + "' was not loaded");
        if (e->shape != r.shape)
          return internal_error("cpu executor: weight '" + r.name + "' loaded as " + shape_str(e->shape) +
                                ", graph wants " + shape_str(r.shape));
        ptr_[size_t(n.outputs[0])] = const_cast<void*>(e->data);
        weight_dtype_[size_t(n.outputs[0])] = e->dtype;
        weight_rounds_bf16_[size_t(n.outputs[0])] = e->rounds_to_bf16;
        break;
      }
      case OpKind::Input:
        break;
      case OpKind::Constant: {
        const ValueInfo& o = g.info(n.outputs[0]);
        if (o.dtype != DType::F32) return unsupported(label(n) + ": only f32 constants");
        break;
      }
      case OpKind::Reshape:  // aliases its input (exec::storage_roots)
        break;
      case OpKind::Linear: {
        VLAC_RETURN_IF_ERROR(need_f32(0));
        const ValueInfo& w = in(1);
        if (n.inputs.size() == 3) VLAC_RETURN_IF_ERROR(need_f32(2));
        if (!is_weight(1) && w.dtype != DType::F32) return unsupported(label(n) + ": activation weight must be f32");
        const DType wd = is_weight(1) ? weight_dtype_[size_t(root_[size_t(n.inputs[1])])] : DType::F32;
        const int64_t k = w.shape[1];
        const int64_t m = in(0).numel() / k;
        const bool pack = options_.pack_weights && is_weight(1) && m > 1;
        auto lin = DnnlLinear::create(m, k, w.shape[0], wd, n.inputs.size() == 3, WeightLayout::NK,
                                      pack ? ptr_[size_t(root_[size_t(n.inputs[1])])] : nullptr,
                                      options_.fp8_activations);
        if (!lin.is_ok()) return Status(lin.status().code(), label(n) + ": " + lin.status().message());
        scratch = std::max(scratch, int64_t((lin->scratch_bytes() + 3) / 4));
        packed_bytes_ += lin->packed_bytes();
        linear_[size_t(id)].emplace(std::move(*lin));
        break;
      }
      case OpKind::PatchEmbed: {
        // [N,C,Y,X]: one image at a time through the same planned matmul (rows of one image).
        const std::vector<int64_t> img(in(0).shape.end() - 3, in(0).shape.end());
        const auto& w = in(1).shape;
        // im2col into the scratch, then a planned matmul over the fp32 weight [O, C·kh·kw] in place
        // (dnnl_sgemm ran this shape at ~25 GFLOP/s, the planned primitive several times faster).
        const int64_t cols = patch_embed_scratch_floats(img[0], img[1], img[2], w[2], w[3]);
        auto lin = DnnlLinear::create((img[1] / w[2]) * (img[2] / w[3]), w[1] * w[2] * w[3], w[0], DType::F32,
                                      n.inputs.size() == 3, WeightLayout::NK);
        if (!lin.is_ok()) return Status(lin.status().code(), label(n) + ": " + lin.status().message());
        scratch = std::max(scratch, int64_t(align_up(uint64_t(cols) * 4) / 4) + int64_t((lin->scratch_bytes() + 3) / 4));
        linear_[size_t(id)].emplace(std::move(*lin));
        break;
      }
      case OpKind::Attention: {
        if (n.inputs.size() == 4 && in(3).dtype != DType::BOOL && in(3).dtype != DType::U8 && in(3).dtype != DType::F32)
          return unsupported(label(n) + ": mask must be bool, u8 or f32");
        const auto& qs = in(0).shape;
        const auto& ks = in(1).shape;
        const auto& vs = in(2).shape;
        scratch = std::max(scratch, attention_scratch_floats(qs[0], ks[0], options_.threads, qs[1]));
        if (options_.bf16_mqa_attention && ks[1] == 1 && qs[1] > 1) {
          auto att = DnnlAttention::create(qs[0], qs[1], ks[0], qs[2], vs[2]);
          if (!att.is_ok()) return Status(att.status().code(), label(n) + ": " + att.status().message());
          scratch = std::max(scratch, int64_t((att->scratch_bytes() + 3) / 4));
          attention_[size_t(id)].emplace(std::move(*att));
        }
        break;
      }
      case OpKind::Add:
      case OpKind::Sub:
      case OpKind::Mul: {
        const ValueInfo& o = g.info(n.outputs[0]);
        if (o.dtype != DType::F32) return unsupported(label(n) + ": f32 only");
        const bool ok = (in(0).numel() == o.numel() && trailing_broadcast(in(0), in(1))) ||
                        (in(1).numel() == o.numel() && trailing_broadcast(in(1), in(0)));
        if (!ok) return unsupported(label(n) + ": broadcast of " + ir::to_string(in(0)) + " and " +
                                    ir::to_string(in(1)) + " (only a trailing-dims operand)");
        break;
      }
      case OpKind::Embedding: {
        if (in(1).dtype != DType::I64) return unsupported(label(n) + ": ids must be i64");
        const DType od = g.info(n.outputs[0]).dtype;
        if (od != DType::F32 && od != DType::BF16) return unsupported(label(n) + ": output must be f32 or bf16");
        scratch = std::max(scratch, in(0).shape[1]);  // one f32 row for a bf16 output
        break;
      }
      case OpKind::Cast: {
        const DType a = in(0).dtype, o = g.info(n.outputs[0]).dtype;
        if ((a != DType::F32 && a != DType::BF16) || (o != DType::F32 && o != DType::BF16))
          return unsupported(label(n) + ": casts between f32 and bf16 only");
        break;
      }
      case OpKind::RoPE: {
        if (in(1).dtype != DType::I64) return unsupported(label(n) + ": positions must be i64");
        // One cos/sin table per (positions, head dim, base), filled once per run().
        const int64_t t = in(0).shape[0], dh = in(0).shape[2];
        const float base = float(n.attrs.get_float("base", 10000.0));
        size_t ti = 0;
        while (ti < rope_tables_.size() &&
               !(rope_tables_[ti].pos == n.inputs[1] && rope_tables_[ti].dh == dh && rope_tables_[ti].base == base))
          ++ti;
        if (ti == rope_tables_.size())
          rope_tables_.push_back({n.inputs[1], t, dh, base, 0, false, std::vector<float>(size_t(t * dh)),
                                  std::vector<int64_t>(size_t(t))});
        rope_table_of_[size_t(id)] = int32_t(ti);
        break;
      }
      case OpKind::Concat:
      case OpKind::Slice:
        if (dtype_size(in(0).dtype) != 4 && dtype_size(in(0).dtype) != 8 && dtype_size(in(0).dtype) != 1 &&
            dtype_size(in(0).dtype) != 2)
          return unsupported(label(n) + ": element size");
        break;
      case OpKind::Scale:
      case OpKind::LayerNorm:
      case OpKind::RMSNorm:
      case OpKind::AdaRMSNorm:
      case OpKind::GeluTanh:
      case OpKind::GeGLU:
      case OpKind::SiLU:
      case OpKind::Softmax:
      case OpKind::TimeEmbedding:
      case OpKind::EulerStep:
        for (size_t i = 0; i < n.inputs.size(); ++i) VLAC_RETURN_IF_ERROR(need_f32(i));
        for (size_t i = 0; i < n.inputs.size(); ++i)
          if (is_weight(i) && weights.find(g.weights()[size_t(g.node(g.value(n.inputs[i]).producer).weight)].name)->dtype != DType::F32)
            return unsupported(label(n) + ": weight input " + std::to_string(i) + " must run in f32");
        break;
      case OpKind::MatMul:
      case OpKind::Transpose:
        return unsupported(label(n) + ": not implemented on the CPU backend");
    }
    if (n.op == OpKind::Linear || n.op == OpKind::Embedding) continue;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (is_weight(i) && n.op != OpKind::Reshape &&
          weights.find(g.weights()[size_t(g.node(g.value(n.inputs[i]).producer).weight)].name)->dtype != DType::F32)
        return unsupported(label(n) + ": weight input " + std::to_string(i) + " must run in f32");
  }
  scratch_floats_ = scratch;
  if (!options_.shared_memory) {
    scratch_.reset(new float[size_t(scratch)]);
    scratch_ptr_ = scratch_.get();
  }

  // Inputs: owned buffers, one block.
  std::vector<uint64_t> in_off;
  for (ValueId v : g.inputs()) {
    in_off.push_back(input_bytes_);
    input_bytes_ += align_up(g.info(v).bytes());
  }
  if (options_.shared_memory) input_bytes_ = 0;  // the caller binds every input
  inputs_.reset(new uint8_t[std::max<uint64_t>(input_bytes_, kAlign)]);
  std::memset(inputs_.get(), 0, std::max<uint64_t>(input_bytes_, kAlign));
  owned_input_ptr_.clear();
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    uint8_t* p = options_.shared_memory ? nullptr : inputs_.get() + in_off[i];
    owned_input_ptr_.push_back(p);
    ptr_[size_t(g.inputs()[i])] = p;
  }
  // Constants: their own storage (filled now).
  {
    size_t floats = 0;
    for (NodeId id : order_)
      if (g.node(id).op == OpKind::Constant) floats += size_t(align_up(g.info(g.node(id).outputs[0]).bytes()) / 4);
    const_storage_.assign(std::max<size_t>(floats, 1), 0.0f);
    size_t at = 0;
    for (NodeId id : order_) {
      const Node& n = g.node(id);
      if (n.op != OpKind::Constant) continue;
      const ValueInfo& o = g.info(n.outputs[0]);
      std::fill_n(const_storage_.data() + at, o.numel(), float(n.attrs.get_float("value")));
      ptr_[size_t(n.outputs[0])] = const_storage_.data() + at;
      at += size_t(align_up(o.bytes()) / 4);
    }
  }

  // Activations: one arena planned from liveness (exec/arena_plan, shared with other backends).
  exec::ArenaPlan arena = exec::plan_arena(g, order_, root_);
  arena_bytes_ = arena.bytes;
  arena_blocks_ = std::move(arena.blocks);
  if (!options_.shared_memory) {
    arena_.reset(new uint8_t[std::max<uint64_t>(arena_bytes_, kAlign)]);
    set_memory(arena_.get(), scratch_.get());
  }
  plan_memo();
  return Status::ok();
}

void Executor::plan_memo() {
  memo_ = {};
  memo_hits_ = 0;
  memo_next_ = 0;
  memo_storage_.reset();
  memo_valid_.clear();
  if (options_.memo_slots > 0) memo_ = exec::plan_memo(graph_, order_, root_, options_.memo_inputs);
  if (!memo_.enabled()) {
    memo_ = {};
    memo_.node.assign(graph_.nodes().size(), 0);
    memo_.results.assign(graph_.nodes().size(), {});
    return;
  }
  memo_storage_.reset(new uint8_t[size_t(memo_.slot_bytes) * size_t(options_.memo_slots)]);
  memo_valid_.assign(size_t(options_.memo_slots), 0);
}

void Executor::set_memory(uint8_t* arena, float* scratch) {
  for (const auto& [v, off] : arena_blocks_) ptr_[size_t(v)] = arena + off;
  scratch_ptr_ = scratch;
}

int Executor::input_index(std::string_view name) const {
  for (size_t i = 0; i < graph_.inputs().size(); ++i)
    if (graph_.node(graph_.value(graph_.inputs()[i]).producer).name == name) return int(i);
  return -1;
}

void* Executor::input_data(int i) { return owned_input_ptr_[size_t(i)]; }

void Executor::bind_input(int i, const void* external) {
  ptr_[size_t(graph_.inputs()[size_t(i)])] = external ? const_cast<void*>(external) : owned_input_ptr_[size_t(i)];
}

const void* Executor::data(ValueId v) const { return ptr(v); }

namespace {

// VLAC_PROFILE_OPS=1: wall time per op kind over the whole process, printed to stderr at exit
// (a developer's view of where CPU time goes; off by default, one getenv per process).
struct OpProfile {
  std::atomic<int64_t> ns[256] = {};
  std::atomic<int64_t> calls[256] = {};
  bool by_shape = false;  // VLAC_PROFILE_OPS=2: Linear, Attention, PatchEmbed also by shape (and oneDNN impl)
  std::mutex mu;
  std::map<std::string, std::pair<int64_t, int64_t>> shapes;  // shape_key -> (ns, calls)
  void add_shape(const std::string& key, int64_t elapsed_ns) {
    if (key.empty()) return;
    std::lock_guard<std::mutex> lock(mu);
    auto& v = shapes[key];
    v.first += elapsed_ns;
    v.second += 1;
  }
  ~OpProfile() {
    int64_t total = 0;
    for (const auto& v : ns) total += v.load();
    if (total == 0) return;
    std::fprintf(stderr, "vlac op profile (VLAC_PROFILE_OPS): %.1f ms in executor nodes\n", double(total) / 1e6);
    for (int i = 0; i < 256; ++i)
      if (ns[i].load() > 0)
        std::fprintf(stderr, "  %-16s %10.1f ms %5.1f%% %8lld calls\n", ir::op_name(OpKind(i)), double(ns[i].load()) / 1e6,
                     100.0 * double(ns[i].load()) / double(total), (long long)calls[i].load());
    for (const auto& [key, v] : shapes)
      std::fprintf(stderr, "    %-52s %10.1f ms %8lld calls %8.1f GFLOP/s\n", key.c_str(), double(v.first) / 1e6,
                   (long long)v.second, flops_of(key) * double(v.second) / double(v.first));
  }
  // 2·M·K·N from a key "MxKxN ..." (GFLOP per ns = FLOP per ns / 1e9 · 1e9).
  static double flops_of(const std::string& key) {
    long long m = 0, k = 0, n = 0;
    long long s = 0, d = 0;
    if (std::sscanf(key.c_str(), "linear %lldx%lldx%lld", &m, &k, &n) == 3) return 2.0 * double(m) * double(k) * double(n);
    // attention T·H query rows × S keys × Dh: QKᵀ and PV
    if (std::sscanf(key.c_str(), "attention %lldx%lldx%lldx%lld", &m, &n, &s, &d) == 4) return 4.0 * double(m * n) * double(s * d);
    if (std::sscanf(key.c_str(), "patch_embed %lldx%lldx%lld", &m, &k, &n) == 3) return 2.0 * double(m) * double(k) * double(n);
    return 0.0;
  }
};

OpProfile* op_profile() {
  static OpProfile* p = [] {
    const char* e = std::getenv("VLAC_PROFILE_OPS");
    static OpProfile prof;
    prof.by_shape = e && std::atoi(e) >= 2;
    return e && *e && *e != '0' ? &prof : nullptr;
  }();
  return p;
}

}  // namespace

// VLAC_PROFILE_OPS=2's key of a node: op and shape for Linear, Attention and PatchEmbed, else "".
std::string Executor::shape_key(ir::NodeId id) const {
  const Node& n = graph_.node(id);
  const auto& in = [&](size_t i) -> const ValueInfo& { return graph_.info(n.inputs[i]); };
  switch (n.op) {
    case OpKind::Linear:
      return "linear " + std::to_string(in(0).numel() / last_dim(in(0))) + "x" + std::to_string(in(1).shape[1]) + "x" +
             std::to_string(in(1).shape[0]) + " " + dtype_name(weight_dtype_[size_t(root_[size_t(n.inputs[1])])]) + " " +
             linear_[size_t(id)]->impl();
    case OpKind::Attention:
      return "attention " + std::to_string(in(0).shape[0]) + "x" + std::to_string(in(0).shape[1]) + "x" +
             std::to_string(in(1).shape[0]) + "x" + std::to_string(in(0).shape[2]) + " kv" + std::to_string(in(1).shape[1]) +
             (attention_[size_t(id)] ? " dnnl-bf16" : " f32");
    case OpKind::PatchEmbed:
      return "patch_embed " + std::to_string(graph_.info(n.outputs[0]).numel() / last_dim(graph_.info(n.outputs[0]))) + "x" +
             std::to_string(in(1).numel() / in(1).shape[0]) + "x" + std::to_string(in(1).shape[0]);
    default:
      return "";
  }
}

int Executor::memo_lookup(bool* hit) {
  *hit = false;
  if (!memo_.enabled()) return -1;
  const size_t slots = memo_valid_.size();
  auto key_matches = [&](const uint8_t* slot) {
    uint64_t at = 0;
    for (int i : memo_.key_inputs) {
      const ValueId v = graph_.inputs()[size_t(i)];
      const uint64_t b = graph_.info(v).bytes();
      if (std::memcmp(slot + at, ptr(v), b) != 0) return false;
      at += b;
    }
    return true;
  };
  for (size_t s = 0; s < slots; ++s)
    if (memo_valid_[s] && key_matches(memo_storage_.get() + s * memo_.slot_bytes)) {
      *hit = true;
      ++memo_hits_;
      return int(s);
    }
  // A new value: this run fills the next slot (valid once the run completes).
  const size_t s = memo_next_;
  memo_next_ = (memo_next_ + 1) % slots;
  memo_valid_[s] = 0;
  uint8_t* slot = memo_storage_.get() + s * memo_.slot_bytes;
  uint64_t at = 0;
  for (int i : memo_.key_inputs) {
    const ValueId v = graph_.inputs()[size_t(i)];
    const uint64_t b = graph_.info(v).bytes();
    std::memcpy(slot + at, ptr(v), b);
    at += b;
  }
  return int(s);
}

Status Executor::run_or_reuse(NodeId id, int slot, bool hit) {
  if (slot < 0 || !memo_.node[size_t(id)]) return run_node(id);
  uint8_t* base = memo_storage_.get() + size_t(slot) * memo_.slot_bytes;
  if (hit) {
    for (const auto& [v, off] : memo_.results[size_t(id)]) std::memcpy(ptr(v), base + off, graph_.info(v).bytes());
    return Status::ok();
  }
  VLAC_RETURN_IF_ERROR(run_node(id));
  for (const auto& [v, off] : memo_.results[size_t(id)]) std::memcpy(base + off, ptr(v), graph_.info(v).bytes());
  return Status::ok();
}

Status Executor::run() {
  ++run_generation_;  // inputs may have changed: RoPE tables are recomputed once
  set_num_threads(options_.threads);  // OpenMP's count is per calling thread: the caller may differ
  bool hit = false;
  const int slot = memo_lookup(&hit);
  VLAC_RETURN_IF_ERROR(run_nodes(slot, hit));
  if (slot >= 0 && !hit) memo_valid_[size_t(slot)] = 1;
  return Status::ok();
}

Status Executor::run_nodes(int slot, bool hit) {
  if (OpProfile* prof = op_profile()) {
    for (NodeId id : order_) {
      const auto t0 = std::chrono::steady_clock::now();
      VLAC_RETURN_IF_ERROR(run_or_reuse(id, slot, hit));
      const auto dt = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
      const size_t op = size_t(graph_.node(id).op);
      prof->ns[op] += dt.count();
      prof->calls[op] += 1;
      if (prof->by_shape) prof->add_shape(shape_key(id), dt.count());
    }
    return Status::ok();
  }
  for (NodeId id : order_) VLAC_RETURN_IF_ERROR(run_or_reuse(id, slot, hit));
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Dispatch

Status Executor::run_node(NodeId id) {
  const ir::Graph& g = graph_;
  const Node& n = g.node(id);
  auto info = [&](ValueId v) -> const ValueInfo& { return g.info(v); };
  auto f = [&](size_t i) { return static_cast<float*>(ptr(n.inputs[i])); };
  float* out = n.outputs.empty() ? nullptr : static_cast<float*>(ptr(n.outputs[0]));
  const ValueInfo& x = info(n.inputs.empty() ? n.outputs[0] : n.inputs[0]);
  switch (n.op) {
    case OpKind::Input:
    case OpKind::Weight:
    case OpKind::Constant:
    case OpKind::Reshape:
      return Status::ok();
    case OpKind::Linear: {
      const float* b = n.inputs.size() == 3 ? f(2) : nullptr;
      if (options_.linear_observer && x.dtype == DType::F32) {
        const ir::Node& wn = graph_.node(graph_.value(n.inputs[1]).producer);
        const int64_t k = last_dim(x);
        if (wn.op == OpKind::Weight && k > 0)
          options_.linear_observer(graph_.weights()[size_t(wn.weight)].name, f(0), x.numel() / k, k);
      }
      return linear_[size_t(id)]->run(f(0), ptr(n.inputs[1]), b, out, scratch_ptr_);
    }
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul: {
      const int64_t na = info(n.inputs[0]).numel(), nb = info(n.inputs[1]).numel();
      const int64_t no = info(n.outputs[0]).numel();
      const BinaryOp op = n.op == OpKind::Add ? BinaryOp::Add : n.op == OpKind::Sub ? BinaryOp::Sub : BinaryOp::Mul;
      binary_op(op, f(0), na, f(1), nb, out, no);
      return Status::ok();
    }
    case OpKind::Scale: {
      scale(f(0), float(n.attrs.get_float("scale", 1.0)), out, x.numel());
      return Status::ok();
    }
    case OpKind::LayerNorm: {
      const int64_t d = last_dim(x);
      layer_norm(f(0), f(1), f(2), out, x.numel() / d, d, float(n.attrs.get_float("eps", 1e-6)));
      return Status::ok();
    }
    case OpKind::RMSNorm: {
      const int64_t d = last_dim(x);
      rms_norm(f(0), f(1), out, x.numel() / d, d, float(n.attrs.get_float("eps", 1e-6)));
      return Status::ok();
    }
    case OpKind::AdaRMSNorm: {
      const int64_t d = last_dim(x);
      ada_rms_norm(f(0), f(1), out, static_cast<float*>(ptr(n.outputs[1])), x.numel() / d, d,
                   float(n.attrs.get_float("eps", 1e-6)));
      return Status::ok();
    }
    case OpKind::GeluTanh:
      gelu_tanh(f(0), out, x.numel());
      return Status::ok();
    case OpKind::SiLU:
      silu(f(0), out, x.numel());
      return Status::ok();
    case OpKind::GeGLU:
      geglu(f(0), f(1), out, x.numel());
      return Status::ok();
    case OpKind::RoPE: {
      RopeTable& tab = rope_tables_[size_t(rope_table_of_[size_t(id)])];
      if (tab.generation != run_generation_) {  // first RoPE of this run at these positions
        // The positions rarely change between runs (every denoise step has the same): the cos/sin
        // table is refilled only when they do.
        const auto* pos = static_cast<const int64_t*>(ptr(n.inputs[1]));
        if (!tab.filled || std::memcmp(tab.pos_copy.data(), pos, size_t(tab.t) * sizeof(int64_t)) != 0) {
          rope_table(pos, tab.t, tab.dh, tab.base, tab.cs.data());
          std::memcpy(tab.pos_copy.data(), pos, size_t(tab.t) * sizeof(int64_t));
          tab.filled = true;
        }
        tab.generation = run_generation_;
      }
      rope_apply(f(0), out, tab.cs.data(), x.shape[0], x.shape[1], x.shape[2]);
      return Status::ok();
    }
    case OpKind::Softmax: {
      std::memcpy(out, f(0), size_t(x.bytes()));
      const int64_t d = last_dim(x);
      softmax(out, x.numel() / d, d);
      return Status::ok();
    }
    case OpKind::Attention: {
      const auto& q = x.shape;
      const auto& k = info(n.inputs[1]).shape;
      const auto& v = info(n.inputs[2]).shape;
      AttentionMask mask;
      if (n.inputs.size() == 4) {
        if (info(n.inputs[3]).dtype == DType::F32) mask.add = f(3);
        else mask.allow = static_cast<const uint8_t*>(ptr(n.inputs[3]));
      }
      const double def_scale = 1.0 / std::sqrt(double(q[2]));
      if (const int64_t blk = n.attrs.get_int("kv_block", 0); blk > 0) {
        // Block-diagonal (images batched along T): each block attends to itself alone.
        const float* qf = f(0);
        const float* kf = f(1);
        const float* vf = f(2);
        for (int64_t t0 = 0; t0 < q[0]; t0 += blk)
          attention(qf + t0 * q[1] * q[2], kf + t0 * k[1] * k[2], vf + t0 * v[1] * v[2], mask, out + t0 * q[1] * v[2], blk,
                    q[1], k[1], blk, q[2], v[2], float(n.attrs.get_float("scale", def_scale)), scratch_ptr_,
                    scratch_floats_);
        return Status::ok();
      }
      if (attention_[size_t(id)])
        return attention_[size_t(id)]->run(f(0), f(1), f(2), mask.allow, mask.add, out,
                                           float(n.attrs.get_float("scale", def_scale)), scratch_ptr_);
      attention(f(0), f(1), f(2), mask, out, q[0], q[1], k[1], k[0], q[2], v[2],
                float(n.attrs.get_float("scale", def_scale)), scratch_ptr_, scratch_floats_);
      return Status::ok();
    }
    case OpKind::PatchEmbed: {
      const auto& w = info(n.inputs[1]).shape;
      const size_t r = x.shape.size();
      const int64_t c = x.shape[r - 3], y = x.shape[r - 2], xx = x.shape[r - 1];
      const int64_t images = r == 4 ? x.shape[0] : 1;
      const int64_t cols = patch_embed_scratch_floats(c, y, xx, w[2], w[3]);
      const int64_t rows = (y / w[2]) * (xx / w[3]);
      for (int64_t i = 0; i < images; ++i) {
        im2col_patches(f(0) + i * c * y * xx, scratch_ptr_, c, y, xx, w[2], w[3]);
        VLAC_RETURN_IF_ERROR(linear_[size_t(id)]->run(scratch_ptr_, f(1), n.inputs.size() == 3 ? f(2) : nullptr,
                                                      out + i * rows * w[0],
                                                      scratch_ptr_ + align_up(uint64_t(cols) * 4) / 4));
      }
      return Status::ok();
    }
    case OpKind::Embedding: {
      const ValueInfo& ids = info(n.inputs[1]);
      const bool rounds = weight_rounds_bf16_[size_t(root_[size_t(n.inputs[0])])];
      const DType tdt = weight_dtype_[size_t(root_[size_t(n.inputs[0])])];
      const bool quant = is_quant_dtype(tdt);
      const bool bf16 = rounds || tdt == DType::BF16 || quant;  // (an 8-bit table stands in for a bf16 one)
      float mul = float(n.attrs.get_float("scale", 1.0));
      if (bf16 && n.attrs.get_int("round_scale_to_table", 0)) mul = bf16_to_f32(f32_to_bf16(mul));
      const int64_t* tok = static_cast<const int64_t*>(ptr(n.inputs[1]));
      if (quant && info(n.outputs[0]).dtype == DType::F32)
        return embedding_quant(static_cast<const uint8_t*>(ptr(n.inputs[0])), tdt, x.shape[0], x.shape[1], tok,
                               ids.shape[0], mul, out);
      if (info(n.outputs[0]).dtype == DType::BF16) {
        // Rows in the table's dtype (a bf16 checkpoint): the product rounds to bf16, as in torch.
        // Computed into the f32 scratch of the row count first, then narrowed in place.
        uint16_t* o16 = reinterpret_cast<uint16_t*>(out);
        const int64_t d = x.shape[1];
        for (int64_t t0 = 0; t0 < ids.shape[0]; ++t0) {
          Status st = quant ? embedding_quant(static_cast<const uint8_t*>(ptr(n.inputs[0])), tdt, x.shape[0], d, tok + t0,
                                              1, mul, scratch_ptr_)
                      : bf16 ? embedding_bf16(static_cast<const uint16_t*>(ptr(n.inputs[0])), x.shape[0], d, tok + t0, 1,
                                            mul, scratch_ptr_)
                           : embedding_f32(f(0), x.shape[0], d, tok + t0, 1, mul, scratch_ptr_);
          if (!st.is_ok()) return st;
          for (int64_t j = 0; j < d; ++j) o16[t0 * d + j] = f32_to_bf16(scratch_ptr_[size_t(j)]);
        }
        return Status::ok();
      }
      if (rounds) {  // an F32 table run as BF16: round each gathered element as a converted table would
        const int64_t d = x.shape[1];
        VLAC_RETURN_IF_ERROR(embedding_f32(f(0), x.shape[0], d, tok, ids.shape[0], 1.0f, out));
        for (int64_t i = 0; i < ids.shape[0] * d; ++i) out[i] = bf16_to_f32(f32_to_bf16(out[i])) * mul;
        return Status::ok();
      }
      if (bf16)
        return embedding_bf16(static_cast<const uint16_t*>(ptr(n.inputs[0])), x.shape[0], x.shape[1], tok,
                              ids.shape[0], mul, out);
      return embedding_f32(f(0), x.shape[0], x.shape[1], tok, ids.shape[0], mul, out);
    }
    case OpKind::Cast: {
      const DType a = x.dtype, o = info(n.outputs[0]).dtype;
      const int64_t cnt = x.numel();
      if (a == o) {
        std::memcpy(out, ptr(n.inputs[0]), size_t(x.bytes()));
      } else if (a == DType::BF16) {
        const uint16_t* s16 = static_cast<const uint16_t*>(ptr(n.inputs[0]));
        for (int64_t i = 0; i < cnt; ++i) out[i] = bf16_to_f32(s16[i]);
      } else {
        uint16_t* o16 = reinterpret_cast<uint16_t*>(out);
        const float* s32 = f(0);
        for (int64_t i = 0; i < cnt; ++i) o16[i] = f32_to_bf16(s32[i]);
      }
      return Status::ok();
    }
    case OpKind::Concat: {
      const ValueInfo& o = info(n.outputs[0]);
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += int64_t(o.shape.size());
      int64_t outer = 1;
      for (int64_t d = 0; d < axis; ++d) outer *= o.shape[size_t(d)];
      const uint64_t es = dtype_size(o.dtype);
      const uint64_t out_row = uint64_t(o.numel() / std::max<int64_t>(outer, 1)) * es;
      uint8_t* dst = reinterpret_cast<uint8_t*>(out);
      uint64_t col = 0;
      for (ValueId in : n.inputs) {
        const uint64_t row = uint64_t(info(in).numel() / std::max<int64_t>(outer, 1)) * es;
        const uint8_t* src = static_cast<const uint8_t*>(ptr(in));
        if (outer == 1) parallel_copy(dst + col, src, row);  // pi0.5's [prefix | suffix] keys and values
        else
          for (int64_t r = 0; r < outer; ++r) std::memcpy(dst + uint64_t(r) * out_row + col, src + uint64_t(r) * row, row);
        col += row;
      }
      return Status::ok();
    }
    case OpKind::Slice: {
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += int64_t(x.shape.size());
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < axis; ++d) outer *= x.shape[size_t(d)];
      for (size_t d = size_t(axis) + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
      const int64_t dim = x.shape[size_t(axis)];
      const int64_t start = n.attrs.get_int("start", 0), end = n.attrs.get_int("end", dim);
      const uint64_t es = dtype_size(x.dtype);
      const uint8_t* src = static_cast<const uint8_t*>(ptr(n.inputs[0]));
      uint8_t* dst = reinterpret_cast<uint8_t*>(out);
      const uint64_t len = uint64_t((end - start) * inner) * es;
      for (int64_t r = 0; r < outer; ++r)
        std::memcpy(dst + uint64_t(r) * len, src + (uint64_t(r * dim + start) * uint64_t(inner)) * es, len);
      return Status::ok();
    }
    case OpKind::TimeEmbedding: {
      const ValueInfo& o = info(n.outputs[0]);
      time_embedding(double(f(0)[0]), out, o.shape[0], n.attrs.get_float("min_period", 4e-3),
                     n.attrs.get_float("max_period", 4.0));
      return Status::ok();
    }
    case OpKind::EulerStep:
      std::memcpy(out, f(0), size_t(x.bytes()));
      euler_step(out, f(1), float(n.attrs.get_float("dt", 0.0)), x.numel());
      return Status::ok();
    case OpKind::MatMul:
    case OpKind::Transpose:
      break;
  }
  return internal_error(std::string("cpu executor: op ") + ir::op_name(n.op) + " not planned");
}

}  // namespace vlac::cpu
