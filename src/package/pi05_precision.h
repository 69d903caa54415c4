// The values of a pi0.5 package manifest's `policy.precision` (docs/compile.md): written by
// compile_pi05, read by the package runtime (fast vision, e4m3 activations) and printed by
// `vlac run`. One list, so a new precision cannot be spelled two ways.
#pragma once

#include <string>
#include <string_view>

namespace vlac::pi05_precision {

inline constexpr std::string_view kFp32 = "fp32";                  // lerobot's fp32 arithmetic
inline constexpr std::string_view kBf16Lerobot = "bf16-lerobot";   // lerobot's bf16 mode
inline constexpr std::string_view kBf16All = "bf16-all-matrices";  // every matrix in bf16
inline constexpr std::string_view kInt8Weights = "int8-weights";   // W8A16, int8 codes
inline constexpr std::string_view kFp8Weights = "fp8-weights";     // W8A16, e4m3 codes
inline constexpr std::string_view kFp8W8a8 = "fp8-w8a8";           // e4m3 codes and activations

/// Whether SigLIP runs in bf16 with its fused epilogues: every precision but lerobot's two.
inline bool fast_vision(std::string_view p) { return !p.empty() && p != kFp32 && p != kBf16Lerobot; }

/// Whether the matrices are stored as 8-bit codes (int8 / fp8, W8A16 or W8A8).
inline bool eight_bit(std::string_view p) { return p == kInt8Weights || p == kFp8Weights || p == kFp8W8a8; }

/// Whether a chunk's first denoising step runs beside the prefix LM by default where the runtime
/// has two lanes (Pi05PackageOptions::step_overlap): not in W8A8 packages, which it made slower
/// (session 35). The 8-bit packages' bound is 3.5 GiB, and the step's own arena and scratch (its
/// widened weights) with the second lane's cuBLASLt workspace cost them 32-62 MiB (H100, sessions
/// 35-36); the W8A16 ones take it since their fast vision mode plans no fp32 GEMM with cuBLASLt
/// (H100, session 38: int8 24.91 -> 24.31 ms, fp8 25.06 -> 24.50 ms, both 3.348 -> 3.38 GiB).
inline bool step_overlap_default(std::string_view p) { return p != kFp8W8a8; }

/// The short name `vlac run` prints: int8, fp8, fp8-w8a8 for the 8-bit packages, else the
/// activations' dtype (bf16 or fp32).
inline std::string short_name(std::string_view p, bool bf16) {
  if (p == kInt8Weights) return "int8";
  if (p == kFp8Weights) return "fp8";
  if (p == kFp8W8a8) return std::string(kFp8W8a8);
  return bf16 ? "bf16" : "fp32";
}

}  // namespace vlac::pi05_precision
