// vlac_write_pi05: writes a random-weight pi0.5 policy folder in lerobot's layout (streamed through
// write_random_pi05_folder, bounded memory whatever the size) and/or a matching observation file.
// Never loads a checkpoint: the observation is sized from config.json and the tensors' headers.
#include <dirent.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/bytes.h"
#include "core/status.h"
#include "io/safetensors_writer.h"
#include "mem/meter.h"
#include "mem/progress.h"
#include "models/pi05_arch.h"
#include "models/pi05_demo.h"

namespace vlac {
namespace {

struct Flags {
  std::string out;
  std::string size = "demo";
  std::string layout = "finetune";
  uint64_t seed = 0;
  std::string write_obs;
  bool obs_only = false;
  int64_t obs_tokens = 48;
};

// Size of the writer's temporary file for `final_name` in `dir` (AtomicFile names it
// ".NAME.vlac-tmp-XXXXXX"); 0 before it exists and after the rename.
uint64_t bytes_on_disk(const std::string& dir, const std::string& final_name) {
  const std::string prefix = "." + final_name + ".vlac-tmp-";
  uint64_t best = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
      struct stat st{};
      if (::stat((dir + "/" + e->d_name).c_str(), &st) == 0) best = std::max<uint64_t>(best, uint64_t(st.st_size));
    }
    ::closedir(d);
  }
  return best;
}

// The folder writer has no progress hook, so a thread polls the size of the file being written
// (a readdir of a small folder every 100 ms). Draws only when stderr is a terminal.
Status write_folder(const Flags& f, const Pi05Dims& dims, Pi05Layout layout, uint64_t* bytes) {
  uint64_t total = 0;
  std::vector<TensorSpec> specs;
  for (const auto& w : pi05_weights(dims, layout)) {
    total += w.numel() * 4;
    specs.push_back({w.name, DType::F32, w.shape});
  }
  if (auto h = build_safetensors_header(specs, {{"format", "pt"}}); h.is_ok()) total += h.value().size();
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    Progress progress("writing " + f.out + "/model.safetensors", total);
    while (!done) {
      progress.update(bytes_on_disk(f.out, "model.safetensors"));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    progress.update(total);
    progress.finish();
  });
  Status s = write_random_pi05_folder(f.out, dims, layout, f.seed);
  done = true;
  watcher.join();
  VLAC_RETURN_IF_ERROR(s);
  struct stat st{};
  *bytes = 0;
  for (const char* name : {"/model.safetensors", "/config.json"})
    if (::stat((f.out + name).c_str(), &st) == 0) *bytes += uint64_t(st.st_size);
  return Status::ok();
}

Status write_observation(const std::string& dir, const std::string& path, int64_t n_valid, uint64_t seed) {
  VLAC_RETURN_IF_ERROR(write_pi05_sample_observation(dir, path, n_valid, seed));
  std::printf("vlac_write_pi05: wrote observation %s (%lld prompt tokens)\n", path.c_str(), (long long)n_valid);
  return Status::ok();
}

// ~260 M parameters (about 1 GB in fp32) with the real structure: the "medium" size of
// tools/bench_cpu_vs_lerobot.py (SigLIP 384x6, Gemma 1024x8, expert 512x8, vocab 32000), for
// benchmarks that must finish in minutes on 2 cores.
Pi05Dims medium_dims() {
  Pi05Dims d;
  d.vision_width = 384, d.vision_depth = 6, d.vision_mlp = 1536, d.vision_heads = 6;
  d.lm_width = 1024, d.lm_depth = 8, d.lm_mlp = 4096, d.head_dim = 128, d.lm_heads = 8, d.kv_heads = 1;
  d.vocab = 32000;
  d.expert_width = 512, d.expert_mlp = 2048, d.expert_heads = 8;
  return d;
}

Status run(const Flags& f) {
  if (f.size != "full" && f.size != "medium" && f.size != "demo")
    return invalid_argument("--size must be full, medium or demo, got '" + f.size + "'");
  if (f.layout != "finetune" && f.layout != "base")
    return invalid_argument("--layout must be finetune or base, got '" + f.layout + "'");
  if (f.obs_only && f.write_obs.empty()) return invalid_argument("--obs-only needs --write-obs FILE");
  const Pi05Dims dims = f.size == "full" ? Pi05Dims::full() : f.size == "medium" ? medium_dims() : Pi05Dims::demo();
  const Pi05Layout layout = f.layout == "base" ? Pi05Layout::Base : Pi05Layout::FineTune;
  if (!f.obs_only) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    VLAC_RETURN_IF_ERROR(write_folder(f, dims, layout, &bytes));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("vlac_write_pi05: wrote %s pi0.5 policy %s (%s layout, fp32, seed %llu): %s (%llu bytes) in %s "
                "(%.3f s), peak RSS %s (%llu bytes)\n",
                f.size.c_str(), f.out.c_str(), f.layout.c_str(), (unsigned long long)f.seed, format_bytes(bytes).c_str(),
                (unsigned long long)bytes, format_duration(secs).c_str(), secs,
                format_bytes(process_peak_rss_bytes()).c_str(), (unsigned long long)process_peak_rss_bytes());
  }
  if (!f.write_obs.empty()) VLAC_RETURN_IF_ERROR(write_observation(f.out, f.write_obs, f.obs_tokens, f.seed));
  return Status::ok();
}

}  // namespace
}  // namespace vlac

int main(int argc, char** argv) {
  vlac::Flags f;
  CLI::App app{"vlac_write_pi05: write a random-weight pi0.5 policy folder (lerobot layout, fp32) and observations"};
  app.add_option("--out", f.out, "policy folder to write (created if missing; with --obs-only: an existing one)")
      ->required();
  app.add_option("--size", f.size, "full (PaliGemma-3B + gemma_300m, about 16.5 GB), medium (about 1 GB) or demo (default)");
  app.add_option("--layout", f.layout, "finetune (lerobot save_pretrained: model. prefix, default) or base");
  app.add_option("--seed", f.seed, "seed of the random weights and the observation (default 0)");
  app.add_option("--write-obs", f.write_obs, "also write an observation safetensors for the folder's config");
  app.add_flag("--obs-only", f.obs_only, "write only the observation (--write-obs) for the existing folder --out");
  app.add_option("--obs-tokens", f.obs_tokens, "valid prompt tokens in the observation (default 48)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  vlac::Status s = vlac::run(f);
  std::fflush(stdout);
  if (!s.is_ok()) {
    std::fprintf(stderr, "vlac_write_pi05: error: %s\n", s.message().c_str());
    return s.exit_code();
  }
  return 0;
}
