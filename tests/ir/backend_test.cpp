// The backend interface header is self-contained and implementable: a tiny null backend
// (accepts every op, estimates weight bytes from the references, writes nothing).
#include <gtest/gtest.h>

#include "ir/backend.h"

namespace vlac {
namespace {

class NullCompiler : public BackendCompiler {
 public:
  std::string_view name() const override { return "null"; }
  bool supports(const ir::Graph&, ir::NodeId) const override { return true; }
  Result<EngineEstimate> estimate_bytes(const Subgraph& sub) const override {
    EngineEstimate e;
    for (ir::NodeId n : sub.nodes) {
      const ir::Node& nd = sub.graph->node(n);
      if (nd.op == ir::OpKind::Weight) e.weights_bytes += sub.graph->weights()[size_t(nd.weight)].bytes;
      else for (ir::ValueId v : nd.outputs) e.scratch_bytes += sub.graph->info(v).bytes();
    }
    return e;
  }
  Result<EngineBlob> compile(const Subgraph& sub, const std::vector<StoredWeight>&, WeightSource&,
                             const CompileOptions&) override {
    EngineBlob blob;
    blob.backend = "null";
    VLAC_ASSIGN_OR_RETURN(blob.estimate, estimate_bytes(sub));
    return blob;
  }
};

TEST(IrBackend, NullBackendEstimatesFromReferences) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", {DType::F32, {2, 4}});
  ir::ValueId w = g.weight({"w", 0, 128, DType::BF16, {3, 4}, 24, {}});
  ir::ValueId y = g.add(ir::OpKind::Linear, {x, w}).value();
  g.mark_output(y);
  NullCompiler c;
  Subgraph sub{&g, {0, 1, 2}, {x}, {y}};
  EXPECT_TRUE(c.supports(g, 2));
  auto e = c.estimate_bytes(sub);
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(e->weights_bytes, 24u);
  EXPECT_EQ(e->scratch_bytes, 8u * 4 + 6u * 4);  // input value + linear output, f32
  CompileOptions o;
  EXPECT_EQ(o.struct_size, sizeof(CompileOptions));
  EXPECT_STREQ(memory_kind_name(MemoryKind::Unified), "unified");
}

TEST(IrBackend, WholeGraphAndFileWeightSource) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", {DType::F32, {2, 4}});
  ir::ValueId w = g.weight({"w", 0, 8, DType::F32, {1, 4}, 16, {}});
  ir::ValueId y = g.add(ir::OpKind::Linear, {x, w}).value();
  g.mark_output(y);
  auto sub = whole_graph(g);
  ASSERT_TRUE(sub.is_ok());
  EXPECT_EQ(sub->nodes.size(), 3u);
  EXPECT_EQ(sub->inputs, std::vector<ir::ValueId>{x});
  EXPECT_EQ(sub->outputs, std::vector<ir::ValueId>{y});
  std::vector<uint8_t> bytes(32, 7);
  FileWeightSource src({{bytes.data(), bytes.size(), "mem.bin", nullptr}});
  auto p = src.map(g.weights()[0]);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(*p, bytes.data() + 8);
  ir::WeightRef outside{"far", 0, 24, DType::F32, {4}, 16, {}};
  auto bad = src.map(outside);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("mem.bin: tensor 'far' lies outside the file"), std::string::npos);
}

}  // namespace
}  // namespace vlac
