// TensorSet: one file, a folder, a sharded index (good, missing shard, tensor missing from the
// weight_map, a weight_map entry missing from its shard, a name in two shards, path traversal,
// hostile index json). Every error is bad input and names the file (and tensor where relevant).
#include <unistd.h>

#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "st_test_util.h"

namespace vlac {
namespace {

using testing::good_st;
using testing::StTensor;
using testing::TempDir;
using testing::write_bytes;

void expect_error(const Result<TensorSet>& r, StatusCode code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), code) << r.status().message();
  EXPECT_TRUE(r.status().is_bad_input());
  for (const auto& p : parts) EXPECT_NE(r.status().message().find(p), std::string::npos) << "want '" << p << "' in: " << r.status().message();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

// Two shards: a.weight, a.bias in shard 1; b.weight in shard 2.
struct Sharded {
  TempDir dir;
  std::string index = dir.file("model.safetensors.index.json");
  std::string s1 = "model-00001-of-00002.safetensors";
  std::string s2 = "model-00002-of-00002.safetensors";
  Sharded() {
    write_bytes(dir.file(s1), good_st({{"a.weight", "F32", {2, 2}, 4}, {"a.bias", "F32", {2}, 4}}, "{\"format\":\"pt\"}"));
    write_bytes(dir.file(s2), good_st({{"b.weight", "BF16", {3}, 2}}));
  }
  void write_index(const std::string& weight_map) {
    write_bytes(index, "{\"metadata\":{\"total_size\":30},\"weight_map\":{" + weight_map + "}}");
  }
  std::string wm(const std::string& name, const std::string& shard) { return "\"" + name + "\":\"" + shard + "\""; }
  std::string good_wm() { return wm("a.weight", s1) + "," + wm("a.bias", s1) + "," + wm("b.weight", s2); }
};

TEST(TensorSet, SingleFileAndFolder) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), good_st({{"x", "F32", {3}, 4}, {"y", "U8", {5}, 1}}, "{\"k\":\"v\"}"));
  for (const std::string& p : {dir.file("model.safetensors"), dir.path(), dir.path() + "/"}) {
    auto r = TensorSet::open(p);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->tensors().size(), 2u);
    EXPECT_EQ(r->files().size(), 1u);
    EXPECT_EQ(r->total_bytes(), 17u);
    EXPECT_EQ(r->metadata().at("k"), "v");
    ASSERT_NE(r->find("y"), nullptr);
    EXPECT_EQ(r->find("y")->info->nbytes(), 5u);
    EXPECT_EQ(r->find("z"), nullptr);
    EXPECT_NE(r->source().find("model.safetensors"), std::string::npos);
  }
}

TEST(TensorSet, FolderWithoutWeightsListsWhatItHas) {
  TempDir dir;
  write_bytes(dir.file("config.json"), "{}");
  write_bytes(dir.file("weights.bin"), "x");
  expect_error(TensorSet::open(dir.path()), StatusCode::NotFound,
               {dir.path(), "model.safetensors", "config.json", "weights.bin"});
  expect_error(TensorSet::open(dir.file("nothing-here")), StatusCode::NotFound, {"nothing-here"});
}

TEST(TensorSet, ShardedGood) {
  Sharded s;
  s.write_index(s.good_wm());
  // A stray model.safetensors next to the index: the index wins.
  write_bytes(s.dir.file("model.safetensors"), good_st({{"other", "F32", {1}, 4}}));
  for (const std::string& p : {s.index, s.dir.path()}) {
    auto r = TensorSet::open(p);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->files().size(), 2u);
    ASSERT_EQ(r->tensors().size(), 3u);
    EXPECT_EQ(r->tensors()[0].info->name, "a.weight");  // shard order, then data order
    EXPECT_EQ(r->tensors()[1].info->name, "a.bias");
    EXPECT_EQ(r->tensors()[2].info->name, "b.weight");
    EXPECT_EQ(r->find("b.weight")->file, r->files()[1].get());
    EXPECT_EQ(r->find("other"), nullptr);
    EXPECT_EQ(r->total_bytes(), 30u);
    EXPECT_EQ(r->metadata().at("format"), "pt");
    EXPECT_EQ(r->metadata().at("total_size"), "30");
    EXPECT_EQ(r->source(), s.index);
  }
}

