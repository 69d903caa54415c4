// CPU graph executor: runs an ir::Graph with the CPU kernels. Weights are bound once (mapped
// fp32 bytes used in place, conversions into owned buffers at load); every activation buffer is
// planned once from liveness into one arena; run() does no heap allocation.
// Must not depend on models/ or any frontend: a runtime links it without the compiler side.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cpu/dnnl_linear.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "exec/memo_plan.h"
#include "ir/backend.h"
#include "ir/graph.h"

namespace vlac::cpu {

/// Bytes of one weight file (e.g. a mapped safetensors shard); borrowed, must outlive the
/// CpuWeights built over it. WeightRef::offset is absolute in the file.
using WeightFile = WeightFileView;

/// Weights in the form the kernels read, by name: fp32 or bf16 (matmul weights and embedding
/// tables may stay bf16; everything else is fp32). Built once, shared by every executor.
class CpuWeights {
 public:
  struct Entry {
    const void* data = nullptr;  // into a mapped file (used in place) or owned storage
    DType dtype = DType::F32;    // F32 or BF16
    std::vector<int64_t> shape;
    bool owned = false;
    /// An F32 table run as if converted to BF16 (rows rounded when gathered): the same bits as a
    /// converted table without touching the rows nobody looks up.
    bool rounds_to_bf16 = false;
  };
  /// Binds `refs` (duplicates by name allowed, bound once). `run_dtypes[i]` is the dtype ref i
  /// runs in: F32 or BF16 (the executor accepts BF16 only for matmul weights and embedding
  /// tables). Conversions (F32->BF16, BF16/F16->F32, unaligned copies) go to owned buffers;
  /// `files[ref.file_id]` holds the bytes at ref.offset (bounds-checked).
  /// `gather_only[i]` (optional): ref i is only gathered from (an embedding table); asked to
  /// run in BF16 while stored F32, it stays mapped and rounds rows on use (rounds_to_bf16).
  static Result<CpuWeights> load(const std::vector<ir::WeightRef>& refs, const std::vector<DType>& run_dtypes,
                                 const std::vector<WeightFile>& files, const std::vector<bool>& gather_only = {});
  const Entry* find(const std::string& name) const;
  /// Bytes held in owned (converted) buffers.
  uint64_t owned_bytes() const { return owned_bytes_; }
  /// Bytes used in place from the files.
  uint64_t mapped_bytes() const { return mapped_bytes_; }

 private:
  std::map<std::string, Entry> entries_;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
  uint64_t owned_bytes_ = 0, mapped_bytes_ = 0;
};

struct ExecutorOptions {
  int threads = 2;  // OpenMP threads (oneDNN matmuls and the kernels)
  /// The caller provides the activation arena and scratch (set_memory, before each run) and
  /// binds every input: engines that run one after another share one arena.
  bool shared_memory = false;
  /// Linear weights reordered once into oneDNN's blocked layout, owned by the executor
  /// (packed_bytes()): faster matmuls, mainly for few rows, at the cost of a copy of the weights.
  /// Off: weights are used in place (mapped from the package or the checkpoint).
  bool pack_weights = false;
  /// Attention with one KV head shared by several query heads runs its two matmuls in bf16
  /// (DnnlAttention). In pi0.5 those are exactly the Gemma and expert attentions, which lerobot's
  /// bf16 mode computes in bf16; SigLIP's multi-head attention stays fp32. The policy sets it
  /// for bf16 runs (a per-run choice, so a partitioned package and its folder agree).
  bool bf16_mqa_attention = false;
  /// ExecOptions::fp8_activations: F8_E4M3 Linears round x per row to e4m3 (W8A8, emulated).
  bool fp8_activations = false;
  /// Inputs that take few distinct values over the executor's life: pi0.5's denoise time t takes
  /// the same num_steps values in every chunk. A name also matches a partitioned engine's boundary
  /// input "%N:name". The nodes computed from these inputs alone (with weights and constants) are
  /// run once per distinct value: their results used elsewhere are kept in `memo_slots` slots
  /// (allocated in create(), reused round-robin), and a run whose memo inputs hold bytes seen
  /// before copies them back at the point of the schedule where they were computed (so the
  /// arena's liveness plan holds), with the same bytes. 0 slots: off.
  std::vector<std::string> memo_inputs;
  int memo_slots = 0;
  /// ExecOptions::linear_observer (ir/backend.h): each Linear's weight name and fp32 input rows.
  std::function<void(const std::string& weight, const float* x, int64_t rows, int64_t k)> linear_observer;
};

class Executor {
 public:
  /// Plans `graph` (kept by value): schedule, buffer offsets from liveness, scratch; binds every
  /// Weight node to `weights` by name (borrowed: must outlive the executor). Errors: an op or
  /// dtype the CPU kernels cannot run, a weight absent from `weights` or of another shape.
  static Result<Executor> create(ir::Graph graph, const CpuWeights& weights, ExecutorOptions options = {});

