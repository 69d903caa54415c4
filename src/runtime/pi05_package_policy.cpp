// pi0.5 package runtime (see pi05_package_policy.h). Engines share one activation arena (they run
// one after another); values crossing engines and stages are copied into buffers owned here.
#include "runtime/pi05_package_policy.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backends/registry.h"
#include "ir/serialize.h"
#include "ir/walk.h"

namespace vlac {

using nlohmann::json;

struct Pi05PackagePolicy::Engine {
  std::string name, stage;
  ir::Graph program;                       // as packaged (compile-time shapes)
  std::vector<std::string> output_names;   // manifest names of program outputs, in order
  std::vector<ir::WeightRef> refs;         // file_id = index into `segments`, offset within it
  std::vector<DType> run;                  // = stored dtype
  std::vector<const PackageSegment*> segments;
  uint64_t budget_bytes = 0;               // weight bytes a run touches (gathered tables: 0)
  bool verified = false, resident = false;
  Backend* backend = nullptr;              // from the registry, by the manifest's name
  std::unique_ptr<BoundWeights> weights;
  std::unique_ptr<Executable> exec;
  std::map<std::string, std::vector<int64_t>> planned;  // input shapes exec was planned for
};

Pi05PackagePolicy::Pi05PackagePolicy(Pi05PackagePolicy&&) noexcept = default;
Pi05PackagePolicy& Pi05PackagePolicy::operator=(Pi05PackagePolicy&&) noexcept = default;
Pi05PackagePolicy::~Pi05PackagePolicy() = default;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Result<int64_t> get_int(const json& p, const char* key, const std::string& where, int64_t min) {
  auto it = p.find(key);
  if (it == p.end() || !it->is_number_integer() || it->get<int64_t>() < min)
    return invalid_format(where + ": manifest policy." + key + " must be an integer >= " + std::to_string(min));
  return it->get<int64_t>();
}

}  // namespace

uint64_t Pi05PackagePolicy::weight_bytes() const {
  uint64_t b = 0;
  for (const auto& s : pkg_->segments())
    if (s.kind == package::SegmentKind::Engine) b += s.size;
  return b;
}

Result<Pi05PackagePolicy> Pi05PackagePolicy::open(const std::string& path, Pi05PackageOptions options) {
  if (options.pack_weights && options.mem_budget > 0)
    return invalid_argument("packed weights are copies held by each engine and cannot be evicted: use either a "
                            "memory budget or packed weights, not both");
  Pi05PackagePolicy p;
  p.options_ = options;
  VLAC_ASSIGN_OR_RETURN(Package pkg, Package::open(path));
  p.pkg_ = std::make_unique<Package>(std::move(pkg));
  VLAC_RETURN_IF_ERROR(p.load_manifest());
  return p;
}