TEST(TensorSet, MissingShard) {
  Sharded s;
  s.write_index(s.good_wm() + "," + s.wm("c.weight", "model-00003-of-00002.safetensors"));
  expect_error(TensorSet::open(s.index), StatusCode::NotFound, {s.index, "model-00003-of-00002.safetensors", "no such file"});
}

TEST(TensorSet, TensorMissingFromWeightMap) {
  Sharded s;
  s.write_index(s.wm("a.weight", s.s1) + "," + s.wm("b.weight", s.s2));
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.dir.file(s.s1), "tensor 'a.bias'", "not listed"});
}

TEST(TensorSet, WeightMapEntryMissingFromShard) {
  Sharded s;
  s.write_index(s.good_wm() + "," + s.wm("ghost", s.s2));
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "tensor 'ghost'", "not in that shard"});
}

TEST(TensorSet, WeightMapPointsAtWrongShard) {
  Sharded s;
  s.write_index(s.wm("a.weight", s.s2) + "," + s.wm("a.bias", s.s1) + "," + s.wm("b.weight", s.s2));
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "tensor 'a.weight'", "names shard"});
}

TEST(TensorSet, NameInTwoShards) {
  Sharded s;
  write_bytes(s.dir.file(s.s2), good_st({{"b.weight", "BF16", {3}, 2}, {"a.bias", "F32", {2}, 4}}));
  s.write_index(s.good_wm());
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "tensor 'a.bias'", "in two shards"});
}

TEST(TensorSet, DuplicateKeyInWeightMap) {
  Sharded s;
  s.write_index(s.good_wm() + "," + s.wm("a.bias", s.s2));
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "duplicate key 'a.bias'"});
}

TEST(TensorSet, PathTraversal) {
  Sharded s;
  for (const std::string& bad : {std::string("../x.safetensors"), std::string("/etc/passwd"),
                                 std::string("sub/../../x.safetensors"), std::string("..")}) {
    s.write_index(s.good_wm() + "," + s.wm("evil", bad));
    expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "tensor 'evil'", "shard"});
  }
  s.write_index(s.good_wm() + ",\"evil\":\"\"");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "is empty"});
  s.write_index(s.good_wm() + ",\"evil\":\"a\\u0000b\"");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "NUL"});
}

TEST(TensorSet, HostileIndex) {
  Sharded s;
  write_bytes(s.index, "[1,2]");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "not a JSON object"});
  write_bytes(s.index, "{\"weight_map\":[]}");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "weight_map"});
  write_bytes(s.index, "{\"weight_map\":{}}");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "empty"});
  write_bytes(s.index, "{\"weight_map\":{\"a.weight\":1}}");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "tensor 'a.weight'", "not a string"});
  write_bytes(s.index, "{\"weight_map\":{\"a.weight\":\"x\"");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "invalid JSON"});
  write_bytes(s.index, "{\"weight_map\":{\"\xff\":\"x\"}}");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "UTF-8"});
  write_bytes(s.index, std::string(100000, '[') + std::string(100000, ']'));
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "nested deeper"});
  write_bytes(s.index, "");
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "empty"});
  // Larger than the bound: refused before reading (a sparse file, nothing is allocated).
  write_bytes(s.index, "{");
  ASSERT_EQ(truncate(s.index.c_str(), 100'000'001), 0);
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.index, "limit"});
}

TEST(TensorSet, BadShardKeepsItsOwnMessage) {
  Sharded s;
  write_bytes(s.dir.file(s.s2), "short");
  s.write_index(s.good_wm());
  expect_error(TensorSet::open(s.index), StatusCode::InvalidFormat, {s.dir.file(s.s2), "too short"});
}

}  // namespace
}  // namespace vlac
