// The CPU's instruction sets as vlac uses them: what the CPU has (native), what runs after the
// VLAC_MAX_CPU_ISA cap (active), and what oneDNN really builds on the active ISA (probed once,
// never guessed). Every ISA-specific kernel in backends/cpu dispatches on cpu_isa().active, and
// the cap is also handed to oneDNN (dnnl::set_max_cpu_isa before its first primitive), so one
// AVX-512 machine can run and test the AVX2 path.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace vlac::cpu {

/// Ordered within an architecture: x86-64 Scalar < Avx2 < Avx512 < Avx512Bf16 < Amx;
/// aarch64 Scalar < Neon. Avx2 means AVX2 + FMA; Avx512 means AVX-512 F/BW/VL/DQ.
enum class CpuIsa { Scalar, Neon, Avx2, Avx512, Avx512Bf16, Amx };

struct CpuIsaInfo {
  CpuIsa native = CpuIsa::Scalar;  // what the CPU and OS support
  CpuIsa active = CpuIsa::Scalar;  // native capped by VLAC_MAX_CPU_ISA
  bool bf16_matmul = false;  // oneDNN creates a bf16×bf16→f32 matmul (not a reference one) on `active`
  bool int8_matmul = false;  // the same for u8×s8→f32
  std::string name;          // cpu_isa_name(active), e.g. "avx2"
  std::string cap;           // VLAC_MAX_CPU_ISA as given ("" when unset)
  // More detail.
  std::string cap_error;     // non-empty when the cap is not a valid value (then active = native)
  std::string native_name;   // cpu_isa_name(native)
  std::string onednn_isa;    // oneDNN's effective ISA after the cap, e.g. "avx2"
  bool arm_dotprod = false;  // aarch64: SDOT/UDOT (HWCAP_ASIMDDP)
  bool arm_bf16 = false;     // aarch64: BFMMLA/BFDOT (HWCAP2_BF16)
};

/// Detected once (first call; also at program start), thread-safe afterwards.
const CpuIsaInfo& cpu_isa();

/// OK, or the error of a bad VLAC_MAX_CPU_ISA value (one message naming the value and the valid
/// ones). Engines refuse to be created with a bad cap; the CLI prints this before it runs.
Status cpu_isa_status();

/// "scalar", "neon", "avx2", "avx512", "avx512_bf16", "amx".
const char* cpu_isa_name(CpuIsa isa);

/// Parses a cap value, case-insensitive ("AVX2", "avx512_bf16", "avx512-bf16", ...). `x86`
/// selects which architecture's names are valid (neon is not an x86 cap, avx2 not an arm one).
Result<CpuIsa> parse_cpu_isa(std::string_view value, bool x86);

/// Whether this build runs on x86-64 (false: aarch64 or another architecture).
constexpr bool kIsX86 =
#if defined(__x86_64__)
    true;
#else
    false;
#endif

/// How bf16 weights are multiplied on this path: oneDNN's bf16 matmul when it has one, else
/// vlac's blocked bf16→fp32 kernels (set_force_bf16_fallback forces the latter).
bool use_bf16_fallback();
/// For tests and benchmarks: take the blocked bf16→fp32 path even where oneDNN has a bf16
/// matmul. Affects DnnlLinear/DnnlAttention created afterwards.
void set_force_bf16_fallback(bool on);

/// The ISA part of the path: e.g. "avx2 (cap VLAC_MAX_CPU_ISA=avx2; native avx512_bf16), oneDNN
/// isa avx2" (a cap set through ONEDNN_MAX_CPU_ISA alone is named too).
std::string cpu_isa_line();
/// cpu_isa_line() + ", bf16 weights via " + bf16_path_name().
std::string cpu_path_summary();
/// How bf16 weights are multiplied: "oneDNN bf16 matmul", "vlac avx2 register-blocked bf16
/// kernel" (AVX2 and above without a oneDNN bf16 matmul) or "vlac blocked bf16->fp32 + sgemm".
const char* bf16_path_name();
/// How fp32 weights are multiplied: "oneDNN fp32 matmul".
inline const char* f32_path_name() { return "oneDNN fp32 matmul"; }

}  // namespace vlac::cpu
