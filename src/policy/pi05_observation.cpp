// Observation reading and pre/post-processing for pi0.5, in lerobot's order: rename → cache raw
// state → normalize → prompt with discretized state → tokenize; images: /255, CHW, resize-with-pad.
// Every check on file data returns a Status naming the file and key; nothing here asserts.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "policy/pi05_observation.h"

#include <algorithm>
#include <map>
#include <cmath>
#include <cstring>

#include "io/json_reader.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "policy/pi05_image.h"

namespace vlac {

namespace {

constexpr const char* kTokKey = "observation.language.tokens";
constexpr const char* kMaskKey = "observation.language.attention_mask";
constexpr const char* kStateKey = "observation.state";

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

// The tensor that becomes policy key `key` after the preprocessor's rename_map (lerobot renames
// every observation key k to rename_map.get(k, k)). *file_key receives the name in the file.
const ObsTensor* find_renamed(const ObsSource& f, const Pi05Processor* proc, const std::string& key,
                               std::string* file_key) {
  if (proc) {
    for (const auto& [from, to] : proc->rename_map)
      if (to == key)
        if (const ObsTensor* t = f.find(from)) {
          *file_key = from;
          return t;
        }
    if (proc->rename_map.count(key)) return nullptr;  // renamed away to another key
  }
  *file_key = key;
  return f.find(key);
}

// Whether the preprocessor's normalizer touches observation key `key`, and its feature type.
bool normalizes(const Pi05Processor* proc, const std::string& key, std::string* type) {
  if (!proc || !proc->normalizer) return false;
  const Pi05Normalizer& n = *proc->normalizer;
  auto f = n.features.find(key);
  if (f == n.features.end() || f->second.type == "ACTION") return false;
  if (n.normalize_observation_keys &&
      std::find(n.normalize_observation_keys->begin(), n.normalize_observation_keys->end(), key) ==
          n.normalize_observation_keys->end())
    return false;
  *type = f->second.type;
  return n.mode_for(key, *type) != NormMode::Identity;
}

// One camera frame → float CHW [0,1] at the model resolution (lerobot: prepare_observation_for_
// inference, the normalizer step, then _preprocess_images).
Result<std::vector<float>> read_image(const ObsTensor& t, const std::string& key,
                                      const std::string& path, int64_t channels, int64_t res,
                                      const Pi05Processor* proc) {
  if (t.dtype != DType::F32 && t.dtype != DType::U8)
    return shape_mismatch(path + ": '" + key + "' has dtype " + dtype_name(t.dtype) +
                          ", expected F32 (CHW in [0, 1]) or U8 (an HWC camera frame)");
  const std::vector<int64_t> s = unbatched(t.shape, 3);
  bool chw;
  if (s.size() == 3 && t.dtype == DType::U8) chw = s[2] != channels && s[0] == channels;
  else if (s.size() == 3) chw = s[0] == channels || s[2] != channels;
  else chw = true;
  const bool ok_layout = s.size() == 3 && (chw ? s[0] == channels : s[2] == channels);
  if (!ok_layout)
    return shape_mismatch(path + ": '" + key + "' has shape " + shape_str(t.shape) + ", expected [" +
                          std::to_string(channels) + ", H, W] or [H, W, " + std::to_string(channels) +
                          "] (optionally with a leading batch dim of 1)");
  const int64_t H = chw ? s[1] : s[0], W = chw ? s[2] : s[1], C = channels;
  if (H < 1 || W < 1) return shape_mismatch(path + ": '" + key + "' is an empty frame " + shape_str(t.shape));
  if (H != res || W != res) {
    int64_t rh = 0, rw = 0;
    resize_with_pad_size(H, W, res, res, &rh, &rw);
    if (rh < 1 || rw < 1)
      return invalid_argument(path + ": '" + key + "' is " + std::to_string(H) + "x" + std::to_string(W) +
                              ": too thin to resize to " + std::to_string(res) + "x" + std::to_string(res) +
                              " (a side would become 0 pixels)");
  }
  const uint8_t* p = t.bytes;
  const size_t n = size_t(C * H * W);
  std::vector<float> img(n);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const size_t src = chw ? size_t((c * H + y) * W + x) : size_t((y * W + x) * C + c);
        float v;
        if (t.dtype == DType::U8) v = float(p[src]) / 255.0f;
        else std::memcpy(&v, p + 4 * src, 4);
        img[size_t((c * H + y) * W + x)] = v;
      }
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(img[i]))
      return invalid_argument(path + ": '" + key + "' holds a non-finite value at element " + std::to_string(i));
  std::string type;
  if (normalizes(proc, key, &type))
    VLAC_RETURN_IF_ERROR(proc->normalizer->apply(key, type, img.data(), n, false, size_t(C), size_t(H * W)));
  if (H == res && W == res) return img;  // lerobot resizes (and clamps) only when the size differs
  return resize_with_pad_chw(img.data(), C, H, W, res, res);
}

