// `vlac convert IN OUT --dtype bf16|fp16|fp32 [--prefix P] [--max-shard-size SIZE] [--buffer SIZE]`:
// streams a checkpoint into a new dtype through one fixed buffer (io/convert). No logic here
// beyond flags, the progress bar and the report.
#include <cstdio>
#include <memory>

#include "command.h"
#include "core/bytes.h"
#include "io/convert.h"
#include "mem/progress.h"

namespace vlac::cli {

namespace {

struct ConvertFlags {
  CommonOptions common;
  std::string input, output, dtype, prefix, max_shard_size, buffer;
};

Status run_convert(const ConvertFlags& f, MemMeter& meter) {
  meter.begin_phase("open");
  ConvertOptions opt;
  opt.input = f.input;
  opt.output = f.output;
  opt.prefix = f.prefix;
  VLAC_ASSIGN_OR_RETURN(opt.target, parse_convert_target(f.dtype));
  if (!f.max_shard_size.empty()) {
    auto r = parse_size(f.max_shard_size);
    if (!r.is_ok()) return r.status().with_context("--max-shard-size");
    opt.max_shard_size = r.value();
    if (opt.max_shard_size == 0) return invalid_argument("--max-shard-size must be > 0 (omit it for one file)");
  }
  if (!f.buffer.empty()) {
    auto r = parse_size(f.buffer);
    if (!r.is_ok()) return r.status().with_context("--buffer");
    opt.buffer_bytes = r.value();
  }
  meter.begin_phase("convert");
  std::unique_ptr<Progress> bar;
  ConvertStats stats;
  Status st = convert_checkpoint(opt, &stats, [&](uint64_t done, uint64_t total) {
    if (!bar) bar = std::make_unique<Progress>("convert", total);
    bar->update(done);
  });
  if (bar) bar->finish();
  meter.end_phase();
  if (!st.is_ok()) return st;
  double rate = stats.seconds > 0 ? static_cast<double>(stats.input_bytes) / stats.seconds : 0;
  meter.add_extra("input_bytes", std::to_string(stats.input_bytes));
  meter.add_extra("output_bytes", std::to_string(stats.output_bytes));
  meter.add_extra("tensors", std::to_string(stats.n_tensors));
  meter.add_extra("tensors_converted", std::to_string(stats.n_converted));
  meter.add_extra("output_files", std::to_string(stats.output_files.size()));
  meter.add_extra("convert_seconds", std::to_string(stats.seconds));
  meter.add_extra("throughput_bytes_per_second", std::to_string(static_cast<uint64_t>(rate)));
  std::string where = stats.output_files.size() == 1
                          ? stats.output_files[0]
                          : std::to_string(stats.output_files.size() - 1) + " shards + " + stats.output_files.back();
  std::printf("converted %llu tensors (%llu to %s), %s -> %s in %s (%s/s): %s\n",
              static_cast<unsigned long long>(stats.n_tensors), static_cast<unsigned long long>(stats.n_converted),
              dtype_name(opt.target), format_bytes(stats.input_bytes).c_str(),
              format_bytes(stats.output_bytes).c_str(), format_duration(stats.seconds).c_str(),
              format_bytes(static_cast<uint64_t>(rate)).c_str(), where.c_str());
  std::fflush(stdout);  // before the meter's summary line on stderr
  return Status::ok();
}

}  // namespace

void register_convert(CLI::App& app) {
  auto flags = std::make_shared<ConvertFlags>();
  auto* sub = app.add_subcommand(
      "convert",
      "convert a safetensors checkpoint to bf16/fp16/fp32, streaming through a fixed buffer");
  sub->add_option("IN", flags->input, "a .safetensors file, a *.safetensors.index.json, or a folder holding one")
      ->required();
  sub->add_option("OUT", flags->output,
                  "output .safetensors path (with --max-shard-size: shards + index in its folder)")
      ->required();
  sub->add_option("--dtype", flags->dtype, "target float type: bf16, fp16 or fp32")->required();
  sub->add_option("--prefix", flags->prefix, "keep only tensors whose name starts with P, and strip P");
  sub->add_option("--max-shard-size", flags->max_shard_size,
                  "split the output into shards of at most SIZE tensor bytes (e.g. 5GiB), Hugging Face layout");
  sub->add_option("--buffer", flags->buffer, "conversion buffer size (default 8MiB)");
  add_common_options(sub, &flags->common);
  sub->callback([flags] {
    run_command("convert", flags->common, [&](MemMeter& meter) { return run_convert(*flags, meter); });
  });
}

}  // namespace vlac::cli
