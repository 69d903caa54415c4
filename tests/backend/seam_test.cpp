// The backend seam end to end with a backend that exists only in this test: a tiny reference
// interpreter ("ref": Linear, Add, Mul, SiLU in fp32) registered at run time, compiled into a
// package and run through the same public functions the CPU backend goes through
// (compile_graph -> GraphPackage), with the neutral arena planner. Also the registry itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backends/registry.h"
#include "compile/graph_compile.h"
#include "core/atomic_file.h"
#include "exec/arena_plan.h"
#include "ir/backend.h"
#include "ir/walk.h"
#include "runtime/graph_package.h"
#include "runtime/package_engines.h"

namespace vlac {
namespace {

using ir::OpKind;
using ir::ValueId;

// ---------------------------------------------------------------------------------------------
// The reference backend

bool ref_supports(OpKind op) {
  switch (op) {
    case OpKind::Input:
    case OpKind::Weight:
    case OpKind::Reshape:
    case OpKind::Linear:
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::SiLU:
      return true;
    default:
      return false;
  }
}

class RefWeights final : public BoundWeights {
 public:
  std::map<std::string, const float*> by_name;
  uint64_t owned_bytes() const override { return 0; }
  uint64_t mapped_bytes() const override { return mapped; }
  uint64_t mapped = 0;
};

class RefExecutable final : public Executable {
 public:
  static Result<std::unique_ptr<Executable>> create(ir::Graph g, const RefWeights& w, const ExecOptions& o) {
    auto ex = std::unique_ptr<RefExecutable>(new RefExecutable);
    ex->g_ = std::move(g);
    ex->shared_ = o.shared_memory;
    VLAC_ASSIGN_OR_RETURN(ex->order_, ir::schedule(ex->g_));
    ex->root_ = exec::storage_roots(ex->g_, ex->order_);
    ex->arena_ = exec::plan_arena(ex->g_, ex->order_, ex->root_);
    ex->ptr_.assign(ex->g_.values().size(), nullptr);
    for (ir::NodeId id : ex->order_) {
      const ir::Node& n = ex->g_.node(id);
      if (!ref_supports(n.op)) return unsupported(std::string("ref backend: op ") + ir::op_name(n.op));
      if (n.op == OpKind::Weight) {
        const std::string& name = ex->g_.weights()[size_t(n.weight)].name;
        auto it = w.by_name.find(name);
        if (it == w.by_name.end()) return internal_error("ref backend: weight '" + name + "' not bound");
        ex->ptr_[size_t(n.outputs[0])] = const_cast<float*>(it->second);
      }
    }
    for (ValueId v : ex->g_.inputs()) {
      ex->owned_inputs_.emplace_back(size_t(ex->g_.info(v).numel()), 0.0f);
      ex->ptr_[size_t(v)] = ex->shared_ ? nullptr : ex->owned_inputs_.back().data();
    }
    if (!ex->shared_) {
      ex->own_arena_.assign(size_t(ex->arena_.bytes / 4 + 16), 0.0f);
      ex->bind_memory(ex->own_arena_.data(), nullptr);
    }
    return std::unique_ptr<Executable>(std::move(ex));
  }
  const ir::Graph& graph() const override { return g_; }
  MemoryPlan memory() const override {
    MemoryPlan m;
    m.arena_bytes = arena_.bytes;
    return m;
  }
  void bind_memory(void* arena, void*) override {
    for (const auto& [v, off] : arena_.blocks) ptr_[size_t(v)] = static_cast<uint8_t*>(arena) + off;
  }
  int input_index(std::string_view name) const override {
    for (size_t i = 0; i < g_.inputs().size(); ++i)
      if (g_.node(g_.value(g_.inputs()[i]).producer).name == name) return int(i);
    return -1;
  }
  void* input_data(int i) override { return shared_ ? nullptr : owned_inputs_[size_t(i)].data(); }
  void bind_input(int i, const void* p) override {
    ptr_[size_t(g_.inputs()[size_t(i)])] = p ? const_cast<void*>(p) : input_data(i);
  }
  const void* data(ValueId v) const override { return at(v); }
  Status run() override {
    ++runs;
    for (ir::NodeId id : order_) {
      const ir::Node& n = g_.node(id);
      const ir::ValueInfo& o = g_.info(n.outputs[0]);
      float* out = at(n.outputs[0]);
      auto in = [&](size_t i) { return static_cast<const float*>(at(n.inputs[i])); };
      switch (n.op) {
        case OpKind::Linear: {  // x [M, K] · w[N, K]ᵀ (+ b[N])
          const auto& ws = g_.info(n.inputs[1]).shape;
          const int64_t N = ws[0], K = ws[1], M = g_.info(n.inputs[0]).numel() / K;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = 0; j < N; ++j) {
              double s = n.inputs.size() == 3 ? in(2)[j] : 0.0;
              for (int64_t k = 0; k < K; ++k) s += double(in(0)[m * K + k]) * double(in(1)[j * K + k]);
              out[m * N + j] = float(s);
            }
          break;
        }
        case OpKind::Add:
        case OpKind::Mul: {  // b broadcasts over a's trailing dims
          const int64_t na = g_.info(n.inputs[0]).numel(), nb = g_.info(n.inputs[1]).numel();
          for (int64_t i = 0; i < o.numel(); ++i) {
            const float a = in(0)[i % na], b = in(1)[i % nb];
            out[i] = n.op == OpKind::Add ? a + b : a * b;
          }
          break;
        }
        case OpKind::SiLU:
          for (int64_t i = 0; i < o.numel(); ++i) out[i] = in(0)[i] / (1.0f + std::exp(-in(0)[i]));
          break;
        default:
          break;  // Input, Weight, Reshape: nothing to compute
      }
    }
    return Status::ok();
  }
  uint64_t memo_hits() const override { return 0; }
  size_t memo_nodes() const override { return 0; }
  int runs = 0;

