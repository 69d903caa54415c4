// pi0.5 policy on a backend (the CPU by default): observation reading, weight binding per precision, prefix once,
// Euler loop over planned executors. The denoise loop allocates nothing unless recording.
#include "policy/pi05_policy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "backends/registry.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace vlac {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The shape without a leading batch dim of 1 when the tensor has one more dim than expected.
std::vector<int64_t> unbatched(const std::vector<int64_t>& s, size_t rank) {
  if (s.size() == rank + 1 && s[0] == 1) return {s.begin() + 1, s.end()};
  return s;
}

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Observation and noise

Result<Pi05Observation> read_pi05_observation(const std::string& path, const Pi05Model& model) {
  return read_pi05_observation(path, model.config(), model.dims().channels, nullptr, "", model.dims().vocab);
}

Result<std::vector<float>> read_pi05_noise(const std::string& path, const Pi05Model& model) {
  return read_pi05_noise(path, model.config().chunk_size, model.dims().max_action_dim);
}

Result<std::vector<float>> read_pi05_noise(const std::string& path, int64_t chunk_size, int64_t max_action_dim) {
  VLAC_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
  const TensorInfo* t = f.find("noise");
  if (!t) return not_found(path + ": missing key 'noise'");
  const std::vector<int64_t> want{chunk_size, max_action_dim};
  if (t->dtype != DType::F32 || unbatched(t->shape, 2) != want)
    return shape_mismatch(path + ": 'noise' is " + std::string(dtype_name(t->dtype)) + shape_str(t->shape) + ", expected F32 " +
                          shape_str(want) + " [chunk_size, max_action_dim]");
  std::vector<float> v(size_t(t->numel()));
  std::memcpy(v.data(), f.data(*t), t->nbytes());
  return v;
}

std::vector<float> pi05_gaussian_noise(uint64_t seed, int64_t n) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  std::vector<float> out(size_t(std::max<int64_t>(n, 0)));
  uint64_t state = seed;
  for (size_t i = 0; i < out.size(); i += 2) {
    const double u1 = double((splitmix64(&state) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = double(splitmix64(&state) >> 11) * 0x1.0p-53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = float(r * std::cos(kTwoPi * u2));
    if (i + 1 < out.size()) out[i + 1] = float(r * std::sin(kTwoPi * u2));
  }
  return out;
}

void Pi05Intermediates::add_f32(const std::string& name, std::vector<int64_t> shape, const float* data) {
  Tensor t;
  t.name = name;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t s : t.shape) n *= s;
  t.bytes.resize(size_t(n) * 4);
  std::memcpy(t.bytes.data(), data, t.bytes.size());
  for (auto& e : tensors)
    if (e.name == name) {
      e = std::move(t);
      return;
    }
  tensors.push_back(std::move(t));
}

Status Pi05Intermediates::write(const std::string& path) const {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  VLAC_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(path, specs, {{"producer", "vlac run"}}));
  for (const auto& t : tensors) VLAC_RETURN_IF_ERROR(w.write(t.bytes.data(), t.bytes.size()));
  return w.finish();
}

// ---------------------------------------------------------------------------------------------
// Policy

Result<Pi05Policy> Pi05Policy::load(const std::string& policy_dir, Pi05PolicyOptions options) {
  Pi05Policy p;
  p.options_ = options;
  VLAC_ASSIGN_OR_RETURN(p.backend_, backend_registry().get(options.backend, policy_dir));
  VLAC_ASSIGN_OR_RETURN(Pi05Model m, Pi05Model::load(policy_dir));
  p.model_ = std::make_unique<Pi05Model>(std::move(m));
  const Pi05Model& model = *p.model_;
  p.bf16_ = options.precision == Pi05Precision::Bf16 ||
            (options.precision == Pi05Precision::FromConfig && model.config().dtype == "bfloat16");
  // Every weight either graph reads, bound once by name.
  VLAC_ASSIGN_OR_RETURN(Pi05Graph pg, model.build_prefix(model.nominal_prefix()));
  VLAC_ASSIGN_OR_RETURN(Pi05Graph sg, model.build_step(1));
  std::vector<ir::WeightRef> refs = pg.graph.weights();
  refs.insert(refs.end(), sg.graph.weights().begin(), sg.graph.weights().end());
  WeightBinding wb;
  // The embedding table stays mapped (only looked-up rows are paged in); in bf16 mode its rows
  // are rounded on gather, the same bits as the converted table a package stores.
  for (const auto& r : refs) {
    wb.run_dtypes.push_back(Pi05Model::run_dtype(r, p.bf16_, options.vision == Pi05PolicyOptions::Vision::Bf16));
    wb.gather_only.push_back(Pi05Model::gather_only_weight(r.name));
  }
  wb.refs = std::move(refs);
  for (const auto& f : model.tensors().files())
    wb.files.push_back({f->map().data(), f->map().size(), f->path(), &f->map()});
  VLAC_ASSIGN_OR_RETURN(p.weights_, p.backend_->runtime().bind_weights(wb));
  return p;
}

