// ir/fuse: which Linears fuse, the fused weight's parts and rows, the Slices that replace the
// members, and everything that must stay as it was (shared weights, mixed dtypes, other inputs).
#include <gtest/gtest.h>

#include "ir/fuse.h"
#include "ir/walk.h"
#include "models/pi05_builder.h"

namespace vlac {
namespace {

using ir::OpKind;
using ir::ValueId;

ir::WeightRef ref(const std::string& name, std::vector<int64_t> shape, uint64_t offset, DType dt = DType::F32) {
  ir::WeightRef r;
  r.name = name;
  r.offset = offset;
  r.dtype = dt;
  r.shape = std::move(shape);
  r.bytes = uint64_t(ir::ValueInfo{dt, r.shape}.numel()) * dtype_size(dt);
  return r;
}

// x -> k, v, q projections (built in that order, as pi0.5's Gemma builder does) -> outputs.
struct Attn {
  ir::Graph g;
  ValueId x, q, k, v;
  explicit Attn(bool bias) {
    x = g.add_input("x", {DType::F32, {5, 8}});
    auto lin = [&](const char* role, int64_t n, uint64_t off) {
      ValueId w = g.weight(ref(std::string("m.attn.") + role + ".weight", {n, 8}, off));
      std::vector<ValueId> in = {x, w};
      if (bias) in.push_back(g.weight(ref(std::string("m.attn.") + role + ".bias", {n}, off + 4096)));
      return g.add(OpKind::Linear, in, {}, std::string("l.") + role).value();
    };
    k = lin("k_proj", 2, 1000);
    v = lin("v_proj", 2, 2000);
    q = lin("q_proj", 4, 3000);
    g.mark_output(q);
    g.mark_output(k);
    g.mark_output(v);
  }
};

TEST(IrFuse, QkvBecomesOneLinearWithSlicesInKernelRowOrder) {
  for (bool bias : {false, true}) {
    Attn a(bias);
    ir::FuseStats st;
    auto r = ir::fuse_linears(a.g, ir::default_fuse_rules(), &st);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    const ir::Graph& g = r->graph;
    EXPECT_EQ(st.groups, 1);
    EXPECT_EQ(st.linears_fused, 3);
    int linears = 0;
    for (const ir::Node& n : g.nodes()) linears += n.op == OpKind::Linear;
    EXPECT_EQ(linears, 1);
    // The fused weight: q | k | v rows whatever the build order, named after the module.
    const ir::WeightRef& w = g.weights()[0];
    EXPECT_EQ(w.name, "m.attn.qkv_proj.weight");
    EXPECT_EQ(w.shape, (std::vector<int64_t>{8, 8}));
    EXPECT_EQ(w.bytes, 8u * 8u * 4u);
    ASSERT_EQ(w.parts.size(), 3u);
    EXPECT_EQ(w.parts[0].name, "m.attn.q_proj.weight");
    EXPECT_EQ(w.parts[0].offset, 3000u);
    EXPECT_EQ(w.parts[1].name, "m.attn.k_proj.weight");
    EXPECT_EQ(w.parts[2].name, "m.attn.v_proj.weight");
    EXPECT_EQ(g.weights().size(), bias ? 2u : 1u);
    if (bias) {
      EXPECT_EQ(g.weights()[1].name, "m.attn.qkv_proj.bias");
      EXPECT_EQ(g.weights()[1].shape, (std::vector<int64_t>{8}));
      ASSERT_EQ(g.weights()[1].parts.size(), 3u);
      EXPECT_EQ(g.weights()[1].parts[2].name, "m.attn.v_proj.bias");
    }
    // Outputs map to Slices of the last axis, named as the Linears were.
    auto slice_of = [&](ValueId old) {
      const ValueId v = r->value_map[size_t(old)];
      const ir::Node& n = g.node(g.value(v).producer);
      EXPECT_EQ(n.op, OpKind::Slice);
      EXPECT_EQ(n.attrs.get_int("axis"), -1);
      EXPECT_EQ(g.info(v), a.g.info(old));
      return std::make_tuple(n.name, n.attrs.get_int("start"), n.attrs.get_int("end"));
    };
    EXPECT_EQ(slice_of(a.q), std::make_tuple(std::string("l.q_proj"), int64_t{0}, int64_t{4}));
    EXPECT_EQ(slice_of(a.k), std::make_tuple(std::string("l.k_proj"), int64_t{4}, int64_t{6}));
    EXPECT_EQ(slice_of(a.v), std::make_tuple(std::string("l.v_proj"), int64_t{6}, int64_t{8}));
    EXPECT_EQ(g.outputs().size(), 3u);
    EXPECT_EQ(g.node(g.value(r->value_map[size_t(a.q)]).producer).inputs[0],
              g.node(g.value(r->value_map[size_t(a.k)]).producer).inputs[0]);
    EXPECT_TRUE(ir::verify(g).is_ok());
  }
}

TEST(IrFuse, KvOnlyAndGateUpFuse) {
  ir::Graph g;
  ValueId x = g.add_input("x", {DType::F32, {3, 4}});
  ValueId k = g.add(OpKind::Linear, {x, g.weight(ref("l.k_proj.weight", {2, 4}, 0))}).value();
  ValueId v = g.add(OpKind::Linear, {x, g.weight(ref("l.v_proj.weight", {2, 4}, 64))}).value();
  ValueId gt = g.add(OpKind::Linear, {x, g.weight(ref("l.mlp.gate_proj.weight", {6, 4}, 128))}).value();
  ValueId up = g.add(OpKind::Linear, {x, g.weight(ref("l.mlp.up_proj.weight", {6, 4}, 256))}).value();
  ValueId m = g.add(OpKind::GeGLU, {gt, up}).value();
  g.mark_output(k);
  g.mark_output(v);
  g.mark_output(m);
  ir::FuseStats st;
  auto r = ir::fuse_linears(g, ir::default_fuse_rules(), &st);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(st.groups, 2);
  std::vector<std::string> names;
  for (const auto& w : r->graph.weights()) names.push_back(w.name);
  EXPECT_EQ(names, (std::vector<std::string>{"l.kv_proj.weight", "l.mlp.gate_up_proj.weight"}));
  // GeGLU reads gate = [0, F) and up = [F, 2F) of the fused output.
  const ir::Node& geglu = r->graph.node(r->graph.value(r->value_map[size_t(m)]).producer);
  ASSERT_EQ(geglu.op, OpKind::GeGLU);
  const ir::Node& s0 = r->graph.node(r->graph.value(geglu.inputs[0]).producer);
  const ir::Node& s1 = r->graph.node(r->graph.value(geglu.inputs[1]).producer);
  EXPECT_EQ(s0.attrs.get_int("start"), 0);
  EXPECT_EQ(s0.attrs.get_int("end"), 6);
  EXPECT_EQ(s1.attrs.get_int("start"), 6);
  EXPECT_EQ(s1.attrs.get_int("end"), 12);
  EXPECT_EQ(s0.inputs[0], s1.inputs[0]);
}

TEST(IrFuse, LeavesWhatCannotFuseAsItWas) {
  // q/k/v of one module but: k's weight also read elsewhere; a gate/up pair of different dtypes;
  // two projections reading different inputs; a module missing a role.
  ir::Graph g;
  ValueId x = g.add_input("x", {DType::F32, {3, 4}});
  ValueId y = g.add_input("y", {DType::F32, {3, 4}});
  ValueId kw = g.weight(ref("a.k_proj.weight", {2, 4}, 0));
  ValueId q = g.add(OpKind::Linear, {x, g.weight(ref("a.q_proj.weight", {2, 4}, 64))}).value();
  ValueId k = g.add(OpKind::Linear, {x, kw}).value();
  ValueId v = g.add(OpKind::Linear, {x, g.weight(ref("a.v_proj.weight", {2, 4}, 128))}).value();
  ValueId k2 = g.add(OpKind::Linear, {y, kw}).value();
  ValueId gt = g.add(OpKind::Linear, {x, g.weight(ref("b.gate_proj.weight", {2, 4}, 256))}).value();
  ValueId up = g.add(OpKind::Linear, {x, g.weight(ref("b.up_proj.weight", {2, 4}, 512, DType::BF16))}).value();
  ValueId c1 = g.add(OpKind::Linear, {x, g.weight(ref("c.k_proj.weight", {2, 4}, 600))}).value();
  ValueId c2 = g.add(OpKind::Linear, {y, g.weight(ref("c.v_proj.weight", {2, 4}, 700))}).value();
  ValueId d = g.add(OpKind::Linear, {x, g.weight(ref("d.q_proj.weight", {2, 4}, 800))}).value();
  for (ValueId o : {q, k, v, k2, gt, up, c1, c2, d}) g.mark_output(o);
  ir::FuseStats st;
  auto r = ir::fuse_linears(g, ir::default_fuse_rules(), &st);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(st.groups, 0);
  EXPECT_EQ(r->graph.nodes().size(), g.nodes().size());
  EXPECT_EQ(r->graph.weights().size(), g.weights().size());
  for (ValueId o : {q, k, v, k2, gt, up, c1, c2, d})
    EXPECT_EQ(r->graph.node(r->graph.value(r->value_map[size_t(o)]).producer).op, OpKind::Linear);
}

TEST(IrFuse, Pi05StagesFuseEveryProjectionAndKeepTheirOutputs) {
  auto m = Pi05Model::load(std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05/tiny_b/policy");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const Pi05Dims& d = m->dims();
  const int64_t P = int64_t(m->config().cameras.size()) * m->image_tokens() + m->config().tokenizer_max_length;
  struct Case {
    Result<Pi05Graph> graph;
    int groups;
  };
  Case cases[] = {
      {m->build_vision(), int(d.vision_depth)},                        // SigLIP q|k|v (with biases)
      {m->build_lm(P), int(2 * (d.lm_depth - 1) + 1)},                  // q|k|v + gate|up, last layer k|v
      {m->build_step(P), int(2 * d.lm_depth)},                          // expert q|k|v + gate|up
      {m->build_text_embed(4), 0},
  };
  for (Case& c : cases) {
    ASSERT_TRUE(c.graph.is_ok()) << c.graph.status().message();
    ir::FuseStats st;
    auto r = ir::fuse_linears(c.graph->graph, ir::default_fuse_rules(), &st);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(st.groups, c.groups);
    ASSERT_EQ(r->graph.outputs().size(), c.graph->graph.outputs().size());
    for (size_t i = 0; i < r->graph.outputs().size(); ++i)
      EXPECT_EQ(r->graph.info(r->graph.outputs()[i]), c.graph->graph.info(c.graph->graph.outputs()[i]));
    uint64_t before = 0, after = 0;
    for (const auto& w : c.graph->graph.weights()) before += w.bytes;
    for (const auto& w : r->graph.weights()) after += w.bytes;
    EXPECT_EQ(before, after);  // same bytes, fewer tensors
    auto sched = ir::schedule(r->graph);
    ASSERT_TRUE(sched.is_ok());
  }
}

}  // namespace
}  // namespace vlac
