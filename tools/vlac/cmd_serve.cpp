// `vlac serve PACKAGE [--host H] [--port P] ...`: lerobot's async-inference policy server. The
// server is Python (python/vlac/serve.py: gRPC from PyPI, lerobot's pickled payloads read by a
// restricted unpickler), so this subcommand hands over to it: it execs `python3 -m vlac.serve`
// (VLAC_PYTHON names another interpreter) with the same arguments, and says how to install the
// package when that interpreter lacks it. `pip install .` also installs a `vlac` program whose
// `serve` runs in its own interpreter (docs/serve.md).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "command.h"

namespace vlac::cli {

namespace {

// Runs in the interpreter: a missing package is one clear line and exit 2, not a traceback.
constexpr const char* kBootstrap =
    "import sys\n"
    "try:\n"
    "    from vlac.serve import main\n"
    "except ImportError as e:\n"
    "    sys.stderr.write('vlac serve: error: the vlac Python package is not importable by ' + sys.executable +\n"
    "                     ' (' + str(e) + '): install it with `pip install .` from the vlac source tree '\n"
    "                     '(docs/python.md), or set VLAC_PYTHON to an interpreter that has it\\n')\n"
    "    sys.exit(2)\n"
    "sys.exit(main(sys.argv[1:]))\n";

}  // namespace

void register_serve(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "serve", "serve a policy to lerobot's async-inference robot client (gRPC; runs python3 -m vlac.serve)");
  sub->prefix_command();  // everything after `serve` goes to the Python server as is
  sub->callback([sub] {
    const char* env = std::getenv("VLAC_PYTHON");
    const std::string python = env && *env ? env : "python3";
    std::vector<std::string> args{python, "-c", kBootstrap};
    for (const std::string& a : sub->remaining()) args.push_back(a);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(python.c_str(), argv.data());
    std::fprintf(stderr, "vlac serve: error: cannot run %s (%s): install Python 3 with the vlac package "
                 "(pip install .), or set VLAC_PYTHON\n", python.c_str(), std::strerror(errno));
    exit_code() = 2;
  });
}

}  // namespace vlac::cli
