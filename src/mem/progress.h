// Progress: a one-line progress bar on stderr (bytes done/total, rate, ETA), drawn only when
// stderr is a terminal and at most every 100 ms; silent otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace vlac {

class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes);
  ~Progress();
  void update(uint64_t done_bytes);
  void add(uint64_t bytes) { update(done_ + bytes); }
  /// Draws the final state and ends the line (only if anything was drawn).
  void finish();
  static void set_enabled_for_tests(int forced);  // -1 auto, 0 off, 1 on

 private:
  void draw(bool final);
  std::string label_;
  uint64_t total_ = 0, done_ = 0;
  bool enabled_ = false, drawn_ = false, finished_ = false;
  std::chrono::steady_clock::time_point t0_, last_;
};

}  // namespace vlac
