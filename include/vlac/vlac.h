// libvlac's public API: a small, stable surface over the modules. No exceptions cross it and
// no internal header is needed to use it. Thread safety: every function may be called from any
// thread; calls share no state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlac::api {

/// "0.1.0"
const char* version_string();

/// Outcome of a call: exit_code 0 on success, 2 for bad input (a file, a flag), 1 otherwise;
/// `message` names the file/tensor and the problem.
struct Error {
  int exit_code = 0;
  std::string message;
  explicit operator bool() const { return exit_code != 0; }
};

struct ConvertRequest {
  uint32_t struct_size = sizeof(ConvertRequest);
  std::string input;            ///< .safetensors file, *.safetensors.index.json or a folder
  std::string output;           ///< .safetensors path (written atomically)
  std::string dtype = "bf16";   ///< bf16 | fp16 | fp32
  std::string prefix;           ///< keep only tensors under this prefix, stripped ("" = all)
  uint64_t max_shard_bytes = 0; ///< 0 = one file
};

/// Streams `input` to `output` in bounded memory (see docs/convert.md).
Error convert(const ConvertRequest& request);

struct CheckpointSummary {
  uint64_t n_tensors = 0;
  uint64_t total_bytes = 0;
  std::vector<std::string> files;
};

/// Validates the header(s) of a checkpoint without touching tensor data.
/// @param out filled on success; owned by the caller.
Error summarize_checkpoint(const std::string& path, CheckpointSummary* out);

}  // namespace vlac::api