 private:
  RefExecutable() = default;
  float* at(ValueId v) const { return static_cast<float*>(ptr_[size_t(root_[size_t(v)])]); }
  ir::Graph g_;
  bool shared_ = false;
  std::vector<ir::NodeId> order_;
  std::vector<ValueId> root_;
  exec::ArenaPlan arena_;
  std::vector<void*> ptr_;
  std::vector<std::vector<float>> owned_inputs_;
  std::vector<float> own_arena_;
};

class RefRuntime final : public BackendRuntime {
 public:
  std::string_view name() const override { return "ref"; }
  Result<std::unique_ptr<BoundWeights>> bind_weights(const WeightBinding& b) override {
    auto w = std::make_unique<RefWeights>();
    FileWeightSource src(b.files);
    for (size_t i = 0; i < b.refs.size(); ++i) {
      if (b.refs[i].dtype != DType::F32 || b.run_dtypes[i] != DType::F32)
        return unsupported("ref backend: weight '" + b.refs[i].name + "' is not f32");
      VLAC_ASSIGN_OR_RETURN(const uint8_t* p, src.map(b.refs[i]));
      w->by_name[b.refs[i].name] = reinterpret_cast<const float*>(p);
      w->mapped += b.refs[i].bytes;
    }
    return std::unique_ptr<BoundWeights>(std::move(w));
  }
  Result<std::unique_ptr<Executable>> plan(ir::Graph program, const BoundWeights& weights,
                                           const ExecOptions& o) override {
    ++plans;
    return RefExecutable::create(std::move(program), dynamic_cast<const RefWeights&>(weights), o);
  }
  int plans = 0;
};

class RefCompiler final : public BackendCompiler {
 public:
  std::string_view name() const override { return "ref"; }
  bool supports(const ir::Graph& g, ir::NodeId node) const override { return ref_supports(g.node(node).op); }
  Result<EngineEstimate> estimate_bytes(const Subgraph& sub) const override {
    EngineEstimate e;
    for (ir::NodeId n : sub.nodes)
      if (sub.graph->node(n).op == OpKind::Weight) e.weights_bytes += sub.graph->weights()[size_t(sub.graph->node(n).weight)].bytes;
    return e;
  }
  // The engine file: the stored weights back to back, 64-byte aligned, f32 as referenced.
  Result<EngineBlob> compile(const Subgraph&, const std::vector<StoredWeight>& store, WeightSource& src,
                             const CompileOptions& o) override {
    EngineBlob blob;
    blob.backend = "ref";
    blob.path = o.engine_dir + "/" + o.engine_name + ".engine";
    VLAC_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(blob.path));
    uint64_t end = 0;
    for (const StoredWeight& s : store) {
      if (s.ref.dtype != DType::F32 || s.run_dtype != DType::F32)
        return unsupported("ref backend: weight '" + s.ref.name + "' is not f32");
      VLAC_ASSIGN_OR_RETURN(const uint8_t* p, src.map(s.ref));
      end = (end + 63) / 64 * 64;
      VLAC_RETURN_IF_ERROR(f.pwrite(p, s.ref.bytes, end));
      src.release(s.ref);
      blob.weights.push_back({s.ref.name, DType::F32, s.ref.shape, end, s.ref.bytes});
      end += s.ref.bytes;
    }
    VLAC_RETURN_IF_ERROR(f.commit());
    blob.bytes = end;
    ++compiles;
    return blob;
  }
  int compiles = 0;
};

