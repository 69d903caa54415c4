// cuDNN's SDPA forward through the graph (backend) API, loaded with dlopen (cudnn_attention.h).
#include "backends/cuda/cudnn_attention.h"

#include <array>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/context.h"
#include "backends/cuda/env.h"
#include "mem/host_steps.h"

#if defined(VLAC_HAVE_CUDNN)
#include <dlfcn.h>

#include <cudnn_graph.h>
#endif

namespace vlac::cuda {

int cudnn_attention_setting(bool lean) {
  // On by default (H200, session 27: recorded chunk 18.52 / 18.54 -> 17.92 / 17.88 ms, alternated),
  // but not for lean calls: an int8 package measured 3.543 GiB with it on an H100 (3.485 before).
  const int64_t v = env_count("VLAC_CUDNN_ATTN", lean ? 0 : 1);
  return v <= 2 ? int(v) : (lean ? 0 : 1);
}

#if !defined(VLAC_HAVE_CUDNN)

Status cudnn_attention(cudaStream_t, const CudnnAttentionShape&, const void*, const void*, const void*, void*,
                       float) {
  return unsupported("cudnn attention: built without cuDNN's headers (cudnn_graph.h)");
}
std::string cudnn_attention_library() { return "built without cuDNN's headers (cudnn_graph.h)"; }

#else

namespace {

// The entry points used, resolved from libcudnn.so.9 (which loads its sub-libraries itself).
struct Lib {
  size_t (*version)() = nullptr;
  const char* (*error_string)(cudnnStatus_t) = nullptr;
  void (*last_error)(char*, size_t) = nullptr;
  cudnnStatus_t (*create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t) = nullptr;
  cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*) = nullptr;
  cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*set_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                            int64_t, const void*) = nullptr;
  cudnnStatus_t (*get_attr)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                            int64_t, int64_t*, void*) = nullptr;
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) = nullptr;
  cudnnHandle_t handle = nullptr;
  std::string why;  // empty: loaded; else why not
  std::string name;
};

template <typename F>
bool sym(void* h, const char* n, F* f) {
  *f = reinterpret_cast<F>(dlsym(h, n));
  return *f != nullptr;
}

Lib& lib() {
  static Lib l = [] {
    Lib x;
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcudnn.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      x.why = "libcudnn.so.9 not found";
      return x;
    }
    const bool ok = sym(h, "cudnnGetVersion", &x.version) && sym(h, "cudnnGetErrorString", &x.error_string) &&
                    sym(h, "cudnnGetLastErrorString", &x.last_error) && sym(h, "cudnnCreate", &x.create) &&
                    sym(h, "cudnnSetStream", &x.set_stream) &&
                    sym(h, "cudnnBackendCreateDescriptor", &x.create_desc) &&
                    sym(h, "cudnnBackendDestroyDescriptor", &x.destroy_desc) &&
                    sym(h, "cudnnBackendSetAttribute", &x.set_attr) &&
                    sym(h, "cudnnBackendGetAttribute", &x.get_attr) && sym(h, "cudnnBackendFinalize", &x.finalize) &&
                    sym(h, "cudnnBackendExecute", &x.execute);
    if (!ok) {
      x.why = "libcudnn.so.9 lacks the graph API's entry points";
      return x;
    }
    const size_t v = x.version();
    x.name = "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    if (v < 91300) {  // the SDPA forward operation came in 9.13
      x.why = x.name + " has no SDPA operation (needs 9.13 or later)";
      return x;
    }
    const cudnnStatus_t st = x.create(&x.handle);
    if (st != CUDNN_STATUS_SUCCESS) x.why = x.name + ": cudnnCreate: " + x.error_string(st);
    return x;
  }();
  return l;
}