Status Pi05PackagePolicy::load_manifest() {
  const std::string& where = pkg_->path();
  const PackageManifest& m = pkg_->manifest();
  const json& pol = m.policy;
  if (!pol.is_object() || pol.value("type", "") != "pi05")
    return unsupported(where + ": the package holds no pi0.5 policy (manifest policy.type is not \"pi05\")");
  VLAC_ASSIGN_OR_RETURN(H_, get_int(pol, "chunk_size", where, 1));
  VLAC_ASSIGN_OR_RETURN(A_, get_int(pol, "max_action_dim", where, 1));
  VLAC_ASSIGN_OR_RETURN(C_, get_int(pol, "channels", where, 1));
  VLAC_ASSIGN_OR_RETURN(R_, get_int(pol, "image_size", where, 1));
  VLAC_ASSIGN_OR_RETURN(n_img_, get_int(pol, "image_tokens", where, 1));
  VLAC_ASSIGN_OR_RETURN(W_, get_int(pol, "lm_width", where, 1));
  VLAC_ASSIGN_OR_RETURN(depth_, get_int(pol, "lm_depth", where, 1));
  VLAC_ASSIGN_OR_RETURN(steps_, get_int(pol, "num_inference_steps", where, 1));
  if (H_ > (1 << 20) || A_ > (1 << 20) || C_ > 64 || R_ > 16384 || n_img_ > (1 << 20) || W_ > (1 << 20) ||
      depth_ > 4096 || steps_ > 100000)
    return invalid_format(where + ": manifest policy sizes are out of range");
  dt_ = float(-1.0 / double(steps_));
  bf16_ = pol.value("dtype", "") == "bf16";

  // The policy's own files, stored verbatim: config.json, processor configs, stats, tokenizer.
  VLAC_ASSIGN_OR_RETURN(auto cfg_bytes, pkg_->data("policy/config.json"));
  VLAC_RETURN_IF_ERROR(pkg_->verify(*pkg_->find("policy/config.json")));
  VLAC_ASSIGN_OR_RETURN(config_, parse_pi05_config_text(
                                     std::string_view(reinterpret_cast<const char*>(cfg_bytes.data()), cfg_bytes.size()),
                                     where + ": policy/config.json"));
  if (config_.chunk_size != H_ || config_.num_inference_steps != steps_ || config_.image_resolution != R_)
    return invalid_format(where + ": manifest policy disagrees with the stored config.json");
  ProcessorFiles pf;
  pf.origin = where;
  for (const auto& s : pkg_->segments()) {
    if (s.name.rfind("policy/", 0) != 0 || s.name == "policy/config.json") continue;
    VLAC_RETURN_IF_ERROR(pkg_->verify(s));
    pf.files[s.name.substr(7)] = pkg_->data(s);
  }
  VLAC_ASSIGN_OR_RETURN(processor_, parse_pi05_processor(pf));

  // Engines: programs and weight tables (bytes stay untouched until first use).
  for (const PackageEngine& pe : m.engines) {
    auto e = std::make_unique<Engine>();
    e->name = pe.name;
    const std::string ew = where + ": engine '" + pe.name + "'";
    VLAC_ASSIGN_OR_RETURN(e->backend, backend_registry().get(pe.backend, ew));
    const json& x = pe.extra;
    if (!x.contains("stage") || !x["stage"].is_string() || !x.contains("program") || !x.contains("weights") ||
        !x["weights"].is_array())
      return invalid_format(ew + ": needs stage, program and weights");
    e->stage = x["stage"].get<std::string>();
    VLAC_ASSIGN_OR_RETURN(e->program, ir::graph_from_json(x["program"], ew));
    if (e->program.outputs().size() != pe.outputs.size() || e->program.inputs().size() != pe.inputs.size())
      return invalid_format(ew + ": program inputs/outputs differ from the manifest's");
    for (const auto& o : pe.outputs) e->output_names.push_back(o.name);
    for (const json& w : x["weights"]) {
      if (!w.is_object() || !w.contains("name") || !w["name"].is_string() || !w.contains("dtype") ||
          !w["dtype"].is_string() || !w.contains("segment") || !w["segment"].is_string() || !w.contains("offset") ||
          !w["offset"].is_number_unsigned() || !w.contains("shape") || !w["shape"].is_array())
        return invalid_format(ew + ": a weight record needs name, dtype, shape, segment, offset");
      ir::WeightRef r;
      r.name = w["name"].get<std::string>();
      auto dt = dtype_from_name(w["dtype"].get<std::string>());
      if (!dt || (*dt != DType::F32 && *dt != DType::BF16))
        return invalid_format(ew + ": weight '" + r.name + "' has a dtype the runtime does not bind (F32, BF16)");
      r.dtype = *dt;
      for (const json& s : w["shape"]) {
        if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > (int64_t(1) << 40))
          return invalid_format(ew + ": weight '" + r.name + "' has a bad shape");
        r.shape.push_back(s.get<int64_t>());
      }
      if (r.shape.size() > 8) return invalid_format(ew + ": weight '" + r.name + "' has a bad shape");
      ir::ValueInfo vi{r.dtype, r.shape};
      r.bytes = vi.bytes();
      r.offset = w["offset"].get<uint64_t>();
      const PackageSegment* seg = pkg_->find(w["segment"].get<std::string>());
      if (!seg || seg->kind != package::SegmentKind::Engine)
        return invalid_format(ew + ": weight '" + r.name + "' names no engine segment");
      uint64_t end = 0;
      if (__builtin_add_overflow(r.offset, r.bytes, &end) || end > seg->size)
        return invalid_format(ew + ": weight '" + r.name + "' lies outside segment '" + seg->name + "'");
      auto it = std::find(e->segments.begin(), e->segments.end(), seg);
      r.file_id = uint32_t(it - e->segments.begin());
      if (it == e->segments.end()) e->segments.push_back(seg);
      e->refs.push_back(r);
      e->run.push_back(r.dtype);
    }
    // Budget accounting: a weight only gathered from (embedding table) costs its looked-up rows.
    const ir::Graph& g = e->program;
    const ir::UseLists uses = ir::build_use_lists(g);
    std::map<std::string, uint64_t> stored_bytes;
    for (const auto& r : e->refs) stored_bytes[r.name] = r.bytes;
    for (const ir::Node& n : g.nodes()) {
      if (n.op != ir::OpKind::Weight) continue;
      const ir::ValueId v = n.outputs[0];
      bool gather_only = true;
      for (int64_t u = uses.offsets[size_t(v)]; u < uses.offsets[size_t(v) + 1]; ++u)
        if (g.node(uses.node_ids[size_t(u)]).op != ir::OpKind::Embedding) gather_only = false;
      auto it = stored_bytes.find(g.weights()[size_t(n.weight)].name);
      if (!gather_only && it != stored_bytes.end()) e->budget_bytes += it->second;
    }
    stages_[e->stage].push_back(engines_.size());
    engines_.push_back(std::move(e));
  }
  for (const char* s : {"vision", "lm", "step"})
    if (stages_[s].empty()) return invalid_format(where + ": no engine of stage '" + s + "'");
  return Status::ok();
}