class RefBackend final : public Backend {
 public:
  std::string_view name() const override { return "ref"; }
  DeviceInfo device() const override {
    DeviceInfo d;
    d.backend = "ref";
    d.description = "reference interpreter (tests)";
    return d;
  }
  BackendCompiler* compiler() override { return &compiler_; }
  BackendRuntime& runtime() override { return runtime_; }
  RefCompiler compiler_;
  RefRuntime runtime_;
};

RefBackend* ref_backend() {
  static RefBackend* b = [] {
    auto owned = std::make_unique<RefBackend>();
    RefBackend* raw = owned.get();
    EXPECT_TRUE(backend_registry().add(std::move(owned)).is_ok());
    return raw;
  }();
  return b;
}

// ---------------------------------------------------------------------------------------------
// A small graph, its weights in one in-memory "file", and a double-precision reference

struct SmallModel {
  static constexpr int64_t M = 3, K = 32, N = 32, O = 8;
  ir::Graph g;
  ValueId out = ir::kNone;
  std::vector<uint8_t> file;
  std::vector<float> w1, b1, w2, c;

  SmallModel() {
    auto fill = [](std::vector<float>& v, size_t n, float scale, int seed) {
      v.resize(n);
      for (size_t i = 0; i < n; ++i) v[i] = scale * float(std::sin(double(i) * 0.37 + seed));
    };
    fill(w1, N * K, 0.2f, 1);
    fill(b1, N, 0.1f, 2);
    fill(w2, O * N, 0.3f, 3);
    fill(c, O, 0.5f, 4);
    auto put = [&](const std::string& name, const std::vector<float>& v, std::vector<int64_t> shape) {
      const uint64_t off = (file.size() + 63) / 64 * 64;
      file.resize(off + v.size() * 4);
      std::memcpy(file.data() + off, v.data(), v.size() * 4);
      return g.weight({name, 0, off, DType::F32, std::move(shape), v.size() * 4, {}});
    };
    const ValueId x = g.add_input("x", {DType::F32, {M, K}});
    const ValueId W1 = put("l1.weight", w1, {N, K});
    const ValueId B1 = put("l1.bias", b1, {N});
    const ValueId W2 = put("l2.weight", w2, {O, N});
    const ValueId C = put("shift", c, {O});
    const ValueId h = g.add(OpKind::SiLU, {g.add(OpKind::Linear, {x, W1, B1}).value()}).value();
    out = g.add(OpKind::Add, {g.add(OpKind::Linear, {h, W2}).value(), C}).value();
    g.mark_output(out);
  }
  std::vector<float> input() const {
    std::vector<float> x(size_t(M * K));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::cos(double(i) * 0.11));
    return x;
  }
  std::vector<double> reference(const std::vector<float>& x) const {
    std::vector<double> y(size_t(M * O));
    for (int64_t m = 0; m < M; ++m) {
      std::vector<double> h(static_cast<size_t>(N));
      for (int64_t j = 0; j < N; ++j) {
        double s = b1[size_t(j)];
        for (int64_t k = 0; k < K; ++k) s += double(x[size_t(m * K + k)]) * w1[size_t(j * K + k)];
        h[size_t(j)] = s / (1.0 + std::exp(-s));
      }
      for (int64_t o = 0; o < O; ++o) {
        double s = c[size_t(o)];
        for (int64_t j = 0; j < N; ++j) s += h[size_t(j)] * w2[size_t(o * N + j)];
        y[size_t(m * O + o)] = s;
      }
    }
    return y;
  }
};

