// vlac_write_pi05: writes a random-weight pi0.5 policy folder in lerobot's layout (streamed through
// write_random_pi05_folder, bounded memory whatever the size) and/or a matching observation file.
// Never loads a checkpoint: the observation is sized from config.json and the tensors' headers.
#include <dirent.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/bytes.h"
#include "core/status.h"
#include "io/safetensors_writer.h"
#include "mem/meter.h"
#include "mem/progress.h"
#include "models/pi05_arch.h"
#include "models/pi05_builder.h"
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

constexpr const char* kEmptyCameraPrefix = "observation.images.empty_camera_";

// Size of the writer's temporary file for `final_name` in `dir` (AtomicFile names it
// ".NAME.vlac-tmp-XXXXXX"), or of the final file once renamed; 0 if neither exists yet.
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

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// State dim of config.json's input_features (lerobot: observation.state.shape[0]); 0 if absent.
int64_t config_state_dim(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return 0;
  auto feats = j.find("input_features");
  if (feats == j.end() || !feats->is_object()) return 0;
  auto st = feats->find("observation.state");
  if (st == feats->end() || !st->is_object()) return 0;
  auto shape = st->find("shape");
  if (shape == st->end() || !shape->is_array() || shape->size() != 1 || !(*shape)[0].is_number_integer()) return 0;
  return (*shape)[0].get<int64_t>();
}

// An observation for the policy at `dir`: every configured camera (not lerobot's always-absent
// empty cameras) as float32 CHW in [0, 1] at the model resolution, a pre-tokenized prompt
// (BOS + random ids, right-padded with 0 to tokenizer_max_length, mask true on the valid ones)
// and a float32 state. Dims come from Pi05Model::load (maps the weights, reads none).
Status write_observation(const std::string& dir, const std::string& path, int64_t n_valid, uint64_t seed) {
  VLAC_ASSIGN_OR_RETURN(Pi05Model model, Pi05Model::load(dir));
  const Pi05Config& cfg = model.config();
  const Pi05Dims& d = model.dims();
  const int64_t L = cfg.tokenizer_max_length;
  if (n_valid < 1 || n_valid > L)
    return invalid_argument("--obs-tokens must be in [1, tokenizer_max_length = " + std::to_string(L) + "], got " +
                            std::to_string(n_valid));
  int64_t state_dim = config_state_dim(dir + "/config.json");
  if (state_dim <= 0) state_dim = cfg.max_state_dim;

  std::vector<std::string> cams;
  for (const auto& c : cfg.cameras)
    if (c.rfind(kEmptyCameraPrefix, 0) != 0) cams.push_back(c);
  const int64_t img_numel = d.channels * d.image_size * d.image_size;
  std::vector<TensorSpec> specs;
  for (const auto& c : cams) specs.push_back({c, DType::F32, {d.channels, d.image_size, d.image_size}});
  specs.push_back({"observation.language.attention_mask", DType::BOOL, {L}});
  specs.push_back({"observation.language.tokens", DType::I64, {L}});
  specs.push_back({"observation.state", DType::F32, {state_dim}});
  VLAC_ASSIGN_OR_RETURN(SafetensorsWriter w,
                        SafetensorsWriter::create(path, specs, {{"format", "pt"}, {"producer", "vlac_write_pi05"}}));
  uint64_t state = seed ^ 0x6F62735F73656564ull;  // "obs_seed"
  auto unit = [&] { return float(splitmix64(state) >> 40) / 16777216.0f; };  // [0, 1)
  std::vector<float> img(static_cast<size_t>(img_numel));
  for (size_t ci = 0; ci < cams.size(); ++ci) {
    for (auto& v : img) v = unit();
    VLAC_RETURN_IF_ERROR(w.write(img.data(), img.size() * 4));
  }
  std::vector<uint8_t> mask(static_cast<size_t>(L), 0);
  std::vector<int64_t> tokens(static_cast<size_t>(L), 0);
  // Ids below 1000 exist in every vocabulary vlac builds (demo: 1024; PaliGemma: 257152).
  const int64_t id_hi = std::min<int64_t>(d.vocab, 1000);
  for (int64_t i = 0; i < n_valid; ++i) {
    mask[size_t(i)] = 1;
    tokens[size_t(i)] = i == 0 ? std::min<int64_t>(2, d.vocab - 1) : 3 + int64_t(splitmix64(state) % uint64_t(id_hi - 3));
  }
  VLAC_RETURN_IF_ERROR(w.write(mask.data(), mask.size()));
  VLAC_RETURN_IF_ERROR(w.write(tokens.data(), tokens.size() * 8));
  std::vector<float> st(static_cast<size_t>(state_dim));
  for (auto& v : st) v = unit() * 2.0f - 1.0f;
  VLAC_RETURN_IF_ERROR(w.write(st.data(), st.size() * 4));
  VLAC_RETURN_IF_ERROR(w.finish());
  std::printf("vlac_write_pi05: wrote observation %s (%zu cameras %lldx%lld, %lld of %lld prompt tokens, state [%lld])\n",
              path.c_str(), cams.size(), (long long)d.image_size, (long long)d.image_size, (long long)n_valid,
              (long long)L, (long long)state_dim);
  return Status::ok();
}

Status run(const Flags& f) {
  if (f.size != "full" && f.size != "demo") return invalid_argument("--size must be full or demo, got '" + f.size + "'");
  if (f.layout != "finetune" && f.layout != "base")
    return invalid_argument("--layout must be finetune or base, got '" + f.layout + "'");
  if (f.obs_only && f.write_obs.empty()) return invalid_argument("--obs-only needs --write-obs FILE");
  const Pi05Dims dims = f.size == "full" ? Pi05Dims::full() : Pi05Dims::demo();
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
  app.add_option("--size", f.size, "full (PaliGemma-3B + gemma_300m, about 16.5 GB) or demo (default)");
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
