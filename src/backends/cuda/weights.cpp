// Weight upload (weights.h): layout pass, then one bounded staging loop.
#include "backends/cuda/weights.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "backends/cuda/gemm.h"
#include "core/bytes.h"
#include "core/quant.h"
#include "core/mapped_file.h"

namespace vlac::cuda {

namespace {

constexpr uint64_t kWeightAlign = 256;
// The smallest weight left in the file for the memo: VLAC_ON_DEMAND_WEIGHTS=N bytes (0: none, as
// before; read at each upload, so a test can compare both in one process), default 1 MiB: the
// adaRMS matrices (6 MiB each at full size) go, biases and norm scales stay (a read each is not
// worth their bytes).
uint64_t on_demand_min_bytes() {
  const char* e = std::getenv("VLAC_ON_DEMAND_WEIGHTS");
  if (!e || !*e) return 1ull << 20;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(e, &end, 10);
  if (end == e || *end != '\0' || v == 0) return UINT64_MAX;
  return v;
}

uint64_t align_to(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// n elements of `src` (stored dtype) into `dst` (run dtype): the CPU backend's conversions.
void convert(const uint8_t* src, DType st, uint8_t* dst, DType dt, uint64_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(dt));
    return;
  }
  for (uint64_t k = 0; k < n; ++k) {
    float v;
    if (st == DType::F32) std::memcpy(&v, src + 4 * k, 4);
    else {
      uint16_t h;
      std::memcpy(&h, src + 2 * k, 2);
      v = st == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    if (dt == DType::F32) std::memcpy(dst + 4 * k, &v, 4);
    else {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(dst + 2 * k, &h, 2);
    }
  }
}

}  // namespace

void CudaWeights::move_from(CudaWeights& o) noexcept {
  entries_ = std::move(o.entries_);
  base_ = std::exchange(o.base_, nullptr);
  device_bytes_ = o.device_bytes_;
  mapped_bytes_ = o.mapped_bytes_;
  on_demand_bytes_ = o.on_demand_bytes_;
  max_on_demand_ = o.max_on_demand_;
  for (int i = 0; i < kFetchSlots; ++i) fetch_[i] = std::exchange(o.fetch_[i], FetchSlot{});
}

CudaWeights::CudaWeights(CudaWeights&& o) noexcept { move_from(o); }

CudaWeights& CudaWeights::operator=(CudaWeights&& o) noexcept {
  if (this != &o) {
    GemmRunner::remove_flush_region(base_);
    device_free(base_);
    drop_fetch_buffers();
    move_from(o);
  }
  return *this;
}

CudaWeights::~CudaWeights() {
  GemmRunner::remove_flush_region(base_);
  device_free(base_);
  drop_fetch_buffers();
}

void CudaWeights::drop_fetch_buffers() const {
  bool any = false;
  for (const FetchSlot& f : fetch_) any = any || f.device || f.host || f.done;
  if (!any) return;
  // The last fetched weights may still be read by a queued GEMM: wait for the device, once.
  if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
  for (FetchSlot& f : fetch_) {
    if (f.done) (void)cudaEventDestroy(f.done);
    device_free(f.device);
    host_free(f.host);
    f = FetchSlot{};
  }
}

Result<const void*> CudaWeights::fetch(const Entry& e, int slot, cudaStream_t stream) const {
  const std::string what = "reading on-demand weight '" + e.name + "' (" + std::to_string(e.bytes) + " bytes)";
  if (!e.on_demand || e.fd < 0) return internal_error(what + ": not an on-demand weight");
  if (slot < 0 || slot >= kFetchSlots) return internal_error(what + ": fetch slot out of range");
  FetchSlot& f = fetch_[slot];
  if (!f.device) {
    VLAC_ASSIGN_OR_RETURN(f.device, device_alloc(max_on_demand_, "uploading on-demand weights (memo misses)"));
    VLAC_ASSIGN_OR_RETURN(f.host, host_alloc(max_on_demand_, "the weight staging buffer (on-demand weights)"));
    const cudaError_t ce = cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
      f.done = nullptr;
      return cuda_error(what, ce);
    }
  }
  if (f.pending) {  // the host buffer is still being copied from
    const cudaError_t ce = cudaEventSynchronize(f.done);
    if (ce != cudaSuccess) return cuda_error(what, ce);
    f.pending = false;
  }
  if (!read_at(e.fd, f.host, e.bytes, e.file_offset))
    return Status(StatusCode::IoError, what + " from the package: " + (errno ? std::strerror(errno) : "file too short"));
  cudaError_t ce = cudaMemcpyAsync(f.device, f.host, e.bytes, cudaMemcpyHostToDevice, stream);
  if (ce == cudaSuccess) ce = cudaEventRecord(f.done, stream);
  if (ce != cudaSuccess) return cuda_error(what, ce);
  f.pending = true;
  note_on_demand_fetch(e.bytes);
  return static_cast<const void*>(f.device);
}

