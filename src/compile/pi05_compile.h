// `vlac compile` for pi0.5: policy folder -> stage graphs -> engines under a byte cap -> one
// engine file at a time (built by the backend named in the options, through the seam of
// ir/backend.h) -> one .vlac package (atomic). Memory is bounded by a chunk buffer and the
// graphs on meta, not by the model or the cap: weights stream from the map to the engine file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compile/engine_build.h"
#include "core/dtype.h"
#include "core/status.h"

namespace vlac {

struct Pi05CompileOptions {
  std::string out;                      // OUT.vlac
  std::string backend = "cpu";          // registry name of the backend that builds the engines
  bool bf16 = true;                     // lerobot's bf16 split (Gemma matrices bf16), else fp32
  /// With bf16: every weight matrix bf16 (also SigLIP, the projector and the adaRMS denses, which
  /// lerobot's bf16 mode keeps fp32), norms, biases, position and patch embeddings and the flow
  /// heads fp32: what a GPU needs to fit and to run SigLIP on bf16 tensor cores. Not lerobot's
  /// rounding points (the manifest's policy "precision" says which).
  bool bf16_all_matrices = false;
  /// With bf16_all_matrices: I8 or F8_E4M3 stores every such matrix that a Linear reads as 8-bit
  /// codes with one fp32 scale per output row (core/quant.h; "int8" / "fp8" packages: W8A16, the
  /// activations as in bf16-all). F32 (the default): none. Gathered tables stay bf16.
  DType weight_quant = DType::F32;
  /// With weight_quant F8_E4M3: the package's FP8 Linears also round their activations per row to
  /// e4m3 at run time (W8A8, ExecOptions::fp8_activations; manifest precision "fp8-w8a8"). The
  /// engines' bytes are the same as without it; only the manifest says so.
  bool fp8_activations = false;
  /// With weight_quant: observation files (read as `vlac run` reads them, through the folder's
  /// processor) run once each, with seeded noise, through the folder's fp32 CPU path to collect
  /// every Linear's input statistics; the 8-bit matrices are then rounded by GPTQ
  /// (ir/quant_calib.h: same scales, codes chosen for the outputs). Empty: round to nearest.
  std::vector<std::string> calibrate;
  int64_t calibrate_block = 128;  // inputs per diagonal block of the statistics
  uint64_t calibrate_seed = 0;    // noise of the calibration chunks (pi05_gaussian_noise)
  int calibrate_chunks = 8;       // noise draws (denoising loops) per observation
  double calibrate_damp = 0;      // λ = damp · mean(diag H); 0: ir::default_gptq_damp of the dtype
  bool calibrate_act_order = true;  // GPTQ's act-order within each block (else index order)
  /// Also write the statistics of the --calibrate run here (compile/calibration_file.h).
  std::string calibrate_save;
  /// The statistics from this file (a --calibrate-save run) instead of a run: `calibrate` stays
  /// empty, and the file's block is used.
  std::string calibrate_stats;
  std::string tokenizer;          // for observations with a raw task: a SentencePiece model (else the folder's)
  int threads = 2;                // of the calibration run
  uint64_t engine_cap = 512ull << 20;   // packed weight bytes per engine
  std::string engine_dir;               // "" = a temporary folder next to OUT, removed after
  bool keep_engine_files = false;       // keep the engine files in engine_dir after packaging
  std::function<void(const std::string& line)> log;  // progress lines (may be empty)
  /// Tests: called before each step ("engine:<name>", "package"), to kill the compile mid-way.
  std::function<void(const std::string& stage)> on_stage;
};

using Pi05CompileSummary = CompileSummary;

/// Compiles POLICY_DIR into options.out. On any error nothing is left at options.out and the
/// temporary engine folder is removed.
Result<Pi05CompileSummary> compile_pi05(const std::string& policy_dir, const Pi05CompileOptions& options);

/// Side files of a policy folder packaged verbatim besides config.json: lerobot's processor
/// pipelines, the statistics files they name, tokenizer/tokenizer.model (what the runtime reads;
/// tokenizer.json is not). Relative names, sorted.
std::vector<std::string> pi05_side_files(const std::string& policy_dir);

}  // namespace vlac