void Pi05PackagePolicy::make_room(const Engine& next) {
  if (options_.mem_budget == 0) return;
  const uint64_t overhead = stats_.activation_bytes + (64ull << 20);
  const uint64_t limit = options_.mem_budget > overhead ? options_.mem_budget - overhead : 0;
  for (size_t i = 0; i < lru_.size() && resident_ + (next.resident ? 0 : next.budget_bytes) > limit;) {
    Engine& e = *engines_[lru_[i]];
    if (&e == &next) {
      ++i;
      continue;
    }
    for (const PackageSegment* s : e.segments) pkg_->drop(*s);
    resident_ -= std::min(resident_, e.budget_bytes);
    e.resident = false;
    ++stats_.evictions;
    stats_.evicted_bytes += e.budget_bytes;
    lru_.erase(lru_.begin() + std::ptrdiff_t(i));
  }
}

Status Pi05PackagePolicy::prepare(Engine& e, const std::map<std::string, Slot>& values) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (ir::ValueId v : e.program.inputs()) {
    const std::string name = ir::input_name(e.program, v);
    auto it = values.find(name);
    if (it == values.end())
      return invalid_format(pkg_->path() + ": engine '" + e.name + "' reads '" + name + "', which no earlier engine makes");
    if (it->second.info.dtype != e.program.info(v).dtype)
      return invalid_format(pkg_->path() + ": engine '" + e.name + "': '" + name + "' has the wrong dtype");
    shapes[name] = it->second.info.shape;
  }
  if (e.exec && shapes == e.planned) return Status::ok();
  if (!e.weights) {
    // First use: check the bytes of every segment it reads, then bind the weights in place.
    for (const PackageSegment* s : e.segments) VLAC_RETURN_IF_ERROR(pkg_->verify(*s));
    WeightBinding wb;
    wb.refs = e.refs;
    wb.run_dtypes = e.run;
    for (const PackageSegment* s : e.segments) {
      auto span = pkg_->data(*s);
      wb.files.push_back({span.data(), span.size(), pkg_->path() + ": segment '" + s->name + "'", nullptr});
    }
    VLAC_ASSIGN_OR_RETURN(e.weights, e.backend->runtime().bind_weights(wb));
  }
  VLAC_ASSIGN_OR_RETURN(ir::Graph g, ir::respecialize(e.program, shapes));
  ExecOptions eo;
  eo.threads = options_.threads;
  eo.shared_memory = true;
  eo.pack_weights = options_.pack_weights;
  eo.bf16_mqa_attention = bf16_;
  // The step's time-only part (time MLP, adaRMS modulations) is computed once per value of t.
  eo.memo_inputs = {kPi05InTime, kPi05Cond};
  eo.memo_slots = int(steps_);
  e.exec.reset();
  VLAC_ASSIGN_OR_RETURN(e.exec, e.backend->runtime().plan(std::move(g), *e.weights, eo));
  if (e.exec->memory().kind == MemoryKind::Device)
    return unsupported(pkg_->path() + ": engine '" + e.name + "' (backend '" + std::string(e.backend->name()) +
                       "') needs device memory for its arena; this runtime provides host memory only");
  // The executor now holds packed copies of its Linear weights: give the mapped pages back (they
  // stay in the page cache; the few in-place weights left, norms and biases, fault in again on
  // use), so packing trades the mapping for the copy instead of holding both.
  if (options_.pack_weights)
    for (const PackageSegment* s : e.segments) pkg_->release(*s);
  stats_.packed_weight_bytes = 0;
  for (const auto& other : engines_)
    if (other->exec) stats_.packed_weight_bytes += other->exec->memory().packed_bytes;
  e.planned = std::move(shapes);
  ++stats_.engines_loaded;
  return Status::ok();
}