const CudaWeights::Entry* CudaWeights::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

Result<CudaWeights> CudaWeights::upload(CudaContext& ctx, const WeightBinding& b) {
  VLAC_RETURN_IF_ERROR(ctx.ensure());
  if (b.run_dtypes.size() != b.refs.size()) return internal_error("cuda weights: one run dtype per weight needed");
  CudaWeights w;
  struct Job {
    size_t ref;
    uint64_t offset;  // in the device allocation
  };
  std::vector<Job> jobs;
  uint64_t total = 0;
  const uint64_t min_on_demand = on_demand_min_bytes();
  for (size_t i = 0; i < b.refs.size(); ++i) {
    const ir::WeightRef& r = b.refs[i];
    if (w.entries_.count(r.name)) continue;
    if (r.file_id >= b.files.size()) return internal_error("weight '" + r.name + "': file id out of range");
    const WeightFileView& f = b.files[r.file_id];
    uint64_t end = 0;
    if (__builtin_add_overflow(r.offset, r.bytes, &end) || end > f.size)
      return invalid_format(f.path + ": tensor '" + r.name + "' lies outside the file");
    const DType want = b.run_dtypes[i];
    // An 8-bit matrix (core/quant.h) is uploaded as compiled, codes and scales: bytes, no conversion.
    const bool quant = is_quant_dtype(want);
    if (quant && (r.dtype != want || !is_quant_matrix(r.dtype, r.shape) || r.bytes != stored_weight_bytes(r.dtype, r.shape)))
      return internal_error("weight '" + r.name + "': " + dtype_name(want) + " weights are bound as compiled, not converted");
    if (!quant && want != DType::F32 && want != DType::BF16)
      return internal_error("weight '" + r.name + "': run dtype must be F32, BF16, I8 or F8_E4M3");
    if (!quant && r.dtype != DType::F32 && r.dtype != DType::BF16 && r.dtype != DType::F16)
      return unsupported(f.path + ": tensor '" + r.name + "' has dtype " + dtype_name(r.dtype) +
                         " (the CUDA backend reads F32, BF16 and F16)");
    const uint8_t* src = f.data + r.offset;
    Entry e;
    e.shape = r.shape;
    e.name = r.name;
    // Left in the file when only the memo reads it, it needs no conversion and the file can be
    // read without a mapping; small ones (biases, norms) are not worth a read each.
    const bool on_demand = i < b.on_demand.size() && b.on_demand[i] && f.fd >= 0 && want == r.dtype &&
                           r.bytes >= min_on_demand;
    const bool gather = i < b.gather_only.size() && b.gather_only[i] && r.dtype != DType::F16 &&
                        (quant || (reinterpret_cast<uintptr_t>(src) % dtype_size(r.dtype) == 0 &&
                                   (want == r.dtype || (want == DType::BF16 && r.dtype == DType::F32))));
    if (gather) {
      e.data = src;
      e.dtype = r.dtype;
      e.host_table = true;
      e.rounds_to_bf16 = want != r.dtype;
      if (f.fd >= 0) e.fd = f.fd, e.file_offset = f.file_offset + r.offset;
      else if (f.map != nullptr && f.map->fd() >= 0) e.fd = f.map->fd(), e.file_offset = uint64_t(src - f.map->data());
      w.mapped_bytes_ += r.bytes;
    } else if (on_demand) {
      e.dtype = want;
      e.on_demand = true;
      e.fd = f.fd;
      e.file_offset = f.file_offset + r.offset;
      e.bytes = r.bytes;
      w.on_demand_bytes_ += r.bytes;
      w.max_on_demand_ = std::max(w.max_on_demand_, r.bytes);
    } else {
      e.dtype = want;
      total = align_to(total, kWeightAlign);
      jobs.push_back({i, total});
      total += quant ? r.bytes : uint64_t(ir::ValueInfo{want, r.shape}.numel()) * dtype_size(want);
    }
    w.entries_.emplace(r.name, std::move(e));
  }
  note_on_demand_weights(w.on_demand_bytes_);
  if (total > 0) {
    VLAC_ASSIGN_OR_RETURN(w.base_, device_alloc(total, "uploading " + std::to_string(jobs.size()) + " weights"));
    w.device_bytes_ = total;
  }
  if (jobs.empty()) return w;

  // Two halves of the staging buffer: one is filled on the host while the other's copy runs.
  const uint64_t staging_bytes = std::min<uint64_t>(kStagingBytes, 2 * align_to(total, 4096));
  VLAC_ASSIGN_OR_RETURN(void* staging_p, host_alloc(staging_bytes, "the weight staging buffer"));
  uint8_t* staging = static_cast<uint8_t*>(staging_p);
  const uint64_t half_bytes = staging_bytes / 2;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  Status st;
  for (auto& e : ev) {
    const cudaError_t ce = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (ce != cudaSuccess && st.is_ok()) st = cuda_error("weight upload event", ce);
  }
  bool pending[2] = {false, false};
  int h = 0;
  for (const Job& j : jobs) {
    if (!st.is_ok()) break;
    const ir::WeightRef& r = b.refs[j.ref];
    const WeightFileView& f = b.files[r.file_id];
    Entry& e = w.entries_.at(r.name);
    uint8_t* dst = static_cast<uint8_t*>(w.base_) + j.offset;
    e.data = dst;
    const bool quant = is_quant_dtype(e.dtype);  // bytes (1-byte elements), copied as they are
    const uint64_t n = quant ? r.bytes : uint64_t(ir::ValueInfo{r.dtype, r.shape}.numel());
    const uint64_t ss = dtype_size(r.dtype), ds = dtype_size(e.dtype);
    const uint64_t per = std::max<uint64_t>(1, half_bytes / std::max(ss, ds));
    for (uint64_t at = 0; at < n && st.is_ok(); at += per) {
      const uint64_t cnt = std::min(per, n - at);
      if (pending[h]) {
        const cudaError_t ce = cudaEventSynchronize(ev[h]);
        if (ce != cudaSuccess) {
          st = cuda_error("uploading weight '" + r.name + "'", ce);
          break;
        }
      }
      uint8_t* buf = staging + uint64_t(h) * half_bytes;
      convert(f.data + r.offset + at * ss, r.dtype, buf, e.dtype, cnt);
      // These source bytes are not read again: their pages leave this process (memory rule 1),
      // chunk by chunk, so an engine's upload holds at most a chunk of them, not the segment.
      if (f.map) f.map->drop(r.offset + at * ss, cnt * ss);
      else if (f.release) f.release(r.offset + at * ss, cnt * ss);
      cudaError_t ce = cudaMemcpyAsync(dst + at * ds, buf, cnt * ds, cudaMemcpyHostToDevice, ctx.stream());
      if (ce == cudaSuccess) ce = cudaEventRecord(ev[h], ctx.stream());
      if (ce != cudaSuccess) {
        st = cuda_error("uploading weight '" + r.name + "' (" + std::to_string(cnt * ds) + " bytes)", ce);
        break;
      }
      pending[h] = true;
      h ^= 1;
    }
  }
  const cudaError_t se = cudaStreamSynchronize(ctx.stream());
  if (se != cudaSuccess && st.is_ok()) st = cuda_error("weight upload", se);
  for (auto& e : ev)
    if (e) (void)cudaEventDestroy(e);
  host_free(staging);  // the staging buffer lives only for one engine's upload
  VLAC_RETURN_IF_ERROR(st);
  trim_clean_pages();  // a loading step done (context.h)
  GemmRunner::add_flush_region(w.base_, w.device_bytes_);  // read only, for the cold GEMM timing
  return w;
}

}  // namespace vlac::cuda
