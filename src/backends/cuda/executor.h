// CUDA graph executor: runs an ir::Graph node by node on the context's stream, one kernel or
// cuBLASLt call (or an async device copy) per node. Everything is planned in create(): the
// schedule, one device arena from exec::plan_arena (or the caller's, shared by engines), the
// kernel scratch, constants, the memo of time-only nodes (exec::plan_memo, slots in device
// memory) and every GEMM's cuBLASLt algorithm, so run() allocates nothing, never synchronizes
// and can be captured into a CUDA graph. Numerics mirror the CPU executor: activations fp32,
// bf16 weights multiply bf16-rounded activations with fp32 accumulation, the one-KV-head
// attentions run in bf16 under ExecOptions::bf16_mqa_attention, everything else fp32 (TF32 off).
// Where an fp32 value is read only by consumers that round it to bf16 first (bf16 GEMMs, the bf16
// attention), its producer writes it in bf16 instead (same bits, one kernel and 2 bytes/element
// fewer): see plan_bf16_stores. ExecOptions::fast_vision trades parity for speed in SigLIP.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/context.h"
#include "backends/cuda/expert_mlp.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/l2_prefetch.h"
#include "backends/cuda/op_profile.h"
#include "backends/cuda/weights.h"
#include "core/quant.h"
#include "exec/memo_plan.h"
#include "ir/backend.h"

namespace vlac::cuda {

class CudaExecutable final : public Executable {
 public:
  static Result<std::unique_ptr<CudaExecutable>> create(CudaContext& ctx, ir::Graph graph, const CudaWeights& weights,
                                                        const ExecOptions& options);
  ~CudaExecutable() override;

  const ir::Graph& graph() const override { return graph_; }
  MemoryPlan memory() const override;
  void bind_memory(void* arena, void* scratch) override;
  int input_index(std::string_view name) const override;
  void* input_data(int i) override;
  void bind_input(int i, const void* external) override;
  const void* data(ir::ValueId v) const override { return ptr(v); }
  Status run() override;
  uint64_t memo_hits() const override { return memo_hits_; }
  size_t memo_nodes() const override { return memo_.node_count; }
  MemoryKind memory_kind() const override { return MemoryKind::Device; }
  Status write_input(int i, const void* src, uint64_t bytes) override;
  void inputs_changed() override { stable_dirty_ = true; }
  void set_memo_key(const void* key, uint64_t bytes) override;
  void wait_input(int i, int mark) override;