// One folder per test process, removed at exit.
std::string temp_dir() {
  static const std::string d = [] {
    std::string p = ::testing::TempDir() + "vlac_seam_" + std::to_string(::getpid());
    std::filesystem::create_directories(p);
    std::atexit([] { std::filesystem::remove_all(::testing::TempDir() + "vlac_seam_" + std::to_string(::getpid())); });
    return p;
  }();
  return d;
}

// Compiles the model with `backend` under `cap`, runs the package, returns the output.
std::vector<float> compile_and_run(const SmallModel& sm, const std::string& backend, uint64_t cap, const std::string& out,
                                   size_t* n_engines) {
  GraphCompileOptions co;
  co.out = out;
  co.backend = backend;
  co.engine_cap = cap;
  co.files = {{sm.file.data(), sm.file.size(), "small.bin", nullptr}};
  auto cs = compile_graph(sm.g, {{"y", sm.out}}, co);
  EXPECT_TRUE(cs.is_ok()) << cs.status().message();
  if (!cs.is_ok()) return {};
  *n_engines = cs->engines.size();
  auto pkg = GraphPackage::open(out);
  EXPECT_TRUE(pkg.is_ok()) << pkg.status().message();
  if (!pkg.is_ok()) return {};
  for (const PackageEngine& e : pkg->package().manifest().engines) EXPECT_EQ(e.backend, backend);
  const std::vector<float> x = sm.input();
  std::map<std::string, PackageValue> values;
  values["x"] = PackageValue{x.data(), ir::ValueInfo{DType::F32, {SmallModel::M, SmallModel::K}}};
  Status st = pkg->run(&values);
  EXPECT_TRUE(st.is_ok()) << st.message();
  auto it = values.find("y");
  EXPECT_NE(it, values.end());
  if (it == values.end()) return {};
  EXPECT_EQ(it->second.info.shape, (std::vector<int64_t>{SmallModel::M, SmallModel::O}));
  const float* y = static_cast<const float*>(it->second.data);
  return std::vector<float>(y, y + SmallModel::M * SmallModel::O);
}

// ---------------------------------------------------------------------------------------------

TEST(BackendRegistry, BuiltInCpuReportsItsDevice) {
  Backend* cpu = backend_registry().find("cpu");
  ASSERT_NE(cpu, nullptr);
  const DeviceInfo d = cpu->device();
  EXPECT_EQ(d.backend, "cpu");
  EXPECT_EQ(d.memory, MemoryKind::Host);
  EXPECT_FALSE(d.isa.empty());
  EXPECT_NE(cpu->compiler(), nullptr);
  EXPECT_EQ(cpu->runtime().name(), "cpu");
  EXPECT_EQ(backend_registry().names().front(), "cpu");
}

