// `vlac mem`: training-memory tools (oom, plan, snapshot); each lives in its own file.
#include "command.h"

namespace vlac::cli {

void register_mem(CLI::App& app) {
  auto* mem = app.add_subcommand("mem", "explain the memory of training a policy (oom, plan, snapshot)");
  mem->require_subcommand(1);
  register_mem_oom(*mem);
  register_mem_plan(*mem);
  register_mem_snapshot(*mem);
}

}  // namespace vlac::cli