// A backend descriptor destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t t) {
    if (lib().create_desc(t, &d_) != CUDNN_STATUS_SUCCESS) d_ = nullptr;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  ~Desc() {
    if (d_) lib().destroy_desc(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* addr() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A failed call as one line: what, cuDNN's status and its last error message.
std::string failure(const char* what, cudnnStatus_t st) {
  char msg[512] = {0};
  lib().last_error(msg, sizeof(msg));
  return std::string(what) + ": " + lib().error_string(st) + (msg[0] ? std::string(" (") + msg + ")" : std::string());
}

#define VLAC_DNN(call, what)                                                      \
  do {                                                                            \
    const cudnnStatus_t st_ = (call);                                             \
    if (st_ != CUDNN_STATUS_SUCCESS) return unsupported(failure((what), st_));    \
  } while (0)

Status set(const Desc& d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t count, const void* v,
           const char* what) {
  VLAC_DNN(lib().set_attr(d.get(), n, t, count, v), what);
  return Status::ok();
}

enum Uid : int64_t { kQ = 1, kK = 2, kV = 3, kO = 4, kScale = 5 };

// A [b, heads, rows, d] tensor over the row layout: element (i, j, r, e) at i·rows·stride + j·d + r·stride + e.
Status tensor(Desc* out, int64_t uid, int64_t b, int64_t heads, int64_t rows, int64_t d, int64_t stride) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  if (!t.get()) return unsupported("cudnn attention: no tensor descriptor");
  const cudnnDataType_t dt = CUDNN_DATA_BFLOAT16;
  const std::array<int64_t, 4> dims = {b, heads, rows, d}, strides = {rows * stride, d, stride, 1};
  const int64_t align = 16;
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor dtype"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment"));
  VLAC_DNN(lib().finalize(t.get()), "tensor finalize");
  *out = std::move(t);
  return Status::ok();
}

// The scale, a float passed by value at each execution.
Status scale_tensor(Desc* out) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  if (!t.get()) return unsupported("cudnn attention: no tensor descriptor");
  const cudnnDataType_t dt = CUDNN_DATA_FLOAT;
  const std::array<int64_t, 4> one = {1, 1, 1, 1};
  const int64_t uid = kScale, align = 4;
  const bool by_value = true;
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "scale dtype"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, one.data(), "scale dims"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, one.data(), "scale strides"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "scale uid"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "scale alignment"));
  VLAC_RETURN_IF_ERROR(set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "scale by value"));
  VLAC_DNN(lib().finalize(t.get()), "scale finalize");
  *out = std::move(t);
  return Status::ok();
}

struct Plan {
  Desc plan;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  Status status = Status::ok();  // not ok: no engine took the shape (asked once)
};

// Builds the execution plan of one shape: the SDPA operation, its graph, the heuristic's engine
// configurations in order (mode A, then the fallback list), the first that finalizes.
Status build(const CudnnAttentionShape& s, Plan* p) {
  Desc q, k, v, o, sc;
  VLAC_RETURN_IF_ERROR(tensor(&q, kQ, s.b, s.h, s.sq, s.d, s.q_stride));
  VLAC_RETURN_IF_ERROR(tensor(&k, kK, s.b, s.hk, s.skv, s.d, s.k_stride));
  VLAC_RETURN_IF_ERROR(tensor(&v, kV, s.b, s.hk, s.skv, s.d, s.v_stride));
  VLAC_RETURN_IF_ERROR(tensor(&o, kO, s.b, s.h, s.sq, s.d, s.o_stride));
  VLAC_RETURN_IF_ERROR(scale_tensor(&sc));
  Desc op(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
  if (!op.get()) return unsupported("cudnn attention: no SDPA operation descriptor");
  const std::array<std::pair<cudnnBackendAttributeName_t, const Desc*>, 5> io = {
      {{CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, &q},
       {CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, &k},
       {CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, &v},
       {CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, &o},
       {CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, &sc}}};
  for (const auto& [name, d] : io) {
    const cudnnBackendDescriptor_t x = d->get();
    VLAC_RETURN_IF_ERROR(set(op, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "SDPA operand"));
  }
  VLAC_DNN(lib().finalize(op.get()), "SDPA operation finalize");
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const cudnnBackendDescriptor_t opd = op.get();
  VLAC_RETURN_IF_ERROR(set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &lib().handle, "graph handle"));
  VLAC_RETURN_IF_ERROR(set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opd, "graph ops"));
  VLAC_DNN(lib().finalize(graph.get()), "operation graph finalize");
  std::string last = "no engine configuration";
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendDescriptor_t gd = graph.get();
    VLAC_RETURN_IF_ERROR(set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd,
                             "heuristic graph"));
    VLAC_RETURN_IF_ERROR(set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristic mode"));
    if (lib().finalize(heur.get()) != CUDNN_STATUS_SUCCESS) continue;
    constexpr int kMaxConfigs = 8;
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < kMaxConfigs; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    if (lib().get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &got,
                       raw.data()) != CUDNN_STATUS_SUCCESS)
      continue;
    for (int64_t i = 0; i < got && i < kMaxConfigs; ++i) {
      Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      const cudnnBackendDescriptor_t cd = raw[size_t(i)];
      if (lib().set_attr(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &lib().handle) !=
              CUDNN_STATUS_SUCCESS ||
          lib().set_attr(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd) !=
              CUDNN_STATUS_SUCCESS)
        continue;
      const cudnnStatus_t st = lib().finalize(plan.get());
      if (st != CUDNN_STATUS_SUCCESS) {
        last = failure("execution plan finalize", st);
        continue;
      }
      int64_t ws = 0, n = 0;
      if (lib().get_attr(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws) !=
          CUDNN_STATUS_SUCCESS)
        ws = 0;
      if (ws > 0) {  // kept for the process, as the plan
        VLAC_ASSIGN_OR_RETURN(p->workspace, device_alloc(uint64_t(ws), "cudnn attention workspace"));
      }
      p->workspace_bytes = ws;
      p->plan = std::move(plan);
      return Status::ok();
    }
  }
  return unsupported("cudnn attention: no engine takes the shape (" + last + ")");
}

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

