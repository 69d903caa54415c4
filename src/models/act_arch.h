// ACT's architecture as a table (lerobot `act`, spec 7.3): ResNet-18 trunk with frozen BatchNorm
// (statistics stored as buffers), DETR-style post-norm encoder/decoder, VAE encoder used only in
// training. Holds no data.
#pragma once

#include <cstdint>

#include "models/policy_arch.h"

namespace vlac {

struct ActDims {
  int64_t dim_model = 512, heads = 8, ffn = 3200;
  int64_t encoder_layers = 4;
  /// lerobot default 1: the original ACT configured 7, but a bug there only ever used the first
  /// decoder layer's output, so lerobot builds one (comment in lerobot's configuration_act.py).
  int64_t decoder_layers = 1;
  int64_t vae_encoder_layers = 4;
  int64_t latent_dim = 32;
  bool use_vae = true;
};

/// Conv/BN tensors of torchvision resnet18 up to layer4 (no fc), named as in a state dict.
/// BatchNorm tensors are FrozenBatchNorm2d buffers (weight, bias, running_mean, running_var).
struct ConvTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool is_buffer;
};
std::vector<ConvTensor> resnet18_trunk_tensors();

/// Activation elements (and fixed extra bytes: int64 max-pool indices) the ResNet-18 trunk saves
/// for backward on one image of h x w; see act_arch.cpp for what each layer keeps.
void resnet18_saved_activations(int64_t h, int64_t w, int64_t* elements, int64_t* extra_bytes,
                                std::vector<int64_t>* tensors = nullptr);  // tensors: the maps one by one

/// The planner's description of ACT for `inputs` (state/action dims size the projections).
Result<PolicyArch> act_policy_arch(const ActDims& dims, const PolicyInputs& inputs);

}  // namespace vlac
