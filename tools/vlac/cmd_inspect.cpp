// `vlac inspect` (placeholder until its module lands).
#include "command.h"

namespace vlac::cli {

void register_inspect(CLI::App& app) {
  auto* sub = app.add_subcommand("inspect", "not implemented yet");
  sub->callback([] { std::fprintf(stderr, "vlac inspect: not implemented yet\n"); exit_code() = 1; });
}

}  // namespace vlac::cli
