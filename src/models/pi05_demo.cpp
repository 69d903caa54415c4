// Random-weight checkpoint writers (see pi05_demo.h). One fixed buffer; never a whole tensor.
#include "models/pi05_demo.h"
#include <cstdio>
#include "models/pi05_builder.h"
#include <sstream>
#include <fstream>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/dtype.h"

namespace vlac {

namespace {

constexpr size_t kGenBufferBytes = 1u << 20;

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// 24 random bits -> uniform [-0.05, 0.05).
inline float uniform(uint32_t bits) { return static_cast<float>(bits >> 8) * (0.1f / 16777216.0f) - 0.05f; }

// Fills n elements of `dt` at dst from the generator state.
void fill(DType dt, uint8_t* dst, uint64_t n, uint64_t& state) {
  const uint32_t es = dtype_size(dt);
  for (uint64_t i = 0; i < n;) {
    uint64_t r = splitmix64(state);
    // Two 32-bit draws per step.
    for (int half = 0; half < 2 && i < n; ++half, ++i) {
      uint32_t bits = static_cast<uint32_t>(half ? r >> 32 : r);
      uint8_t* p = dst + i * es;
      switch (dt) {
        case DType::F32: { float v = uniform(bits); std::memcpy(p, &v, 4); break; }
        case DType::F64: { double v = uniform(bits); std::memcpy(p, &v, 8); break; }
        case DType::BF16: { uint16_t v = f32_to_bf16(uniform(bits)); std::memcpy(p, &v, 2); break; }
        case DType::F16: { uint16_t v = f32_to_f16(uniform(bits)); std::memcpy(p, &v, 2); break; }
        case DType::BOOL: p[0] = static_cast<uint8_t>(bits & 1u); break;
        case DType::F8_E4M3:
        case DType::F8_E5M2: p[0] = static_cast<uint8_t>(bits & 0x37u); break;  // small, never NaN
        default: {  // integers: small non-negative values, little-endian
          uint64_t v = bits % 100u;
          std::memcpy(p, &v, es);
          break;
        }
      }
    }
  }
}

}  // namespace

Status write_random_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors, uint64_t seed,
                                const std::map<std::string, std::string>& metadata, uint64_t* bytes_written) {
  VLAC_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::create(path, tensors, metadata));
  auto buffer = std::make_unique_for_overwrite<uint8_t[]>(kGenBufferBytes);
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);  // validated by the writer
    const uint64_t es = dtype_size(t.dtype);
    const uint64_t chunk = kGenBufferBytes / es;
    uint64_t state = seed ^ fnv1a(t.name);
    for (uint64_t e = 0; e < n; e += chunk) {
      uint64_t m = std::min(chunk, n - e);
      fill(t.dtype, buffer.get(), m, state);
      VLAC_RETURN_IF_ERROR(writer.write(buffer.get(), m * es));
    }
  }
  uint64_t total = writer.header_bytes() + writer.data_bytes_written();
  VLAC_RETURN_IF_ERROR(writer.finish());
  if (bytes_written != nullptr) *bytes_written = total;
  return Status::ok();
}

Status write_random_pi05_folder(const std::string& dir, const Pi05Dims& dims, Pi05Layout layout, uint64_t seed) {
  VLAC_RETURN_IF_ERROR(dims.validate());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create folder: " + ec.message());
  std::vector<TensorSpec> specs;
  for (const auto& w : pi05_weights(dims, layout)) specs.push_back({w.name, DType::F32, w.shape});
  VLAC_RETURN_IF_ERROR(write_random_safetensors(dir + "/model.safetensors", specs, seed));
  std::string config = pi05_config_json(dims, /*n_cameras=*/2, /*state_dim=*/8, /*action_dim=*/7).dump(2) + "\n";
  VLAC_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(dir + "/config.json"));
  VLAC_RETURN_IF_ERROR(f.write(config.data(), config.size()));
  return f.commit();
}

Status write_synthetic_checkpoint(const std::string& path, uint64_t bytes, uint64_t seed) {
  constexpr int64_t kRows = 4096, kCols = 4096;
  constexpr uint64_t kTensorBytes = kRows * kCols * 4;
  if (bytes < 4) return invalid_argument("synthetic checkpoint size must be at least 4 bytes");
  std::vector<TensorSpec> specs;
  uint64_t left = bytes / 4 * 4;
  for (int i = 0; left > 0; ++i) {
    std::string name = "synthetic.layers." + std::to_string(i) + ".weight";
    if (left >= kTensorBytes) {
      specs.push_back({name, DType::F32, {kRows, kCols}});
      left -= kTensorBytes;
    } else {
      specs.push_back({name, DType::F32, {static_cast<int64_t>(left / 4)}});
      left = 0;
    }
  }
  return write_random_safetensors(path, specs, seed);
}

