// The compile side of 8-bit weights (core/quant.h): one stored weight streamed from its
// checkpoint into an engine file as a quantized blob, row by row. Shared by the CPU and CUDA
// engine writers, so both backends' packages hold the same bytes for the same weight.
#pragma once

#include <cstdint>
#include <functional>

#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/status.h"
#include "ir/backend.h"
#include "ir/graph.h"
#include "ir/quant_calib.h"

namespace vlac::ir {

/// Writes `r` (a [N,K] tensor of F32/BF16/F16, or the rows of r.parts in order) as the blob of
/// `dt` (I8 or F8_E4M3) at byte `at` of `out`; returns the blob's size (stored_weight_bytes).
/// Memory: `buf` (at least one row of K floats plus K codes; more batches writes) and N scales.
/// Source bytes are released behind the reader; `written(end)` is called after each write with
/// the file offset reached (the caller flushes behind it). A row holding NaN or Inf is refused
/// with the tensor's name. With `calib` holding statistics for a part (by its name, else the fused
/// weight's), that part's rows are rounded by GPTQ (ir/quant_calib.h): same scales, other codes.
Result<uint64_t> write_quant_matrix(AtomicFile& out, WeightSource& source, const WeightRef& r, DType dt, uint64_t at,
                                    uint8_t* buf, uint64_t buf_bytes,
                                    const std::function<void(uint64_t end)>& written = nullptr,
                                    const QuantCalibration* calib = nullptr);

}  // namespace vlac::ir
