// `vlac demo` (placeholder until its module lands).
#include "command.h"

namespace vlac::cli {

void register_demo(CLI::App& app) {
  auto* sub = app.add_subcommand("demo", "not implemented yet");
  sub->callback([] { std::fprintf(stderr, "vlac demo: not implemented yet\n"); exit_code() = 1; });
}

}  // namespace vlac::cli
