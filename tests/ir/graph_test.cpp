// Tests of the IR: construction with inference, the verifier, the printer on a small graph.
#include <gtest/gtest.h>

#include "ir/graph.h"
#include "ir/printer.h"
#include "ir/walk.h"

namespace vlac::ir {
namespace {

WeightRef wref(std::string name, std::vector<int64_t> shape, DType dt = DType::F32,
               uint64_t offset = 0) {
  WeightRef w{std::move(name), 0, offset, dt, std::move(shape), 0, {}};
  w.bytes = ValueInfo{dt, w.shape}.bytes();
  return w;
}

// A tiny expert-like block: adaRMS -> q/k/v -> rope -> attention -> o_proj * gate + residual.
struct Tiny {
  Graph g;
  ValueId x, pos, cond, out, mask;
};

Tiny build_tiny() {
  Tiny t;
  Graph& g = t.g;
  const int64_t T = 4, D = 8, H = 2, Dh = 4;
  t.x = g.add_input("x", {DType::F32, {T, D}});
  t.pos = g.add_input("pos", {DType::I64, {T}});
  t.cond = g.add_input("cond", {DType::F32, {D}});
  t.mask = g.add_input("mask", {DType::BOOL, {T, T}});
  ValueId wd = g.weight(wref("norm.dense.weight", {3 * D, D}));
  ValueId bd = g.weight(wref("norm.dense.bias", {3 * D}));
  ValueId mod = g.add(OpKind::Linear, {t.cond, wd, bd}, {}, "norm.dense").value();
  NodeId norm = g.add_node(OpKind::AdaRMSNorm, {t.x, mod}, {{"eps", 1e-6}}, "norm").value();
  ValueId u = g.node(norm).outputs[0], gate = g.node(norm).outputs[1];
  ValueId q = g.add(OpKind::Linear, {u, g.weight(wref("q.weight", {H * Dh, D}))}, {}, "q").value();
  ValueId k = g.add(OpKind::Linear, {u, g.weight(wref("k.weight", {Dh, D}))}, {}, "k").value();
  ValueId v = g.add(OpKind::Linear, {u, g.weight(wref("v.weight", {Dh, D}))}, {}, "v").value();
  q = g.add(OpKind::Reshape, {q}, {{"shape", std::vector<int64_t>{T, H, Dh}}}).value();
  k = g.add(OpKind::Reshape, {k}, {{"shape", std::vector<int64_t>{T, 1, -1}}}).value();
  v = g.add(OpKind::Reshape, {v}, {{"shape", std::vector<int64_t>{T, 1, Dh}}}).value();
  q = g.add(OpKind::RoPE, {q, t.pos}, {{"base", 10000.0}}).value();
  k = g.add(OpKind::RoPE, {k, t.pos}, {{"base", 10000.0}}).value();
  ValueId a = g.add(OpKind::Attention, {q, k, v, t.mask}, {{"scale", 0.5}}, "attn").value();
  a = g.add(OpKind::Reshape, {a}, {{"shape", std::vector<int64_t>{T, H * Dh}}}).value();
  ValueId o = g.add(OpKind::Linear, {a, g.weight(wref("o.weight", {D, H * Dh}))}, {}, "o").value();
  o = g.add(OpKind::Mul, {o, gate}).value();
  t.out = g.add(OpKind::Add, {t.x, o}, {}, "residual").value();
  g.mark_output(t.out);
  return t;
}

TEST(IrOps, TableIsComplete) {
  EXPECT_EQ(op_count(), int(OpKind::EulerStep) + 1);
  EXPECT_STREQ(op_name(OpKind::AdaRMSNorm), "ada_rms_norm");
  EXPECT_EQ(op_info(OpKind::AdaRMSNorm).n_out, 2);
  EXPECT_EQ(op_info(OpKind::Concat).n_in_max, -1);
}

TEST(IrGraph, BuildsAndVerifies) {
  Tiny t = build_tiny();
  ASSERT_TRUE(verify(t.g).is_ok()) << verify(t.g).message();
  EXPECT_EQ(to_string(t.g.info(t.out)), "f32[4, 8]");
  EXPECT_EQ(t.g.weights().size(), 6u);
}

TEST(IrGraph, InferenceRejectsBadShapes) {
  Graph g;
  ValueId x = g.add_input("x", {DType::F32, {3, 5}});
  ValueId w = g.weight(wref("w", {7, 4}));
  auto r = g.add(OpKind::Linear, {x, w}, {}, "proj");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("proj"), std::string::npos);
  EXPECT_FALSE(g.add(OpKind::Reshape, {x}, {{"shape", std::vector<int64_t>{4, 4}}}).is_ok());
  EXPECT_FALSE(g.add(OpKind::Transpose, {x}, {{"perm", std::vector<int64_t>{0, 0}}}).is_ok());
  EXPECT_FALSE(g.add(OpKind::Slice, {x}, {{"axis", int64_t{1}}, {"start", int64_t{2}}, {"end", int64_t{9}}}).is_ok());
  EXPECT_FALSE(g.add(OpKind::Add, {x}).is_ok());  // arity
  ValueId y = g.add_input("y", {DType::F32, {1, 5}});
  EXPECT_EQ(g.info(g.add(OpKind::Add, {x, y}).value()).shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(g.info(g.add(OpKind::Concat, {x, y}, {{"axis", int64_t{0}}}).value()).shape,
            (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(g.info(g.add(OpKind::Transpose, {x}, {{"perm", std::vector<int64_t>{1, 0}}}).value()).shape,
            (std::vector<int64_t>{5, 3}));
  ValueId img = g.add_input("img", {DType::F32, {3, 28, 30}});
  ValueId pw = g.weight(wref("patch.w", {16, 3, 14, 14}));
  EXPECT_EQ(g.info(g.add(OpKind::PatchEmbed, {img, pw}).value()).shape, (std::vector<int64_t>{4, 16}));  // 2x2 patches, floor
  ValueId t = g.add_input("t", {DType::F32, {1}});
  EXPECT_EQ(g.info(g.add(OpKind::TimeEmbedding, {t}, {{"dim", int64_t{32}}}).value()).shape,
            (std::vector<int64_t>{32}));
  EXPECT_EQ(g.info(g.add(OpKind::Cast, {x}, {{"dtype", std::string("BF16")}}).value()).dtype, DType::BF16);
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).message();
}

TEST(IrGraph, VerifierCatchesCorruption) {
  {
    Tiny t = build_tiny();
    // Wrong output shape on the attention node.
    for (Node& n : t.g.mutable_nodes())
      if (n.name == "attn") t.g.mutable_values()[size_t(n.outputs[0])].info.shape[0] = 5;
    Status s = verify(t.g);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("attn"), std::string::npos) << s.message();
  }
  {
    Tiny t = build_tiny();  // a cycle: the first Linear reads the residual output
    for (Node& n : t.g.mutable_nodes())
      if (n.name == "norm.dense") n.inputs[0] = t.out;
    t.g.mutable_values()[size_t(t.out)].info = t.g.info(t.cond);
    Status s = verify(t.g);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("cycle"), std::string::npos) << s.message();
  }
  {
    Tiny t = build_tiny();  // dangling value id
    t.g.mutable_nodes().back().inputs[0] = 99999;
    EXPECT_FALSE(verify(t.g).is_ok());
  }
  {
    Tiny t = build_tiny();  // arity
    for (Node& n : t.g.mutable_nodes())
      if (n.name == "residual") n.inputs.push_back(t.x);
    EXPECT_FALSE(verify(t.g).is_ok());
  }
}

TEST(IrWalk, InputOnlyReachabilityLiveness) {
  Tiny t = build_tiny();
  Graph& g = t.g;
  // Input-only chain: mask -> cast -> (unused) plus a positions table derived from pos.
  ValueId posf = g.add(OpKind::Cast, {t.pos}, {{"dtype", std::string("F32")}}, "pos_f").value();
  ValueId dead = g.add(OpKind::Scale, {posf}, {{"scale", 2.0}}, "dead").value();
  ASSERT_TRUE(verify(g).is_ok());
  auto order = topo_order(g).value();
  EXPECT_EQ(order.size(), g.nodes().size());
  std::vector<int64_t> step(g.nodes().size());
  for (size_t i = 0; i < order.size(); ++i) step[size_t(order[i])] = int64_t(i);
  for (size_t n = 0; n < g.nodes().size(); ++n)
    for (ValueId v : g.nodes()[n].inputs) EXPECT_LT(step[size_t(g.value(v).producer)], step[n]);

  auto only = input_only_values(g, order);
  EXPECT_TRUE(only[size_t(posf)]);
  EXPECT_TRUE(only[size_t(dead)]);
  EXPECT_TRUE(only[size_t(t.mask)]);
  EXPECT_FALSE(only[size_t(t.out)]);

  auto reach = reachable_from_outputs(g);
  EXPECT_FALSE(reach[size_t(g.value(dead).producer)]);
  EXPECT_TRUE(reach[size_t(g.value(t.mask).producer)]);
  auto sched = schedule(g).value();
  EXPECT_EQ(sched.size(), g.nodes().size() - 2);  // pos_f and dead drop out

  auto live = liveness(g, sched);
  EXPECT_EQ(live[size_t(t.out)].last_use, int64_t(sched.size()));
  EXPECT_EQ(live[size_t(dead)].def, -1);
  // x is read by the norm and by the residual add (the last node).
  EXPECT_EQ(live[size_t(t.x)].last_use, int64_t(sched.size()) - 1);
  EXPECT_GT(peak_live_bytes(g, sched, live), 0u);
  UseLists uses = build_use_lists(g);
  EXPECT_EQ(uses.count(t.x), 2);
  EXPECT_EQ(uses.count(t.out), 0);
}

TEST(IrPrinter, ListsEveryNodeWithShapesAndWeights) {
  Tiny t = build_tiny();
  std::string s = print_graph(t.g);
  size_t lines = 0;
  for (char c : s) lines += c == '\n';
  EXPECT_EQ(lines, t.g.nodes().size() + 3);
  EXPECT_NE(s.find("ada_rms_norm"), std::string::npos);
  EXPECT_NE(s.find("f32[4, 2, 4]"), std::string::npos);          // attention output
  EXPECT_NE(s.find("norm.dense  (%2, %4, %5) -> %6 f32[24]  w 864 B"), std::string::npos) << s;
  EXPECT_NE(s.find("weights 6: "), std::string::npos);
  EXPECT_NE(s.find("scale=0.5"), std::string::npos);
}

}  // namespace
}  // namespace vlac::ir
