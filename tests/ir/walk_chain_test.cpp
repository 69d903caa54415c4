// The 1,000,000-node chain: sort, walk, liveness and printing without deep recursion
// (must also pass under ASan with the default 8 MiB stack).
#include <gtest/gtest.h>

#include "ir/graph.h"
#include "ir/walk.h"

namespace vlac::ir {
namespace {

constexpr int kChain = 1'000'000;

// A forward chain: x -> silu -> silu -> ... (ids in edge order).
Graph build_chain() {
  Graph g;
  g.reserve(kChain + 2, kChain + 2);
  ValueId v = g.add_input("x", {DType::F32, {1}});
  for (int i = 0; i < kChain; ++i)
    v = g.nodes()[size_t(g.add_node_unchecked(OpKind::SiLU, {v}, {{DType::F32, {1}}}))].outputs[0];
  g.mark_output(v);
  return g;
}

TEST(IrChain, MillionNodesSortWalkLiveness) {
  Graph g = build_chain();
  ASSERT_TRUE(verify(g).is_ok());
  auto order = topo_order(g);
  ASSERT_TRUE(order.is_ok());
  ASSERT_EQ(order->size(), size_t(kChain) + 1);
  for (size_t i = 0; i < order->size(); ++i) ASSERT_EQ((*order)[i], NodeId(i));
  auto sched = schedule(g);
  ASSERT_TRUE(sched.is_ok());
  EXPECT_EQ(sched->size(), size_t(kChain) + 1);
  auto reach = reachable_from_outputs(g);
  for (bool b : reach) ASSERT_TRUE(b);
  auto live = liveness(g, *order);
  EXPECT_EQ(live[0].def, 0);
  EXPECT_EQ(live[0].last_use, 1);
  EXPECT_EQ(live[size_t(g.outputs()[0])].last_use, int64_t(kChain) + 1);
  EXPECT_EQ(peak_live_bytes(g, *order, live), 8u);  // two 4-byte values at a time
  auto only = input_only_values(g, *order);
  EXPECT_TRUE(only[size_t(g.outputs()[0])]);
}

TEST(IrChain, MillionNodesReverseIdOrder) {
  // Node ids run against the edges: node i reads node i+1, so a walk in id order must descend
  // the whole chain before emitting anything.
  Graph g;
  g.reserve(kChain + 1, kChain + 1);
  // Create values first via unchecked nodes with placeholder inputs, then rewire.
  for (int i = 0; i < kChain; ++i) g.add_node_unchecked(OpKind::SiLU, {}, {{DType::F32, {1}}});
  ValueId x = g.add_input("x", {DType::F32, {1}});
  auto& nodes = g.mutable_nodes();
  for (int i = 0; i < kChain; ++i)
    nodes[size_t(i)].inputs = {i + 1 < kChain ? nodes[size_t(i) + 1].outputs[0] : x};
  g.mark_output(nodes[0].outputs[0]);
  ASSERT_TRUE(verify(g).is_ok());
  auto order = topo_order(g);
  ASSERT_TRUE(order.is_ok());
  EXPECT_EQ(order->front(), NodeId(kChain));  // the Input node
  EXPECT_EQ(order->back(), NodeId(0));
  auto live = liveness(g, *order);
  EXPECT_EQ(live[size_t(x)].def, 0);
  EXPECT_EQ(live[size_t(x)].last_use, 1);
}

}  // namespace
}  // namespace vlac::ir