 private:
  CudaExecutable() = default;
  Status plan(const CudaWeights& weights);
  Status run_node(ir::NodeId id);
  /// Reads the on-demand weights node `id` reads onto the device (CudaWeights::fetch).
  Status fetch_on_demand(ir::NodeId id);
  Status run_or_reuse(ir::NodeId id, int slot, bool hit);
  int memo_lookup(bool* hit);
  void point_memo_results(int slot);
  Status ensure_input(int i);
  std::string where(const ir::Node& n) const;
  void* ptr(ir::ValueId v) const {
    return static_cast<uint8_t*>(ptr_[size_t(root_[size_t(v)])]) + view_off_[size_t(v)];
  }
  /// Row stride in elements of a value read as rows of its last dimension: the fused output's
  /// width for a Slice view (plan_slice_views), else the value's own last dimension.
  int64_t row_stride(ir::ValueId v) const;
  /// The same for a [T, H, D] value read as T rows of H·D (a RoPE's x).
  int64_t heads_stride(ir::ValueId v) const;
  /// (reader node, input index) of every storage root, in schedule order (Reshapes see through),
  /// and which roots hold a graph output: what the plan passes ask of the current roots.
  std::vector<std::vector<std::pair<ir::NodeId, size_t>>> readers_by_root() const;
  std::vector<uint8_t> output_roots() const;
  /// Values an F32 graph keeps in bf16 on the device (plan_bf16_stores).
  bool bf16_stored(ir::ValueId v) const { return bf16_store_[size_t(root_[size_t(v)])] != 0; }
  void plan_bf16_stores();
  Status plan_bf16_gemm_outputs();
  Status plan_geglu_in_place();
  Status plan_gemm_gelu();
  Status plan_qkv_attention_views();
  /// Re-plans a Linear's GEMM after a rewrite changed its descriptor; false (and the descriptor
  /// as it was) where cuBLASLt has no algorithm for the new one.
  bool replan_gemm(ir::NodeId id, const GemmDesc& before);
  /// A bf16 copy of a Linear's f32 bias on the device (cuBLASLt's bf16-output epilogues take the
  /// bias in the output's dtype), made once at plan time.
  Status bf16_bias_copy(ir::NodeId id);
  bool bf16_gemm_rewritable(ir::NodeId id) const;
  bool runs_nothing(ir::NodeId id) const;   // a view, a reshape or a leaf: launches nothing
  bool from_weight(ir::ValueId v) const;     // v's storage is a bound weight's
  /// Bytes a root's block holds: half its f32 size when stored in bf16.
  uint64_t stored_bytes(ir::ValueId r) const;
  void plan_slice_views();
  std::vector<int64_t> residual_norm_lifetimes() const;
  void plan_residual_norms();
  void plan_rope_pairs();
  void plan_prefix_qkv();
  /// VLAC_TIMING_SKIP: nodes left unlaunched, a timing probe (timing_skip_).
  void plan_timing_skip();
  /// The expert's q/k RoPE pair (with its v copy) run inside the attention that reads them
  /// (AttentionRope), opt-in with VLAC_ROPE_ATTENTION=1: correct, and slower than the separate
  /// launch on an H100 (docs/cuda-sessions.md, session 23). The fused q|k|v rows then live until the
  /// attention (rope_attention_lifetimes, folded into the arena's lifetimes).
  Status plan_rope_attention();
  void rope_attention_lifetimes(std::vector<int64_t>& at) const;
  /// The attentions whose K/V start with rows of a kept Concat's stable pieces (pi0.5's prefix
  /// keys at a denoising step) load those before they wait (AttentionShape::stable_keys), and the
  /// RoPE pair launch just before each lets them launch early (opt-in: VLAC_ATTN_EARLY=1 the
  /// loads, 2 the trigger, 3 both).
  void plan_attention_early();
  /// Rows [0, n) of v (a K or V input of an attention) that only a kept Concat's stable pieces
  /// write; 0 where v is not such a Concat's output read in place in bf16.
  int64_t stable_rows(ir::ValueId v) const;
  /// input_first_pos_: by input, the run position of the first launch that reads it (wait_input
  /// waits there); input_wait_: by input, the mark it waits for (-1: none).
  void plan_input_waits();
  std::vector<size_t> input_first_pos_;
  std::vector<int> input_wait_;
  std::vector<std::pair<size_t, int>> run_waits_;  // run(): (position, mark) of this run's waits, sorted
  float* rope_table_ = nullptr;  // rope_sincos of the folded attentions' positions (own_blocks_)
  int64_t rope_folds_ = 0;
  /// VLAC_KV_PERSIST_MIB=N (a measurement, off by default): the attentions of an engine with
  /// Concats kept between runs (the expert's prefix K/V) launch with an L2 window over their
  /// block, lines read marked persisting, in an L2 set-aside of N MiB (capped by the device), so
  /// the 0.6 GB of weights a step streams do not evict them between steps. kv_window_.bytes 0: off.
  void plan_kv_window(void* base, uint64_t bytes);
  L2Window kv_window_;
  /// L2 prefetches of the small-M GEMMs' weights ahead of them (l2_prefetch.h), by run position.
  void plan_prefetches();
  std::vector<PrefetchLaunch> prefetches_;  // sorted by `before`
  int prefetch_blocks_ = 16;
  /// The expert's down_proj (M <= 64, read only by the gated residual) as K parts summed by the
  /// fused norm (VLAC_DOWN_KPARTS): chosen before the arena (its block holds the parts), kept
  /// only where plan_residual_norms then fused that norm.
  void plan_k_parts();
  void keep_fused_k_parts();
  /// The expert's gate|up GEMM, GeGLU and down GEMM (M <= 56) as one expert_mlp launch at the
  /// gate|up node (NodePlan::mlp); the other two are skipped. Opt-in (measured slower): VLAC_EXPERT_MLP=1.
  Status plan_expert_mlp();
  struct MlpRun {
    ExpertMlp plan;
    ir::NodeId geglu, down;
    uint64_t ws_off;  // its partial sums in the scratch (after x's bf16 copy, when x is f32)
    int64_t h_stride, y_stride;  // row strides of GeGLU's output (in place: 2F) and down's
  };
  std::vector<MlpRun> mlps_;
  unsigned* mlp_sync_ = nullptr;  // expert_mlp's barrier and flags (kExpertMlpSyncWords, zeroed once)
  uint8_t* scratch_at(uint64_t off) const { return static_cast<uint8_t*>(scratch_) + off; }

