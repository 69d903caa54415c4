// Placeholder CPU ISA detection (the isa branch replaces it): the best ISA the compiler's
// runtime check reports, no cap.
#include "backends/cpu/cpu_isa.h"

namespace vlac::cpu {

namespace {

CpuIsaInfo detect() {
  CpuIsaInfo info;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("amx-tile")) info.native = CpuIsa::Amx;
  else if (__builtin_cpu_supports("avx512bf16")) info.native = CpuIsa::Avx512Bf16;
  else if (__builtin_cpu_supports("avx512f")) info.native = CpuIsa::Avx512;
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) info.native = CpuIsa::Avx2;
#elif defined(__aarch64__)
  info.native = CpuIsa::Neon;
#endif
  info.active = info.native;
  info.bf16_matmul = info.active >= CpuIsa::Avx512Bf16;
  info.int8_matmul = false;
  static const char* const kNames[] = {"scalar", "neon", "avx2", "avx512", "avx512_bf16", "amx"};
  info.name = kNames[int(info.active)];
  return info;
}

}  // namespace

const CpuIsaInfo& cpu_isa() {
  static const CpuIsaInfo info = detect();
  return info;
}

}  // namespace vlac::cpu
