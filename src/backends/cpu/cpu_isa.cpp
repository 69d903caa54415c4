// CPU ISA detection (cpuid + xgetbv on x86-64, getauxval on aarch64), the VLAC_MAX_CPU_ISA cap
// and the oneDNN probes. The cap is applied to oneDNN at program start (a static initializer
// below), before anything can create a primitive: oneDNN accepts set_max_cpu_isa only before its
// first use.
#include "backends/cpu/cpu_isa.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>

#include <dnnl.hpp>

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "backends/cpu/bf16_gemm.h"

namespace vlac::cpu {
namespace {

std::atomic<bool> g_force_fallback{false};

#if defined(__x86_64__)
uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuIsa detect_native() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return CpuIsa::Scalar;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28);
  if (!osxsave || !avx) return CpuIsa::Scalar;
  const uint64_t xcr0 = xgetbv0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;           // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;         // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_tile = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  if (!os_ymm || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return CpuIsa::Scalar;
  const bool avx2 = b & (1u << 5);
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));  // F DQ BW VL
  const bool amx = (d & (1u << 24)) && (d & (1u << 22));  // AMX-TILE, AMX-BF16
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const bool avx512bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
  if (!avx2 || !fma) return CpuIsa::Scalar;
  if (!avx512 || !os_zmm) return CpuIsa::Avx2;
  if (amx && os_tile) return CpuIsa::Amx;
  return avx512bf16 ? CpuIsa::Avx512Bf16 : CpuIsa::Avx512;
}

dnnl::cpu_isa onednn_cap(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return dnnl::cpu_isa::avx2;
    case CpuIsa::Avx512: return dnnl::cpu_isa::avx512_core;
    case CpuIsa::Avx512Bf16: return dnnl::cpu_isa::avx512_core_bf16;
    case CpuIsa::Amx: return dnnl::cpu_isa::avx512_core_amx;
    default: return dnnl::cpu_isa::sse41;  // oneDNN's lowest x86 level; vlac's own code is scalar
  }
}

const char* onednn_isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}
#else
CpuIsa detect_native() {
#if defined(__aarch64__)
  return CpuIsa::Neon;  // Advanced SIMD is part of the AArch64 base ISA
#else
  return CpuIsa::Scalar;
#endif
}
#endif

// Whether oneDNN builds a matmul with these source/weight types (fp32 output) that is not its
// reference implementation (which would be orders of magnitude slower than our own kernels).
bool probe_matmul(dnnl::memory::data_type src, dnnl::memory::data_type wei) {
  try {
    using tag = dnnl::memory::format_tag;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::dim m = 64, k = 64, n = 64;
    dnnl::memory::desc a({m, k}, src, tag::ab), b({k, n}, wei, tag::ba),
        c({m, n}, dnnl::memory::data_type::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
    const std::string impl = pd.impl_info_str();
    return impl.rfind("ref", 0) != 0;
  } catch (const dnnl::error&) {
    return false;
  }
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& ch : r) ch = ch == '-' ? '_' : char(std::tolower(static_cast<unsigned char>(ch)));
  return r;
}

