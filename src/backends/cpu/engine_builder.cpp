// CPU engine builder (see engine_builder.h). Memory: one chunk buffer, whatever the weights.
#include "backends/cpu/engine_builder.h"

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/atomic_file.h"
#include "core/quant.h"
#include "ir/quant_write.h"

namespace vlac::cpu {

void release_heap() { ::malloc_trim(0); }

namespace {

// Writes back and drops the file's page cache behind us, so dirty pages stay bounded.
void flush_behind(int fd, uint64_t begin, uint64_t end) {
  if (end <= begin) return;
  ::sync_file_range(fd, off_t(begin), off_t(end - begin),
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
  ::posix_fadvise(fd, off_t(begin), off_t(end - begin), POSIX_FADV_DONTNEED);
}

}  // namespace

Result<EngineFile> write_cpu_engine_file(const std::string& path, const std::vector<StoredWeight>& store,
                                         WeightSource& source, uint64_t chunk_bytes,
                                         const ir::QuantCalibration* calibration) {
  chunk_bytes = std::max<uint64_t>(chunk_bytes / 4 * 4, 4096);
  VLAC_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(path));
  std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[chunk_bytes]);
  if (!buf) return Status(StatusCode::ResourceExhausted, "engine builder: no memory for an I/O buffer");
  EngineFile ef;
  ef.path = path;
  uint64_t end = 0, flushed = 0;
  static const uint8_t kZeros[kEngineAlign] = {};
  for (size_t i = 0; i < store.size(); ++i) {
    const ir::WeightRef& r = store[i].ref;
    const DType want = store[i].run_dtype;
    if (want != DType::F32 && want != DType::BF16 && !is_quant_matrix(want, r.shape))
      return internal_error("engine builder: run dtype must be F32, BF16 or (a matrix) I8 / F8_E4M3");
    if (r.dtype != DType::F32 && r.dtype != DType::BF16 && r.dtype != DType::F16)
      return unsupported("tensor '" + r.name + "' has dtype " + dtype_name(r.dtype) + " (the CPU backend reads F32, BF16, F16)");
    if (want == DType::BF16 && r.dtype == DType::F16) return unsupported("tensor '" + r.name + "': no F16 -> BF16 path");
    const uint64_t pad = (kEngineAlign - end % kEngineAlign) % kEngineAlign;
    if (pad) VLAC_RETURN_IF_ERROR(out.pwrite(kZeros, pad, end));
    end += pad;
    if (is_quant_matrix(want, r.shape)) {  // codes + per-row scales, streamed row by row
      VLAC_ASSIGN_OR_RETURN(uint64_t bytes,
                            ir::write_quant_matrix(out, source, r, want, end, buf.get(), chunk_bytes, [&](uint64_t at) {
                              if (at - flushed >= (32ull << 20)) {
                                flush_behind(out.fd(), flushed, at / 4096 * 4096);
                                flushed = at / 4096 * 4096;
                              }
                            }, calibration));
      ef.weights.push_back(EngineWeight{r.name, want, r.shape, end, bytes});
      end += bytes;
      continue;
    }
    VLAC_ASSIGN_OR_RETURN(const uint8_t* base, source.map(r));
    const uint64_t in_size = dtype_size(r.dtype), out_size = dtype_size(want);
    const uint64_t n = r.bytes / in_size;
    EngineWeight w{r.name, want, r.shape, end, n * out_size};
    // Elements per chunk, bounded by the buffer on the output side.
    const uint64_t per = chunk_bytes / std::max(in_size, out_size);
    for (uint64_t k0 = 0; k0 < n; k0 += per) {
      const uint64_t k1 = std::min(n, k0 + per);
      const uint8_t* src = base + k0 * in_size;
      uint8_t* dst = buf.get();
      if (r.dtype == want) {
        std::memcpy(dst, src, (k1 - k0) * in_size);
      } else if (want == DType::BF16) {
        for (uint64_t k = 0; k < k1 - k0; ++k) {
          float v;
          std::memcpy(&v, src + 4 * k, 4);
          const uint16_t h = f32_to_bf16(v);
          std::memcpy(dst + 2 * k, &h, 2);
        }
      } else {
        for (uint64_t k = 0; k < k1 - k0; ++k) {
          uint16_t h;
          std::memcpy(&h, src + 2 * k, 2);
          const float v = r.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
          std::memcpy(dst + 4 * k, &v, 4);
        }
      }
      VLAC_RETURN_IF_ERROR(out.pwrite(dst, (k1 - k0) * out_size, end + k0 * out_size));
      // Source bytes are not read again by this engine (memory rule 1).
      source.release_range(r, k0 * in_size, (k1 - k0) * in_size);
      const uint64_t written = end + k1 * out_size;
      if (written - flushed >= (32ull << 20)) {
        flush_behind(out.fd(), flushed, written / 4096 * 4096);
        flushed = written / 4096 * 4096;
      }
    }
    source.release(r);
    end += w.bytes;
    ef.weights.push_back(std::move(w));
  }
  flush_behind(out.fd(), flushed, end);
  VLAC_RETURN_IF_ERROR(out.commit());
  ef.bytes = end;
  buf.reset();
  release_heap();
  return ef;
}

}  // namespace vlac::cpu
