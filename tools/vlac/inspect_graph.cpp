// `vlac inspect --graph`: the pi0.5 graphs on meta, printed with the IR printer.
// Never reads weight bytes (the builder works on safetensors headers only).
#include "inspect_graph.h"

#include <cstdio>

#include "ir/printer.h"
#include "models/pi05_builder.h"

namespace vlac::cli {

Status inspect_graph(const std::string& policy_dir, MemMeter& meter) {
  meter.begin_phase("build");
  VLAC_ASSIGN_OR_RETURN(Pi05Model m, Pi05Model::load(policy_dir));
  const Pi05PrefixShape shape = m.nominal_prefix();
  VLAC_ASSIGN_OR_RETURN(Pi05Graph pg, m.build_prefix(shape));
  const int64_t P = int64_t(shape.cameras.size()) * m.image_tokens() + shape.n_text;
  VLAC_ASSIGN_OR_RETURN(Pi05Graph sg, m.build_step(P));
  meter.end_phase();
  const Pi05Dims& d = m.dims();
  std::printf("pi0.5 policy %s\n", policy_dir.c_str());
  std::printf("  vision: width %lld, depth %lld, mlp %lld, heads %lld, patch %lld, %lld tokens per camera\n",
              (long long)d.vision_width, (long long)d.vision_depth, (long long)d.vision_mlp,
              (long long)d.vision_heads, (long long)d.patch_size, (long long)m.image_tokens());
  std::printf("  vlm: width %lld, depth %lld, mlp %lld, heads %lld x %lld, vocab %lld\n", (long long)d.lm_width,
              (long long)d.lm_depth, (long long)d.lm_mlp, (long long)d.lm_heads, (long long)d.head_dim,
              (long long)d.vocab);
  std::printf("  expert: width %lld, mlp %lld, heads %lld; chunk %lld x %lld\n", (long long)d.expert_width,
              (long long)d.expert_mlp, (long long)d.expert_heads, (long long)m.config().chunk_size,
              (long long)d.max_action_dim);
  std::printf("\n== prefix graph (%zu cameras, %lld prompt tokens: P = %lld; masked cameras and padding are dropped at run time)\n",
              shape.cameras.size(), (long long)shape.n_text, (long long)P);
  std::fputs(ir::print_graph(pg.graph).c_str(), stdout);
  std::printf("\n== denoise-step graph (prefix P = %lld)\n", (long long)P);
  std::fputs(ir::print_graph(sg.graph).c_str(), stdout);
  const Pi05EulerSpec e = m.euler();
  std::printf("\n== Euler loop: %lld steps, dt = %.9g, t_k = float32(1 + k*dt): x <- x_next of the step graph\n",
              (long long)e.steps, double(e.dt));
  return Status::ok();
}

}  // namespace vlac::cli
