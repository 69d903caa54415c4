// `vlac inspect --graph POLICY_DIR`: prints the IR graphs the pi0.5 builder makes from a policy
// folder (every node with its shapes and weight bytes). Reads headers only, never weight bytes.
#pragma once

#include <string>

#include "core/status.h"
#include "mem/meter.h"

namespace vlac::cli {

/// Prints the prefix graph (every configured camera, the full prompt length) and one
/// denoising-step graph, then the Euler loop that repeats the step.
Status inspect_graph(const std::string& policy_dir, MemMeter& meter);

}  // namespace vlac::cli
