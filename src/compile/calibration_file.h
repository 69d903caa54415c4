// The calibration statistics in a file of their own: `vlac compile --calibrate OBS
// --calibrate-save FILE` writes them, `--calibrate-stats FILE` reads them back instead of running
// the observations again. One fp32 calibration run then serves every 8-bit dtype and damping:
// the statistics (ir::QuantCalibration, Σ x xᵀ per Linear) depend on neither.
//
// The file is safetensors: one F32 tensor per weight, named for it, holding its block-diagonal
// InputStats::h; metadata "format" (kCalibrationFormat), "block", "weights" (JSON: each weight's
// k and observed rows) and the writer's own entries (which observations, how many noise draws).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/status.h"
#include "ir/quant_calib.h"

namespace vlac {

inline constexpr const char* kCalibrationFormat = "vlac-gptq-statistics-1";

/// Writes c's statistics and `info` (metadata entries; not format, block or weights) to `path`,
/// through a temporary name renamed into place.
Status save_calibration(const ir::QuantCalibration& c, const std::string& path,
                        const std::map<std::string, std::string>& info);

/// A statistics file read back: the calibration (in the file's block, with the caller's GPTQ
/// damping, order and threads, which the statistics do not depend on) and the writer's entries.
struct CalibrationFile {
  std::unique_ptr<ir::QuantCalibration> calib;
  std::map<std::string, std::string> info;
};
/// Reads a file save_calibration wrote, in one pass. Every problem is one error naming the file:
/// not safetensors, another format, a weight without its k, a tensor whose size is not its k and
/// block's.
Result<CalibrationFile> read_calibration(const std::string& path, double damp, bool act_order, int threads);

}  // namespace vlac