namespace {

constexpr const char* kEmptyCameraPrefix = "observation.images.empty_camera_";

uint64_t obs_splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// State dim of config.json's input_features (lerobot: observation.state.shape[0]); 0 if absent.
int64_t config_state_dim(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return 0;
  auto feats = j.find("input_features");
  if (feats == j.end() || !feats->is_object()) return 0;
  auto st = feats->find("observation.state");
  if (st == feats->end() || !st->is_object()) return 0;
  auto shape = st->find("shape");
  if (shape == st->end() || !shape->is_array() || shape->size() != 1 || !(*shape)[0].is_number_integer()) return 0;
  return (*shape)[0].get<int64_t>();
}

}  // namespace

// An observation for the policy at `dir`: every configured camera (not lerobot's always-absent
// empty cameras) as float32 CHW in [0, 1] at the model resolution, a pre-tokenized prompt
// (BOS + random ids, right-padded with 0 to tokenizer_max_length, mask true on the valid ones)
// and a float32 state. Dims come from Pi05Model::load (maps the weights, reads none).
Status write_pi05_sample_observation(const std::string& dir, const std::string& path, int64_t n_valid, uint64_t seed) {
  VLAC_ASSIGN_OR_RETURN(Pi05Model model, Pi05Model::load(dir));
  const Pi05Config& cfg = model.config();
  const Pi05Dims& d = model.dims();
  const int64_t L = cfg.tokenizer_max_length;
  if (n_valid < 1 || n_valid > L)
    return invalid_argument("prompt tokens must be in [1, tokenizer_max_length = " + std::to_string(L) + "], got " +
                            std::to_string(n_valid));
  int64_t state_dim = config_state_dim(dir + "/config.json");
  if (state_dim <= 0) state_dim = cfg.max_state_dim;

  std::vector<std::string> cams;
  for (const auto& c : cfg.cameras)
    if (c.rfind(kEmptyCameraPrefix, 0) != 0) cams.push_back(c);
  const int64_t img_numel = d.channels * d.image_size * d.image_size;
  std::vector<TensorSpec> specs;
  for (const auto& c : cams) specs.push_back({c, DType::F32, {d.channels, d.image_size, d.image_size}});
  specs.push_back({"observation.language.attention_mask", DType::BOOL, {L}});
  specs.push_back({"observation.language.tokens", DType::I64, {L}});
  specs.push_back({"observation.state", DType::F32, {state_dim}});
  VLAC_ASSIGN_OR_RETURN(SafetensorsWriter w,
                        SafetensorsWriter::create(path, specs, {{"format", "pt"}, {"producer", "vlac"}}));
  uint64_t state = seed ^ 0x6F62735F73656564ull;  // "obs_seed"
  auto unit = [&] { return float(obs_splitmix64(state) >> 40) / 16777216.0f; };  // [0, 1)
  std::vector<float> img(static_cast<size_t>(img_numel));
  for (size_t ci = 0; ci < cams.size(); ++ci) {
    for (auto& v : img) v = unit();
    VLAC_RETURN_IF_ERROR(w.write(img.data(), img.size() * 4));
  }
  std::vector<uint8_t> mask(static_cast<size_t>(L), 0);
  std::vector<int64_t> tokens(static_cast<size_t>(L), 0);
  // Ids below 1000 exist in every vocabulary vlac builds (demo: 1024; PaliGemma: 257152).
  const int64_t id_hi = std::min<int64_t>(d.vocab, 1000);
  for (int64_t i = 0; i < n_valid; ++i) {
    mask[size_t(i)] = 1;
    tokens[size_t(i)] = i == 0 ? std::min<int64_t>(2, d.vocab - 1) : 3 + int64_t(obs_splitmix64(state) % uint64_t(id_hi - 3));
  }
  VLAC_RETURN_IF_ERROR(w.write(mask.data(), mask.size()));
  VLAC_RETURN_IF_ERROR(w.write(tokens.data(), tokens.size() * 8));
  std::vector<float> st(static_cast<size_t>(state_dim));
  for (auto& v : st) v = unit() * 2.0f - 1.0f;
  VLAC_RETURN_IF_ERROR(w.write(st.data(), st.size() * 4));
  VLAC_RETURN_IF_ERROR(w.finish());
  return Status::ok();
}


}  // namespace vlac
