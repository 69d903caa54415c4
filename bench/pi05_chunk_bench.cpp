// pi0.5 chunk latency from a .vlac package, split by stage, on whatever backend its engines name
// (cpu or cuda): the first chunk of the process (cold start: process start to first action) then
// warm-up chunks, then ROUNDS x CHUNKS timed chunks, each with its stage times (vision per camera,
// text, prefix LM, each denoising step); median and min per stage; then (--recorded, the default)
// ROUNDS x CHUNKS whole chunks as the runtime replays them (recorded once per prefix shape: CUDA
// graphs on a GPU, no stage timing inside). One JSON (with the meter's memory report) and the
// first chunk's actions. Used by tools/bench_cuda_vs_lerobot.py. Not a test.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "mem/meter.h"
#include "policy/pi05_observation.h"
#include "policy/pi05_policy.h"
#include "runtime/memory_report.h"
#include "runtime/pi05_package_policy.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Seconds since this process started (kernel start time; 1/CLK_TCK resolution).
double seconds_since_process_start() {
  std::ifstream f("/proc/self/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t rp = s.rfind(')');
  if (rp == std::string::npos) return -1;
  std::istringstream in(s.substr(rp + 2));
  std::string field;
  unsigned long long start_ticks = 0;
  for (int i = 3; i <= 22 && in >> field; ++i)
    if (i == 22) start_ticks = std::stoull(field);
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9 - double(start_ticks) / double(::sysconf(_SC_CLK_TCK));
}

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

json stats(std::vector<double> v) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return json::object({{"median_ms", med}, {"min_ms", v.front()}, {"max_ms", v.back()}, {"n", n}});
}

}  // namespace