CpuIsaInfo detect() {
  CpuIsaInfo info;
  info.native = detect_native();
  info.active = info.native;
  if (const char* cap = std::getenv("VLAC_MAX_CPU_ISA"); cap && *cap) {
    info.cap = cap;
    auto parsed = parse_cpu_isa(info.cap, kIsX86);
    if (parsed.is_ok()) info.active = std::min(info.native, parsed.value());
    else info.cap_error = parsed.status().message();
  }
#if defined(__x86_64__)
  if (!info.cap.empty() && info.cap_error.empty() && dnnl::set_max_cpu_isa(onednn_cap(info.active)) != dnnl::status::success)
    info.cap_error = "VLAC_MAX_CPU_ISA=" + info.cap + ": oneDNN was used before the cap could be applied";
  const dnnl::cpu_isa eff = dnnl::get_effective_cpu_isa();
  info.onednn_isa = onednn_isa_name(eff);
  if (info.cap.empty()) {  // ONEDNN_MAX_CPU_ISA alone caps oneDNN; vlac's own kernels follow it
    const CpuIsa from_onednn = eff == dnnl::cpu_isa::avx512_core_amx    ? CpuIsa::Amx
                               : eff == dnnl::cpu_isa::avx512_core_bf16 ? CpuIsa::Avx512Bf16
                               : (eff == dnnl::cpu_isa::avx512_core || eff == dnnl::cpu_isa::avx512_core_vnni)
                                   ? CpuIsa::Avx512
                               : (eff == dnnl::cpu_isa::avx2 || eff == dnnl::cpu_isa::avx2_vnni) ? CpuIsa::Avx2
                                                                                                 : CpuIsa::Scalar;
    info.active = std::min(info.active, from_onednn);
  }
#elif defined(__aarch64__) && defined(__linux__)
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  info.arm_dotprod = hw & (1ul << 20);  // HWCAP_ASIMDDP
  info.arm_bf16 = hw2 & (1ul << 14);    // HWCAP2_BF16
  info.onednn_isa = "aarch64";
#endif
  info.name = cpu_isa_name(info.active);
  info.native_name = cpu_isa_name(info.native);
  using dt = dnnl::memory::data_type;
  info.bf16_matmul = probe_matmul(dt::bf16, dt::bf16);
  info.int8_matmul = probe_matmul(dt::u8, dt::s8);
  return info;
}

// Applies the cap before main(): nothing in vlac creates a oneDNN primitive at static-init time.
[[maybe_unused]] const CpuIsaInfo& g_at_start = cpu_isa();

}  // namespace

const CpuIsaInfo& cpu_isa() {
  static const CpuIsaInfo info = detect();
  return info;
}

Status cpu_isa_status() {
  const CpuIsaInfo& i = cpu_isa();
  return i.cap_error.empty() ? Status::ok() : invalid_argument(i.cap_error);
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Neon: return "neon";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx512Bf16: return "avx512_bf16";
    case CpuIsa::Amx: return "amx";
  }
  return "?";
}

Result<CpuIsa> parse_cpu_isa(std::string_view value, bool x86) {
  const std::string v = lower(value);
  if (v == "scalar") return CpuIsa::Scalar;
  if (x86) {
    if (v == "avx2") return CpuIsa::Avx2;
    if (v == "avx512" || v == "avx512_core") return CpuIsa::Avx512;
    if (v == "avx512_bf16" || v == "avx512_core_bf16") return CpuIsa::Avx512Bf16;
    if (v == "amx" || v == "avx512_core_amx") return CpuIsa::Amx;
  } else if (v == "neon") {
    return CpuIsa::Neon;
  }
  return invalid_argument("VLAC_MAX_CPU_ISA=" + std::string(value) + ": not an ISA cap for this " +
                          (x86 ? "x86-64" : "aarch64") + " build; use one of " +
                          (x86 ? "scalar, avx2, avx512, avx512_bf16, amx" : "scalar, neon") + " (any case)");
}

bool use_bf16_fallback() { return g_force_fallback.load() || !cpu_isa().bf16_matmul; }
void set_force_bf16_fallback(bool on) { g_force_fallback.store(on); }

const char* bf16_path_name() {
  if (!use_bf16_fallback()) return "oneDNN bf16 matmul";
  return bf16_gemm_available() ? "vlac avx2 register-blocked bf16 kernel" : "vlac blocked bf16->fp32 + sgemm";
}

std::string cpu_isa_line() {
  const CpuIsaInfo& i = cpu_isa();
  std::string s = i.name;
  if (!i.cap.empty()) {
    s += " (cap VLAC_MAX_CPU_ISA=" + i.cap + "; native " + i.native_name + ")";
  } else if (const char* d = std::getenv("ONEDNN_MAX_CPU_ISA"); d && *d) {
    s += " (cap ONEDNN_MAX_CPU_ISA=" + std::string(d) + "; native " + i.native_name + ")";
  }
  return s + ", oneDNN isa " + i.onednn_isa;
}

std::string cpu_path_summary() { return cpu_isa_line() + ", bf16 weights via " + bf16_path_name(); }

}  // namespace vlac::cpu