  Executor(Executor&&) noexcept = default;
  Executor& operator=(Executor&&) noexcept = default;

  const ir::Graph& graph() const { return graph_; }
  /// Index into graph().inputs() of the Input node named `name`; -1 if none.
  int input_index(std::string_view name) const;
  /// The executor's own buffer for input i (bytes = graph().info(inputs()[i]).bytes()).
  void* input_data(int i);
  /// Reads input i from caller memory instead (borrowed until the next bind or destruction);
  /// nullptr returns to the owned buffer.
  void bind_input(int i, const void* external);
  /// Data of any value after run(); graph outputs stay valid until the next run().
  const void* data(ir::ValueId v) const;
  const float* data_f32(ir::ValueId v) const { return static_cast<const float*>(data(v)); }
  /// Runs every scheduled node. No heap allocation. Errors only for data-dependent problems
  /// (a token id outside the vocabulary).
  Status run();

  /// With ExecutorOptions::shared_memory: points the activations at `arena` (arena_bytes(),
  /// 64-byte aligned) and the kernels' scratch at `scratch` (scratch_bytes()).
  void set_memory(uint8_t* arena, float* scratch);

  uint64_t arena_bytes() const { return arena_bytes_; }
  uint64_t input_bytes() const { return input_bytes_; }
  uint64_t scratch_bytes() const { return uint64_t(scratch_floats_) * 4; }
  /// Bytes of packed weight copies (ExecutorOptions::pack_weights), else 0.
  uint64_t packed_bytes() const { return packed_bytes_; }
  /// ExecutorOptions::memo_inputs: nodes the memo covers, bytes it holds, runs that reused it.
  size_t memo_nodes() const { return memo_.node_count; }
  uint64_t memo_bytes() const { return memo_.slot_bytes * memo_valid_.size(); }
  uint64_t memo_hits() const { return memo_hits_; }

 private:
  Executor() = default;
  Status plan(const CpuWeights& weights);
  void plan_memo();
  Status run_node(ir::NodeId id);
  // Memo: the slot this run reads (*hit) or fills, -1 when off; a node run or its results copied.
  int memo_lookup(bool* hit);
  Status run_or_reuse(ir::NodeId id, int slot, bool hit);
  Status run_nodes(int slot, bool hit);
  std::string shape_key(ir::NodeId id) const;
  void* ptr(ir::ValueId v) const { return ptr_[size_t(root_[size_t(v)])]; }

  ir::Graph graph_;
  ExecutorOptions options_;
  std::vector<ir::NodeId> order_;
  std::vector<ir::ValueId> root_;  // storage root (reshape outputs alias their input)
  std::vector<void*> ptr_;         // by root value id
  std::vector<void*> owned_input_ptr_;
  std::vector<DType> weight_dtype_;  // by value id (weights only)
  std::vector<bool> weight_rounds_bf16_;  // by value id: F32 table rounded to BF16 on gather
  std::vector<float> const_storage_;
  std::vector<std::optional<DnnlLinear>> linear_;  // by node id: the planned matmul of each Linear
  std::vector<std::optional<DnnlAttention>> attention_;
  struct RopeTable {
    ir::ValueId pos;
    int64_t t, dh;
    float base;
    uint64_t generation;   // run_generation_ it was last checked in (0: never)
    bool filled;            // cs holds the table of pos_copy
    std::vector<float> cs;  // [T, Dh/2, 2] cos, sin
    std::vector<int64_t> pos_copy;  // the positions cs was filled for
  };
  std::vector<RopeTable> rope_tables_;
  std::vector<int32_t> rope_table_of_;  // by node id: index into rope_tables_ (RoPE nodes)
  uint64_t run_generation_ = 0;  // by node id: bf16 attentions (else kernels' fp32)
  std::unique_ptr<uint8_t[]> arena_;
  std::unique_ptr<uint8_t[]> inputs_;
  std::unique_ptr<float[]> scratch_;
  float* scratch_ptr_ = nullptr;
  std::vector<std::pair<ir::ValueId, uint64_t>> arena_blocks_;  // activation root -> arena offset
  uint64_t arena_bytes_ = 0, input_bytes_ = 0;
  int64_t scratch_floats_ = 0;
  uint64_t packed_bytes_ = 0;
  // Memo (ExecutorOptions::memo_inputs): the plan (exec/memo_plan), its slots, the lookup state.
  exec::MemoPlan memo_;
  uint64_t memo_hits_ = 0;
  size_t memo_next_ = 0;
  std::unique_ptr<uint8_t[]> memo_storage_;
  std::vector<uint8_t> memo_valid_;  // by slot
};

}  // namespace vlac::cpu
