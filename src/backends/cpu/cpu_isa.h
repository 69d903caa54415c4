// The CPU's instruction sets as vlac uses them (placeholder: the isa branch replaces this file
// with the real detection, the VLAC_MAX_CPU_ISA cap and oneDNN probing).
#pragma once

#include <string>

namespace vlac::cpu {

enum class CpuIsa { Scalar, Neon, Avx2, Avx512, Avx512Bf16, Amx };

struct CpuIsaInfo {
  CpuIsa native = CpuIsa::Scalar;
  CpuIsa active = CpuIsa::Scalar;
  bool bf16_matmul = false;
  bool int8_matmul = false;
  std::string name;
  std::string cap;
};

const CpuIsaInfo& cpu_isa();

}  // namespace vlac::cpu
