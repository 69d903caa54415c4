// Tests of graph <-> JSON (the program stored for each packaged engine) and respecialize: round
// trips of the pi0.5 stage graphs and their partitioned engines, respecialize to other prefix
// lengths, and hostile JSON (every malformed form gives InvalidFormat naming the source, never a
// crash; a seeded mutation loop as a small in-test fuzzer).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/graph.h"
#include "ir/serialize.h"
#include "models/pi05_builder.h"

namespace vlac::ir {
namespace {

using nlohmann::json;

const std::string kFixtures = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05";

WeightRef wref(std::string name, std::vector<int64_t> shape, DType dt = DType::F32) {
  WeightRef w{std::move(name), 0, 0, dt, std::move(shape), 0, {}};
  w.bytes = ValueInfo{dt, w.shape}.bytes();
  return w;
}

// A small graph touching most attribute forms: ints (reshape, transpose), float (scale, eps),
// string (cast), an int (slice), a multi-output node, a constant, a weight read twice.
Graph small_graph() {
  Graph g;
  const int64_t T = 4, D = 8;
  ValueId x = g.add_input("x", {DType::F32, {T, D}});
  ValueId cond = g.add_input("cond", {DType::F32, {D}});
  ValueId pos = g.add_input("pos", {DType::I64, {T}});
  ValueId w = g.weight(wref("w.weight", {D, D}));
  ValueId mod = g.add(OpKind::Linear, {cond, g.weight(wref("mod.weight", {3 * D, D}))}, {}, "mod").value();
  NodeId ada = g.add_node(OpKind::AdaRMSNorm, {x, mod}, {{"eps", 1e-6}}, "ada").value();
  ValueId h = g.add(OpKind::Linear, {g.node(ada).outputs[0], w}, {}, "lin").value();
  h = g.add(OpKind::Mul, {h, g.node(ada).outputs[1]}, {}, "gate").value();
  ValueId r = g.add(OpKind::Reshape, {h}, {{"shape", std::vector<int64_t>{-1, 2, 4}}}, "split").value();
  r = g.add(OpKind::RoPE, {r, pos}, {{"base", 10000.0}}, "rope").value();
  r = g.add(OpKind::Transpose, {r}, {{"perm", std::vector<int64_t>{1, 0, 2}}}, "tr").value();
  r = g.add(OpKind::Reshape, {r}, {{"shape", std::vector<int64_t>{-1, D}}}, "merge").value();
  ValueId c = g.add_constant({DType::F32, {D}}, 0.5, "half");
  r = g.add(OpKind::Add, {r, c}, {}, "plus").value();
  r = g.add(OpKind::Linear, {r, w}, {}, "lin2").value();
  r = g.add(OpKind::Slice, {r}, {{"axis", int64_t(1)}, {"start", int64_t(2)}, {"end", int64_t(6)}}, "cut").value();
  r = g.add(OpKind::Scale, {r}, {{"scale", 0.25}}, "sc").value();
  ValueId b = g.add(OpKind::Cast, {r}, {{"dtype", std::string("BF16")}}, "to_bf16").value();
  g.mark_output(b);
  g.mark_output(g.node(ada).outputs[1]);
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).message();
  return g;
}

void expect_round_trip(const Graph& g, const std::string& what) {
  const json j1 = graph_to_json(g);
  auto back = graph_from_json(j1, what);
  ASSERT_TRUE(back.is_ok()) << what << ": " << back.status().message();
  EXPECT_TRUE(verify(*back).is_ok());
  const json j2 = graph_to_json(*back);
  EXPECT_EQ(j1.dump(), j2.dump()) << what;
  // Also through text, as stored in a package manifest.
  auto back2 = graph_from_json(json::parse(j1.dump()), what);
  ASSERT_TRUE(back2.is_ok()) << back2.status().message();
  EXPECT_EQ(graph_to_json(*back2).dump(), j1.dump()) << what;
  EXPECT_EQ(back->nodes().size(), g.nodes().size());
  EXPECT_EQ(back->values().size(), g.values().size());
  EXPECT_EQ(back->inputs().size(), g.inputs().size());
  EXPECT_EQ(back->outputs(), g.outputs());
  ASSERT_EQ(back->weights().size(), g.weights().size());
  for (size_t i = 0; i < g.weights().size(); ++i) {
    EXPECT_EQ(back->weights()[i].name, g.weights()[i].name);
    EXPECT_EQ(back->weights()[i].shape, g.weights()[i].shape);
    EXPECT_EQ(back->weights()[i].dtype, g.weights()[i].dtype);
    EXPECT_EQ(back->weights()[i].bytes, g.weights()[i].bytes);
  }
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    EXPECT_EQ(back->nodes()[n].op, g.nodes()[n].op);
    EXPECT_EQ(back->nodes()[n].name, g.nodes()[n].name);
    EXPECT_EQ(back->nodes()[n].inputs, g.nodes()[n].inputs);
  }
  for (size_t v = 0; v < g.values().size(); ++v) EXPECT_EQ(back->values()[v].info, g.values()[v].info);
  for (ValueId v : g.inputs()) EXPECT_EQ(input_name(*back, v), input_name(g, v));
}