Status Pi05PackagePolicy::run_stage(const std::vector<size_t>& ids, std::map<std::string, Slot>* values) {
  for (size_t id : ids) {
    Engine& e = *engines_[id];
    VLAC_RETURN_IF_ERROR(prepare(e, *values));
    // One arena and scratch shared by all engines (grown only when a new plan needs more).
    const MemoryPlan mp = e.exec->memory();
    if (mp.arena_bytes > arena_.size() || mp.scratch_bytes > scratch_.size() * 4) {
      arena_.assign(std::max<uint64_t>(mp.arena_bytes, arena_.size()) + 64, 0);
      scratch_.assign(std::max<uint64_t>(mp.scratch_bytes / 4 + 1, scratch_.size()), 0.0f);
    }
    uint8_t* base = arena_.data();
    base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
    e.exec->bind_memory(base, scratch_.data());
    const auto& ins = e.exec->graph().inputs();
    for (size_t i = 0; i < ins.size(); ++i)
      e.exec->bind_input(int(i), values->at(ir::input_name(e.exec->graph(), ins[i])).data);
    uint64_t act = arena_.size() + scratch_.size() * 4;
    for (const auto& [n, b] : store_) act += b.size();
    for (const auto& other : engines_)
      if (other->exec) act += other->exec->memory().memo_bytes;  // the step's time-only results
    stats_.activation_bytes = act;
    make_room(e);
    VLAC_RETURN_IF_ERROR(e.exec->run());
    if (!e.resident) {
      e.resident = true;
      resident_ += e.budget_bytes;
    }
    lru_.erase(std::remove(lru_.begin(), lru_.end(), id), lru_.end());
    lru_.push_back(id);
    stats_.peak_resident_weight_bytes = std::max(stats_.peak_resident_weight_bytes, resident_);
    // Outputs leave the shared arena: copy them into buffers owned here.
    const auto& outs = e.exec->graph().outputs();
    for (size_t i = 0; i < outs.size(); ++i) {
      const ir::ValueInfo& info = e.exec->graph().info(outs[i]);
      std::vector<uint8_t>& buf = store_[e.stage + "/" + e.output_names[i]];
      if (buf.size() != info.bytes()) buf.resize(info.bytes());
      std::memcpy(buf.data(), e.exec->data(outs[i]), info.bytes());
      (*values)[e.output_names[i]] = Slot{buf.data(), info};
    }
  }
  return Status::ok();
}

void Pi05PackagePolicy::release_stage(const std::string& stage) {
  for (size_t id : stages_[stage]) {
    Engine& e = *engines_[id];
    if (!e.resident) continue;
    for (const PackageSegment* s : e.segments) pkg_->release(*s);
    e.resident = false;
    resident_ -= std::min(resident_, e.budget_bytes);
    lru_.erase(std::remove(lru_.begin(), lru_.end(), id), lru_.end());
  }
}