int main(int argc, char** argv) {
  const double start_to_main_s = seconds_since_process_start();
  const Clock::time_point t_main = Clock::now();
  std::string pkg_path, obs_path, noise_path, out_json, out_actions, vision = "auto";
  int warmup = 3, rounds = 3, chunks = 50, threads = 2;
  bool recorded = true;
  CLI::App app{"pi05_chunk_bench: per-stage pi0.5 chunk latency of a .vlac package (JSON)"};
  app.add_option("package", pkg_path, ".vlac package")->required();
  app.add_option("--obs", obs_path, "observation safetensors (lerobot keys)")->required();
  app.add_option("--noise", noise_path, "noise safetensors ('noise' [chunk, max_action_dim]); default: seed 0");
  app.add_option("--warmup", warmup, "chunks after the first, untimed (default 3)");
  app.add_option("--rounds", rounds, "timed rounds (default 3)");
  app.add_option("--chunks", chunks, "chunks per round (default 50)");
  app.add_option("--threads", threads, "CPU threads (default 2)");
  app.add_option("--out", out_json, "result JSON")->required();
  app.add_option("--actions", out_actions, "write the first chunk's action_normalized here (safetensors)");
  app.add_option("--vision", vision, "SigLIP rounding points: auto (fast for a bf16-all package), exact or fast")
      ->check(CLI::IsMember({"auto", "exact", "fast"}));
  app.add_flag("--recorded,!--no-recorded", recorded,
               "also time ROUNDS x CHUNKS whole chunks recorded once and replayed (run_chunk: CUDA graphs on a "
               "GPU), after the stage-timed eager rounds (default on)");
  int profile = 0;
  app.add_option("--profile", profile,
                 "GPU (or CPU) time per node of the stage-timed eager chunks, printed to stderr at exit: 1 per op "
                 "kind and engine, 2 also per node name across layers and per GEMM shape, 3 also per layer (sets "
                 "VLAC_PROFILE_OPS)")
      ->check(CLI::Range(0, 3));
  CLI11_PARSE(app, argc, argv);
  if (profile > 0) setenv("VLAC_PROFILE_OPS", std::to_string(profile).c_str(), 1);  // before any engine runs

  vlac::MemMeter meter("pi05_chunk_bench");
  auto fail = [&](const vlac::Status& st) {
    std::fprintf(stderr, "pi05_chunk_bench: %s\n", st.message().c_str());
    return st.exit_code();
  };
  meter.begin_phase("load");
  vlac::Pi05PackageOptions opts;
  opts.threads = threads;
  if (vision != "auto") opts.fast_vision = vision == "fast";
  auto policy = vlac::Pi05PackagePolicy::open(pkg_path, opts);
  if (!policy.is_ok()) return fail(policy.status());
  // The GPU probe before the engines' first use (its first reading is the idle level), and the
  // breakdown at three points (memory_breakdown in the JSON; runtime/memory_report.h).
  if (policy->runtime().memory_kind() != vlac::MemoryKind::Host)
    vlac::install_gpu_probe(meter, std::string(policy->runtime().name()));
  else
    meter.note_no_gpu_probe("the package's engines run on the host (" + std::string(policy->runtime().name()) + ")");
  json breakdown = json::object();
  auto snapshot = [&](const char* when) {
    breakdown[when] = json::parse(vlac::memory_breakdown_json(&policy->runtime(), pkg_path, &meter));
  };
  snapshot("after_open");
  const int64_t vocab = policy->package().manifest().policy.value("vocab", int64_t{0});
  vlac::Pi05Processor proc = policy->processor();
  auto obs = vlac::read_pi05_observation(obs_path, policy->config(), policy->channels(), &proc, "", vocab);
  if (!obs.is_ok()) return fail(obs.status());
  const int64_t H = policy->chunk_size(), A = policy->max_action_dim();
  std::vector<float> noise;
  if (!noise_path.empty()) {
    auto n = vlac::read_pi05_noise(noise_path, H, A);
    if (!n.is_ok()) return fail(n.status());
    noise = std::move(*n);
  } else {
    noise = vlac::pi05_gaussian_noise(0, H * A);
  }
  std::vector<float> action(size_t(H * A));
  const Clock::time_point t_open = Clock::now();

  struct Row {
    int round = -1;  // -2: first chunk, -1: warm-up
    double total = 0, prefix = 0, denoise = 0;
    vlac::Pi05PackageStats st;
  };
  std::vector<Row> rows;
  auto chunk = [&](int round) -> vlac::Status {
    const Clock::time_point a = Clock::now();
    VLAC_RETURN_IF_ERROR(policy->run_prefix(*obs));
    const Clock::time_point b = Clock::now();
    VLAC_RETURN_IF_ERROR(policy->denoise(noise.data(), action.data()));
    const Clock::time_point c = Clock::now();
    rows.push_back({round, ms(a, c), ms(a, b), ms(b, c), policy->stats()});
    return vlac::Status::ok();
  };
  meter.begin_phase("first_chunk");
  if (auto st = chunk(-2); !st.is_ok()) return fail(st);
  const double first_action_s = seconds_since_process_start();
  const Clock::time_point t_first = Clock::now();
  snapshot("after_first_chunk");
  if (!out_actions.empty()) {
    int64_t D = 0;
    if (auto st = vlac::write_pi05_run_output(out_actions, action.data(), H, A, policy->config(), proc, *obs,
                                              policy->bf16(), &D);
        !st.is_ok())
      return fail(st);
  }
  meter.begin_phase("warmup");
  for (int i = 0; i < warmup; ++i)
    if (auto st = chunk(-1); !st.is_ok()) return fail(st);
  meter.begin_phase("timed");
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < chunks; ++i)
      if (auto st = chunk(r); !st.is_ok()) return fail(st);
  // Whole chunks as the runtime replays them: recorded at the first call (untimed), then timed
  // by wall clock from the call to the actions on the host. Their actions must equal the eager ones.
  std::vector<std::vector<double>> rec_ms(size_t(recorded ? rounds : 0));
  double rec_vs_eager = 0;
  if (recorded) {
    std::vector<float> eager = action, rec(action.size());
    meter.begin_phase("recorded");
    for (int i = 0; i < std::max(1, warmup); ++i)
      if (auto st = policy->run_chunk(*obs, noise.data(), rec.data()); !st.is_ok()) return fail(st);
    for (size_t i = 0; i < rec.size(); ++i) rec_vs_eager = std::max(rec_vs_eager, double(std::abs(rec[i] - eager[i])));
    for (int r = 0; r < rounds; ++r)
      for (int i = 0; i < chunks; ++i) {
        const Clock::time_point a = Clock::now();
        if (auto st = policy->run_chunk(*obs, noise.data(), rec.data()); !st.is_ok()) return fail(st);
        rec_ms[size_t(r)].push_back(ms(a, Clock::now()));
      }
  }
  meter.end_phase();

  // Per stage over all timed chunks and per round.
  auto collect = [&](int round) {
    std::map<std::string, std::vector<double>> s;
    for (const Row& row : rows) {
      if (row.round < 0 || (round >= 0 && row.round != round)) continue;
      s["chunk"].push_back(row.total);
      s["prefix"].push_back(row.prefix);
      s["denoise"].push_back(row.denoise);
      double vision = 0;
      for (double v : row.st.vision_ms) vision += v;
      s["vision"].push_back(vision);
      s["text"].push_back(row.st.text_ms);
      s["prefix_lm"].push_back(row.st.lm_ms);
      for (size_t k = 0; k < row.st.step_ms.size(); ++k) s["step." + std::to_string(k)].push_back(row.st.step_ms[k]);
    }
    json o = json::object();
    for (auto& [k, v] : s) o[k] = stats(v);
    return o;
  };
  json per_round = json::array();
  for (int r = 0; r < rounds; ++r) per_round.push_back(collect(r));
  json chunk_rows = json::array();
  for (const Row& row : rows)
    chunk_rows.push_back(json::object({{"round", row.round},
                                       {"chunk_ms", row.total},
                                       {"prefix_ms", row.prefix},
                                       {"denoise_ms", row.denoise},
                                       {"vision_ms", row.st.vision_ms},
                                       {"text_ms", row.st.text_ms},
                                       {"prefix_lm_ms", row.st.lm_ms},
                                       {"step_ms", row.st.step_ms}}));
  const Row& first = rows.front();
  snapshot("after_timed");
  vlac::MemReport rep = meter.finish();
  json out = json::object({
      {"package", pkg_path},
      {"engines_backends",
       [&] {
         json b = json::array();
         for (const auto& e : policy->package().manifest().engines)
           if (std::find(b.begin(), b.end(), e.backend) == b.end()) b.push_back(e.backend);
         return b;
       }()},
      {"dtype", policy->bf16() ? "bf16" : "fp32"},
      {"cameras_present", obs->cameras.size()},
      {"prefix_tokens", int64_t(obs->cameras.size()) * policy->image_tokens() + int64_t(obs->tokens.size())},
      {"steps", policy->steps()},
      {"warmup", warmup},
      {"rounds", rounds},
      {"chunks_per_round", chunks},
      {"cold_start",
       json::object({{"process_start_to_main_s", start_to_main_s},
                     {"process_start_to_first_action_s", first_action_s},
                     {"open_ms", ms(t_main, t_open)},
                     {"first_chunk_ms", first.total},
                     {"first_prefix_ms", first.prefix},
                     {"first_denoise_ms", first.denoise},
                     {"main_to_first_action_ms", ms(t_main, t_first)}})},
      {"vision", policy->fast_vision() ? "fast" : "exact"},
      {"summary", collect(-1)},
      {"recorded_chunk",
       [&]() -> json {
         if (!recorded) return nullptr;
         std::vector<double> all;
         json per = json::array();
         for (const auto& v : rec_ms) {
           all.insert(all.end(), v.begin(), v.end());
           per.push_back(stats(v));
         }
         return json::object({{"summary", stats(all)},
                              {"per_round", std::move(per)},
                              {"replays", policy->chunk_replays()},
                              {"max_abs_diff_vs_eager", rec_vs_eager}});
       }()},
      {"per_round", std::move(per_round)},
      {"chunks", std::move(chunk_rows)},
      {"memory", json::parse(rep.to_json())},
      {"memory_breakdown", std::move(breakdown)},
  });
  std::ofstream f(out_json);
  f << out.dump(2) << "\n";
  if (!f) {
    std::fprintf(stderr, "pi05_chunk_bench: cannot write %s\n", out_json.c_str());
    return 1;
  }
  std::fprintf(stderr, "pi05_chunk_bench: %s: chunk median %.2f ms (min %.2f) over %d x %d stage-timed",
               pkg_path.c_str(), out["summary"]["chunk"]["median_ms"].get<double>(),
               out["summary"]["chunk"]["min_ms"].get<double>(), rounds, chunks);
  if (recorded)
    std::fprintf(stderr, ", %.2f ms (min %.2f) recorded", out["recorded_chunk"]["summary"]["median_ms"].get<double>(),
                 out["recorded_chunk"]["summary"]["min_ms"].get<double>());
  std::fprintf(stderr, "; first action %.2f s after process start; %s\n", first_action_s, rep.summary_line().c_str());
  return 0;
}