// A backend without lanes (the CPU, this test's) runs everything in order: one lane, marks -1,
// waits on them no-ops, and asking for a second lane is one clear error naming the backend.
TEST(BackendRegistry, OneLaneBackendsRunInOrder) {
  BackendRuntime& rt = backend_registry().find("cpu")->runtime();
  EXPECT_EQ(rt.lanes(), 1);
  EXPECT_TRUE(rt.use_lane(0).is_ok());
  const Status st = rt.use_lane(1);
  EXPECT_EQ(st.code(), StatusCode::Unsupported);
  EXPECT_NE(st.message().find("cpu backend: one lane only"), std::string::npos) << st.message();
  auto m = rt.mark();
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(*m, -1);
  EXPECT_TRUE(rt.wait_mark(*m).is_ok());
  rt.clear_marks();
}

TEST(BackendRegistry, UnknownAndDuplicateNamesAreErrors) {
  auto missing = backend_registry().get("nosuch", "pkg.vlac: engine 'e0'");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("pkg.vlac: engine 'e0': backend 'nosuch' is not built into this vlac"),
            std::string::npos)
      << missing.status().message();
  EXPECT_NE(missing.status().message().find("cpu"), std::string::npos);
  ref_backend();
  EXPECT_FALSE(backend_registry().add(std::make_unique<RefBackend>()).is_ok());  // "ref" is taken
}

TEST(BackendSeam, TestBackendRunsCompilePackageRuntime) {
  RefBackend* ref = ref_backend();
  const SmallModel sm;
  const std::string dir = temp_dir();
  const int compiles0 = ref->compiler_.compiles, plans0 = ref->runtime_.plans;
  size_t engines = 0;
  // A 4 KiB cap splits the two layers into several engines: crossings go through the runtime.
  const std::vector<float> y = compile_and_run(sm, "ref", 4096, dir + "/ref.vlac", &engines);
  ASSERT_EQ(y.size(), size_t(SmallModel::M * SmallModel::O));
  EXPECT_GE(engines, 2u);
  EXPECT_EQ(ref->compiler_.compiles - compiles0, int(engines));
  EXPECT_EQ(ref->runtime_.plans - plans0, int(engines));
  const std::vector<double> want = sm.reference(sm.input());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-5) << i;

  // The same graph through the CPU backend, by the same functions: same numbers (fp32).
  size_t cpu_engines = 0;
  const std::vector<float> yc = compile_and_run(sm, "cpu", 4096, dir + "/cpu.vlac", &cpu_engines);
  ASSERT_EQ(yc.size(), y.size());
  EXPECT_EQ(cpu_engines, engines);  // the partition does not depend on the backend
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(yc[i], want[i], 1e-4) << i;
}

// Compile options for the small model on the "ref" backend, written to `path`.
GraphCompileOptions ref_compile_options(const SmallModel& sm, const std::string& path) {
  GraphCompileOptions co;
  co.out = path;
  co.backend = "ref";
  co.files = {{sm.file.data(), sm.file.size(), "small.bin", nullptr}};
  return co;
}

// A ref backend with two lanes that logs what the package runtime asks of them: the marks it
// records (lane, id), the lanes it switches to, and each engine's input waits (engine, input, mark).
struct LaneLog {
  std::vector<std::pair<int, int>> marks;            // (lane, id)
  std::vector<std::tuple<int, int, int>> waits;      // (executable, input, mark), mark >= 0 only
  std::vector<void*> arenas;                          // by executable: the arena it was bound to
};
class LaneExecutable final : public Executable {
 public:
  LaneExecutable(std::unique_ptr<Executable> in, LaneLog* log, int id) : in_(std::move(in)), log_(log), id_(id) {}
  const ir::Graph& graph() const override { return in_->graph(); }
  MemoryPlan memory() const override { return in_->memory(); }
  void bind_memory(void* arena, void* scratch) override {
    log_->arenas[size_t(id_)] = arena;
    in_->bind_memory(arena, scratch);
  }
  int input_index(std::string_view name) const override { return in_->input_index(name); }
  void* input_data(int i) override { return in_->input_data(i); }
  void bind_input(int i, const void* p) override { in_->bind_input(i, p); }
  const void* data(ValueId v) const override { return in_->data(v); }
  Status run() override { return in_->run(); }
  uint64_t memo_hits() const override { return 0; }
  size_t memo_nodes() const override { return 0; }
  void wait_input(int i, int mark) override {
    if (mark >= 0) log_->waits.emplace_back(id_, i, mark);
  }