Status Pi05PackagePolicy::run_prefix(const Pi05Observation& obs) {
  if (obs.cameras.empty()) return invalid_argument("pi0.5: no camera present");
  const int64_t nt = int64_t(obs.tokens.size());
  const int64_t P = int64_t(obs.cameras.size()) * n_img_ + nt;
  embeddings_.assign(size_t(P * W_), 0.0f);
  stats_.vision_ms.clear();
  stats_.text_ms = 0;
  image_in_.resize(size_t(C_ * R_ * R_));
  for (size_t c = 0; c < obs.cameras.size(); ++c) {
    if (obs.images[c].size() != image_in_.size()) return invalid_argument("pi0.5: image of the wrong size");
    for (size_t i = 0; i < image_in_.size(); ++i) image_in_[i] = obs.images[c][i] * 2.0f - 1.0f;  // SigLIP range
    std::map<std::string, Slot> v;
    v[kPi05InImage] = Slot{image_in_.data(), ir::ValueInfo{DType::F32, {C_, R_, R_}}};
    const auto tv = std::chrono::steady_clock::now();
    VLAC_RETURN_IF_ERROR(run_stage(stages_["vision"], &v));
    stats_.vision_ms.push_back(ms_since(tv));
    auto it = v.find(kPi05OutImageTokens);
    if (it == v.end() || it->second.info.shape != std::vector<int64_t>{n_img_, W_} || it->second.info.dtype != DType::F32)
      return invalid_format(pkg_->path() + ": the vision engines do not produce image_tokens F32[" + std::to_string(n_img_) +
                            ", " + std::to_string(W_) + "]");
    const Slot& tok = it->second;
    std::memcpy(embeddings_.data() + size_t(int64_t(c) * n_img_ * W_), tok.data, size_t(n_img_ * W_) * 4);
  }
  // The prefix stages run once per observation: their pages leave this process when done (the
  // page cache keeps them, so the next observation maps them back with minor faults only).
  release_stage("vision");
  if (nt > 0) {
    if (stages_["text"].empty()) return invalid_format(pkg_->path() + ": no engine of stage 'text'");
    tokens_ = obs.tokens;
    std::map<std::string, Slot> v;
    v[kPi05InTokens] = Slot{tokens_.data(), ir::ValueInfo{DType::I64, {nt}}};
    const auto tt = std::chrono::steady_clock::now();
    VLAC_RETURN_IF_ERROR(run_stage(stages_["text"], &v));
    stats_.text_ms = ms_since(tt);
    auto it = v.find(kPi05OutTextEmbeddings);
    if (it == v.end() || it->second.info.shape != std::vector<int64_t>{nt, W_} || it->second.info.dtype != DType::F32)
      return invalid_format(pkg_->path() + ": the text engines do not produce text_embeddings F32[" + std::to_string(nt) +
                            ", " + std::to_string(W_) + "]");
    const Slot& te = it->second;
    std::memcpy(embeddings_.data() + size_t(int64_t(obs.cameras.size()) * n_img_ * W_), te.data, size_t(nt * W_) * 4);
    release_stage("text");
  }
  prefix_pos_.resize(size_t(P));
  for (int64_t i = 0; i < P; ++i) prefix_pos_[size_t(i)] = i;
  std::map<std::string, Slot> v;
  v[kPi05InPrefixEmbeddings] = Slot{embeddings_.data(), ir::ValueInfo{DType::F32, {P, W_}}};
  v[kPi05InPrefixPos] = Slot{prefix_pos_.data(), ir::ValueInfo{DType::I64, {P}}};
  const auto tl = std::chrono::steady_clock::now();
  VLAC_RETURN_IF_ERROR(run_stage(stages_["lm"], &v));
  stats_.lm_ms = ms_since(tl);
  release_stage("lm");
  prefix_kv_.clear();
  for (int64_t l = 0; l < depth_; ++l)
    for (const char* kv : {"prefix.k.", "prefix.v."}) {
      const std::string name = kv + std::to_string(l);
      auto it = v.find(name);
      if (it == v.end() || it->second.info.dtype != DType::F32)
        return invalid_format(pkg_->path() + ": the lm engines do not produce '" + name + "'");
      prefix_kv_[name] = it->second;
    }
  prefix_len_ = P;
  return Status::ok();
}

Status Pi05PackagePolicy::denoise(const float* noise, float* action_normalized) {
  if (prefix_len_ == 0) return internal_error("pi0.5: denoise before run_prefix");
  x_.assign(noise, noise + H_ * A_);
  t_.assign(1, 0.0f);
  suffix_pos_.resize(size_t(H_));
  for (int64_t i = 0; i < H_; ++i) suffix_pos_[size_t(i)] = prefix_len_ + i;
  std::map<std::string, Slot> v = prefix_kv_;
  v[kPi05InX] = Slot{x_.data(), ir::ValueInfo{DType::F32, {H_, A_}}};
  v[kPi05InTime] = Slot{t_.data(), ir::ValueInfo{DType::F32, {1}}};
  v[kPi05InSuffixPos] = Slot{suffix_pos_.data(), ir::ValueInfo{DType::I64, {H_}}};
  Pi05EulerSpec euler;
  euler.steps = steps_;
  euler.dt = dt_;
  stats_.step_ms.assign(size_t(steps_), 0.0);
  for (int64_t k = 0; k < steps_; ++k) {
    t_[0] = euler.time(k);  // x_ and t_ are bound in place; outputs are overwritten each step
    const auto ts = std::chrono::steady_clock::now();
    VLAC_RETURN_IF_ERROR(run_stage(stages_["step"], &v));
    stats_.step_ms[size_t(k)] = ms_since(ts);
    auto it = v.find("x_next");
    if (it == v.end() || it->second.info.bytes() != x_.size() * 4 || it->second.info.dtype != DType::F32)
      return invalid_format(pkg_->path() + ": the step engines do not produce 'x_next' F32[" + std::to_string(H_) + ", " +
                            std::to_string(A_) + "]");
    std::memcpy(x_.data(), it->second.data, x_.size() * 4);
  }
  std::memcpy(action_normalized, x_.data(), x_.size() * 4);
  return Status::ok();
}

}  // namespace vlac
