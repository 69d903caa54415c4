// vlac: compile robot policies into packages that fit small machines, and explain the memory
// of training them. This file only wires the subcommands together.
#include <cstdio>

#include "command.h"

int main(int argc, char** argv) {
  CLI::App app{"vlac: compile and run robot policies in the memory of small machines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "vlac 0.1.0");
  vlac::cli::register_inspect(app);
  vlac::cli::register_convert(app);
  vlac::cli::register_demo(app);
  vlac::cli::register_mem(app);
  vlac::cli::register_compile(app);
  vlac::cli::register_run(app);
  vlac::cli::register_serve(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // a bad flag is bad input
  }
  return vlac::cli::exit_code();
}
