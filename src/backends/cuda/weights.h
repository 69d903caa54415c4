// Weights on the GPU: every weight an engine reads is converted to its run dtype on the host,
// chunk by chunk, in a page-locked staging buffer of at most 64 MiB (two halves: one fills while
// the other uploads) and copied once into one device allocation; the source pages are dropped
// behind the reader, so nothing is held twice. Gather-only tables (the embedding) stay mapped on
// the host: only the rows a prompt looks up are converted and uploaded, per run. Weights only the
// memo reads (WeightBinding::on_demand: pi0.5's time MLP and adaRMS modulation matrices, 233 MB
// of the full-size expert in bf16) stay in the package and are read into one reused device
// buffer at each memo miss (fetch): the first chunk pays ~a read per matrix and step value, later
// chunks hit the memo and never read them (VLAC_ON_DEMAND_WEIGHTS=0 uploads them like the rest; =N leaves those of at least N bytes,
// default 1 MiB).
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
    DType dtype = DType::F32;    // as stored on the device: F32, BF16, or an 8-bit blob (I8, F8_E4M3)
    std::vector<int64_t> shape;
    bool host_table = false;     // gathered on the host from the mapped file
    bool rounds_to_bf16 = false; // a host F32 table run as BF16: rows rounded when gathered
    int fd = -1;                 // a host table's or on-demand weight's file (pread: nothing mapped), or -1
    uint64_t file_offset = 0;    // where the table starts in it
    bool on_demand = false;      // left in the file (data null): fetch() reads it to the device
    uint64_t bytes = 0;          // an on-demand weight's bytes (stored = run dtype)
    std::string name;            // for messages
  };
  static Result<CudaWeights> upload(CudaContext& ctx, const WeightBinding& b);
  CudaWeights() = default;
  CudaWeights(CudaWeights&&) noexcept;
  CudaWeights& operator=(CudaWeights&&) noexcept;
  ~CudaWeights() override;

  const Entry* find(const std::string& name) const;
  uint64_t owned_bytes() const override { return device_bytes_; }
  uint64_t mapped_bytes() const override { return mapped_bytes_; }
  uint64_t on_demand_bytes() const { return on_demand_bytes_; }

  /// An on-demand weight on the device, in stream order: read from the file into a page-locked
  /// buffer, copied into device buffer `slot` (0..kFetchSlots-1: one per weight a node reads;
  /// both allocated at the slot's first fetch). The pointer holds it until the slot's next fetch
  /// is read by the stream. Synchronizes the host with that slot's previous copy; never inside a
  /// recording (a memo miss there is an error).
  static constexpr int kFetchSlots = 3;
  Result<const void*> fetch(const Entry& e, int slot, cudaStream_t stream) const;
  /// Frees the fetch buffers (the memo is full: nothing fetches again until it misses).
  void drop_fetch_buffers() const;

 private:
  std::map<std::string, Entry> entries_;
  void* base_ = nullptr;  // one device allocation for all uploaded weights
  uint64_t device_bytes_ = 0, mapped_bytes_ = 0, on_demand_bytes_ = 0, max_on_demand_ = 0;
  // fetch(): per slot, the buffers and the event of the last copy out of the host one.
  struct FetchSlot {
    void* device = nullptr;
    void* host = nullptr;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  mutable FetchSlot fetch_[kFetchSlots];
  void move_from(CudaWeights& o) noexcept;
};

}  // namespace vlac::cuda
