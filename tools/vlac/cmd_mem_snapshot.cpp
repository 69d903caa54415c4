// `vlac mem snapshot` (placeholder until its issue lands).
#include "command.h"

namespace vlac::cli {

void register_mem_snapshot(CLI::App& mem) {
  auto* sub = mem.add_subcommand("snapshot", "not implemented yet");
  sub->callback([] { std::fprintf(stderr, "vlac mem snapshot: not implemented yet\n"); exit_code() = 1; });
}

}  // namespace vlac::cli
