// `vlac convert` (placeholder until its module lands).
#include "command.h"

namespace vlac::cli {

void register_convert(CLI::App& app) {
  auto* sub = app.add_subcommand("convert", "not implemented yet");
  sub->callback([] { std::fprintf(stderr, "vlac convert: not implemented yet\n"); exit_code() = 1; });
}

}  // namespace vlac::cli
