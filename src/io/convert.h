// Streaming checkpoint conversion (fp32/fp64/fp16/bf16/fp8 -> bf16|fp16|fp32): tensor by tensor
// through one fixed buffer, source pages dropped behind, output renamed into place only when
// complete. Must never hold a whole tensor or model in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac {

inline constexpr uint64_t kConvertDefaultBufferBytes = 8ull << 20;

struct ConvertOptions {
  uint32_t struct_size = sizeof(ConvertOptions);
  /// A .safetensors file, a *.safetensors.index.json, or a folder holding model.safetensors
  /// or model.safetensors.index.json.
  std::string input;
  /// The output .safetensors path. With max_shard_size, shards "<stem>-00001-of-0000N.safetensors"
  /// and "<stem>.safetensors.index.json" go to this path's folder (<stem> = name minus ".safetensors").
  std::string output;
  /// BF16, F16 or F32. Float tensors are rounded to it (nearest, ties to even); others copied.
  DType target = DType::BF16;
  /// Keep only tensors whose name starts with this, with the prefix stripped; "" keeps all.
  std::string prefix;
  /// Largest tensor-data bytes per output shard (as Hugging Face counts it: headers excluded;
  /// a tensor larger than this gets a shard of its own). 0 = one file.
  uint64_t max_shard_size = 0;
  /// The one conversion buffer; peak memory is about this plus the mapped chunk in flight.
  uint64_t buffer_bytes = kConvertDefaultBufferBytes;
};

struct ConvertStats {
  uint64_t input_bytes = 0;      // tensor bytes read (selected tensors only)
  uint64_t output_bytes = 0;     // bytes of all files written (headers and index included)
  uint64_t n_tensors = 0;        // tensors written
  uint64_t n_converted = 0;      // of those, tensors whose dtype changed
  double seconds = 0;
  std::vector<std::string> output_files;  // final paths: the file, or the shards then the index
};

/// Called after each chunk with input tensor bytes done and the total to do.
using ConvertProgressFn = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

/// Converts options.input into options.output. Errors: InvalidArgument (bad option, output ==
/// input), NotFound (no tensor under the prefix, missing input), reader errors for bad files,
/// IoError. On any error nothing is left at the output path(s); a killed process may leave
/// hidden ".NAME.vlac-tmp-*" / ".NAME.vlac-part-*" files in the output folder, never NAME.
/// @param stats optional; filled on success.
Status convert_checkpoint(const ConvertOptions& options, ConvertStats* stats = nullptr,
                          const ConvertProgressFn& progress = {});

/// Parses "bf16" | "fp16" | "fp32" (also "bfloat16", "f16", "float16", "f32", "float32", any case).
Result<DType> parse_convert_target(const std::string& text);

/// Converts n elements from `src` (dtype from) into `dst` (dtype to), both float types or equal.
/// Rounds to nearest even; NaN stays NaN, Inf stays Inf, overflow rounds to Inf. F64 goes
/// through round-to-odd f32 so that there is one rounding only. Unaligned pointers are fine.
Status convert_elements(DType from, DType to, const uint8_t* src, uint8_t* dst, uint64_t n);

}  // namespace vlac