  CudaContext* ctx_ = nullptr;
  ir::Graph graph_;
  ExecOptions options_;
  std::vector<ir::NodeId> order_;
  std::vector<ir::ValueId> root_;
  std::vector<void*> ptr_;  // by root value id (device pointers; host tables for Embedding)
  // Slice views (plan_slice_views), by value id: byte offset into the root's block and the
  // root's row width in elements (0: not a view).
  std::vector<uint64_t> view_off_;
  std::vector<int64_t> view_stride_;
  std::vector<uint8_t> bf16_store_;  // by root value id
  std::vector<uint8_t> bf16_gemm_out_;  // by root value id: GEMM outputs written in bf16 (plan_bf16_gemm_outputs)
  std::vector<int> k_parts_;            // by root value id: K parts its block holds (plan_k_parts), 0: none
  std::vector<std::pair<ir::ValueId, uint64_t>> arena_blocks_;
  uint64_t arena_bytes_ = 0, scratch_bytes_ = 0;
  void* own_arena_ = nullptr;
  void* own_scratch_ = nullptr;
  void* scratch_ = nullptr;
  void* const_storage_ = nullptr;

  struct Input {
    void* own = nullptr;     // device buffer, allocated on first write_input()/input_data()
    bool external = false;   // bound to the caller's device memory
    std::vector<uint8_t> shadow;  // host copy of what write_input() wrote (memo keys, token ids)
    bool shadow_valid = false;
    const void* host_src = nullptr;  // the host memory it was last written from
    bool keep_shadow = false;
  };
  std::vector<Input> inputs_;
  uint64_t input_bytes_ = 0;

