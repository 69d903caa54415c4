// cuda_chunk_bench: a pi0.5 policy folder on the "cuda" backend, whole chunks timed. Loads the
// folder (weights uploaded once), runs one eager chunk with the prefix and the Euler loop timed
// apart (each synchronized), then records the chunk as CUDA graphs (run_chunk) and times
// --rounds x --chunks replays. Prints JSON (also to --out): per-stage eager times, median/min of
// the recorded chunk per round, the recorded chunk's agreement with the eager one, cold start
// to the first action (page cache as found), peak host RSS and GPU memory above idle.
// Usage: cuda_chunk_bench --policy DIR --obs OBS.safetensors [--dtype bf16|fp32] [--rounds 3] [--vision fp32|tf32|bf16]
//        [--chunks 50] [--out FILE.json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "mem/meter.h"
#include "policy/pi05_policy.h"

using namespace vlac;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

int fail(const Status& s) {
  std::fprintf(stderr, "cuda_chunk_bench: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Clock::time_point t_start = Clock::now();
  std::string policy, obs_path, out, dtype = "bf16";
  int rounds = 3, chunks = 50;
  std::string vision = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--policy") policy = v;
    else if (k == "--obs") obs_path = v;
    else if (k == "--out") out = v;
    else if (k == "--dtype") dtype = v;
    else if (k == "--vision" && (v == "fp32" || v == "tf32" || v == "bf16")) vision = v;
    else if (k == "--rounds") rounds = std::max(1, std::atoi(v.c_str()));
    else if (k == "--chunks") chunks = std::max(1, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "cuda_chunk_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (policy.empty() || obs_path.empty()) {
    std::fprintf(stderr, "usage: cuda_chunk_bench --policy DIR --obs OBS [--dtype bf16|fp32] [--rounds N] [--chunks N] [--out F] [--vision fp32|tf32|bf16]\n");
    return 2;
  }
  Backend* cuda = backend_registry().find("cuda");
  if (!cuda) return fail(unsupported("this build has no CUDA backend"));
  auto gpu_used = [&]() -> int64_t {
    const DeviceInfo d = cuda->device();
    return int64_t(d.total_memory - d.free_memory);
  };
  const int64_t gpu_idle = gpu_used();
  int64_t gpu_peak = gpu_idle;
  auto probe = [&] { gpu_peak = std::max(gpu_peak, gpu_used()); };

  Pi05PolicyOptions o;
  o.backend = "cuda";
  o.precision = dtype == "fp32" ? Pi05Precision::Fp32 : Pi05Precision::Bf16;
  o.vision = vision == "bf16"   ? Pi05PolicyOptions::Vision::Bf16
             : vision == "tf32" ? Pi05PolicyOptions::Vision::Tf32
                                : Pi05PolicyOptions::Vision::Fp32;
  const Clock::time_point t0 = Clock::now();
  auto pol = Pi05Policy::load(policy, o);
  if (!pol.is_ok()) return fail(pol.status());
  const Clock::time_point t1 = Clock::now();
  probe();
  auto obs = read_pi05_observation(obs_path, pol->model());
  if (!obs.is_ok()) return fail(obs.status());
  const int64_t H = pol->model().config().chunk_size, A = pol->model().dims().max_action_dim;
  std::vector<float> noise = pi05_gaussian_noise(0, H * A), eager(size_t(H * A)), chunk(size_t(H * A));

  // Eager chunks: the first plans everything (arenas, cuBLASLt algorithms) and fills the memo.
  double prefix_ms[2] = {0, 0}, denoise_ms[2] = {0, 0};
  double first_action_s = 0;
  for (int i = 0; i < 2; ++i) {
    const Clock::time_point a = Clock::now();
    Status st = pol->run_prefix(*obs);
    if (!st.is_ok()) return fail(st);
    const Clock::time_point b = Clock::now();
    st = pol->denoise(noise.data(), eager.data());
    if (!st.is_ok()) return fail(st);
    const Clock::time_point c = Clock::now();
    prefix_ms[i] = ms(a, b);
    denoise_ms[i] = ms(b, c);
    if (i == 0) first_action_s = ms(t_start, c) / 1000.0;
    probe();
  }
  // Recorded chunks: call 1 runs directly, call 2 records, later calls replay.
  for (int i = 0; i < 2; ++i) {
    Status st = pol->run_chunk(*obs, noise.data(), chunk.data());
    if (!st.is_ok()) return fail(st);
  }
  double max_diff = 0;
  for (size_t i = 0; i < chunk.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(chunk[i] - eager[i])));
  nlohmann::json jr = nlohmann::json::array();
  std::vector<double> all;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> t;
    for (int c = 0; c < chunks; ++c) {
      const Clock::time_point a = Clock::now();
      Status st = pol->run_chunk(*obs, noise.data(), chunk.data());
      if (!st.is_ok()) return fail(st);
      t.push_back(ms(a, Clock::now()));
    }
    probe();
    std::sort(t.begin(), t.end());
    all.insert(all.end(), t.begin(), t.end());
    jr.push_back({{"median_ms", t[t.size() / 2]}, {"min_ms", t.front()}, {"max_ms", t.back()}});
  }
  std::sort(all.begin(), all.end());
  const int64_t P = int64_t(obs->cameras.size()) * pol->model().image_tokens() + int64_t(obs->tokens.size());
  nlohmann::json j = {
      {"bench", "cuda_chunk_bench"},
      {"device", cuda->device().description},
      {"policy", policy},
      {"dtype", pol->bf16() ? "bf16" : "fp32"},
      {"vision", pol->bf16() ? vision : std::string("fp32")},
      {"cameras", obs->cameras.size()},
      {"prompt_tokens", obs->tokens.size()},
      {"prefix_tokens", P},
      {"chunk_size", H},
      {"steps", pol->model().euler().steps},
      {"load_s", ms(t0, t1) / 1000.0},
      {"first_action_s_from_process_start", first_action_s},
      {"eager_first", {{"prefix_ms", prefix_ms[0]}, {"denoise_ms", denoise_ms[0]}}},
      {"eager_warm", {{"prefix_ms", prefix_ms[1]}, {"denoise_ms", denoise_ms[1]},
                      {"step_ms", denoise_ms[1] / double(pol->model().euler().steps)}}},
      {"recorded_chunk", {{"rounds", jr}, {"median_ms", all[all.size() / 2]}, {"min_ms", all.front()},
                          {"chunks_per_round", chunks}, {"replays", pol->chunk_replays()}}},
      {"recorded_vs_eager_max_abs_diff", max_diff},
      {"weights_device_bytes", pol->weights().owned_bytes()},
      {"weights_host_mapped_bytes", pol->weights().mapped_bytes()},
      {"activation_bytes", pol->activation_bytes()},
      {"peak_rss_bytes", process_peak_rss_bytes()},
      {"gpu_idle_used_bytes", gpu_idle},
      {"peak_gpu_above_idle_bytes", gpu_peak - gpu_idle},
      {"peak_rss_plus_gpu_above_idle_bytes", int64_t(process_peak_rss_bytes()) + gpu_peak - gpu_idle},
  };
  const std::string text = j.dump(2);
  std::printf("%s\n", text.c_str());
  if (!out.empty()) {
    std::ofstream f(out + ".tmp");
    f << text << "\n";
    f.close();
    std::rename((out + ".tmp").c_str(), out.c_str());
  }
  return 0;
}