Status read_tokens(const ObsSource& f, const ObsTensor* tok, const std::string& path, int64_t vocab,
                   Pi05Observation* obs) {
  const ObsTensor* mask = f.find(kMaskKey);
  if (!mask) return not_found(path + ": missing key '" + std::string(kMaskKey) + "' (bool [L])");
  const std::vector<int64_t> ts = unbatched(tok->shape, 1);
  if (ts.size() != 1 || (tok->dtype != DType::I64 && tok->dtype != DType::I32))
    return shape_mismatch(path + ": '" + kTokKey + "' is " + dtype_name(tok->dtype) + shape_str(tok->shape) +
                          ", expected I64 [L] (optionally [1, L])");
  const int64_t L = ts[0];
  if (unbatched(mask->shape, 1) != ts)
    return shape_mismatch(path + ": '" + kMaskKey + "' has shape " + shape_str(mask->shape) + ", expected " +
                          shape_str(ts) + " like the tokens");
  if (mask->dtype != DType::BOOL && mask->dtype != DType::U8 && mask->dtype != DType::I64 && mask->dtype != DType::I32)
    return shape_mismatch(path + ": '" + kMaskKey + "' has dtype " + dtype_name(mask->dtype) +
                          ", expected BOOL or an integer type");
  const uint8_t* tp = tok->bytes;
  const uint8_t* mp = mask->bytes;
  const uint32_t ms = dtype_size(mask->dtype);
  for (int64_t i = 0; i < L; ++i) {
    bool on = false;
    for (uint32_t b = 0; b < ms; ++b) on = on || mp[uint64_t(i) * ms + b] != 0;
    if (!on) continue;
    int64_t id;
    if (tok->dtype == DType::I64) {
      std::memcpy(&id, tp + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, tp + 4 * i, 4);
      id = v;
    }
    if (id < 0 || (vocab > 0 && id >= vocab))
      return invalid_argument(path + ": '" + kTokKey + "' holds id " + std::to_string(id) + " at position " +
                              std::to_string(i) + ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    obs->tokens.push_back(id);
  }
  return Status::ok();
}

// Builds and tokenizes lerobot's pi0.5 prompt from the state and the task.
Status build_prompt(const ObsSource& f, const std::string& path, const Pi05Processor* proc,
                    const std::string& task_override, bool have_state, int64_t vocab, Pi05Observation* obs) {
  if (!proc || !proc->tokenizer_step)
    return not_found(path + ": missing key '" + std::string(kTokKey) +
                     "' (int64 [L], pre-tokenized prompt), and the policy has no processor "
                     "(policy_preprocessor.json with a tokenizer step) to build the prompt from the state and task");
  if (!proc->tokenizer)
    return not_found(path + ": no pre-tokenized prompt ('" + std::string(kTokKey) +
                     "') and no tokenizer to build one: put the PaliGemma SentencePiece model at " + proc->origin +
                     "/tokenizer/tokenizer.model or pass --tokenizer PATH (a tokenizer.model or a folder holding it)");
  const Pi05TokenizerStep& ts = *proc->tokenizer_step;
  std::string task;
  if (!task_override.empty()) {
    task = task_override;
  } else {
    auto it = f.metadata.find(ts.task_key);
    if (it == f.metadata.end())
      return not_found(path + ": no task: the file's __metadata__ has no '" + ts.task_key +
                       "' and --task was not given");
    task = it->second;
  }
  if (proc->state_prompt) {
    if (!have_state)
      return not_found(path + ": missing key '" + std::string(kStateKey) +
                       "' (float32 [S], the raw robot state): pi0.5 writes the state into its prompt");
    obs->state_normalized = obs->state_raw;
    std::string type;
    if (normalizes(proc, kStateKey, &type)) {
      const auto& feat = proc->normalizer->features.at(kStateKey);
      if (feat.shape.size() == 1 && feat.shape[0] != int64_t(obs->state_raw.size()))
        return shape_mismatch(path + ": '" + std::string(kStateKey) + "' has " + std::to_string(obs->state_raw.size()) +
                              " values, the policy's normalizer expects " + std::to_string(feat.shape[0]));
      VLAC_RETURN_IF_ERROR(proc->normalizer->apply(kStateKey, type, obs->state_normalized.data(),
                                                   obs->state_normalized.size(), false, obs->state_normalized.size()));
    }
    obs->prompt = pi05_prompt(task, pi05_discretize_state(obs->state_normalized.data(), obs->state_normalized.size()));
  } else {
    obs->prompt = task;  // without lerobot's pi0.5 state step the tokenizer sees the task as is
  }
  VLAC_ASSIGN_OR_RETURN(TokenizedPrompt tp, tokenize_prompt(*proc->tokenizer, obs->prompt, ts.options));
  obs->lang_tokens = tp.ids;
  obs->lang_mask = tp.mask;
  for (size_t i = 0; i < tp.ids.size(); ++i) {
    if (!tp.mask[i]) continue;
    if (vocab > 0 && (tp.ids[i] < 0 || tp.ids[i] >= vocab))
      return invalid_argument(proc->tokenizer->origin() + ": token id " + std::to_string(tp.ids[i]) +
                              " is outside the model's vocabulary [0, " + std::to_string(vocab) +
                              "): this tokenizer does not belong to the policy");
    obs->tokens.push_back(tp.ids[i]);
  }
  return Status::ok();
}

}  // namespace

