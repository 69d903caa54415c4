// `vlac mem oom` (placeholder until its issue lands).
#include "command.h"

namespace vlac::cli {

void register_mem_oom(CLI::App& mem) {
  auto* sub = mem.add_subcommand("oom", "not implemented yet");
  sub->callback([] { std::fprintf(stderr, "vlac mem oom: not implemented yet\n"); exit_code() = 1; });
}

}  // namespace vlac::cli
