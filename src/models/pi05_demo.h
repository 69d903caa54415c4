// Writers of random-weight checkpoints: a pi0.5-shaped lerobot policy folder (config.json +
// model.safetensors) and a plain synthetic fp32 file for benchmarks. Deterministic (seeded) and
// streamed tensor by tensor through one fixed buffer: memory does not grow with the size written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/safetensors_writer.h"
#include "models/pi05_arch.h"

namespace vlac {

/// Streams seeded uniform [-0.05, 0.05] values into `path` (float tensors; integer and bool
/// tensors get small non-negative values). Values of a tensor depend only on (seed, name).
/// @param bytes_written optional: total bytes of the file.
Status write_random_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors, uint64_t seed,
                                const std::map<std::string, std::string>& metadata = {{"format", "pt"}},
                                uint64_t* bytes_written = nullptr);

/// Creates `dir` (if needed) holding config.json (lerobot format, type pi05, 2 cameras) and
/// model.safetensors (fp32 random weights with lerobot's tensor names for `dims`/`layout`).
/// Both written atomically. With Pi05Dims::full() this is the 16.5 GB fine-tune layout.
Status write_random_pi05_folder(const std::string& dir, const Pi05Dims& dims, Pi05Layout layout, uint64_t seed);

/// A sample observation for the policy folder `dir`: every configured camera (not lerobot's
/// always-absent empty cameras) as float32 CHW in [0, 1] at the model resolution, a
/// pre-tokenized prompt (BOS + `n_valid` - 1 seeded ids, right-padded with 0, mask on the valid
/// ones) and a float32 state. Sized from config.json and the tensor headers (reads no weights).
Status write_pi05_sample_observation(const std::string& dir, const std::string& path, int64_t n_valid, uint64_t seed);

/// A single fp32 safetensors file of about `bytes` tensor bytes (64 MiB tensors
/// "synthetic.layers.N.weight" [4096, 4096] and a smaller last one), for benchmarks.
Status write_synthetic_checkpoint(const std::string& path, uint64_t bytes, uint64_t seed);

}  // namespace vlac