uint64_t ObsTensor::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

const ObsTensor* ObsSource::find(const std::string& key) const {
  auto it = tensors.find(key);
  return it == tensors.end() ? nullptr : &it->second;
}

Result<Pi05Observation> read_pi05_observation(const std::string& obs_path, const Pi05Config& cfg, int64_t channels,
                                              const Pi05Processor* proc, const std::string& task_override,
                                              int64_t vocab) {
  VLAC_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(obs_path));
  ObsSource src;  // views into the map, which outlives the read
  src.origin = obs_path;
  src.metadata = file.metadata();
  for (const TensorInfo& t : file.tensors()) src.tensors[t.name] = ObsTensor{t.dtype, t.shape, file.data(t)};
  return read_pi05_observation(src, cfg, channels, proc, task_override, vocab);
}

Result<Pi05Observation> read_pi05_observation(const ObsSource& f, const Pi05Config& cfg, int64_t channels,
                                              const Pi05Processor* proc, const std::string& task_override,
                                              int64_t vocab) {
  const std::string& path = f.origin;
  Pi05Observation obs;
  for (const std::string& cam : cfg.cameras) {
    std::string fk;
    const ObsTensor* t = find_renamed(f, proc, cam, &fk);
    if (!t) continue;  // absent camera: masked, as lerobot does
    VLAC_ASSIGN_OR_RETURN(std::vector<float> img,
                          read_image(*t, fk, path, channels, cfg.image_resolution, proc));
    obs.cameras.push_back(cam);
    obs.images.push_back(std::move(img));
  }
  if (obs.cameras.empty()) {
    std::string list;
    for (const auto& c : cfg.cameras) list += (list.empty() ? "" : ", ") + c;
    return not_found(path + ": no camera of the policy is present (expected at least one of " + list + ")");
  }
  // The raw state (lerobot's relative step caches it before normalization).
  std::string sk;
  const ObsTensor* st = find_renamed(f, proc, kStateKey, &sk);
  if (st) {
    const std::vector<int64_t> s = unbatched(st->shape, 1);
    if (st->dtype != DType::F32 || s.size() != 1 || s[0] < 1)
      return shape_mismatch(path + ": '" + sk + "' is " + std::string(dtype_name(st->dtype)) + shape_str(st->shape) +
                            ", expected F32 [S] (optionally [1, S])");
    obs.state_raw.resize(size_t(s[0]));
    std::memcpy(obs.state_raw.data(), st->bytes, st->nbytes());
    for (size_t i = 0; i < obs.state_raw.size(); ++i)
      if (!std::isfinite(obs.state_raw[i]))
        return invalid_argument(path + ": '" + sk + "' holds " + (std::isnan(obs.state_raw[i]) ? "NaN" : "an infinity") +
                                " at element " + std::to_string(i));
  }
  std::string tk;
  if (const ObsTensor* tok = find_renamed(f, proc, kTokKey, &tk)) {
    VLAC_RETURN_IF_ERROR(read_tokens(f, tok, path, vocab, &obs));  // pre-tokenized ids take precedence
  } else {
    VLAC_RETURN_IF_ERROR(build_prompt(f, path, proc, task_override, st != nullptr, vocab, &obs));
  }
  return obs;
}