uint64_t Pi05Policy::activation_bytes() const {
  uint64_t b = 0;
  for (const Executable* e : {prefix_.get(), step_.get()})
    if (e) {
      const MemoryPlan m = e->memory();
      b += m.arena_bytes + m.input_bytes + m.scratch_bytes + m.memo_bytes;
    }
  return b;
}

Status Pi05Policy::plan_for(const Pi05PrefixShape& shape) {
  if (planned_ && planned_->cameras == shape.cameras && planned_->n_text == shape.n_text) return Status::ok();
  const Pi05Model& m = *model_;
  BackendRuntime& rt = backend_->runtime();
  const bool debug = options_.record_intermediates;
  if (seq_) seq_->clear();  // recordings name the executables planned below
  step_.reset();
  prefix_.reset();
  planned_.reset();
  ExecOptions eo;
  eo.threads = options_.threads;
  eo.pack_weights = options_.pack_weights;
  eo.linear_observer = options_.linear_observer;
  eo.bf16_mqa_attention = bf16_;
  // The step's time MLP and adaRMS modulations depend on t alone, and t takes the same
  // num_steps values in every chunk: computed in the first chunk, reused after.
  eo.memo_inputs = {kPi05InTime, kPi05Cond};
  eo.memo_slots = int(m.euler().steps);
  VLAC_ASSIGN_OR_RETURN(Pi05Graph pg, m.build_prefix(shape, debug));
  prefix_outputs_ = pg.outputs;
  eo.label = "prefix";
  eo.fast_vision = options_.vision != Pi05PolicyOptions::Vision::Fp32 && bf16_;
  VLAC_ASSIGN_OR_RETURN(prefix_, rt.plan(std::move(pg.graph), *weights_, eo));
  eo.fast_vision = false;
  const int64_t P = int64_t(shape.cameras.size()) * m.image_tokens() + shape.n_text;
  VLAC_ASSIGN_OR_RETURN(Pi05Graph sg, m.build_step(P, debug));
  step_outputs_ = sg.outputs;
  step_velocity_ = sg.output("velocity");
  step_x_next_ = sg.output("x_next");
  eo.label = "step";
  // The prefix K/V cache stays the same over a chunk's steps (denoise says when it changed).
  for (int64_t l = 0; l < m.dims().lm_depth; ++l)
    for (const char* kv : {"prefix.k.", "prefix.v."}) eo.stable_inputs.push_back(kv + std::to_string(l));
  VLAC_ASSIGN_OR_RETURN(step_, rt.plan(std::move(sg.graph), *weights_, eo));
  step_x_ = step_->input_index(kPi05InX);
  step_t_ = step_->input_index(kPi05InTime);
  // Positions: prefix 0..P-1, suffix P..P+H-1 (compact prefix: every token valid).
  {
    std::vector<int64_t> pp(static_cast<size_t>(P)), sp(static_cast<size_t>(m.config().chunk_size));
    for (int64_t i = 0; i < P; ++i) pp[size_t(i)] = i;
    for (int64_t i = 0; i < m.config().chunk_size; ++i) sp[size_t(i)] = P + i;
    VLAC_RETURN_IF_ERROR(prefix_->write_input(prefix_->input_index(kPi05InPrefixPos), pp.data(), pp.size() * 8));
    VLAC_RETURN_IF_ERROR(step_->write_input(step_->input_index(kPi05InSuffixPos), sp.data(), sp.size() * 8));
    VLAC_RETURN_IF_ERROR(rt.synchronize());  // pp and sp leave scope
  }
  // The step reads the prefix K/V where the prefix executor left them (graph outputs).
  step_prefix_inputs_.clear();
  for (int64_t l = 0; l < m.dims().lm_depth; ++l)
    for (const char* kv : {"prefix.k.", "prefix.v."}) {
      const std::string name = kv + std::to_string(l);
      const int in = step_->input_index(name);
      ir::ValueId out = ir::kNone;
      for (const auto& [n, v] : prefix_outputs_)
        if (n == name) out = v;
      if (in < 0 || out == ir::kNone) return internal_error("pi0.5: graphs disagree on '" + name + "'");
      step_->bind_input(in, prefix_->data(out));
    }
  // Host staging for the inputs written per observation / per step.
  image_stage_.clear();
  image_inputs_.clear();
  const uint64_t image_bytes = uint64_t(m.dims().channels * m.dims().image_size * m.dims().image_size) * 4;
  for (const std::string& cam : shape.cameras) {
    image_inputs_.push_back(prefix_->input_index(pi05_image_input(cam)));
    VLAC_ASSIGN_OR_RETURN(auto b, rt.allocate(image_bytes, MemoryKind::Host, "staging of camera " + cam));
    image_stage_.push_back(std::move(b));
  }
  prefix_tokens_ = shape.n_text > 0 ? prefix_->input_index(kPi05InTokens) : -1;
  VLAC_ASSIGN_OR_RETURN(tokens_stage_, rt.allocate(uint64_t(std::max<int64_t>(shape.n_text, 1)) * 8, MemoryKind::Host,
                                                   "staging of the prompt tokens"));
  const Pi05EulerSpec e = m.euler();
  VLAC_ASSIGN_OR_RETURN(noise_stage_, rt.allocate(uint64_t(m.config().chunk_size * m.dims().max_action_dim) * 4,
                                                  MemoryKind::Host, "staging of the noise"));
  VLAC_ASSIGN_OR_RETURN(times_, rt.allocate(uint64_t(e.steps) * 4, MemoryKind::Host, "the Euler times"));
  for (int64_t k = 0; k < e.steps; ++k) static_cast<float*>(times_->data())[k] = e.time(k);
  planned_ = shape;
  return Status::ok();
}