 private:
  std::unique_ptr<Executable> in_;
  LaneLog* log_;
  int id_;
};
class LaneRefRuntime final : public BackendRuntime {
 public:
  std::string_view name() const override { return "lane-ref"; }
  Result<std::unique_ptr<BoundWeights>> bind_weights(const WeightBinding& b) override { return ref_.bind_weights(b); }
  Result<std::unique_ptr<Executable>> plan(ir::Graph program, const BoundWeights& weights,
                                           const ExecOptions& o) override {
    VLAC_ASSIGN_OR_RETURN(auto ex, ref_.plan(std::move(program), weights, o));
    log.arenas.push_back(nullptr);
    return std::unique_ptr<Executable>(std::make_unique<LaneExecutable>(std::move(ex), &log, int(log.arenas.size()) - 1));
  }
  int lanes() const override { return 2; }
  Status use_lane(int lane) override {
    lane_ = lane;
    return Status::ok();
  }
  Result<int> mark() override {
    log.marks.emplace_back(lane_, next_);
    return next_++;
  }
  void clear_marks() override { next_ = 0; }
  LaneLog log;

 private:
  RefRuntime ref_;
  int lane_ = 0, next_ = 0;
};
class LaneRefBackend final : public Backend {
 public:
  std::string_view name() const override { return "lane-ref"; }
  DeviceInfo device() const override { return DeviceInfo{}; }
  BackendCompiler* compiler() override { return nullptr; }
  BackendRuntime& runtime() override { return runtime_; }
  LaneRefRuntime runtime_;
};