TEST(Serialize, SmallGraphRoundTrip) {
  Graph g = small_graph();
  expect_round_trip(g, "small");
  // Deterministic: same graph, same text.
  EXPECT_EQ(graph_to_json(g).dump(), graph_to_json(small_graph()).dump());
  // Attribute values survive exactly.
  auto back = graph_from_json(graph_to_json(g), "small");
  ASSERT_TRUE(back.is_ok());
  for (size_t n = 0; n < g.nodes().size(); ++n)
    EXPECT_EQ(back->nodes()[n].attrs.items(), g.nodes()[n].attrs.items()) << g.nodes()[n].name;
}

TEST(Serialize, Pi05StageGraphsRoundTrip) {
  for (const char* fx : {"tiny_a", "tiny_b"}) {
    auto m = Pi05Model::load(kFixtures + "/" + fx + "/policy");
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    const int64_t L = m->config().tokenizer_max_length;
    const int64_t P = int64_t(m->config().cameras.size()) * m->image_tokens() + L;
    std::vector<std::pair<std::string, Result<Pi05Graph>>> stages;
    stages.emplace_back("vision", m->build_vision());
    stages.emplace_back("text", m->build_text_embed(L));
    stages.emplace_back("lm", m->build_lm(P));
    stages.emplace_back("step", m->build_step(P));
    stages.emplace_back("prefix", m->build_prefix(m->nominal_prefix()));
    for (auto& [name, g] : stages) {
      ASSERT_TRUE(g.is_ok()) << name << ": " << g.status().message();
      expect_round_trip(g->graph, std::string(fx) + " " + name);
    }
  }
}

