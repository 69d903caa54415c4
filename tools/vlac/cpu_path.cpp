// The CPU path a run takes (ISA after the VLAC_MAX_CPU_ISA cap, how bf16 weights are multiplied),
// for the summary line and the --report-json fields.
#include "backends/cpu/cpu_isa.h"
#include "command.h"

namespace vlac::cli {

Result<std::string> cpu_path(MemMeter& meter) {
  VLAC_RETURN_IF_ERROR(cpu::cpu_isa_status());
  const cpu::CpuIsaInfo& i = cpu::cpu_isa();
  auto q = [](const std::string& s) { return "\"" + s + "\""; };
  meter.add_extra("cpu_isa", q(i.name));
  meter.add_extra("cpu_isa_native", q(i.native_name));
  meter.add_extra("cpu_isa_cap", q(i.cap));
  meter.add_extra("onednn_isa", q(i.onednn_isa));
  meter.add_extra("bf16_matmul", i.bf16_matmul ? "true" : "false");
  meter.add_extra("bf16_path", q(cpu::bf16_path_name()));
  return cpu::cpu_path_summary();
}

}  // namespace vlac::cli