  // Per node (by node id): what plan() decided.
  struct NodePlan {
    GemmDesc gemm;                 // Linear, PatchEmbed
    uint64_t cast_off = 0;         // scratch offset of bf16 copies (Linear x; attention q, k, v)
    uint64_t k_off = 0, v_off = 0, split_off = 0, split_bytes = 0;
    bool bf16 = false;             // Linear with bf16 weight / bf16 attention
    AttentionShape att;
    int splits = 1;
    DType weight_dtype = DType::F32;
    // Embedding over a host table: rows gathered on the host into `rows_host`, uploaded into the
    // scratch at cast_off, then scaled by the kernel reading ids 0..T-1 (`iota`).
    struct HostGather* gather = nullptr;
    // plan_residual_norms: a Mul (gate) and an Add folded into the norm that reads the sum.
    bool skip = false;           // Mul/Add computed by the fused norm later
    bool fused = false;          // this norm runs residual_norm_to
    ir::ValueId f_h = 0, f_branch = 0, f_sum = 0, f_gate = 0;
    bool f_has_gate = false;
    bool view = false;           // a Slice read in place by its readers (plan_slice_views)
    bool gelu_in_gemm = false;   // a GeluTanh computed by its Linear's GEMM epilogue (plan_gemm_gelu)
    int mlp = -1;                // >= 0: this gate|up Linear runs the whole MLP (mlps_[mlp], plan_expert_mlp)
    int qskinny = 0;             // > 0: an 8-bit weight's GEMM in the skinny kernel, this many splits (plan_quant_skinny)
    int64_t qexact = 0;          // > 0: an 8-bit weight's GEMM on unscaled codes, its sums scaled after, this many x rows at once (run_quant_linear)
    bool qfp8 = false;           // an e4m3 weight's GEMM in FP8: x quantized per row, cuBLASLt's FP8 GEMM (plan_quant_fp8)
    bool qfp8_gelu = false;      // ... whose planned GELU epilogue runs after it (no FP8 GEMM offers it)
    bool qfp8_bias_after = false;  // ... whose fp32 bias is added after it (no F32-out FP8 GEMM with a bias)
    bool qfp8_x_ready = false;   // ... whose x's codes its producer wrote (plan_fp8_fused_codes)
    bool f_codes = false;        // a fused residual norm or a GeGLU writing its output as e4m3 codes for that GEMM
    void* bias_bf16 = nullptr;   // a Linear's bias rounded to bf16 for its bf16-output GEMM (own_blocks_)
    // A Concat over stable inputs (ExecOptions::stable_inputs): its output lives in a buffer of
    // its own, and the pieces flagged here are written only when those inputs changed.
    uint32_t stable_pieces = 0;
    // ... and the pieces whose producer (a RoPE, a column Slice) writes straight into it.
    uint32_t inplace_pieces = 0;
    bool into_concat = false;    // a Slice written as rows into a concatenation (cast_rows)
    // plan_rope_pairs: this RoPE also runs the next one (its node id), in one launch.
    int64_t rope_pair = -1;
    // ... and a column Slice written into a concatenation (its node id; the v of q|k|v).
    int64_t rope_copy = -1;
    // plan_prefix_qkv: this (q) RoPE also runs the k RoPE and the v Slice (node ids) that feed
    // the attention qkv_att, writing their bf16 copies into its scratch (kv_ready there).
    int64_t qkv_k = -1, qkv_v = -1, qkv_att = -1;
    bool kv_ready = false;
    // plan_rope_attention: this attention rotates q and its own keys itself; rope_q is the q RoPE
    // (with its rope_pair and rope_copy) whose launch it replaces, and rope_table says it fills
    // rope_table_ first (the first such attention of a run).
    int64_t rope_q = -1;
    bool rope_table = false;
    // plan_attention_early: an attention's keys [0, stable_keys) are a kept Concat's stable rows,
    // loaded before its wait in runs that do not rewrite them; a RoPE pair launch that lets the
    // attention after it launch early in those runs.
    int64_t stable_keys = 0;
    bool early_dependents = false;
    // plan_k_parts: this fused norm's branch is a GEMM's K parts (GemmDesc::k_parts), summed here.
    int f_branch_parts = 1;
    int64_t f_part_stride = 0;
  };
  std::vector<NodePlan> plans_;
  std::vector<std::unique_ptr<struct HostGather>> gathers_;
  Status gather_status(struct HostGather& hg) const;
  void* iota_ = nullptr;  // int64 0..max T-1 on the device (host-table embeddings)
  DType weight_dtype(ir::ValueId v) const { return weight_dtype_[size_t(root_[size_t(v)])]; }
  std::vector<DType> weight_dtype_;       // by value id (weights)
  std::vector<const CudaWeights::Entry*> weight_entry_;  // by value id (weights)
  // 8-bit matrices (quant.cu): by value id, the blob (device, or the on-demand fetch buffer) the
  // GEMM's bf16 weight is widened from into the scratch at dequant_off_; null for other values.
  std::vector<const void*> quant_src_;
  bool eight_bit_weights_ = false;  // some weight is 8-bit codes: attention plans are lean
  unsigned* quant_counters_ = nullptr;  // the skinny kernel's tile counters (zero between GEMMs)
  Status plan_quant_skinny();
  bool widened(ir::ValueId v) const {
    const CudaWeights::Entry* e = size_t(v) < weight_entry_.size() ? weight_entry_[size_t(v)] : nullptr;
    return e && is_quant_dtype(e->dtype) && !e->host_table;
  }
  // By value id: rows widened at once (dequant_slice_rows); fewer than the matrix's: sliced.
  std::vector<int64_t> slice_rows_;
  bool sliced(ir::ValueId v) const {
    return widened(v) && slice_rows_[size_t(v)] > 0 && slice_rows_[size_t(v)] < weight_entry_[size_t(v)]->shape[0];
  }
  uint64_t dequant_bytes_ = 0, dequant_off_ = 0;
  // Widened together (plan_dequant_groups): consecutive 8-bit GEMMs whose bf16 weights fit the
  // slice cap side by side in the scratch, widened in one launch before the first of them.
  std::vector<std::vector<ir::ValueId>> dequant_groups_;  // weight values (roots), in run order
  std::vector<int> dequant_group_at_;                      // by node id: the group widened first, or -1
  std::vector<uint64_t> widen_off_;                        // by value id: its offset past dequant_off_
  std::vector<uint8_t> in_group_;                          // by value id: widened with its group
  void plan_dequant_groups();
  // Exact 8-bit GEMMs (NodePlan::qexact, opt-in VLAC_QUANT_EXACT=1): the weight widened unscaled
  // (exact), the GEMM's fp32 sums for a block of x's rows in the scratch at qsum_off_, and
  // scale_columns applying the row scales and the GEMM's epilogue with one rounding (quant.cu).
  // Otherwise the weight is widened to bf16(code · scale).
  uint64_t qsum_off_ = 0, qsum_bytes_ = 0;
  // FP8 W8A8 GEMMs (NodePlan::qfp8, opt-in VLAC_FP8_GEMM=1): x's e4m3 codes and row scales in the
  // scratch at qfp8_off_ (quantize_rows_e4m3), then cuBLASLt's FP8 GEMM on the weight's own codes
  // and row scales: nothing widened.
  uint64_t qfp8_off_ = 0, qfp8_bytes_ = 0;
  Status plan_quant_fp8();
  void plan_fp8_fused_codes();
  Status run_fp8_linear(ir::NodeId id, const void* bias, void* out);
  static GemmDesc fp8_desc(const NodePlan& p);
  static uint64_t fp8_x_bytes(int64_t m, int64_t k);
  std::pair<uint8_t*, float*> fp8_x_codes(int64_t elems) const;
  // VLAC_PROFILE_OPS (op_profile.h): events between the nodes of eager runs after the first.
  std::unique_ptr<NodeTimer> timer_;
  int64_t eager_runs_ = 0;
  Status profile_run(const std::vector<float>& ms, const std::vector<uint8_t>& memo_kind);
  uint64_t memo_copies_ = 0;  // results copied between the memo's slot and the arena (run_or_reuse)
  std::vector<uint8_t> qexact_w_;  // by value id: a weight its (one) reader runs exactly (grouped widening)
  void plan_quant_exact();
  Status run_quant_linear(ir::NodeId id, const void* xin, const void* bias, void* out);
  const CudaWeights* weights_ = nullptr;
  std::vector<uint8_t> reads_on_demand_;  // by node id: reads a weight left in the file

