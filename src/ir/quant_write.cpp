// Streams a weight into a quantized blob (see quant_write.h).
#include "ir/quant_write.h"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "core/quant.h"

namespace vlac::ir {

namespace {

void widen_row(const uint8_t* src, DType st, int64_t k, float* dst) {
  if (st == DType::F32) {
    std::memcpy(dst, src, size_t(k) * 4);
    return;
  }
  for (int64_t i = 0; i < k; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = st == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
}

}  // namespace

Result<uint64_t> write_quant_matrix(AtomicFile& out, WeightSource& source, const WeightRef& r, DType dt, uint64_t at,
                                    uint8_t* buf, uint64_t buf_bytes, const std::function<void(uint64_t)>& written,
                                    const QuantCalibration* calib) {
  if (!is_quant_dtype(dt)) return internal_error("quantize: '" + r.name + "': " + dtype_name(dt) + " is no 8-bit weight dtype");
  if (r.shape.size() != 2 || r.shape[0] <= 0 || r.shape[1] <= 0)
    return unsupported("quantize: '" + r.name + "' is not a matrix: only [N, K] weights take per-row scales");
  const int64_t n = r.shape[0], k = r.shape[1];
  const std::vector<WeightRef> single = r.parts.empty() ? std::vector<WeightRef>{r} : std::vector<WeightRef>{};
  const std::vector<WeightRef>& pieces = r.parts.empty() ? single : r.parts;
  // The row in fp32 first, then as many rows of codes as fit behind it.
  const uint64_t row_f32 = uint64_t(k) * 4;
  if (buf_bytes < row_f32 + uint64_t(k)) return internal_error("quantize: '" + r.name + "': buffer smaller than one row");
  auto* rowf = reinterpret_cast<float*>(buf);
  uint8_t* codes = buf + row_f32;
  const int64_t batch = int64_t((buf_bytes - row_f32) / uint64_t(k));
  std::vector<float> scales;
  scales.reserve(size_t(n));
  uint64_t pos = at;
  for (const WeightRef& p : pieces) {
    if (p.dtype != DType::F32 && p.dtype != DType::BF16 && p.dtype != DType::F16)
      return unsupported("tensor '" + p.name + "' has dtype " + dtype_name(p.dtype) + " (8-bit weights are made from F32, BF16, F16)");
    if (p.shape.size() != 2 || p.shape[1] != k)
      return internal_error("quantize: part '" + p.name + "' does not fit fused weight '" + r.name + "'");
    const uint64_t es = dtype_size(p.dtype), row_bytes = uint64_t(k) * es;
    if (uint64_t(p.shape[0]) * row_bytes != p.bytes)
      return internal_error("quantize: '" + p.name + "' holds " + std::to_string(p.bytes) + " bytes, not its shape's");
    // The parts of a fused weight read the same x: their statistics are those of any of them.
    const InputStats* stats = calib ? calib->find(p.name) : nullptr;
    if (!stats && calib) stats = calib->find(r.name);
    std::optional<GptqFactor> factor;
    if (stats && stats->k == k) {
      VLAC_ASSIGN_OR_RETURN(factor, gptq_factor(*stats, calib->damp(), p.name, calib->act_order()));
      calib->note_applied();
    }
    VLAC_ASSIGN_OR_RETURN(const uint8_t* base, source.map(p));
    auto keep = [&](int64_t row, float s) -> Status {
      if (!(s == s))
        return invalid_format("tensor '" + p.name + "' row " + std::to_string(row) +
                              " holds NaN or Inf: it cannot be stored with a scale");
      scales.push_back(s);
      return Status::ok();
    };
    for (int64_t r0 = 0; r0 < p.shape[0]; r0 += batch) {
      const int64_t r1 = std::min<int64_t>(p.shape[0], r0 + batch);
      // GPTQ costs ~k·block/2 multiply-adds a row: its rows go to the calibration's threads,
      // each widening into its own fp32 row (the caller's thread into the buffer's). Nearest
      // rounding stays on the caller's thread. Each row's codes depend on that row alone.
      const int64_t nt = factor ? std::min<int64_t>(calib->threads(), r1 - r0) : 1;
      std::vector<float> bs(size_t(r1 - r0));
      std::atomic<int64_t> next{r0};
      auto work = [&](float* rw) {
        for (int64_t row; (row = next.fetch_add(1)) < r1;) {
          widen_row(base + uint64_t(row) * row_bytes, p.dtype, k, rw);
          uint8_t* rc = codes + uint64_t(row - r0) * uint64_t(k);
          bs[size_t(row - r0)] = factor ? quantize_row_gptq(rw, k, dt, rc, *factor) : quantize_row(rw, k, dt, rc);
        }
      };
      std::vector<std::thread> pool;
      for (int64_t t = 1; t < nt; ++t)
        pool.emplace_back([&] {
          std::vector<float> rw(static_cast<size_t>(k));
          work(rw.data());
        });
      work(rowf);
      for (std::thread& t : pool) t.join();
      for (int64_t row = r0; row < r1; ++row) VLAC_RETURN_IF_ERROR(keep(row, bs[size_t(row - r0)]));
      const uint64_t bytes = uint64_t(r1 - r0) * uint64_t(k);
      VLAC_RETURN_IF_ERROR(out.pwrite(codes, bytes, pos));
      pos += bytes;
      source.release_range(p, uint64_t(r0) * row_bytes, uint64_t(r1 - r0) * row_bytes);  // memory rule 1
      if (written) written(pos);
    }
    source.release(p);
  }
  if (int64_t(scales.size()) != n)
    return internal_error("quantize: the parts of '" + r.name + "' hold " + std::to_string(scales.size()) + " rows, not " +
                          std::to_string(n));
  const uint64_t soff = quant_scales_offset(n, k);
  static const uint8_t kZeros[64] = {};
  if (at + soff > pos) VLAC_RETURN_IF_ERROR(out.pwrite(kZeros, at + soff - pos, pos));
  VLAC_RETURN_IF_ERROR(out.pwrite(scales.data(), uint64_t(n) * 4, at + soff));
  if (written) written(at + soff + uint64_t(n) * 4);
  return stored_weight_bytes(dt, r.shape);
}

}  // namespace vlac::ir
