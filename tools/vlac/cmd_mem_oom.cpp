// `vlac mem oom [FILE|-] [--json]`: reads a pasted PyTorch out-of-memory error and explains it.
// Only reads its input; never writes anything but stdout (and --report-json through run_command).
#include <cerrno>
#include <cstdio>
#include <string>

#include "command.h"
#include "diag/oom_explain.h"
#include "diag/oom_parser.h"

namespace vlac::cli {
namespace {

constexpr size_t kMaxInputBytes = 64ull << 20;  // a log, not a dataset (the reader keeps ~3 copies)

struct OomOptions {
  std::string input = "-";
  bool json = false;
};

Status read_all(std::FILE* f, const std::string& name, std::string* out) {
  char buf[1 << 16];
  while (true) {
    size_t n = std::fread(buf, 1, sizeof buf, f);
    out->append(buf, n);
    if (out->size() > kMaxInputBytes)
      return invalid_argument(name + ": more than 64 MiB; pass the part of the log with the error");
    if (n < sizeof buf) {
      if (std::ferror(f)) return errno_error("read " + name, errno);
      return Status::ok();
    }
  }
}

Status read_input(const std::string& path, std::string* text, std::string* name) {
  if (path == "-") {
    *name = "stdin";
    return read_all(stdin, *name, text);
  }
  *name = path;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    int err = errno;
    if (err == ENOENT) return not_found(path + ": no such file");
    if (err == EISDIR) return invalid_argument(path + ": is a directory, not a log file");
    return errno_error("open " + path, err);
  }
  Status st = read_all(f, path, text);
  std::fclose(f);
  // fopen succeeds on a directory on Linux; the read then fails with EISDIR.
  if (!st.is_ok() && st.message().find("Is a directory") != std::string::npos)
    return invalid_argument(path + ": is a directory, not a log file");
  return st;
}

}  // namespace

void register_mem_oom(CLI::App& mem) {
  auto* sub = mem.add_subcommand(
      "oom", "explain a PyTorch out-of-memory error (CUDA, HIP, XPU, MPS) pasted into a file or stdin");
  static OomOptions opts;
  static CommonOptions common;
  sub->add_option("input", opts.input, "file with the error (a whole log is fine); '-' or nothing reads stdin");
  sub->add_flag("--json", opts.json, "print the numbers, derived figures and levers as JSON (exact bytes)");
  add_common_options(sub, &common);
  sub->callback([] {
    run_command("mem oom", common, [](MemMeter& meter) -> Status {
      meter.begin_phase("read");
      std::string text, name;
      VLAC_RETURN_IF_ERROR(read_input(opts.input, &text, &name));
      meter.begin_phase("parse");
      VLAC_ASSIGN_OR_RETURN(diag::OomMessage msg, diag::parse_oom(text, name));
      diag::OomExplanation ex = diag::explain_oom(msg);
      std::string out = opts.json ? diag::oom_report_json(msg, ex) : diag::oom_report_text(msg, ex);
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fflush(stdout);
      meter.add_extra("input_bytes", std::to_string(text.size()));
      meter.end_phase();
      return Status::ok();
    });
  });
}

}  // namespace vlac::cli