  // Memo: plan, device slots, host keys.
  exec::MemoPlan memo_;
  void* memo_storage_ = nullptr;
  std::vector<std::vector<uint8_t>> memo_keys_;  // by slot
  std::vector<uint8_t> memo_valid_;
  size_t memo_next_ = 0;
  std::vector<uint8_t> given_key_;  // set_memo_key: the key instead of the memo inputs' bytes
  std::vector<uint8_t> run_key_;    // memo_lookup: this run's key (kept: no allocation per run)
  uint64_t memo_hits_ = 0;
  // Memo results read in place from the slot (no copy on a hit): by root, 1 when redirected.
  std::vector<uint8_t> memo_in_slot_;
  // By node: 1 where VLAC_TIMING_SKIP leaves it unlaunched (empty: none is).
  std::vector<uint8_t> timing_skip_;
  std::vector<int64_t> arena_off_;  // by root: offset in the arena, -1 when not placed
  // adaRMS gates that are a view of their modulation in the slot: (gate root, mod root, D).
  struct GateView {
    ir::ValueId gate, mod;
    int64_t d;
  };
  std::vector<GateView> gate_views_;
  uint8_t* arena_base_ = nullptr;
  // Stable inputs: by input index; whether they changed since the last run; the persistent
  // outputs of the Concats over them.
  std::vector<uint8_t> stable_input_;
  bool stable_dirty_ = true;
  std::vector<void*> own_blocks_;
};

}  // namespace vlac::cuda
