// pi0.5 package runtime (see pi05_package_policy.h): the manifest's pi0.5 description and stored
// config/processor files; the engines themselves run through PackageEngines (one shared arena,
// crossing values in its buffers, on the backends the manifest names).
#include "runtime/pi05_package_policy.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "package/pi05_precision.h"

namespace vlac {

using nlohmann::json;

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

  // Engines: programs and weight tables (bytes stay untouched until first use), each on the
  // backend its manifest entry names.
  PackageRunOptions ro;
  ro.threads = options_.threads;
  ro.mem_budget = options_.mem_budget;
  ro.pack_weights = options_.pack_weights;
  ro.bf16_mqa_attention = bf16_;
  // The step's time-only part (time MLP, adaRMS modulations) is computed once per value of t.
  ro.memo_inputs = {kPi05InTime, kPi05Cond};
  ro.memo_slots = int(steps_);
  // The prefix K/V cache is the same for the N steps of a chunk (enqueue_denoise says when not).
  for (int64_t l = 0; l < depth_; ++l)
    for (const char* kv : {"prefix.k.", "prefix.v."}) ro.stable_inputs.push_back(kv + std::to_string(l));
  ro.backend = options_.backend;
  const std::string precision = pkg_->manifest().policy.value("precision", std::string());
  // Every precision that stores SigLIP's matrices in bf16 or 8 bits (all but lerobot's own two).
  fast_vision_ = options_.fast_vision.value_or(pi05_precision::fast_vision(precision));
  ro.fast_vision = fast_vision_;
  ro.fp8_activations = precision == pi05_precision::kFp8W8a8;
  if (options_.step_overlap) {
    step_overlap_ = *options_.step_overlap;
  } else {  // VLAC_STEP_OVERLAP=0 off, =1 on (as the CUDA backend reads its switches), else the precision's default
    const char* e = std::getenv("VLAC_STEP_OVERLAP");
    const std::string ov = e ? e : "";
    step_overlap_ = ov == "0" ? false : ov == "1" ? true : pi05_precision::step_overlap_default(precision);
  }
  // Step 0 runs beside the LM: the step engines cannot share the LM's arena and scratch.
  if (step_overlap_) ro.own_memory_stages = {"step"};
  VLAC_ASSIGN_OR_RETURN(PackageEngines engines, PackageEngines::open(*pkg_, std::move(ro)));
  engines_ = std::make_unique<PackageEngines>(std::move(engines));
  step_overlap_ = step_overlap_ && engines_->runtime().lanes() > 1;
  for (const char* s : {"vision", "lm", "step"})
    if (!engines_->has_stage(s)) return invalid_format(where + ": no engine of stage '" + s + "'");
  const auto image = engines_->input_info("vision", kPi05InImage);
  vision_batched_ = image && image->shape.size() == 4;
  return Status::ok();
}

Status Pi05PackagePolicy::run_stage(const std::string& stage, std::map<std::string, Slot>* values, bool mark_outputs) {
  Status st = engines_->run_stage(stage, values, mark_outputs);
  static_cast<PackageRunStats&>(stats_) = engines_->stats();
  return st;
}

Status Pi05PackagePolicy::buffer(std::unique_ptr<BackendBuffer>* b, uint64_t bytes, MemoryKind kind, const char* what) {
  if (*b && (*b)->bytes() == bytes && (*b)->kind() == kind) return Status::ok();
  b->reset();
  VLAC_ASSIGN_OR_RETURN(*b, engines_->runtime().allocate(bytes, kind, pkg_->path() + ": " + what));
  return Status::ok();
}

double Pi05PackagePolicy::stage_done(std::chrono::steady_clock::time_point t0) {
  // A GPU enqueues asynchronously: the stage's latency is measured once its work is done (the
  // eager path only; a recorded chunk is timed as a whole by the caller).
  if (engines_->memory_kind() != MemoryKind::Host) (void)engines_->runtime().synchronize();
  return ms_since(t0);
}

