// Terminal progress bar.
#include "mem/progress.h"

#include <unistd.h>

#include <cstdio>

#include "core/bytes.h"

namespace vlac {

namespace {
int g_forced = -1;
}

void Progress::set_enabled_for_tests(int forced) { g_forced = forced; }

Progress::Progress(std::string label, uint64_t total_bytes)
    : label_(std::move(label)), total_(total_bytes) {
  enabled_ = g_forced >= 0 ? g_forced == 1 : isatty(STDERR_FILENO) == 1;
  t0_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

void Progress::update(uint64_t done_bytes) {
  done_ = done_bytes;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_ = now;
  draw(false);
}

void Progress::draw(bool final) {
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  double rate = secs > 0 ? static_cast<double>(done_) / secs : 0;
  double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  if (frac > 1) frac = 1;
  constexpr int kWidth = 24;
  int fill = static_cast<int>(frac * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < fill ? '#' : '.';
  bar[kWidth] = '\0';
  std::string eta = final ? format_duration(secs)
                          : (rate > 0 ? "ETA " + format_duration(static_cast<double>(total_ - std::min(done_, total_)) / rate)
                                      : "ETA ?");
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %s / %s, %s/s, %s\033[K", label_.c_str(), bar, frac * 100,
               format_bytes(done_).c_str(), format_bytes(total_).c_str(),
               format_bytes(static_cast<uint64_t>(rate)).c_str(), eta.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_ || !drawn_) return;
  draw(true);
  std::fputc('\n', stderr);
}

}  // namespace vlac
