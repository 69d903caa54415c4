// Pi05Session (see pi05_session.h): the `vlac run` path for a folder (Pi05Policy) or a package
// (Pi05PackagePolicy), kept open between observations.
#include "session/pi05_session.h"

#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <set>

#include "backends/registry.h"
#include "package/package.h"
#include "policy/pi05_policy.h"
#include "runtime/device_choice.h"
#include "runtime/pi05_package_policy.h"

namespace vlac {

namespace {

using Clock = std::chrono::steady_clock;
double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

constexpr const char* kEmptyCameraPrefix = "observation.images.empty_camera_";

Result<bool> want_bf16(const std::string& dtype, const std::string& path) {
  if (dtype == "fp32" || dtype == "float32") return false;
  if (dtype == "bf16" || dtype == "bfloat16") return true;
  return invalid_argument(path + ": dtype must be fp32 (float32) or bf16 (bfloat16), got '" + dtype + "'");
}

}  // namespace

struct Pi05Session::Impl {
  std::unique_ptr<Pi05Policy> folder;
  std::unique_ptr<Pi05PackagePolicy> package;
  Pi05Config config;
  Pi05Processor proc;
  int64_t vocab = 0;
};

Pi05Session::~Pi05Session() = default;

Result<std::unique_ptr<Pi05Session>> Pi05Session::open(const std::string& path, const Pi05SessionOptions& options) {
  if (options.threads < 1) return invalid_argument("threads must be at least 1");
  std::unique_ptr<Pi05Session> s(new Pi05Session);
  s->options_ = options;
  s->impl_ = std::make_unique<Impl>();
  Impl& im = *s->impl_;
  Pi05SessionInfo& info = s->info_;
  info.path = path;
  struct stat st;
  const bool plain_file = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  const bool is_package = plain_file || has_package_magic(path);
  // vlac run's device policy, from the same code (runtime/device_choice): "" is vlac run's
  // default (a folder on the CPU, a package on its manifest's backends).
  VLAC_ASSIGN_OR_RETURN(const DeviceChoice dev, choose_device(options.device, is_package ? "" : kDefaultBackend, "device"));
  if (dev.gpu && options.pack_weights) return invalid_argument("pack_weights applies to the CPU (device cpu)");
  if (is_package) {
    Pi05PackageOptions po;
    po.threads = options.threads;
    po.pack_weights = options.pack_weights;
    po.backend = dev.backend;
    VLAC_ASSIGN_OR_RETURN(Pi05PackagePolicy p, Pi05PackagePolicy::open(path, po));
    im.package = std::make_unique<Pi05PackagePolicy>(std::move(p));
    const Pi05PackagePolicy& pk = *im.package;
    if (!options.dtype.empty()) {
      VLAC_ASSIGN_OR_RETURN(const bool bf16, want_bf16(options.dtype, path));
      if (bf16 != pk.bf16())
        return invalid_argument(path + ": the package was compiled for " + std::string(pk.bf16() ? "bf16" : "fp32") +
                                "; dtype " + options.dtype + " needs a package compiled with that dtype");
    }
    // Where the engines run: the device asked for (they were re-bound to it), else the manifest's.
    std::string list = dev.backend;
    if (list.empty()) {
      std::set<std::string> backends;
      for (const PackageEngine& e : pk.package().manifest().engines) backends.insert(e.backend);
      for (const std::string& b : backends) list += (list.empty() ? "" : ", ") + b;
    }
    info.kind = "package";
    info.device = list;
    info.dtype = pk.bf16() ? "bf16" : "fp32";
    im.config = pk.config();
    im.proc = pk.processor();
    im.vocab = pk.package().manifest().policy.value("vocab", int64_t{0});
    info.chunk_size = pk.chunk_size();
    info.max_action_dim = pk.max_action_dim();
    info.channels = pk.channels();
    info.num_inference_steps = pk.steps();
  } else {
    Pi05PolicyOptions fo;
    if (!options.dtype.empty()) {
      VLAC_ASSIGN_OR_RETURN(const bool bf16, want_bf16(options.dtype, path));
      fo.precision = bf16 ? Pi05Precision::Bf16 : Pi05Precision::Fp32;
    }
    fo.threads = options.threads;
    fo.pack_weights = options.pack_weights;
    fo.backend = dev.backend;
    VLAC_ASSIGN_OR_RETURN(Pi05Policy p, Pi05Policy::load(path, fo));
    im.folder = std::make_unique<Pi05Policy>(std::move(p));
    VLAC_ASSIGN_OR_RETURN(im.proc, load_pi05_processor(path));
    const Pi05Model& m = im.folder->model();
    info.kind = "folder";
    info.device = fo.backend;
    info.dtype = im.folder->bf16() ? "bf16" : "fp32";
    im.config = m.config();
    im.vocab = m.dims().vocab;
    info.chunk_size = m.config().chunk_size;
    info.max_action_dim = m.dims().max_action_dim;
    info.channels = m.dims().channels;
    info.num_inference_steps = m.euler().steps;
  }
  if (!options.tokenizer.empty()) {
    VLAC_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_path(options.tokenizer));
    im.proc.set_tokenizer(std::move(tok));
  }
  const Pi05Config& cfg = im.config;
  info.n_action_steps = cfg.n_action_steps;
  info.max_state_dim = cfg.max_state_dim;
  info.image_resolution = cfg.image_resolution;
  info.has_preprocessor = im.proc.has_preprocessor;
  info.has_postprocessor = im.proc.has_postprocessor;
  if (im.proc.tokenizer_step) info.task_key = im.proc.tokenizer_step->task_key;
  // The action width postprocess_pi05_action gives: config, else the unnormalizer's feature.
  info.action_dim = cfg.action_dim;
  if (info.action_dim <= 0 && im.proc.unnormalizer) {
    auto it = im.proc.unnormalizer->features.find("action");
    if (it != im.proc.unnormalizer->features.end() && it->second.shape.size() == 1)
      info.action_dim = it->second.shape[0];
  }
  if (info.action_dim <= 0 || info.action_dim > info.max_action_dim) info.action_dim = info.max_action_dim;
  const Pi05Normalizer* norm = im.proc.normalizer ? &*im.proc.normalizer : nullptr;
  if (norm) {
    auto it = norm->features.find("observation.state");
    if (it != norm->features.end() && it->second.shape.size() == 1) info.state_dim = it->second.shape[0];
  }
  for (const std::string& cam : cfg.cameras) {
    if (cam.rfind(kEmptyCameraPrefix, 0) == 0) continue;
    info.cameras.push_back(cam);
    std::vector<int64_t> shape;
    if (norm) {
      auto it = norm->features.find(cam);
      if (it != norm->features.end()) shape = it->second.shape;
    }
    info.camera_shapes.push_back(shape);
  }
  return s;
}