Status Pi05PackagePolicy::stage_observation(const Pi05Observation& obs) {
  if (obs.cameras.empty()) return invalid_argument("pi0.5: no camera present");
  const uint64_t image_elems = uint64_t(C_ * R_ * R_);
  VLAC_RETURN_IF_ERROR(buffer(&images_, image_elems * 4 * obs.cameras.size(), MemoryKind::Host, "image staging"));
  for (size_t c = 0; c < obs.cameras.size(); ++c) {
    if (obs.images[c].size() != image_elems) return invalid_argument("pi0.5: image of the wrong size");
    float* dst = static_cast<float*>(images_->data()) + c * image_elems;
    for (size_t i = 0; i < image_elems; ++i) dst[i] = obs.images[c][i] * 2.0f - 1.0f;  // SigLIP range
  }
  n_cams_ = int64_t(obs.cameras.size());
  n_text_ = int64_t(obs.tokens.size());
  const int64_t P = n_cams_ * n_img_ + n_text_;
  if (n_text_ > 0) {
    VLAC_RETURN_IF_ERROR(buffer(&tokens_, uint64_t(n_text_) * 8, MemoryKind::Host, "token staging"));
    std::memcpy(tokens_->data(), obs.tokens.data(), size_t(n_text_) * 8);
  }
  if (P != staged_prefix_) {  // positions and times depend on the prefix length alone
    VLAC_RETURN_IF_ERROR(buffer(&prefix_pos_, uint64_t(P) * 8, MemoryKind::Host, "prefix positions"));
    for (int64_t i = 0; i < P; ++i) static_cast<int64_t*>(prefix_pos_->data())[i] = i;
    VLAC_RETURN_IF_ERROR(buffer(&suffix_pos_, uint64_t(H_) * 8, MemoryKind::Host, "suffix positions"));
    for (int64_t i = 0; i < H_; ++i) static_cast<int64_t*>(suffix_pos_->data())[i] = P + i;
    VLAC_RETURN_IF_ERROR(buffer(&times_, uint64_t(steps_) * 4, MemoryKind::Host, "Euler times"));
    Pi05EulerSpec euler;
    euler.steps = steps_;
    euler.dt = dt_;
    for (int64_t k = 0; k < steps_; ++k) static_cast<float*>(times_->data())[k] = euler.time(k);
    const MemoryKind kind = engines_->memory_kind();
    if (kind != MemoryKind::Host) {
      BackendRuntime& rt = engines_->runtime();
      VLAC_RETURN_IF_ERROR(buffer(&prefix_pos_dev_, uint64_t(P) * 8, kind, "prefix positions"));
      VLAC_RETURN_IF_ERROR(buffer(&suffix_pos_dev_, uint64_t(H_) * 8, kind, "suffix positions"));
      VLAC_RETURN_IF_ERROR(buffer(&times_dev_, uint64_t(steps_) * 4, kind, "Euler times"));
      VLAC_RETURN_IF_ERROR(rt.copy(prefix_pos_dev_->data(), prefix_pos_->data(), uint64_t(P) * 8));
      VLAC_RETURN_IF_ERROR(rt.copy(suffix_pos_dev_->data(), suffix_pos_->data(), uint64_t(H_) * 8));
      VLAC_RETURN_IF_ERROR(rt.copy(times_dev_->data(), times_->data(), uint64_t(steps_) * 4));
    }
    staged_prefix_ = P;
  }
  VLAC_RETURN_IF_ERROR(buffer(&noise_, uint64_t(H_ * A_) * 4, MemoryKind::Host, "noise staging"));
  VLAC_RETURN_IF_ERROR(buffer(&embeddings_, uint64_t(P * W_) * 4, engines_->memory_kind(), "prefix embeddings"));
  VLAC_RETURN_IF_ERROR(buffer(&x_, uint64_t(H_ * A_) * 4, engines_->memory_kind(), "the action state"));
  return Status::ok();
}