// The stage graph for prefix length P, respecialized to P', equals the graph built for P'.
TEST(Serialize, RespecializeMatchesAFreshBuild) {
  for (const char* fx : {"tiny_a", "tiny_b"}) {
    auto m = Pi05Model::load(kFixtures + "/" + fx + "/policy");
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    const int64_t L = m->config().tokenizer_max_length;
    const int64_t W = m->dims().lm_width, hd = m->dims().head_dim, depth = m->dims().lm_depth;
    const int64_t P = int64_t(m->config().cameras.size()) * m->image_tokens() + L;
    auto lm = m->build_lm(P);
    auto text = m->build_text_embed(L);
    auto step = m->build_step(P);
    ASSERT_TRUE(lm.is_ok() && text.is_ok() && step.is_ok());
    for (int64_t p2 : {int64_t(1), int64_t(3), P - 1, P + 5}) {
      auto want = m->build_lm(p2);
      ASSERT_TRUE(want.is_ok());
      auto got = respecialize(lm->graph, {{kPi05InPrefixEmbeddings, {p2, W}}, {kPi05InPrefixPos, {p2}}});
      ASSERT_TRUE(got.is_ok()) << fx << " lm P=" << p2 << ": " << got.status().message();
      EXPECT_EQ(graph_to_json(*got).dump(), graph_to_json(want->graph).dump()) << fx << " lm P=" << p2;
      // The prefix outputs follow.
      for (const auto& [name, v] : lm->outputs)
        if (name.rfind("prefix.k.", 0) == 0) {
          EXPECT_EQ(got->info(v).shape[0], p2) << name;
        }

      auto ws = m->build_step(p2);
      ASSERT_TRUE(ws.is_ok());
      std::map<std::string, std::vector<int64_t>> kv;
      for (int64_t l = 0; l < depth; ++l) {
        kv["prefix.k." + std::to_string(l)] = {p2, 1, hd};
        kv["prefix.v." + std::to_string(l)] = {p2, 1, hd};
      }
      auto gs = respecialize(step->graph, kv);
      ASSERT_TRUE(gs.is_ok()) << fx << " step P=" << p2 << ": " << gs.status().message();
      EXPECT_EQ(graph_to_json(*gs).dump(), graph_to_json(ws->graph).dump()) << fx << " step P=" << p2;
    }
    for (int64_t n : {int64_t(1), L / 2 + 1}) {
      auto want = m->build_text_embed(n);
      ASSERT_TRUE(want.is_ok());
      auto got = respecialize(text->graph, {{kPi05InTokens, {n}}});
      ASSERT_TRUE(got.is_ok()) << got.status().message();
      EXPECT_EQ(graph_to_json(*got).dump(), graph_to_json(want->graph).dump()) << fx << " text n=" << n;
    }
    // Unnamed inputs keep their shapes; a no-op respecialize is the identity.
    auto same = respecialize(lm->graph, {});
    ASSERT_TRUE(same.is_ok());
    EXPECT_EQ(graph_to_json(*same).dump(), graph_to_json(lm->graph).dump());
    // Shapes the ops cannot take: ShapeMismatch naming the node, never a crash.
    auto bad = respecialize(lm->graph, {{kPi05InPrefixEmbeddings, {P, W + 1}}});
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().code(), StatusCode::ShapeMismatch);
    EXPECT_NE(bad.status().message().find("cannot take the new shapes"), std::string::npos) << bad.status().message();
    auto bad2 = respecialize(lm->graph, {{kPi05InPrefixEmbeddings, {P, W}}, {kPi05InPrefixPos, {P + 1}}});
    EXPECT_FALSE(bad2.is_ok());
    auto bad3 = respecialize(lm->graph, {{kPi05InPrefixEmbeddings, {W}}});  // wrong rank
    EXPECT_FALSE(bad3.is_ok());
  }
}