Result<std::vector<float>> postprocess_pi05_action(const float* action_normalized, int64_t H, int64_t A,
                                                   const Pi05Config& cfg, const Pi05Processor& proc,
                                                   const Pi05Observation& obs, int64_t* action_dim) {
  int64_t D = cfg.action_dim;
  if (D <= 0 && proc.unnormalizer) {
    auto it = proc.unnormalizer->features.find("action");
    if (it != proc.unnormalizer->features.end() && it->second.shape.size() == 1) D = it->second.shape[0];
  }
  if (D <= 0) D = A;
  if (D > A)
    return invalid_format(proc.origin + ": the action has " + std::to_string(D) + " dims, more than max_action_dim " +
                          std::to_string(A));
  std::vector<float> a(size_t(H * D));
  for (int64_t h = 0; h < H; ++h)
    std::memcpy(a.data() + h * D, action_normalized + h * A, size_t(D) * 4);  // crop to the real dims
  if (proc.unnormalizer)
    VLAC_RETURN_IF_ERROR(proc.unnormalizer->apply("action", "ACTION", a.data(), a.size(), true, size_t(D)));
  if (proc.absolute_enabled) {
    if (obs.state_raw.empty())
      return not_found(proc.origin + "/policy_postprocessor.json: relative actions are enabled "
                       "(absolute_actions_processor) but the observation has no 'observation.state' to add back");
    if (int64_t(obs.state_raw.size()) < D && obs.state_raw.size() != 1)
      return shape_mismatch("'observation.state' has " + std::to_string(obs.state_raw.size()) +
                            " values, fewer than the " + std::to_string(D) +
                            " action dims that relative actions add it to");
    const std::vector<bool> mask = proc.relative_mask(D);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < D; ++j) {
        const float s = obs.state_raw.size() == 1 ? obs.state_raw[0] : obs.state_raw[size_t(j)];
        a[size_t(h * D + j)] = a[size_t(h * D + j)] + s * (mask[size_t(j)] ? 1.0f : 0.0f);
      }
  }
  *action_dim = D;
  return a;
}

Status write_pi05_run_output(const std::string& out, const float* action_normalized, int64_t H, int64_t A,
                             const Pi05Config& cfg, const Pi05Processor& proc, const Pi05Observation& obs,
                             bool bf16, int64_t* action_dim) {
  std::vector<float> robot_action;  // [H, D] after the postprocessor, when there is one
  int64_t D = 0;
  if (proc.has_postprocessor) {
    VLAC_ASSIGN_OR_RETURN(robot_action, postprocess_pi05_action(action_normalized, H, A, cfg, proc, obs, &D));
  }
  std::vector<TensorSpec> specs{{"action_normalized", DType::F32, {H, A}}};
  if (!robot_action.empty()) specs.push_back({"action", DType::F32, {H, D}});
  std::map<std::string, std::string> meta{{"producer", "vlac run"}, {"dtype", bf16 ? "bf16" : "fp32"}};
  if (!obs.prompt.empty()) meta["prompt"] = obs.prompt;
  VLAC_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(out, specs, meta));
  VLAC_RETURN_IF_ERROR(w.write(action_normalized, size_t(H * A) * 4));
  if (!robot_action.empty()) VLAC_RETURN_IF_ERROR(w.write(robot_action.data(), robot_action.size() * 4));
  VLAC_RETURN_IF_ERROR(w.finish());
  if (action_dim) *action_dim = robot_action.empty() ? 0 : D;
  return Status::ok();
}

}  // namespace vlac
