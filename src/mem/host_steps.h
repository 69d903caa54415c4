// Which loading step grew the host's malloc heap and anonymous RSS. A HostStep scope around a
// step (the CUDA context, cuBLASLt's load, a GEMM's planning or timing, a chunk's warm-up,
// recording and graph instantiation...) adds what the heap in use (mallinfo2) and RssAnon
// (/proc/self/status) grew by while it ran, less what scopes nested inside it grew, to the step's
// tally: each byte is counted once, under the innermost step. Process-wide figures, so another
// thread's allocations during a scope land in it too. A scope costs one status read and one
// mallinfo2 at each end (tens of µs): for loading steps, never per chunk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlac {

struct HostStepTally {
  std::string name;
  int64_t heap_bytes = 0;  // growth of malloc's bytes in use (arena + mmapped chunks), may be < 0
  int64_t anon_bytes = 0;  // growth of RssAnon: malloc's pages, the driver's own anonymous maps...
  int64_t calls = 0;
};

class HostStep {
 public:
  explicit HostStep(const char* name);
  ~HostStep();
  HostStep(const HostStep&) = delete;
  HostStep& operator=(const HostStep&) = delete;

 private:
  const char* name_;
  int64_t heap0_, anon0_;
  int64_t child_heap_ = 0, child_anon_ = 0;  // what nested scopes grew (counted there)
  HostStep* parent_;
};

/// The tallies so far, in the order the steps first ran.
std::vector<HostStepTally> host_step_tallies();
/// Forgets every tally (tests).
void reset_host_steps();

}  // namespace vlac