Status Pi05Session::predict(const ObsSource& src, const std::string& task, const float* noise, Pi05SessionOutput* out) {
  std::lock_guard<std::mutex> lock(mu_);
  Impl& im = *impl_;
  const int64_t H = info_.chunk_size, A = info_.max_action_dim;
  const Clock::time_point t0 = Clock::now();
  VLAC_ASSIGN_OR_RETURN(Pi05Observation obs,
                        read_pi05_observation(src, im.config, info_.channels, &im.proc, task, im.vocab));
  std::vector<float> drawn;
  out->seeded = noise == nullptr;
  if (!noise) {
    out->seed = options_.seed + noise_calls_++;
    drawn = pi05_gaussian_noise(out->seed, H * A);
    noise = drawn.data();
  }
  out->action_normalized.resize(size_t(H * A));
  const Clock::time_point t1 = Clock::now();
  if (im.folder) VLAC_RETURN_IF_ERROR(im.folder->run_prefix(obs));
  else VLAC_RETURN_IF_ERROR(im.package->run_prefix(obs));
  const Clock::time_point t2 = Clock::now();
  if (im.folder) VLAC_RETURN_IF_ERROR(im.folder->denoise(noise, out->action_normalized.data()));
  else VLAC_RETURN_IF_ERROR(im.package->denoise(noise, out->action_normalized.data()));
  const Clock::time_point t3 = Clock::now();
  if (im.proc.has_postprocessor) {
    VLAC_ASSIGN_OR_RETURN(out->action, postprocess_pi05_action(out->action_normalized.data(), H, A, im.config, im.proc,
                                                               obs, &out->action_dim));
  } else {  // no postprocessor: the normalized chunk cropped to the real action dims
    const int64_t D = info_.action_dim;
    out->action.resize(size_t(H * D));
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(out->action.data() + h * D, out->action_normalized.data() + h * A, size_t(D) * 4);
    out->action_dim = D;
  }
  out->prompt = obs.prompt;
  const Clock::time_point t4 = Clock::now();
  out->preprocess_ms = ms(t0, t1);
  out->prefix_ms = ms(t1, t2);
  out->denoise_ms = ms(t2, t3);
  out->postprocess_ms = ms(t3, t4);
  return Status::ok();
}

}  // namespace vlac