std::string shape_name(const CudnnAttentionShape& s) {
  return std::to_string(s.b) + " x " + std::to_string(s.sq) + " tokens x " + std::to_string(s.h) + "/" +
         std::to_string(s.hk) + " heads vs " + std::to_string(s.skv) + " keys, head dim " + std::to_string(s.d);
}

}  // namespace

std::string cudnn_attention_library() {
  const Lib& l = lib();
  return l.why.empty() ? l.name : l.why;
}

Status cudnn_attention(cudaStream_t stream, const CudnnAttentionShape& s, const void* q, const void* k, const void* v,
                       void* out, float scale) {
  Lib& l = lib();
  if (!l.why.empty()) return unsupported("cudnn attention: " + l.why);
  static std::mutex mu;
  static std::map<Key, Plan> plans;
  const std::lock_guard<std::mutex> lock(mu);
  const Key key{s.b, s.h, s.hk, s.sq, s.skv, s.d, s.q_stride, s.k_stride, s.v_stride, s.o_stride};
  auto it = plans.find(key);
  if (it == plans.end()) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      return unsupported("cudnn attention: no plan for " + shape_name(s) + " before the capture");
    }
    Plan p;
    const HostStep step("cudnn_plan");
    p.status = build(s, &p);
    // A declined shape is said once (it runs the own kernel); a planned one where the switch is set.
    if (!p.status.is_ok())
      std::fprintf(stderr, "vlac attention: cuDNN declines %s, the own kernel runs: %s\n", shape_name(s).c_str(),
                   p.status.message().c_str());
    else if (!env_str("VLAC_CUDNN_ATTN").empty())
      std::fprintf(stderr, "vlac attention: cuDNN SDPA for %s: planned, workspace %lld bytes\n",
                   shape_name(s).c_str(), static_cast<long long>(p.workspace_bytes));
    it = plans.emplace(key, std::move(p)).first;
  }
  Plan& p = it->second;
  if (!p.status.is_ok()) return p.status;
  VLAC_DNN(l.set_stream(l.handle, stream), "cudnnSetStream");
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const std::array<int64_t, 5> uids = {kQ, kK, kV, kO, kScale};
  std::array<void*, 5> ptrs = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, &scale};
  VLAC_RETURN_IF_ERROR(set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 5, uids.data(), "variant uids"));
  VLAC_RETURN_IF_ERROR(
      set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 5, ptrs.data(), "variant pointers"));
  VLAC_RETURN_IF_ERROR(
      set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &p.workspace, "variant workspace"));
  VLAC_DNN(l.finalize(pack.get()), "variant pack finalize");
  const cudnnStatus_t st = l.execute(l.handle, p.plan.get(), pack.get());
  if (st != CUDNN_STATUS_SUCCESS) return Status(StatusCode::Backend, failure("cudnn attention: execute", st));
  return Status::ok();
}

#endif  // VLAC_HAVE_CUDNN

}  // namespace vlac::cuda
