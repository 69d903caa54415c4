// pi0's architecture as a table (lerobot `pi0`): pi0.5's tensors (same SigLIP, projector, Gemma-2B
// and expert geometry, built from pi05_weights) with a plain-RMSNorm expert and pi0's heads
// (state_proj, action_time_mlp_*). Spec section 7.1. Holds no data.
#pragma once

#include <vector>

#include "core/status.h"
#include "models/pi05_arch.h"
#include "models/policy_arch.h"

namespace vlac {

/// Every tensor a lerobot pi0 checkpoint of this layout holds (same naming rules as pi0.5).
std::vector<WeightSpec> pi0_weights(const Pi05Dims& dims, Pi05Layout layout);

/// The planner's description of pi0 (modules, tensors, per-block activations for `inputs`).
PolicyArch pi0_policy_arch(const Pi05Dims& dims, const PolicyInputs& inputs);

}  // namespace vlac