Status Pi05Policy::stage_observation(const Pi05Observation& obs) {
  for (size_t c = 0; c < obs.cameras.size(); ++c) {
    float* dst = static_cast<float*>(image_stage_[c]->data());
    const std::vector<float>& src = obs.images[c];
    if (src.size() * 4 != image_stage_[c]->bytes()) return invalid_argument("pi0.5: image of the wrong size");
    for (size_t i = 0; i < src.size(); ++i) dst[i] = src[i] * 2.0f - 1.0f;  // SigLIP range [-1, 1]
  }
  staged_tokens_ = int64_t(obs.tokens.size());
  if (!obs.tokens.empty()) std::memcpy(tokens_stage_->data(), obs.tokens.data(), obs.tokens.size() * 8);
  return Status::ok();
}

Status Pi05Policy::enqueue_prefix() {
  for (size_t c = 0; c < image_inputs_.size(); ++c)
    VLAC_RETURN_IF_ERROR(prefix_->write_input(image_inputs_[c], image_stage_[c]->data(), image_stage_[c]->bytes()));
  if (prefix_tokens_ >= 0)
    VLAC_RETURN_IF_ERROR(prefix_->write_input(prefix_tokens_, tokens_stage_->data(), uint64_t(staged_tokens_) * 8));
  return prefix_->run();
}

Status Pi05Policy::download(void* dst, const void* src, uint64_t bytes) {
  BackendRuntime& rt = backend_->runtime();
  VLAC_RETURN_IF_ERROR(rt.copy(dst, src, bytes));
  return rt.synchronize();
}

Status Pi05Policy::dump_value(const Executable& e, const std::string& name, std::vector<int64_t> shape, ir::ValueId v) {
  std::vector<float> host(size_t(e.graph().info(v).numel()));
  VLAC_RETURN_IF_ERROR(download(host.data(), e.data(v), host.size() * 4));
  dump_.add_f32(name, std::move(shape), host.data());
  return Status::ok();
}

