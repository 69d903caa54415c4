// The engines of a .vlac package, run on the backends their manifest entries name (found in the
// backend registry): programs and weight tables parsed at open (no byte read), each engine bound
// and planned lazily for the shapes of its inputs, all sharing one activation arena and scratch;
// values crossing engines copied into buffers owned here; with a memory budget, engines' pages
// are evicted least recently run first (weight streaming). Backend- and policy-neutral: pi0.5's
// runtime and the generic GraphPackage both run through it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "ir/backend.h"
#include "ir/graph.h"
#include "package/package.h"

namespace vlac {

class BackendRegistry;

struct PackageRunOptions {
  int threads = 2;
  /// 0: every engine stays mapped once touched. Otherwise mapped weights + activations are kept
  /// under this many bytes by dropping engines' pages in turn (slower, the stats say how much).
  uint64_t mem_budget = 0;
  bool pack_weights = false;         // ExecOptions::pack_weights (not with mem_budget)
  bool bf16_mqa_attention = false;   // ExecOptions::bf16_mqa_attention
  bool fast_vision = false;          // ExecOptions::fast_vision, for the engines of stage "vision"
  bool fp8_activations = false;      // ExecOptions::fp8_activations (a "fp8-w8a8" package)
  std::vector<std::string> memo_inputs;  // ExecOptions::memo_inputs
  int memo_slots = 0;
  std::vector<std::string> stable_inputs;  // ExecOptions::stable_inputs (inputs_changed())
  /// Runs every engine on this registry backend instead of the one its manifest entry names
  /// (weights are bound by name, so a CPU package's engines run on "cuda" too). Empty: the manifest's.
  std::string backend;
  /// Stages whose engines get an activation arena and kernel scratch of their own instead of the
  /// shared ones, so that they may run on a second lane beside the others (pi0.5's first
  /// denoising step beside the prefix LM). Only on a runtime with lanes (BackendRuntime::lanes).
  std::vector<std::string> own_memory_stages;
};

struct PackageRunStats {
  int engines_loaded = 0;           // executables planned (lazily, on first use or new shapes)
  uint64_t evictions = 0;           // engine segments whose pages were dropped for the budget
  uint64_t evicted_bytes = 0;       // their size (re-read from disk when used again)
  uint64_t peak_resident_weight_bytes = 0;  // by the budget's accounting
  uint64_t activation_bytes = 0;    // arena + scratch + crossing buffers + memo slots
  uint64_t packed_weight_bytes = 0; // packed weight copies of the live executables
};

/// A tensor handed between engines: borrowed data and its type.
struct PackageValue {
  const void* data = nullptr;
  ir::ValueInfo info;
  MemoryKind kind = MemoryKind::Host;  // where `data` lives (an engine's own values: its backend's kind)
  /// Ready once this runtime mark is reached (BackendRuntime::mark; run_stage with
  /// mark_outputs): an engine on another lane waits for it before its first read. -1: ready in
  /// the order of the lane that reads it.
  int mark = -1;
};

class PackageEngines {
 public:
  /// Parses the engine entries of `pkg` (borrowed; must outlive this). Every engine's backend must
  /// be in `registry` (null: backend_registry()); the error names the package, the engine and
  /// the backend.
  static Result<PackageEngines> open(const Package& pkg, PackageRunOptions options,
                                     const BackendRegistry* registry = nullptr);

  PackageEngines(PackageEngines&&) noexcept;
  PackageEngines& operator=(PackageEngines&&) noexcept;
  ~PackageEngines();

  /// Stage names in manifest order of their first engine.
  const std::vector<std::string>& stages() const { return stage_order_; }
  bool has_stage(const std::string& stage) const;
  /// The type of input `name` as the stage's first engine that reads it was compiled (before any
  /// respecialization); nullopt when none reads it. (pi0.5: a batched vision engine's image.)
  std::optional<ir::ValueInfo> input_info(const std::string& stage, const std::string& name) const;
  /// Runs the engines of `stage` in order; each reads its inputs from `values` by name and adds
  /// its outputs there (pointing into buffers owned here, valid until the stage runs again).
  /// With `mark_outputs` each engine's outputs carry a runtime mark recorded after their copies
  /// (PackageValue::mark); an input that carries one is waited for at its first read.
  Status run_stage(const std::string& stage, std::map<std::string, PackageValue>* values, bool mark_outputs = false);
  /// The stage's pages leave this process (they stay in the page cache).
  void release_stage(const std::string& stage);
  /// The stable inputs (PackageRunOptions::stable_inputs) of the stage's engines changed: their
  /// next runs read them again (Executable::inputs_changed).
  void inputs_changed(const std::string& stage);
  /// The memo key of the stage's engines from now on (Executable::set_memo_key); empty: from
  /// their inputs.
  void set_memo_key(const std::string& stage, const void* key, uint64_t bytes);
  const PackageRunStats& stats() const { return stats_; }

  /// The backend runtime of the engines (the first engine's; all of a pi0.5 package share one)
  /// and the memory kind of the values they produce. Callers allocate their crossing buffers,
  /// copy, synchronize and record chunks through it, so one code path drives CPU and GPU.
  BackendRuntime& runtime() const { return *rt_; }
  MemoryKind memory_kind() const { return rt_->memory_kind(); }
  /// The backend's device line (DeviceInfo::description).
  std::string device_description() const;

 private:
  struct Engine;
  PackageEngines();
  Status prepare(Engine& e, const std::map<std::string, PackageValue>& values);
  void make_room(const Engine& next);
  void assign_store_keys(const std::vector<PackageEngine>& manifest);

  const Package* pkg_ = nullptr;
  PackageRunOptions options_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::map<std::string, std::vector<size_t>> stage_engines_;
  std::vector<std::string> stage_order_;
  std::vector<size_t> lru_;  // engine indices, least recently run first (resident ones)
  uint64_t resident_ = 0;
  PackageRunStats stats_;
  std::map<std::string, std::vector<uint8_t>> memo_keys_;  // by stage (set_memo_key)
  BackendRuntime* rt_ = nullptr;
  Backend* backend0_ = nullptr;
  // Engine outputs, "<stage>/<name>" (or a buffer shared by internal values: assign_store_keys),
  // in the producing backend's memory.
  std::map<std::string, std::unique_ptr<BackendBuffer>> store_;
  // The activation arena and kernel scratch shared by all engines of one backend runtime.
  struct Shared {
    std::unique_ptr<BackendBuffer> arena, scratch;
  };
  // Keyed by runtime and, for PackageRunOptions::own_memory_stages, the stage ("" for the rest).
  std::map<std::pair<BackendRuntime*, std::string>, Shared> shared_;
};

}  // namespace vlac