Status Pi05PackagePolicy::enqueue_prefix() {
  BackendRuntime& rt = engines_->runtime();
  const MemoryKind kind = engines_->memory_kind();
  const int64_t nt = n_text_;
  const int64_t P = n_cams_ * n_img_ + nt;
  uint8_t* emb = static_cast<uint8_t*>(embeddings_->data());
  if (!recording_) stats_.vision_ms.clear();
  if (!recording_) stats_.text_ms = 0;
  // A batched vision engine (image [N,C,R,R]) takes every present camera in one run: N times the
  // GEMM rows fill a GPU that one image's 256 rows leave mostly idle. Older packages: one per camera.
  const int64_t per_run = vision_batched_ ? n_cams_ : 1;
  for (int64_t c = 0; c < n_cams_; c += per_run) {
    std::map<std::string, Slot> v;
    std::vector<int64_t> shape{C_, R_, R_};
    if (vision_batched_) shape.insert(shape.begin(), per_run);
    v[kPi05InImage] = Slot{static_cast<const float*>(images_->data()) + c * C_ * R_ * R_,
                           ir::ValueInfo{DType::F32, shape}, MemoryKind::Host};
    const auto tv = std::chrono::steady_clock::now();
    VLAC_RETURN_IF_ERROR(run_stage("vision", &v));
    auto it = v.find(kPi05OutImageTokens);
    if (it == v.end() || it->second.info.shape != std::vector<int64_t>{per_run * n_img_, W_} ||
        it->second.info.dtype != DType::F32)
      return invalid_format(pkg_->path() + ": the vision engines do not produce image_tokens F32[" +
                            std::to_string(per_run * n_img_) + ", " + std::to_string(W_) + "]");
    VLAC_RETURN_IF_ERROR(
        rt.copy(emb + uint64_t(c * n_img_ * W_) * 4, it->second.data, uint64_t(per_run * n_img_ * W_) * 4));
    if (!recording_) stats_.vision_ms.push_back(stage_done(tv));
  }
  // The prefix stages run once per observation: their pages leave this process when done (the
  // page cache keeps them, so the next observation maps them back with minor faults only).
  if (!recording_) engines_->release_stage("vision");
  if (nt > 0) {
    if (!engines_->has_stage("text")) return invalid_format(pkg_->path() + ": no engine of stage 'text'");
    std::map<std::string, Slot> v;
    v[kPi05InTokens] = Slot{tokens_->data(), ir::ValueInfo{DType::I64, {nt}}, MemoryKind::Host};
    const auto tt = std::chrono::steady_clock::now();
    VLAC_RETURN_IF_ERROR(run_stage("text", &v));
    auto it = v.find(kPi05OutTextEmbeddings);
    if (it == v.end() || it->second.info.shape != std::vector<int64_t>{nt, W_} || it->second.info.dtype != DType::F32)
      return invalid_format(pkg_->path() + ": the text engines do not produce text_embeddings F32[" + std::to_string(nt) +
                            ", " + std::to_string(W_) + "]");
    VLAC_RETURN_IF_ERROR(rt.copy(emb + uint64_t(n_cams_ * n_img_ * W_) * 4, it->second.data, uint64_t(nt * W_) * 4));
    if (!recording_) stats_.text_ms = stage_done(tt);
    if (!recording_) engines_->release_stage("text");
  }
  std::map<std::string, Slot> v;
  v[kPi05InPrefixEmbeddings] = Slot{embeddings_->data(), ir::ValueInfo{DType::F32, {P, W_}}, kind};
  v[kPi05InPrefixPos] = prefix_pos_dev_ ? Slot{prefix_pos_dev_->data(), ir::ValueInfo{DType::I64, {P}}, kind}
                                        : Slot{prefix_pos_->data(), ir::ValueInfo{DType::I64, {P}}, MemoryKind::Host};
  const auto tl = std::chrono::steady_clock::now();
  // Overlapped (run_chunk): lane 1 starts from here, and each LM engine's K/V carry a mark.
  const bool overlap = recording_ && step_overlap_;
  lm_fork_mark_ = -1;
  if (overlap) {
    VLAC_ASSIGN_OR_RETURN(lm_fork_mark_, engines_->runtime().mark());
  }
  VLAC_RETURN_IF_ERROR(run_stage("lm", &v, overlap));
  if (!recording_) stats_.lm_ms = stage_done(tl);
  if (!recording_) engines_->release_stage("lm");
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

Status Pi05PackagePolicy::run_prefix(const Pi05Observation& obs) {
  VLAC_RETURN_IF_ERROR(stage_observation(obs));
  return enqueue_prefix();
}

Status Pi05PackagePolicy::enqueue_denoise() {
  if (prefix_len_ == 0) return internal_error("pi0.5: denoise before run_prefix");
  BackendRuntime& rt = engines_->runtime();
  const uint64_t bytes = uint64_t(H_ * A_) * 4;
  // Overlapped: step 0 on lane 1 from the mark before the LM, its expert layers waiting each for
  // their prefix K/V's mark; then lane 0 waits for step 0, and steps 1.. run there. Lane 0 again
  // on every way out.
  const bool overlap = recording_ && step_overlap_ && lm_fork_mark_ >= 0;
  struct LaneZero {
    BackendRuntime* rt;
    ~LaneZero() {
      if (rt) (void)rt->use_lane(0);
    }
  } lane_zero{overlap ? &rt : nullptr};
  if (overlap) {
    VLAC_RETURN_IF_ERROR(rt.use_lane(1));
    VLAC_RETURN_IF_ERROR(rt.wait_mark(lm_fork_mark_));
  }
  VLAC_RETURN_IF_ERROR(rt.copy(x_->data(), noise_->data(), bytes));
  std::map<std::string, Slot> v = prefix_kv_;
  v[kPi05InX] = Slot{x_->data(), ir::ValueInfo{DType::F32, {H_, A_}}, engines_->memory_kind()};
  v[kPi05InSuffixPos] = suffix_pos_dev_
                            ? Slot{suffix_pos_dev_->data(), ir::ValueInfo{DType::I64, {H_}}, engines_->memory_kind()}
                            : Slot{suffix_pos_->data(), ir::ValueInfo{DType::I64, {H_}}, MemoryKind::Host};
  if (!recording_) stats_.step_ms.assign(size_t(steps_), 0.0);
  const float* times = static_cast<const float*>(times_->data());
  engines_->inputs_changed("step");  // a new prefix K/V cache: the first step reads it again
  for (int64_t k = 0; k < steps_; ++k) {
    // x_ is bound in place; t is read from the step's entry of the Euler times; outputs are
    // overwritten each step.
    v[kPi05InTime] = times_dev_ ? Slot{static_cast<float*>(times_dev_->data()) + k, ir::ValueInfo{DType::F32, {1}},
                                       engines_->memory_kind()}
                                : Slot{times + k, ir::ValueInfo{DType::F32, {1}}, MemoryKind::Host};
    // The step engines' memo keyed by t itself: a later engine reads `cond` (a function of t
    // alone) from device memory, where its memo could not compare it and would recompute the
    // adaRMS modulations of its layers at every step.
    engines_->set_memo_key("step", times + k, 4);
    const auto ts = std::chrono::steady_clock::now();
    VLAC_RETURN_IF_ERROR(run_stage("step", &v));
    auto it = v.find("x_next");
    if (it == v.end() || it->second.info.bytes() != bytes || it->second.info.dtype != DType::F32)
      return invalid_format(pkg_->path() + ": the step engines do not produce 'x_next' F32[" + std::to_string(H_) + ", " +
                            std::to_string(A_) + "]");
    VLAC_RETURN_IF_ERROR(rt.copy(x_->data(), it->second.data, bytes));
    if (!recording_) stats_.step_ms[size_t(k)] = stage_done(ts);
    if (overlap && k == 0) {  // join: lane 0 goes on after step 0; no input waits from here
      VLAC_ASSIGN_OR_RETURN(const int joined, rt.mark());
      VLAC_RETURN_IF_ERROR(rt.use_lane(0));
      VLAC_RETURN_IF_ERROR(rt.wait_mark(joined));
      for (auto& [name, slot] : v) slot.mark = -1;
    }
  }
  return Status::ok();
}

Status Pi05PackagePolicy::denoise(const float* noise, float* action_normalized) {
  if (prefix_len_ == 0) return internal_error("pi0.5: denoise before run_prefix");
  std::memcpy(noise_->data(), noise, size_t(H_ * A_) * 4);
  VLAC_RETURN_IF_ERROR(enqueue_denoise());
  BackendRuntime& rt = engines_->runtime();
  VLAC_RETURN_IF_ERROR(rt.copy(action_normalized, x_->data(), uint64_t(H_ * A_) * 4));
  return rt.synchronize();
}

Status Pi05PackagePolicy::run_chunk(const Pi05Observation& obs, const float* noise, float* action_normalized) {
  // Buffers (re)allocated by staging change what a recording points at: a new shape, new recordings.
  const void* before[5] = {embeddings_ ? embeddings_->data() : nullptr, x_ ? x_->data() : nullptr,
                           tokens_ ? tokens_->data() : nullptr, images_ ? images_->data() : nullptr,
                           prefix_pos_dev_ ? prefix_pos_dev_->data() : nullptr};
  VLAC_RETURN_IF_ERROR(stage_observation(obs));
  std::memcpy(noise_->data(), noise, size_t(H_ * A_) * 4);
  uint64_t key = std::hash<std::string>{}(std::to_string(obs.tokens.size()));
  for (const std::string& c : obs.cameras) key = key * 1000003u ^ std::hash<std::string>{}(c);
  if (!seq_) seq_ = engines_->runtime().make_sequence();
  if (before[0] != embeddings_->data() || before[1] != x_->data() || before[2] != (tokens_ ? tokens_->data() : nullptr) ||
      before[3] != images_->data() || before[4] != (prefix_pos_dev_ ? prefix_pos_dev_->data() : nullptr) ||
      key != seq_key_)
    seq_->clear();
  seq_key_ = key;
  recording_ = true;
  Status st = seq_->run(key, [this]() -> Status {
    engines_->runtime().clear_marks();
    VLAC_RETURN_IF_ERROR(enqueue_prefix());
    return enqueue_denoise();
  });
  recording_ = false;
  static_cast<PackageRunStats&>(stats_) = engines_->stats();
  VLAC_RETURN_IF_ERROR(st);
  BackendRuntime& rt = engines_->runtime();
  VLAC_RETURN_IF_ERROR(rt.copy(action_normalized, x_->data(), uint64_t(H_ * A_) * 4));
  return rt.synchronize();
}

}  // namespace vlac
