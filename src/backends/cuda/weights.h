// Weights on the GPU: every weight an engine reads is converted to its run dtype on the host,
// chunk by chunk, in a page-locked staging buffer of at most 64 MiB (two halves: one fills while
// the other uploads) and copied once into one device allocation; the source pages are dropped
// behind the reader, so nothing is held twice. Gather-only tables (the embedding) stay mapped on
// the host: only the rows a prompt looks up are converted and uploaded, per run.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/context.h"
#include "ir/backend.h"

namespace vlac::cuda {

/// Staging buffer bytes (both halves together). 16 MiB, not the 64 MiB cap: the pinned
/// buffer is host RSS at the first chunk's peak (host_pinned.peak 69.8 MB at 64 MiB on the H200),
/// and 8 MiB halves keep the copy engine fed while the host converts the next half.
inline constexpr uint64_t kStagingBytes = 16ull << 20;

class CudaWeights final : public BoundWeights {
 public:
  struct Entry {
    const void* data = nullptr;  // device pointer, or the mapped host bytes of a host table
    DType dtype = DType::F32;    // as the kernels read it (F32 or BF16)
    std::vector<int64_t> shape;
    bool host_table = false;     // gathered on the host from the mapped file
    bool rounds_to_bf16 = false; // a host F32 table run as BF16: rows rounded when gathered
    int fd = -1;                 // a host table's file (rows read with pread: nothing mapped), or -1
    uint64_t file_offset = 0;    // where the table starts in it
  };
  static Result<CudaWeights> upload(CudaContext& ctx, const WeightBinding& b);
  CudaWeights() = default;
  CudaWeights(CudaWeights&&) noexcept;
  CudaWeights& operator=(CudaWeights&&) noexcept;
  ~CudaWeights() override;

  const Entry* find(const std::string& name) const;
  uint64_t owned_bytes() const override { return device_bytes_; }
  uint64_t mapped_bytes() const override { return mapped_bytes_; }

 private:
  std::map<std::string, Entry> entries_;
  void* base_ = nullptr;  // one device allocation for all uploaded weights
  uint64_t device_bytes_ = 0, mapped_bytes_ = 0;
};

}  // namespace vlac::cuda
