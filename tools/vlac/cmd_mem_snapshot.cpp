// `vlac mem snapshot FILE [--html OUT] [--json] [--device N] [--top N]`: reads a PyTorch CUDA
// memory snapshot (torch.cuda.memory._dump_snapshot) with our own pickle reader and explains it.
// No logic here beyond flags and output; nothing in the pickle is ever executed.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "command.h"
#include "core/atomic_file.h"
#include "diag/snapshot_analysis.h"
#include "diag/snapshot_data.h"
#include "diag/snapshot_report.h"

namespace vlac::cli {

namespace {

struct SnapshotFlags {
  CommonOptions common;
  std::string file;
  std::string html;
  bool json = false;
  int device = -1;
  size_t top = 8;
};

Status write_text_file(const std::string& path, const std::string& text) {
  VLAC_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  VLAC_RETURN_IF_ERROR(f.write(text.data(), text.size()));
  return f.commit();
}

Status run_snapshot(const SnapshotFlags& f, MemMeter& meter) {
  std::error_code ec;
  if (std::filesystem::is_directory(f.file, ec)) return invalid_argument(f.file + ": is a folder, not a snapshot pickle");
  meter.begin_phase("read");
  VLAC_ASSIGN_OR_RETURN(SnapshotData data, load_snapshot_file(f.file));
  meter.begin_phase("analyse");
  SnapshotOptions opt;
  opt.device = f.device;
  opt.top_sites = f.top;
  auto analysis = analyze_snapshot(data, opt);
  if (!analysis.is_ok()) return analysis.status().with_context(f.file);
  const SnapshotAnalysis& a = analysis.value();
  meter.end_phase();
  meter.add_extra("snapshot_events", std::to_string(a.n_events));
  meter.add_extra("snapshot_peak_allocated_bytes", std::to_string(a.peak_allocated));
  if (!f.html.empty()) {
    Status st = write_text_file(f.html, snapshot_html(a, f.file));
    if (!st.is_ok()) return st.with_context("--html " + f.html);
  }
  if (f.json) {
    nlohmann::json j = snapshot_json(a, f.file);
    if (!f.html.empty()) j["html"] = f.html;
    std::printf("%s\n", j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::fputs(snapshot_text(a, f.file).c_str(), stdout);
    if (!f.html.empty()) std::printf("html: %s\n", f.html.c_str());
  }
  return Status::ok();
}

}  // namespace

void register_mem_snapshot(CLI::App& mem) {
  auto flags = std::make_shared<SnapshotFlags>();
  auto* sub = mem.add_subcommand(
      "snapshot",
      "explain a CUDA memory snapshot (torch.cuda.memory._dump_snapshot): peak, flat/sawtooth/staircase, sites, levers");
  sub->add_option("FILE", flags->file, "the snapshot pickle")->required();
  sub->add_option("--html", flags->html, "also write a self-contained HTML page (timeline + diagnosis) to OUT");
  sub->add_flag("--json", flags->json, "print JSON (exact bytes) instead of text");
  sub->add_option("--device", flags->device, "CUDA device to analyse (default: the one with the most events)");
  sub->add_option("--top", flags->top, "number of allocation sites to list (default 8)");
  add_common_options(sub, &flags->common);
  sub->callback([flags] {
    run_command("mem snapshot", flags->common, [&](MemMeter& meter) { return run_snapshot(*flags, meter); });
  });
}

}  // namespace vlac::cli
