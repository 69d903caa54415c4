#include "backends/cuda/op_profile.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/env.h"
#include "backends/cuda/kernels.h"

namespace vlac::cuda {
namespace {

struct Sum {
  double ms = 0;
  long long calls = 0;
};

// The process's profile; printed (host data only, no CUDA call) by its destructor at exit.
struct Profile {
  std::mutex mu;
  std::map<std::string, Sum> by_op, by_engine, by_name, by_shape, by_layer;
  ~Profile() {
    double total = 0;
    for (const auto& [k, v] : by_op) total += v.ms;
    if (total <= 0) return;
    std::fprintf(stderr, "vlac cuda op profile (VLAC_PROFILE_OPS): %.2f ms of GPU time in eager runs' nodes\n", total);
    auto print = [&](const char* title, const std::map<std::string, Sum>& m) {
      if (m.empty()) return;
      std::fprintf(stderr, "  by %s:\n", title);
      std::vector<std::pair<std::string, Sum>> rows(m.begin(), m.end());
      std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
      for (const auto& [k, v] : rows)
        std::fprintf(stderr, "    %-48s %10.3f ms %5.1f%% %8lld calls %9.2f us each\n", k.c_str(), v.ms,
                     100.0 * v.ms / total, v.calls, 1000.0 * v.ms / double(v.calls));
    };
    print("op kind", by_op);
    print("engine", by_engine);
    print("node (layer index as #)", by_name);
    print("GEMM shape", by_shape);
    print("layer", by_layer);
  }
};

Profile& profile() {
  static Profile p;
  return p;
}

Status event_error(const char* what, cudaError_t ce) {
  return Status(StatusCode::Internal, std::string("cuda: profile ") + what + ": " + cudaGetErrorString(ce));
}

// Calls part(begin, end, is_index) for each dot-separated part of `name` in order (a part made
// only of digits is a layer index); stops early when part returns false.
template <typename F>
void for_each_part(const std::string& name, F&& part) {
  size_t i = 0;
  while (i <= name.size()) {
    const size_t j = std::min(name.find('.', i), name.size());
    const bool index = j > i && name.find_first_not_of("0123456789", i) >= j;
    if (!part(i, j, index)) return;
    i = j + 1;
  }
}

}  // namespace

int op_profile_level() {
  static const int level = int(env_count("VLAC_PROFILE_OPS", 0));
  return level;
}

NodeTimer::~NodeTimer() {
  for (cudaEvent_t e : ev_) cudaEventDestroy(e);
  if (flag_host_) cudaFreeHost(flag_host_);
}

Status NodeTimer::start(cudaStream_t stream, size_t nodes) {
  if (!flag_host_) {
    void* h = nullptr;
    cudaError_t ce = cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped);
    if (ce == cudaSuccess) ce = cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev_), h, 0);
    if (ce != cudaSuccess) return event_error("flag", ce);
    flag_host_ = static_cast<int*>(h);
  }
  std::atomic_ref<int>(*flag_host_).store(0);
  VLAC_RETURN_IF_ERROR(hold_stream(stream, flag_dev_, 200'000'000ull));
  while (ev_.size() < nodes + 1) {
    cudaEvent_t e = nullptr;
    const cudaError_t ce = cudaEventCreate(&e);
    if (ce != cudaSuccess) return event_error("event", ce);
    ev_.push_back(e);
  }
  used_ = nodes + 1;
  const cudaError_t ce = cudaEventRecord(ev_[0], stream);
  return ce == cudaSuccess ? Status::ok() : event_error("event", ce);
}

Status NodeTimer::mark(cudaStream_t stream, size_t i) {
  if (i + 1 >= used_) return Status(StatusCode::Internal, "cuda: profile mark past the run's nodes");
  const cudaError_t ce = cudaEventRecord(ev_[i + 1], stream);
  return ce == cudaSuccess ? Status::ok() : event_error("event", ce);
}

Result<std::vector<float>> NodeTimer::finish() {
  std::vector<float> ms(used_ ? used_ - 1 : 0, 0.0f);
  if (flag_host_) std::atomic_ref<int>(*flag_host_).store(1);
  if (!used_) return ms;
  cudaError_t ce = cudaEventSynchronize(ev_[used_ - 1]);
  for (size_t i = 0; ce == cudaSuccess && i + 1 < used_; ++i) ce = cudaEventElapsedTime(&ms[i], ev_[i], ev_[i + 1]);
  if (ce != cudaSuccess) return event_error("event", ce);
  return ms;
}

std::string layer_of(const std::string& name) {
  std::string out = "(outside layers)";
  for_each_part(name, [&](size_t, size_t end, bool index) {
    if (index) out = name.substr(0, end);
    return !index;
  });
  return out;
}

std::string layer_pattern(const std::string& name) {
  std::string out;
  for_each_part(name, [&](size_t begin, size_t end, bool index) {
    out += index ? std::string("#") : name.substr(begin, end - begin);
    if (end < name.size()) out += '.';
    return true;
  });
  return out;
}

void op_profile_add(const char* op, const std::string& engine, const std::string& name, const std::string& shape,
                    double ms) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  auto add = [&](std::map<std::string, Sum>& m, const std::string& k) {
    Sum& s = m[k];
    s.ms += ms;
    s.calls += 1;
  };
  add(p.by_op, op);
  add(p.by_engine, engine.empty() ? std::string("?") : engine);
  if (op_profile_level() >= 2) {
    add(p.by_name, name.empty() ? std::string(op) : layer_pattern(name));
    if (!shape.empty()) add(p.by_shape, shape);
  }
  if (op_profile_level() >= 3) add(p.by_layer, engine + ": " + layer_of(name));
}

}  // namespace vlac::cuda