// PackageEngines on a runtime with lanes: run_stage(mark_outputs) ends each engine with a mark that
// its outputs carry, each later engine is told to wait for its producer's mark at the input that
// crosses (and for nothing else), and the numbers are those of an unmarked run (the marked run
// also in a stage arena of its own: own_memory_stages).
TEST(BackendSeam, MarkedStageOutputsAreWaitedForAtTheirReaders) {
  ref_backend();
  const SmallModel sm;
  const std::string path = temp_dir() + "/lanes.vlac";
  GraphCompileOptions co = ref_compile_options(sm, path);
  co.engine_cap = 4096;  // several engines, values crossing between them
  auto cs = compile_graph(sm.g, {{"y", sm.out}}, co);
  ASSERT_TRUE(cs.is_ok()) << cs.status().message();
  const size_t n_engines = cs->engines.size();
  ASSERT_GE(n_engines, 2u);
  auto pkg = Package::open(path);
  ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
  BackendRegistry reg;
  auto owned = std::make_unique<LaneRefBackend>();
  LaneRefRuntime& rt = owned->runtime_;
  ASSERT_TRUE(reg.add(std::move(owned)).is_ok());
  const std::vector<float> x = sm.input();
  std::vector<float> y[2];
  for (int marked = 0; marked < 2; ++marked) {
    PackageRunOptions ro;
    ro.backend = "lane-ref";
    if (marked) ro.own_memory_stages = {"graph"};
    auto pe = PackageEngines::open(*pkg, ro, &reg);
    ASSERT_TRUE(pe.is_ok()) << pe.status().message();
    rt.log = LaneLog{};
    rt.clear_marks();
    std::map<std::string, PackageValue> values;
    values["x"] = PackageValue{x.data(), ir::ValueInfo{DType::F32, {SmallModel::M, SmallModel::K}}};
    ASSERT_EQ(pe->stages(), std::vector<std::string>{"graph"});
    const Status st = pe->run_stage("graph", &values, marked != 0);
    ASSERT_TRUE(st.is_ok()) << st.message();
    const PackageValue& out = values.at("y");
    const float* py = static_cast<const float*>(out.data);
    y[marked].assign(py, py + SmallModel::M * SmallModel::O);
    if (!marked) {
      EXPECT_TRUE(rt.log.marks.empty());
      EXPECT_TRUE(rt.log.waits.empty());
      EXPECT_EQ(out.mark, -1);
      continue;
    }
    // One mark an engine, on lane 0, in order; the last engine's outputs carry the last one.
    ASSERT_EQ(rt.log.marks.size(), n_engines);
    for (size_t e = 0; e < n_engines; ++e) EXPECT_EQ(rt.log.marks[e], std::make_pair(0, int(e)));
    EXPECT_EQ(out.mark, int(n_engines) - 1);
    // Every engine after the first reads something an earlier one made, and waits for that
    // engine's mark (an earlier one); the first reads only x, which carries none.
    std::vector<int> waits_of(n_engines, 0);
    for (const auto& [ex, input, m] : rt.log.waits) {
      ASSERT_LT(size_t(ex), n_engines);
      EXPECT_LT(m, ex) << "engine " << ex << " waits for a mark not yet recorded before it";
      EXPECT_GE(input, 0);
      ++waits_of[size_t(ex)];
    }
    EXPECT_EQ(waits_of[0], 0);
    for (size_t e = 1; e < n_engines; ++e) EXPECT_GE(waits_of[e], 1) << "engine " << e;
    // The stage's own arena is still one block for all its engines (they run in order).
    for (size_t e = 1; e < n_engines; ++e) EXPECT_EQ(rt.log.arenas[e], rt.log.arenas[0]);
  }
  EXPECT_EQ(y[0], y[1]);
}

TEST(BackendSeam, PackageNamingAnUnknownBackendIsRefusedWithItsName) {
  ref_backend();
  const SmallModel sm;
  const std::string path = temp_dir() + "/unknown.vlac";
  const GraphCompileOptions co = ref_compile_options(sm, path);
  ASSERT_TRUE(compile_graph(sm.g, {{"y", sm.out}}, co).is_ok());
  const BackendRegistry without_ref;  // a vlac built without the "ref" backend
  auto pkg = GraphPackage::open(path, {}, &without_ref);
  ASSERT_FALSE(pkg.is_ok());
  const std::string& msg = pkg.status().message();
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("backend 'ref' is not built into this vlac"), std::string::npos) << msg;

  auto bad = compile_graph(sm.g, {{"y", sm.out}}, [&] {
    GraphCompileOptions o = co;
    o.out = path + ".2";
    o.backend = "nosuch";
    return o;
  }());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("backend 'nosuch'"), std::string::npos);
}

TEST(BackendSeam, CompileRefusesANodeTheBackendDoesNotSupport) {
  ref_backend();
  SmallModel sm;
  const ValueId s = sm.g.add(OpKind::Softmax, {sm.out}).value();  // not in the ref backend
  GraphCompileOptions co;
  co.out = temp_dir() + "/softmax.vlac";
  co.backend = "ref";
  co.files = {{sm.file.data(), sm.file.size(), "small.bin", nullptr}};
  sm.g.mark_output(s);
  auto r2 = compile_graph(sm.g, {{"s", s}}, co);
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("backend 'ref' cannot run node"), std::string::npos) << r2.status().message();
  EXPECT_NE(r2.status().message().find("softmax"), std::string::npos) << r2.status().message();
}

}  // namespace
}  // namespace vlac
