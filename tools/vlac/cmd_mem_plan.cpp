// `vlac mem plan` (placeholder until its issue lands).
#include "command.h"

namespace vlac::cli {

void register_mem_plan(CLI::App& mem) {
  auto* sub = mem.add_subcommand("plan", "not implemented yet");
  sub->callback([] { std::fprintf(stderr, "vlac mem plan: not implemented yet\n"); exit_code() = 1; });
}

}  // namespace vlac::cli
