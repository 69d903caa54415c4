// Random-weight checkpoint writers (see pi05_demo.h). One fixed buffer; never a whole tensor.
#include "models/pi05_demo.h"

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

}  // namespace vlac
