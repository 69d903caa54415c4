// Subcommand plumbing.
#include "command.h"

#include <cstdio>

namespace vlac::cli {

int& exit_code() {
  static int code = 0;
  return code;
}

void add_common_options(CLI::App* sub, CommonOptions* opts) {
  sub->add_option("--report-json", opts->report_json,
                  "write the memory/time report as JSON (exact bytes) to this file");
  sub->add_flag("--quiet", opts->quiet, "do not print the peak-memory summary line");
}

void run_command(const std::string& name, const CommonOptions& opts,
                 const std::function<Status(MemMeter&)>& body) {
  MemMeter meter("vlac " + name);
  Status st = body(meter);
  MemReport report = meter.finish();
  if (!st.is_ok()) std::fprintf(stderr, "vlac %s: error: %s\n", name.c_str(), st.message().c_str());
  if (!opts.quiet) std::fprintf(stderr, "%s\n", report.summary_line().c_str());
  if (!opts.report_json.empty()) {
    Status ws = write_report_json(report, opts.report_json);
    if (!ws.is_ok()) {
      std::fprintf(stderr, "vlac %s: error: %s\n", name.c_str(), ws.message().c_str());
      if (st.is_ok()) st = ws;
    }
  }
  exit_code() = st.exit_code();
}

}  // namespace vlac::cli