Status Pi05Policy::run_prefix(const Pi05Observation& obs) {
  const Pi05Model& m = *model_;
  VLAC_RETURN_IF_ERROR(plan_for(Pi05PrefixShape{obs.cameras, int64_t(obs.tokens.size())}));
  VLAC_RETURN_IF_ERROR(stage_observation(obs));
  VLAC_RETURN_IF_ERROR(enqueue_prefix());
  if (options_.record_intermediates) {
    const int64_t hd = m.dims().head_dim;
    for (const auto& [name, v] : prefix_outputs_) {
      std::vector<int64_t> shape = prefix_->graph().info(v).shape;
      if (name.rfind("prefix.k.", 0) == 0 || name.rfind("prefix.v.", 0) == 0) shape = {shape[0], shape[1] * hd};
      VLAC_RETURN_IF_ERROR(dump_value(*prefix_, name, shape, v));
    }
  }
  // The stage is complete here (its latency is measured by the caller); the CPU has nothing to wait for.
  return backend_->runtime().synchronize();
}

Status Pi05Policy::enqueue_denoise() {
  const Pi05Model& m = *model_;
  const Pi05EulerSpec e = m.euler();
  const int64_t H = m.config().chunk_size, A = m.dims().max_action_dim;
  const uint64_t bytes = uint64_t(H * A) * 4;
  BackendRuntime& rt = backend_->runtime();
  VLAC_RETURN_IF_ERROR(step_->write_input(step_x_, noise_stage_->data(), bytes));
  const float* times = static_cast<const float*>(times_->data());
  step_->inputs_changed();  // the prefix just ran: its K/V cache is new
  for (int64_t k = 0; k < e.steps; ++k) {
    VLAC_RETURN_IF_ERROR(step_->write_input(step_t_, times + k, 4));
    if (options_.record_intermediates) {
      const std::string sk = "step." + std::to_string(k) + ".";
      dump_.add_f32(sk + "time", {1}, times + k);
      VLAC_RETURN_IF_ERROR(dump_value(*step_, sk + "x_in", {H, A}, step_->graph().inputs()[size_t(step_x_)]));
    }
    VLAC_RETURN_IF_ERROR(step_->run());
    VLAC_RETURN_IF_ERROR(rt.copy(step_->input_data(step_x_), step_->data(step_x_next_), bytes));
    if (options_.record_intermediates) {
      const std::string sk = "step." + std::to_string(k) + ".";
      for (const auto& [name, v] : step_outputs_) {
        const std::string n = name == "x_next" ? "x" : name;
        VLAC_RETURN_IF_ERROR(dump_value(*step_, sk + n, step_->graph().info(v).shape, v));
      }
    }
  }
  return Status::ok();
}

Status Pi05Policy::denoise(const float* noise, float* action_normalized) {
  if (!step_) return internal_error("pi0.5: denoise before run_prefix");
  const Pi05Model& m = *model_;
  const int64_t H = m.config().chunk_size, A = m.dims().max_action_dim;
  const uint64_t bytes = uint64_t(H * A) * 4;
  std::memcpy(noise_stage_->data(), noise, bytes);
  VLAC_RETURN_IF_ERROR(enqueue_denoise());
  VLAC_RETURN_IF_ERROR(download(action_normalized, step_->input_data(step_x_), bytes));
  if (options_.record_intermediates) dump_.add_f32("action_normalized", {H, A}, action_normalized);
  return Status::ok();
}

Status Pi05Policy::run_chunk(const Pi05Observation& obs, const float* noise, float* action_normalized) {
  if (options_.record_intermediates) return invalid_argument("pi0.5: run_chunk does not record intermediates");
  const Pi05Model& m = *model_;
  VLAC_RETURN_IF_ERROR(plan_for(Pi05PrefixShape{obs.cameras, int64_t(obs.tokens.size())}));
  VLAC_RETURN_IF_ERROR(stage_observation(obs));
  const int64_t H = m.config().chunk_size, A = m.dims().max_action_dim;
  const uint64_t bytes = uint64_t(H * A) * 4;
  std::memcpy(noise_stage_->data(), noise, bytes);
  if (!seq_) seq_ = backend_->runtime().make_sequence();
  // One recording per prefix shape (plan_for clears them when it replans).
  uint64_t key = std::hash<std::string>{}(std::to_string(obs.tokens.size()));
  for (const std::string& c : obs.cameras) key = key * 1000003u ^ std::hash<std::string>{}(c);
  const Status st = seq_->run(key, [this]() -> Status {
    VLAC_RETURN_IF_ERROR(enqueue_prefix());
    return enqueue_denoise();
  });
  VLAC_RETURN_IF_ERROR(st);
  return download(action_normalized, step_->input_data(step_x_), bytes);
}

}  // namespace vlac