TEST(Serialize, RespecializeSmallGraph) {
  Graph g = small_graph();
  auto g6 = respecialize(g, {{"x", {6, 8}}, {"pos", {6}}});
  ASSERT_TRUE(g6.is_ok()) << g6.status().message();
  EXPECT_EQ(g6->info(g6->outputs()[0]).shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(g6->info(g6->outputs()[0]).dtype, DType::BF16);
  // The original is unchanged.
  EXPECT_EQ(g.info(g.outputs()[0]).shape, (std::vector<int64_t>{4, 4}));
  auto odd = respecialize(g, {{"x", {6, 8}}});  // pos still [4]: RoPE rejects
  ASSERT_FALSE(odd.is_ok());
  EXPECT_EQ(odd.status().code(), StatusCode::ShapeMismatch);
  EXPECT_NE(odd.status().message().find("rope"), std::string::npos) << odd.status().message();
  auto unknown = respecialize(g, {{"no_such_input", {1}}});  // names nothing: ignored
  EXPECT_TRUE(unknown.is_ok());
}

// ---- hostile JSON ----

void expect_bad(const json& j, const std::string& why) {
  auto r = graph_from_json(j, "evil.vlac: engine 'e'");
  ASSERT_FALSE(r.is_ok()) << why << ": accepted";
  EXPECT_EQ(r.status().code(), StatusCode::InvalidFormat) << why << ": " << r.status().message();
  EXPECT_NE(r.status().message().find("evil.vlac: engine 'e'"), std::string::npos) << why << ": " << r.status().message();
}

// Index of the first node with this name.
size_t node_index(const json& j, const std::string& name) {
  for (size_t i = 0; i < j["nodes"].size(); ++i)
    if (j["nodes"][i].value("name", "") == name) return i;
  ADD_FAILURE() << "no node " << name;
  return 0;
}

TEST(SerializeHostile, StructureAndTypes) {
  const json base = graph_to_json(small_graph());
  ASSERT_TRUE(graph_from_json(base, "ok").is_ok());
  expect_bad(json(), "null");
  expect_bad(json::array(), "array");
  expect_bad(json(5), "number");
  expect_bad(json("nodes"), "string");
  for (const char* key : {"nodes", "weights", "outputs"}) {
    json j = base;
    j.erase(key);
    expect_bad(j, std::string("missing ") + key);
    j = base;
    j[key] = json::object();
    expect_bad(j, std::string(key) + " as object");
    j[key] = "x";
    expect_bad(j, std::string(key) + " as string");
  }
  {
    json j = base;
    j["nodes"][3] = 7;
    expect_bad(j, "node not an object");
  }
  for (const char* key : {"op", "in", "out"}) {
    json j = base;
    j["nodes"][4].erase(key);
    expect_bad(j, std::string("node without ") + key);
    j = base;
    j["nodes"][4][key] = 12;
    expect_bad(j, std::string("node with numeric ") + key);
  }
  {
    json j = base;
    j["nodes"][4]["name"] = 3;
    expect_bad(j, "numeric name");
  }
  {
    json j = base;
    j["nodes"][4]["attrs"] = "eps";
    expect_bad(j, "attrs not a list");
  }
  {
    json j = base;
    const size_t ada = node_index(j, "ada");
    j["nodes"][ada]["attrs"] = json::array({json::array({"eps"})});
    expect_bad(j, "attr without value");
    j["nodes"][ada]["attrs"] = json::array({json::array({1, json::object({{"f", 1e-6}})})});
    expect_bad(j, "attr with numeric key");
    j["nodes"][ada]["attrs"] = json::array({json::array({"eps", json::object({{"q", 1}})})});
    expect_bad(j, "unknown attr form");
    j["nodes"][ada]["attrs"] = json::array({json::array({"eps", json::object({{"f", 1}, {"i", 2}})})});
    expect_bad(j, "attr with two forms");
    j["nodes"][ada]["attrs"] = json::array({json::array({"eps", json::object({{"f", "small"}})})});
    expect_bad(j, "float attr holding a string");
    const size_t split = node_index(j, "split");
    j = base;
    j["nodes"][split]["attrs"] = json::array({json::array({"shape", json::object({{"ints", json::array({4, "2", -1})}})})});
    expect_bad(j, "ints attr holding a string");
    j["nodes"][split]["attrs"] = json::array({json::array({"shape", json::object({{"ints", 5}})})});
    expect_bad(j, "ints attr not a list");
  }
}

TEST(SerializeHostile, UnknownOpAndArity) {
  const json base = graph_to_json(small_graph());
  const size_t lin = node_index(base, "lin"), ada = node_index(base, "ada"), plus = node_index(base, "plus");
  {
    json j = base;
    j["nodes"][lin]["op"] = "frobnicate";
    expect_bad(j, "unknown op");
    j["nodes"][lin]["op"] = "";
    expect_bad(j, "empty op");
    j["nodes"][lin]["op"] = "LINEAR";
    expect_bad(j, "op in the wrong case");
  }
  {
    json j = base;
    j["nodes"][lin]["in"] = json::array({j["nodes"][lin]["in"][0]});
    expect_bad(j, "linear with one input");
    j = base;
    auto in = j["nodes"][plus]["in"];
    in.push_back(in[0]);
    j["nodes"][plus]["in"] = in;
    expect_bad(j, "add with three inputs");
    j = base;
    j["nodes"][0]["in"] = json::array({0});
    expect_bad(j, "input node with an input");
  }
  {
    json j = base;
    j["nodes"][ada]["out"] = json::array({j["nodes"][ada]["out"][0]});
    expect_bad(j, "ada_rms_norm with one output");
    j = base;
    auto out = j["nodes"][lin]["out"];
    out.push_back(out[0]);
    j["nodes"][lin]["out"] = out;
    expect_bad(j, "linear with two outputs");
    j = base;
    j["nodes"][lin]["out"] = json::array();
    expect_bad(j, "linear with no output");
  }
  {
    // A weight node turned into a compute op (and the reverse).
    json j = base;
    size_t wnode = 0;
    for (size_t i = 0; i < j["nodes"].size(); ++i)
      if (j["nodes"][i]["op"] == "weight") wnode = i;
    j["nodes"][wnode]["op"] = "gelu_tanh";
    expect_bad(j, "weight node as gelu");
    j = base;
    j["nodes"][lin]["op"] = "weight";
    expect_bad(j, "linear as weight");
  }
}

TEST(SerializeHostile, OutOfRangeIds) {
  const json base = graph_to_json(small_graph());
  const size_t lin = node_index(base, "lin");
  for (json v : {json(-1), json(100000), json(int64_t(1) << 40), json(-(int64_t(1) << 62)), json(1.5), json("0"),
                 json(nullptr), json::array({0})}) {
    json j = base;
    j["nodes"][lin]["in"][0] = v;
    expect_bad(j, "input id " + v.dump());
    j = base;
    j["outputs"][0] = v;
    expect_bad(j, "output id " + v.dump());
  }
  {
    // Reading a value defined later (a forward edge / cycle).
    json j = base;
    const int64_t later = int64_t(j["nodes"].size());  // beyond every value defined so far at node 'lin'
    j["nodes"][lin]["in"][0] = later - 1;
    expect_bad(j, "forward reference");
  }
  {
    // A value that exists but has the wrong shape for the op.
    json j = base;
    j["nodes"][lin]["in"][0] = 0;  // x [4, 8] instead of the norm's output: same shape, accepted
    EXPECT_TRUE(graph_from_json(j, "e").is_ok());
    j["nodes"][lin]["in"][0] = 2;  // pos i64[4]
    expect_bad(j, "linear on positions");
  }
}

TEST(SerializeHostile, BadShapesAndDtypes) {
  const json base = graph_to_json(small_graph());
  const size_t lin = node_index(base, "lin");
  const std::vector<json> bad_shapes = {
      json::array({-1, 8}),
      json::array({4, 8.5}),
      json::array({4, "8"}),
      json::array({int64_t(1) << 41}),
      json::array({int64_t(1) << 30, int64_t(1) << 30, int64_t(1) << 30}),  // element count overflows the limit
      json::array({1, 1, 1, 1, 1, 1, 1, 1, 1}),                              // rank 9
      json("4x8"),
      json::object(),
  };
  for (const json& s : bad_shapes) {
    json j = base;
    j["nodes"][lin]["out"][0][1] = s;
    expect_bad(j, "node output shape " + s.dump());
    j = base;
    j["nodes"][0]["out"][0][1] = s;
    expect_bad(j, "input shape " + s.dump());
    j = base;
    j["weights"][0]["shape"] = s;
    expect_bad(j, "weight shape " + s.dump());
  }
  {
    json j = base;
    j["nodes"][lin]["out"][0] = json::array({"F32"});
    expect_bad(j, "info without shape");
    j["nodes"][lin]["out"][0] = json::array({"F99", json::array({4, 8})});
    expect_bad(j, "unknown dtype");
    j["nodes"][lin]["out"][0] = json::array({7, json::array({4, 8})});
    expect_bad(j, "numeric dtype");
    j["nodes"][lin]["out"][0] = json::array({"F32", json::array({4, 9})});
    expect_bad(j, "shape differs from inference");
    j["nodes"][lin]["out"][0] = json::array({"BF16", json::array({4, 8})});
    expect_bad(j, "dtype differs from inference");
  }
  {
    json j = base;
    j["weights"][0]["dtype"] = "Q4";
    expect_bad(j, "unknown weight dtype");
    j = base;
    j["weights"][0].erase("name");
    expect_bad(j, "weight without name");
    j = base;
    j["weights"][0] = 3;
    expect_bad(j, "weight not an object");
    j = base;
    j["weights"][0]["shape"] = json::array({8, 9});  // the node's output no longer matches
    expect_bad(j, "weight shape differs from its node");
  }
}

TEST(SerializeHostile, WeightIndex) {
  const json base = graph_to_json(small_graph());
  size_t wnode = 0;
  for (size_t i = 0; i < base["nodes"].size(); ++i)
    if (base["nodes"][i]["op"] == "weight") {
      wnode = i;
      break;
    }
  for (json v : {json(-1), json(2), json(99), json(int64_t(1) << 40), json("0"), json(0.5), json(nullptr)}) {
    json j = base;
    j["nodes"][wnode]["weight"] = v;
    expect_bad(j, "weight index " + v.dump());
  }
  {
    json j = base;
    j["nodes"][wnode].erase("weight");
    expect_bad(j, "weight node without index");
  }
  {
    // Two nodes for one weight.
    json j = base;
    size_t second = 0;
    for (size_t i = wnode + 1; i < j["nodes"].size(); ++i)
      if (j["nodes"][i]["op"] == "weight") {
        second = i;
        break;
      }
    ASSERT_GT(second, 0u);
    j["nodes"][second]["weight"] = j["nodes"][wnode]["weight"];
    expect_bad(j, "weight read by two nodes");
  }
  {
    json j = base;
    j["weights"] = json::array();
    expect_bad(j, "no weights");
  }
}

TEST(SerializeHostile, AttributesOpsCannotTake) {
  const json base = graph_to_json(small_graph());
  auto set_attr = [](json& j, size_t node, const std::string& key, json value) {
    json attrs = json::array();
    for (const auto& kv : j["nodes"][node].value("attrs", json::array()))
      if (kv[0] != key) attrs.push_back(kv);
    attrs.push_back(json::array({key, std::move(value)}));
    j["nodes"][node]["attrs"] = std::move(attrs);
  };
  const size_t split = node_index(base, "split"), tr = node_index(base, "tr"), cut = node_index(base, "cut"),
               cast = node_index(base, "to_bf16");
  const int64_t huge = int64_t(1) << 40;
  const std::vector<std::pair<size_t, std::pair<std::string, json>>> cases = {
      {split, {"shape", json::object({{"ints", json::array({4, -1, -1})}})}},
      {split, {"shape", json::object({{"ints", json::array({4, 0, -1})}})}},
      {split, {"shape", json::object({{"ints", json::array({4, -2, 4})}})}},
      {split, {"shape", json::object({{"ints", json::array({huge, huge, huge, -1})}})}},
      {split, {"shape", json::object({{"ints", json::array({int64_t(1) << 62, 4, 2})}})}},
      {split, {"shape", json::object({{"ints", json::array({INT64_MAX, INT64_MAX})}})}},
      {split, {"shape", json::object({{"i", 4}})}},
      {tr, {"perm", json::object({{"ints", json::array({0, 0, 1})}})}},
      {tr, {"perm", json::object({{"ints", json::array({5, 0, 1})}})}},
      {tr, {"perm", json::object({{"ints", json::array({-1, 0, 1})}})}},
      {tr, {"perm", json::object({{"ints", json::array({0, 1})}})}},
      {cut, {"axis", json::object({{"i", 7}})}},
      {cut, {"axis", json::object({{"i", INT64_MIN}})}},
      {cut, {"start", json::object({{"i", -3}})}},
      {cut, {"end", json::object({{"i", INT64_MAX}})}},
      {cut, {"start", json::object({{"i", 7}})}},
      {cast, {"dtype", json::object({{"s", "F128"}})}},
      {cast, {"dtype", json::object({{"i", 3}})}},
  };
  for (const auto& [node, kv] : cases) {
    json j = base;
    set_attr(j, node, kv.first, kv.second);
    expect_bad(j, j["nodes"][node].value("name", "") + " " + kv.first + "=" + kv.second.dump());
  }
}

// Seeded mutations of a real stage graph's JSON: every result is either InvalidFormat or a graph
// that verifies; never a crash (run under ASan+UBSan too).
TEST(SerializeHostile, MutationLoop) {
  auto m = Pi05Model::load(kFixtures + "/tiny_a/policy");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  auto st = m->build_step(12);
  ASSERT_TRUE(st.is_ok());
  const json base = graph_to_json(st->graph);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  auto rnd = [&s](uint64_t n) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return n ? s % n : 0;
  };
  const std::vector<json> values = {json(-1), json(0), json(1), json(2), json(3), json(7), json(int64_t(1) << 31),
                                    json(INT64_MAX), json(INT64_MIN), json(-0.5), json("F32"), json(nullptr),
                                    json::array(), json::object(), json(true)};
  int accepted = 0, rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    json j = base;
    const int n_mut = 1 + int(rnd(3));
    for (int k = 0; k < n_mut; ++k) {
      json& nodes = j["nodes"];
      json& nd = nodes[size_t(rnd(nodes.size()))];
      switch (rnd(6)) {
        case 0:
          if (!nd["in"].empty()) nd["in"][size_t(rnd(nd["in"].size()))] = values[size_t(rnd(values.size()))];
          break;
        case 1:
          if (!nd["in"].empty()) nd["in"][size_t(rnd(nd["in"].size()))] = int64_t(rnd(base["nodes"].size() + 5));
          break;
        case 2: {
          json& o = nd["out"][0];
          if (!o[1].empty()) o[1][size_t(rnd(o[1].size()))] = int64_t(rnd(70)) - 2;
          else o[1].push_back(int64_t(rnd(9)));
          break;
        }
        case 3:
          if (nd.contains("attrs") && !nd["attrs"].empty()) {
            json& a = nd["attrs"][size_t(rnd(nd["attrs"].size()))][1];
            if (a.contains("ints") && !a["ints"].empty())
              a["ints"][size_t(rnd(a["ints"].size()))] = int64_t(rnd(20)) - 3;
            else if (a.contains("i"))
              a["i"] = int64_t(rnd(40)) - 10;
            else
              a = json::object({{"i", int64_t(rnd(5))}});
          }
          break;
        case 4:
          nd["op"] = base["nodes"][size_t(rnd(base["nodes"].size()))]["op"];
          break;
        case 5:
          if (nd.contains("weight")) nd["weight"] = int64_t(rnd(base["weights"].size() + 2)) - 1;
          else j["outputs"][size_t(rnd(j["outputs"].size()))] = int64_t(rnd(base["nodes"].size() * 2));
          break;
      }
    }
    auto r = graph_from_json(j, "mut");
    if (r.is_ok()) {
      ++accepted;
      EXPECT_TRUE(verify(*r).is_ok());
      (void)graph_to_json(*r);
    } else {
      ++rejected;
      EXPECT_EQ(r.status().code(), StatusCode::InvalidFormat) << r.status().message();
    }
  }
  EXPECT_GT(rejected, 100);
  std::printf("[ mutation ] %d accepted, %d rejected\n", accepted, rejected);
}

}  // namespace
}  // namespace vlac::ir
