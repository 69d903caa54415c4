// CUDA compile side (see compiler.h). Host code only: no CUDA runtime call, so it runs on a
// GPU-less workstation. Memory: one conversion buffer, whatever the weights.
#include "backends/cuda/compiler.h"

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels.h"
#include "core/atomic_file.h"
#include "core/quant.h"
#include "exec/arena_plan.h"
#include "ir/fuse.h"
#include "ir/quant_write.h"

namespace vlac::cuda {

using nlohmann::json;

const char* weight_use_name(WeightUse use) {
  switch (use) {
    case WeightUse::Gemm: return "gemm";
    case WeightUse::ConvGemm: return "conv_gemm";
    case WeightUse::Bias: return "bias";
    case WeightUse::Norm: return "norm";
    case WeightUse::Table: return "table";
    case WeightUse::Other: return "other";
  }
  return "?";
}

DType stored_dtype(WeightUse use, DType requested) { return use == WeightUse::Norm ? DType::F32 : requested; }

std::vector<std::pair<std::string, WeightUse>> weight_uses(const Subgraph& sub) {
  const ir::Graph& g = *sub.graph;
  std::vector<std::pair<std::string, WeightUse>> out;
  std::map<std::string, size_t> seen;
  for (ir::NodeId n : sub.nodes) {
    const ir::Node& nd = g.node(n);
    for (size_t slot = 0; slot < nd.inputs.size(); ++slot) {
      const ir::Node& p = g.node(g.value(nd.inputs[slot]).producer);
      if (p.op != ir::OpKind::Weight) continue;
      WeightUse use = WeightUse::Other;
      switch (nd.op) {
        case ir::OpKind::Linear: use = slot == 1 ? WeightUse::Gemm : slot == 2 ? WeightUse::Bias : use; break;
        case ir::OpKind::PatchEmbed: use = slot == 1 ? WeightUse::ConvGemm : slot == 2 ? WeightUse::Bias : use; break;
        case ir::OpKind::LayerNorm:
        case ir::OpKind::RMSNorm: use = slot >= 1 ? WeightUse::Norm : use; break;
        case ir::OpKind::Embedding: use = slot == 0 ? WeightUse::Table : use; break;
        default: break;
      }
      const std::string& name = g.weights()[size_t(p.weight)].name;
      if (seen.emplace(name, out.size()).second) out.emplace_back(name, use);
    }
  }
  return out;
}

bool supports_op(ir::OpKind op) {
  switch (op) {
    case ir::OpKind::MatMul:
    case ir::OpKind::Transpose:
    case ir::OpKind::Softmax:
    case ir::OpKind::Sub:
      return false;
    default:
      return true;
  }
}

namespace {

// Writes back and drops the file's page cache behind us, so dirty pages stay bounded (a memory
// cgroup counts them).
void flush_behind(int fd, uint64_t begin, uint64_t end) {
  if (end <= begin) return;
  ::sync_file_range(fd, off_t(begin), off_t(end - begin),
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
  ::posix_fadvise(fd, off_t(begin), off_t(end - begin), POSIX_FADV_DONTNEED);
}

bool readable(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// n elements of `st` at src -> `dt` at dst (F32/BF16 out; F16 -> BF16 through the exact F32 value).
void convert(const uint8_t* src, DType st, uint8_t* dst, DType dt, uint64_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  for (uint64_t k = 0; k < n; ++k) {
    float v;
    if (st == DType::F32) {
      std::memcpy(&v, src + 4 * k, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * k, 2);
      v = st == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    if (dt == DType::F32) {
      std::memcpy(dst + 4 * k, &v, 4);
    } else {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(dst + 2 * k, &h, 2);
    }
  }
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The parts of a stored weight checked against it: same dtype and trailing dims, bytes summing up.
Status check_parts(const ir::WeightRef& r) {
  uint64_t bytes = 0;
  int64_t rows = 0;
  for (const ir::WeightRef& p : r.parts) {
    std::vector<int64_t> a(p.shape.begin() + (p.shape.empty() ? 0 : 1), p.shape.end());
    std::vector<int64_t> b(r.shape.begin() + (r.shape.empty() ? 0 : 1), r.shape.end());
    if (!p.parts.empty() || p.dtype != r.dtype || p.shape.empty() || a != b)
      return internal_error("cuda compile: part '" + p.name + "' " + shape_text(p.shape) + " does not fit fused weight '" +
                            r.name + "' " + shape_text(r.shape));
    bytes += p.bytes;
    rows += p.shape[0];
  }
  if (bytes != r.bytes || r.shape.empty() || rows != r.shape[0])
    return internal_error("cuda compile: the parts of fused weight '" + r.name + "' hold " + std::to_string(bytes) +
                          " bytes, the weight " + std::to_string(r.bytes));
  return Status::ok();
}

struct Estimate {
  EngineEstimate e;
  uint64_t arena_bytes = 0, input_bytes = 0, gemm_workspace_bytes = 0, attention_scratch_bytes = 0;
};

Result<Estimate> estimate(const Subgraph& sub, uint64_t chunk_bytes) {
  if (!sub.graph) return invalid_argument("cuda compile: a subgraph without a graph");
  const ir::Graph& g = *sub.graph;
  Estimate est;
  std::map<std::string, WeightUse> uses;
  for (auto& [n, u] : weight_uses(sub)) uses.emplace(n, u);
  bool any_gemm = false;
  for (ir::NodeId n : sub.nodes) {
    const ir::Node& nd = g.node(n);
    if (nd.op == ir::OpKind::Weight) {
      const ir::WeightRef& r = g.weights()[size_t(nd.weight)];
      auto it = uses.find(r.name);
      const DType dt = stored_dtype(it == uses.end() ? WeightUse::Other : it->second, r.dtype);
      est.e.weights_bytes += exec::align_up(stored_weight_bytes(dt, r.shape), kEngineAlign);
    }
    if (nd.op == ir::OpKind::Linear || nd.op == ir::OpKind::PatchEmbed) any_gemm = true;
    if (nd.op == ir::OpKind::Attention) {
      const ir::ValueInfo& q = g.info(nd.inputs[0]);
      const ir::ValueInfo& k = g.info(nd.inputs[1]);
      const ir::ValueInfo& v = g.info(nd.inputs[2]);
      if (q.shape.size() == 3 && k.shape.size() == 3 && v.shape.size() == 3) {
        AttentionShape a;
        a.t = q.shape[0], a.h = q.shape[1], a.dh = q.shape[2];
        a.s = k.shape[0], a.hk = k.shape[1], a.dv = v.shape[2];
        const int splits = attention_splits(a, DType::BF16, kEstimateMaxSms);
        est.attention_scratch_bytes = std::max(est.attention_scratch_bytes, attention_scratch_bytes(a, DType::BF16, splits));
      }
    }
  }
  for (ir::ValueId v : sub.inputs) est.input_bytes += exec::align_up(g.info(v).bytes());
  const std::vector<ir::ValueId> roots = exec::storage_roots(g, sub.nodes);
  est.arena_bytes = exec::plan_arena(g, sub.nodes, roots).bytes;
  est.gemm_workspace_bytes = any_gemm ? GemmRunner::kDefaultWorkspaceBytes : 0;
  est.e.scratch_bytes = est.arena_bytes + est.gemm_workspace_bytes + exec::align_up(est.attention_scratch_bytes);
  est.e.compile_peak_bytes = chunk_bytes;
  return est;
}

constexpr uint64_t kChunkBytes = 4ull << 20;

class CudaCompiler final : public BackendCompiler {
 public:
  std::string_view name() const override { return "cuda"; }
  // SigLIP over all cameras at once: 768 GEMM rows fill the H200 where 256 leave it mostly idle
  // (vision 7.0 -> 3.0 ms for 3 cameras).
  bool prefers_batched_images() const override { return true; }

  Result<std::optional<LoweredGraph>> lower(const ir::Graph& g) const override {
    VLAC_ASSIGN_OR_RETURN(LoweredGraph lg, ir::fuse_linears(g));
    return std::optional<LoweredGraph>(std::move(lg));
  }

  bool supports(const ir::Graph& g, ir::NodeId node) const override {
    const ir::Node& nd = g.node(node);
    if (!supports_op(nd.op)) return false;
    for (ir::ValueId v : nd.outputs) {
      const DType t = g.info(v).dtype;
      if (t != DType::F32 && t != DType::BF16 && t != DType::I64 && !(nd.op == ir::OpKind::Weight && t == DType::F16))
        return false;
    }
    return true;
  }

  Result<EngineEstimate> estimate_bytes(const Subgraph& sub) const override {
    VLAC_ASSIGN_OR_RETURN(Estimate e, estimate(sub, kChunkBytes));
    return e.e;
  }

  Result<EngineBlob> compile(const Subgraph& sub, const std::vector<StoredWeight>& store, WeightSource& weights,
                             const CompileOptions& options) override {
    if (options.engine_dir.empty() || options.engine_name.empty())
      return invalid_argument("cuda backend: compile needs an engine folder and an engine name");
    if (!sub.graph) return invalid_argument("cuda backend: compile needs the engine's subgraph");
    std::map<std::string, WeightUse> uses;
    for (auto& [n, u] : weight_uses(sub)) uses.emplace(n, u);
    std::vector<DType> dtypes;
    std::vector<WeightUse> store_uses;
    for (const StoredWeight& w : store) {
      auto it = uses.find(w.ref.name);
      store_uses.push_back(it == uses.end() ? WeightUse::Other : it->second);
      dtypes.push_back(stored_dtype(store_uses.back(), w.run_dtype));
    }
    VLAC_ASSIGN_OR_RETURN(Estimate est, estimate(sub, kChunkBytes));
    const std::string path = options.engine_dir + "/" + options.engine_name + ".engine";
    VLAC_ASSIGN_OR_RETURN(CudaEngineFile ef, write_cuda_engine_file(path, store, dtypes, weights, kChunkBytes, options.calibration));

    json ws = json::array();
    for (size_t i = 0; i < store.size(); ++i) {
      const ir::WeightRef& r = store[i].ref;
      json w = json::object({{"name", r.name}, {"use", weight_use_name(store_uses[i])}});
      if (store_uses[i] == WeightUse::Gemm || store_uses[i] == WeightUse::ConvGemm) {
        int64_t k = 1;
        for (size_t d = 1; d < r.shape.size(); ++d) k *= r.shape[d];
        w["gemm_shape"] = std::vector<int64_t>{r.shape.empty() ? 0 : r.shape[0], k};
      }
      if (!r.parts.empty()) {
        json parts = json::array();
        int64_t row = 0;
        for (const ir::WeightRef& p : r.parts) {
          parts.push_back(json::object({{"name", p.name}, {"rows", std::vector<int64_t>{row, row + p.shape[0]}}}));
          row += p.shape[0];
        }
        w["parts"] = std::move(parts);
      }
      ws.push_back(std::move(w));
    }
    json info = json::object({
        {"layout", kEngineLayout},
        {"align", kEngineAlign},
        {"gemm_operand", "row-major [N, K] (the B operand of cuBLASLt's TN GEMM: y = x W^T)"},
        {"weights", std::move(ws)},
        {"estimate", json::object({{"weights_bytes", ef.bytes},
                                   {"arena_bytes", est.arena_bytes},
                                   {"input_bytes", est.input_bytes},
                                   {"gemm_workspace_bytes", est.gemm_workspace_bytes},
                                   {"attention_scratch_bytes", est.attention_scratch_bytes},
                                   {"attention_max_sms", kEstimateMaxSms},
                                   {"compile_peak_bytes", est.e.compile_peak_bytes}})},
        {"chosen_at_load", std::vector<std::string>{"cublaslt_algorithm", "gemm_workspace", "attention_key_splits"}},
    });
    EngineBlob blob;
    blob.backend = "cuda";
    blob.path = ef.path;
    blob.bytes = ef.bytes;
    blob.weights = std::move(ef.weights);
    blob.estimate = est.e;
    blob.estimate.weights_bytes = ef.bytes;
    blob.backend_info = info.dump();
    return blob;
  }

  void release_memory() override { ::malloc_trim(0); }
};

}  // namespace

Result<CudaEngineFile> write_cuda_engine_file(const std::string& path, const std::vector<StoredWeight>& store,
                                              const std::vector<DType>& dtypes, WeightSource& source,
                                              uint64_t chunk_bytes, const ir::QuantCalibration* calibration) {
  if (dtypes.size() != store.size()) return internal_error("cuda compile: one dtype per stored weight");
  chunk_bytes = std::max<uint64_t>(chunk_bytes / 4 * 4, 4096);
  // Every source is checked before the file is created, so bad input leaves nothing behind.
  for (size_t i = 0; i < store.size(); ++i) {
    const ir::WeightRef& r = store[i].ref;
    if (dtypes[i] != DType::F32 && dtypes[i] != DType::BF16 && !is_quant_matrix(dtypes[i], r.shape))
      return internal_error("cuda compile: weight '" + r.name + "' must be stored F32, BF16 or (a matrix) I8 / F8_E4M3");
    if (!r.parts.empty()) VLAC_RETURN_IF_ERROR(check_parts(r));
    if (!readable(r.dtype))
      return unsupported("tensor '" + (r.parts.empty() ? r.name : r.parts[0].name) + "' has dtype " +
                         dtype_name(r.dtype) + " (the CUDA backend reads F32, BF16, F16)");
    if (ir::ValueInfo{r.dtype, r.shape}.bytes() != r.bytes)
      return internal_error("cuda compile: weight '" + r.name + "' has " + std::to_string(r.bytes) + " bytes, its shape " +
                            shape_text(r.shape) + " needs another count");
  }
  VLAC_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(path));
  std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[chunk_bytes]);
  if (!buf) return Status(StatusCode::ResourceExhausted, "cuda compile: no memory for a conversion buffer");
  static const uint8_t kZeros[kEngineAlign] = {};
  CudaEngineFile ef;
  ef.path = path;
  uint64_t end = 0, flushed = 0;
  for (size_t i = 0; i < store.size(); ++i) {
    const ir::WeightRef& r = store[i].ref;
    const DType want = dtypes[i];
    const uint64_t pad = (kEngineAlign - end % kEngineAlign) % kEngineAlign;
    if (pad) VLAC_RETURN_IF_ERROR(out.pwrite(kZeros, pad, end));
    end += pad;
    if (is_quant_matrix(want, r.shape)) {  // codes + per-row scales, the parts' rows in order
      VLAC_ASSIGN_OR_RETURN(uint64_t bytes,
                            ir::write_quant_matrix(out, source, r, want, end, buf.get(), chunk_bytes, [&](uint64_t at) {
                              if (at - flushed >= (32ull << 20)) {
                                flush_behind(out.fd(), flushed, at / 4096 * 4096);
                                flushed = at / 4096 * 4096;
                              }
                            }, calibration));
      ef.weights.push_back(BlobWeight{r.name, want, r.shape, end, bytes});
      end += bytes;
      continue;
    }
    const uint64_t in_size = dtype_size(r.dtype), out_size = dtype_size(want);
    BlobWeight w{r.name, want, r.shape, end, r.bytes / in_size * out_size};
    const std::vector<ir::WeightRef> single = r.parts.empty() ? std::vector<ir::WeightRef>{r} : std::vector<ir::WeightRef>{};
    const std::vector<ir::WeightRef>& pieces = r.parts.empty() ? single : r.parts;
    uint64_t at = end;  // where the next piece's rows go
    for (const ir::WeightRef& p : pieces) {
      VLAC_ASSIGN_OR_RETURN(const uint8_t* base, source.map(p));
      const uint64_t n = p.bytes / in_size;
      const uint64_t per = chunk_bytes / std::max(in_size, out_size);
      for (uint64_t k0 = 0; k0 < n; k0 += per) {
        const uint64_t k1 = std::min(n, k0 + per);
        convert(base + k0 * in_size, r.dtype, buf.get(), want, k1 - k0);
        VLAC_RETURN_IF_ERROR(out.pwrite(buf.get(), (k1 - k0) * out_size, at + k0 * out_size));
        source.release_range(p, k0 * in_size, (k1 - k0) * in_size);  // never read again (memory rule 1)
        const uint64_t written = at + k1 * out_size;
        if (written - flushed >= (32ull << 20)) {
          flush_behind(out.fd(), flushed, written / 4096 * 4096);
          flushed = written / 4096 * 4096;
        }
      }
      source.release(p);
      at += n * out_size;
    }
    if (at - end != w.bytes) return internal_error("cuda compile: weight '" + r.name + "' wrote a wrong byte count");
    end = at;
    ef.weights.push_back(std::move(w));
  }
  flush_behind(out.fd(), flushed, end);
  VLAC_RETURN_IF_ERROR(out.commit());
  ef.bytes = end;
  buf.reset();
  ::malloc_trim(0);
  return ef;
}

std::unique_ptr<BackendCompiler> make_cuda_compiler() { return std::make_unique<CudaCompiler>(); }

}  // namespace vlac::cuda
