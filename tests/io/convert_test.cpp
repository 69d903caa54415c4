// io/convert end to end: values (fp32/fp64/fp16/bf16 -> bf16|fp16|fp32), non-float tensors
// copied unchanged, metadata kept, chunking, sharded input and output, --prefix, bad input
// (through the CLI: exit 2, nothing at OUT), and the demo command's files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/convert.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace vlac {
namespace {

namespace fs = std::filesystem;

struct T {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

template <typename V>
std::vector<uint8_t> raw(const std::vector<V>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(V));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

void write_st(const std::string& path, const std::vector<T>& ts, std::map<std::string, std::string> md = {}) {
  std::vector<TensorSpec> specs;
  for (const auto& t : ts) specs.push_back({t.name, t.dtype, t.shape});
  auto w = SafetensorsWriter::create(path, specs, std::move(md));
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  for (const auto& t : ts) ASSERT_TRUE(w->write(t.bytes.data(), t.bytes.size()).is_ok());
  ASSERT_TRUE(w->finish().is_ok());
}

std::vector<uint8_t> tensor_bytes(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (t == nullptr) return {};
  const uint8_t* p = f.data(*t);
  return std::vector<uint8_t>(p, p + t->nbytes());
}

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("vlac_convert_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs the vlac CLI; returns its exit code (stderr/stdout to a file to keep test logs short).
int run_vlac(const std::vector<std::string>& args, std::string* output = nullptr) {
  std::string log = fs::temp_directory_path() / ("vlac_convert_test_log_" + std::to_string(getpid()));
  std::string cmd = std::string(VLAC_BINARY);
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " >" + log + " 2>&1";
  int rc = std::system(cmd.c_str());
  if (output != nullptr) {
    std::ifstream in(log);
    std::getline(in, *output, '\0');
  }
  fs::remove(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::vector<float> special_floats() {
  return {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* bf16 tie 1+2^-8 */, 1.01171875f /* 1+3*2^-8 tie */,
          3.14159265f, -2.7182818f, 65504.0f, 65520.0f, 1e-8f, 1e-40f /* denormal */, 3.4e38f, INFINITY,
          -INFINITY, std::nanf(""), -std::nanf(""), 1e30f, -1e-30f, 0.1f};
}

TEST(Convert, Fp32ToBf16ValuesNonFloatAndMetadata) {
  std::string dir = temp_dir("basic");
  auto fl = special_floats();
  std::vector<int64_t> ids = {1, -2, 3, INT64_MAX, INT64_MIN};
  std::vector<uint8_t> mask = {1, 0, 1};
  std::vector<int32_t> i32 = {7, -7};
  write_st(dir + "/in.safetensors",
           {{"w", DType::F32, {4, 5}, raw(fl)},
            {"ids", DType::I64, {5}, raw(ids)},
            {"mask", DType::BOOL, {3}, mask},
            {"i32", DType::I32, {2}, raw(i32)},
            {"empty", DType::F32, {0, 3}, {}},
            {"scalar", DType::F32, {}, raw(std::vector<float>{2.5f})}},
           {{"format", "pt"}, {"note", "kept"}});
  ConvertOptions opt;
  opt.input = dir + "/in.safetensors";
  opt.output = dir + "/out.safetensors";
  opt.target = DType::BF16;
  ConvertStats stats;
  std::vector<uint64_t> seen;
  Status st = convert_checkpoint(opt, &stats, [&](uint64_t done, uint64_t total) {
    seen.push_back(done);
    EXPECT_LE(done, total);
  });
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(stats.n_tensors, 6u);
  EXPECT_EQ(stats.n_converted, 3u);  // w, empty, scalar
  EXPECT_EQ(stats.input_bytes, 80u + 40u + 3u + 8u + 0u + 4u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), stats.input_bytes);
  EXPECT_EQ(stats.output_bytes, fs::file_size(opt.output));
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"in.safetensors", "out.safetensors"}));

  auto out = SafetensorsFile::open(opt.output);
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(out->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "kept"}}));
  ASSERT_EQ(out->tensors().size(), 6u);
  const TensorInfo* w = out->find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::BF16);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{4, 5}));
  auto wb = tensor_bytes(*out, "w");
  ASSERT_EQ(wb.size(), fl.size() * 2);
  for (size_t i = 0; i < fl.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, wb.data() + 2 * i, 2);
    if (std::isnan(fl[i])) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << i;
      EXPECT_EQ(std::signbit(bf16_to_f32(h)), std::signbit(fl[i])) << i;
    } else {
      EXPECT_EQ(h, f32_to_bf16(fl[i])) << i;
    }
  }
  // A few values spelled out (independent of f32_to_bf16).
  auto at = [&](size_t i) { uint16_t h; std::memcpy(&h, wb.data() + 2 * i, 2); return h; };
  EXPECT_EQ(at(2), 0x3F80);   // 1.0
  EXPECT_EQ(at(4), 0x3F80);   // tie 1+2^-8 -> even 1.0
  EXPECT_EQ(at(5), 0x3F82);   // tie 1+3*2^-8 -> even 1+2^-6
  EXPECT_EQ(at(1), 0x8000);   // -0
  EXPECT_EQ(at(12), 0x7F80);  // 3.4e38 is above the bf16 max + half an ulp (3.396e38): Inf
  EXPECT_EQ(at(13), 0x7F80);  // Inf
  EXPECT_EQ(at(14), 0xFF80);  // -Inf
  EXPECT_EQ(tensor_bytes(*out, "ids"), raw(ids));
  EXPECT_EQ(out->find("ids")->dtype, DType::I64);
  EXPECT_EQ(tensor_bytes(*out, "mask"), mask);
  EXPECT_EQ(out->find("mask")->dtype, DType::BOOL);
  EXPECT_EQ(tensor_bytes(*out, "i32"), raw(i32));
  EXPECT_EQ(out->find("empty")->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(out->find("empty")->dtype, DType::BF16);
  EXPECT_EQ(out->find("scalar")->shape, std::vector<int64_t>{});
  EXPECT_EQ(tensor_bytes(*out, "scalar"), raw(std::vector<uint16_t>{0x4020}));
  // Declaration order is kept.
  std::vector<std::string> names;
  for (const auto& t : out->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"w", "ids", "mask", "i32", "empty", "scalar"}));
  fs::remove_all(dir);
}

TEST(Convert, Fp16TargetAndF64Input) {
  std::string dir = temp_dir("f16");
  std::vector<double> d = {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), 65519.0, 65520.0, -1e300,
                           std::ldexp(1.0, -25), 0.5, std::nan("")};
  std::vector<float> f = {65504.0f, 65520.0f, -65520.0f, 1e-8f, std::ldexp(3.0f, -25), 1.0f};
  write_st(dir + "/in.safetensors", {{"d", DType::F64, {7}, raw(d)}, {"f", DType::F32, {6}, raw(f)}});
  ConvertOptions opt;
  opt.input = dir + "/in.safetensors";
  opt.output = dir + "/out.safetensors";
  opt.target = DType::F16;
  ASSERT_TRUE(convert_checkpoint(opt).is_ok());
  auto out = SafetensorsFile::open(opt.output);
  ASSERT_TRUE(out.is_ok());
  auto dh = tensor_bytes(*out, "d");
  std::vector<uint16_t> h(dh.size() / 2);
  std::memcpy(h.data(), dh.data(), dh.size());
  EXPECT_EQ(h[0], 0x3C01);  // single rounding from the double (a double rounding gives 0x3C00)
  EXPECT_EQ(h[1], 0x7BFF);
  EXPECT_EQ(h[2], 0x7C00);  // overflow -> Inf
  EXPECT_EQ(h[3], 0xFC00);
  EXPECT_EQ(h[4], 0x0000);  // tie at the smallest subnormal -> even (0)
  EXPECT_EQ(h[5], 0x3800);
  EXPECT_EQ(h[6] & 0x7C00, 0x7C00);
  EXPECT_NE(h[6] & 0x3FF, 0);
  auto fh = tensor_bytes(*out, "f");
  std::vector<uint16_t> g(fh.size() / 2);
  std::memcpy(g.data(), fh.data(), fh.size());
  EXPECT_EQ(g, (std::vector<uint16_t>{0x7BFF, 0x7C00, 0xFC00, 0x0000, 0x0002, 0x3C00}));
  // F64 -> F32 is one IEEE rounding.
  opt.output = dir + "/out32.safetensors";
  opt.target = DType::F32;
  ASSERT_TRUE(convert_checkpoint(opt).is_ok());
  auto o32 = SafetensorsFile::open(opt.output);
  ASSERT_TRUE(o32.is_ok());
  auto b32 = tensor_bytes(*o32, "d");
  std::vector<float> v(b32.size() / 4);
  std::memcpy(v.data(), b32.data(), b32.size());
  for (size_t i = 0; i + 1 < d.size(); ++i) EXPECT_EQ(v[i], static_cast<float>(d[i])) << i;
  EXPECT_TRUE(std::isnan(v[6]));
  EXPECT_EQ(tensor_bytes(*o32, "f"), raw(f));  // same dtype: byte copy
  fs::remove_all(dir);
}

TEST(Convert, HalfInputsWidenAndCrossConvert) {
  std::string dir = temp_dir("half");
  std::vector<uint16_t> bf = {0x3F80, 0x7F80, 0xFFC1, 0x0001, 0x4049};
  std::vector<uint16_t> hf = {0x3C00, 0x7C00, 0x0001, 0x7BFF, 0xFE01};
  std::vector<uint8_t> e4 = {0x38, 0x7F, 0x01, 0xB8};  // 1.0, NaN, min subnormal, -1.0
  write_st(dir + "/in.safetensors", {{"bf", DType::BF16, {5}, raw(bf)}, {"hf", DType::F16, {5}, raw(hf)},
                                     {"e4", DType::F8_E4M3, {4}, e4}});
  ConvertOptions opt;
  opt.input = dir + "/in.safetensors";
  opt.output = dir + "/out.safetensors";
  opt.target = DType::F32;
  ASSERT_TRUE(convert_checkpoint(opt).is_ok());
  auto out = SafetensorsFile::open(opt.output);
  ASSERT_TRUE(out.is_ok());
  auto b = tensor_bytes(*out, "bf");
  std::vector<float> v(5);
  std::memcpy(v.data(), b.data(), 20);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], INFINITY);
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_EQ(v[3], std::ldexp(1.0f, -133));
  EXPECT_EQ(v[4], 3.140625f);
  auto h = tensor_bytes(*out, "hf");
  std::memcpy(v.data(), h.data(), 20);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], INFINITY);
  EXPECT_EQ(v[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(v[3], 65504.0f);
  EXPECT_TRUE(std::isnan(v[4]));
  auto e = tensor_bytes(*out, "e4");
  std::vector<float> ev(4);
  std::memcpy(ev.data(), e.data(), 16);
  EXPECT_EQ(ev[0], 1.0f);
  EXPECT_TRUE(std::isnan(ev[1]));
  EXPECT_EQ(ev[2], std::ldexp(1.0f, -9));
  EXPECT_EQ(ev[3], -1.0f);
  // bf16 -> bf16 is a byte copy; f16 -> bf16 rounds once through the exact f32.
  opt.output = dir + "/out_bf.safetensors";
  opt.target = DType::BF16;
  ASSERT_TRUE(convert_checkpoint(opt).is_ok());
  auto ob = SafetensorsFile::open(opt.output);
  ASSERT_TRUE(ob.is_ok());
  EXPECT_EQ(tensor_bytes(*ob, "bf"), raw(bf));
  auto hb = tensor_bytes(*ob, "hf");
  std::vector<uint16_t> hv(5);
  std::memcpy(hv.data(), hb.data(), 10);
  EXPECT_EQ(hv[0], 0x3F80);
  EXPECT_EQ(hv[1], 0x7F80);
  EXPECT_EQ(hv[2], f32_to_bf16(std::ldexp(1.0f, -24)));
  EXPECT_EQ(hv[3], 0x4780);  // 65504 -> 65536 in bf16 (nearest)
  fs::remove_all(dir);
}

TEST(Convert, TinyBufferGivesIdenticalBytes) {
  std::string dir = temp_dir("chunks");
  std::vector<float> big(10007);
  for (size_t i = 0; i < big.size(); ++i) big[i] = std::sin(static_cast<float>(i)) * 100.0f;
  std::vector<int64_t> ints(1001);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<int64_t>(i * i);
  std::vector<double> dd(777);
  for (size_t i = 0; i < dd.size(); ++i) dd[i] = std::cos(static_cast<double>(i)) * 1e-3;
  write_st(dir + "/in.safetensors",
           {{"a", DType::F32, {10007}, raw(big)}, {"b", DType::I64, {1001}, raw(ints)}, {"c", DType::F64, {777}, raw(dd)}});
  ConvertOptions opt;
  opt.input = dir + "/in.safetensors";
  opt.output = dir + "/big_buffer.safetensors";
  ASSERT_TRUE(convert_checkpoint(opt).is_ok());
  opt.output = dir + "/small_buffer.safetensors";
  opt.buffer_bytes = 100;  // not a multiple of any element size pairing
  ASSERT_TRUE(convert_checkpoint(opt).is_ok());
  auto a = SafetensorsFile::open(dir + "/big_buffer.safetensors");
  auto b = SafetensorsFile::open(dir + "/small_buffer.safetensors");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  for (const char* n : {"a", "b", "c"}) EXPECT_EQ(tensor_bytes(*a, n), tensor_bytes(*b, n)) << n;
  auto ab = tensor_bytes(*a, "a");
  for (size_t i = 0; i < big.size(); i += 1000) {
    uint16_t h;
    std::memcpy(&h, ab.data() + 2 * i, 2);
    EXPECT_EQ(h, f32_to_bf16(big[i]));
  }
  opt.buffer_bytes = 8;  // below the minimum
  EXPECT_EQ(convert_checkpoint(opt).code(), StatusCode::InvalidArgument);
  fs::remove_all(dir);
}

// Two shards + index -> one file.
void write_sharded_input(const std::string& dir) {
  write_st(dir + "/model-00001-of-00002.safetensors",
           {{"model.x.weight", DType::F32, {3}, raw(std::vector<float>{1, 2, 3})},
            {"model.y.bias", DType::F32, {2}, raw(std::vector<float>{4, 5})}},
           {{"format", "pt"}});
  write_st(dir + "/model-00002-of-00002.safetensors",
           {{"model.z.weight", DType::F32, {2, 2}, raw(std::vector<float>{6, 7, 8, 9})},
            {"head.steps", DType::I32, {1}, raw(std::vector<int32_t>{42})}},
           {{"format", "pt"}});
  nlohmann::json idx = {{"metadata", {{"total_size", 48}}},
                        {"weight_map",
                         {{"model.x.weight", "model-00001-of-00002.safetensors"},
                          {"model.y.bias", "model-00001-of-00002.safetensors"},
                          {"model.z.weight", "model-00002-of-00002.safetensors"},
                          {"head.steps", "model-00002-of-00002.safetensors"}}}};
  std::ofstream(dir + "/model.safetensors.index.json") << idx.dump();
}

TEST(Convert, ShardedInput) {
  std::string dir = temp_dir("shardin");
  fs::create_directories(dir + "/in");
  write_sharded_input(dir + "/in");
  for (std::string input : {dir + "/in/model.safetensors.index.json", dir + "/in"}) {
    ConvertOptions opt;
    opt.input = input;
    opt.output = dir + "/out.safetensors";
    ConvertStats stats;
    Status st = convert_checkpoint(opt, &stats);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(stats.n_tensors, 4u);
    auto out = SafetensorsFile::open(opt.output);
    ASSERT_TRUE(out.is_ok());
    EXPECT_EQ(out->tensors().size(), 4u);
    // The index's total_size is not shard metadata: only the shards' own __metadata__ is kept.
    EXPECT_EQ(out->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
    EXPECT_EQ(tensor_bytes(*out, "model.z.weight"),
              raw(std::vector<uint16_t>{f32_to_bf16(6), f32_to_bf16(7), f32_to_bf16(8), f32_to_bf16(9)}));
    EXPECT_EQ(tensor_bytes(*out, "head.steps"), raw(std::vector<int32_t>{42}));
    fs::remove(opt.output);
  }
  fs::remove_all(dir);
}

TEST(Convert, ShardedOutput) {
  std::string dir = temp_dir("shardout");
  std::vector<T> ts;
  for (int i = 0; i < 7; ++i) {
    std::vector<float> v(256 + i);
    for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(i * 1000 + static_cast<int>(k));
    ts.push_back({"layers." + std::to_string(i) + ".w", DType::F32, {static_cast<int64_t>(v.size())}, raw(v)});
  }
  ts.push_back({"big", DType::F32, {2000}, raw(std::vector<float>(2000, 0.5f))});  // larger than a shard
  write_st(dir + "/in.safetensors", ts, {{"format", "pt"}});
  ConvertOptions opt;
  opt.input = dir + "/in.safetensors";
  opt.output = dir + "/out/model.safetensors";
  opt.max_shard_size = 1100;  // bf16: 2 tensors of ~520 B per shard
  fs::create_directories(dir + "/out");
  ConvertStats stats;
  Status st = convert_checkpoint(opt, &stats);
  ASSERT_TRUE(st.is_ok()) << st.message();
  auto files = listing(dir + "/out");
  std::vector<std::string> want = {"model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                                   "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                                   "model-00005-of-00005.safetensors", "model.safetensors.index.json"};
  EXPECT_EQ(files, want);
  EXPECT_EQ(stats.output_files.size(), 6u);
  nlohmann::json idx = nlohmann::json::parse(std::ifstream(dir + "/out/model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& t : ts) total += t.bytes.size() / 2;
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(idx["weight_map"].size(), ts.size());
  EXPECT_EQ(idx["weight_map"]["layers.0.w"], "model-00001-of-00005.safetensors");
  EXPECT_EQ(idx["weight_map"]["layers.1.w"], "model-00001-of-00005.safetensors");
  EXPECT_EQ(idx["weight_map"]["layers.2.w"], "model-00002-of-00005.safetensors");
  EXPECT_EQ(idx["weight_map"]["big"], "model-00005-of-00005.safetensors");
  uint64_t bytes_on_disk = 0;
  for (const auto& f : files) bytes_on_disk += fs::file_size(dir + "/out/" + f);
  EXPECT_EQ(stats.output_bytes, bytes_on_disk);
  // Read back as one logical set; values match a one-file conversion.
  auto set = TensorSet::open(dir + "/out");
  ASSERT_TRUE(set.is_ok()) << set.status().message();
  EXPECT_EQ(set->tensors().size(), ts.size());
  for (const auto& t : ts) {
    const auto* e = set->find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    std::vector<float> src(t.bytes.size() / 4);
    std::memcpy(src.data(), t.bytes.data(), t.bytes.size());
    std::vector<uint16_t> want16;
    for (float x : src) want16.push_back(f32_to_bf16(x));
    EXPECT_EQ(std::vector<uint8_t>(e->file->data(*e->info), e->file->data(*e->info) + e->info->nbytes()), raw(want16));
    EXPECT_EQ(e->file->metadata().at("format"), "pt");
  }
  // Everything fits in one shard: a plain file, no index (as Hugging Face does).
  opt.output = dir + "/one/model.safetensors";
  opt.max_shard_size = 1ull << 30;
  fs::create_directories(dir + "/one");
  st = convert_checkpoint(opt);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(listing(dir + "/one"), std::vector<std::string>{"model.safetensors"});
  // Output == an input shard -> error, nothing written.
  ConvertOptions again;
  again.input = dir + "/out";
  again.output = dir + "/out/model.safetensors";  // would produce the same shard names
  again.max_shard_size = 1100;
  again.target = DType::F32;
  EXPECT_EQ(convert_checkpoint(again).code(), StatusCode::InvalidArgument);
  EXPECT_EQ(listing(dir + "/out"), want);
  fs::remove_all(dir);
}

TEST(Convert, PrefixKeepsAndStrips) {
  std::string dir = temp_dir("prefix");
  write_sharded_input(dir);
  ConvertOptions opt;
  opt.input = dir;
  opt.output = dir + "/sub.safetensors";
  opt.prefix = "model.";
  ConvertStats stats;
  ASSERT_TRUE(convert_checkpoint(opt, &stats).is_ok());
  auto out = SafetensorsFile::open(opt.output);
  ASSERT_TRUE(out.is_ok());
  std::vector<std::string> names;
  for (const auto& t : out->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"x.weight", "y.bias", "z.weight"}));
  EXPECT_EQ(stats.input_bytes, 12u + 8u + 16u);
  // No tensor under the prefix: NotFound, naming the prefix; nothing written.
  opt.output = dir + "/none.safetensors";
  opt.prefix = "vision.";
  Status st = convert_checkpoint(opt);
  EXPECT_EQ(st.code(), StatusCode::NotFound);
  EXPECT_NE(st.message().find("vision."), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(opt.output));
  // A prefix equal to a whole name would leave an empty name.
  opt.prefix = "head.steps";
  EXPECT_EQ(convert_checkpoint(opt).code(), StatusCode::InvalidArgument);
  EXPECT_FALSE(fs::exists(opt.output));
  fs::remove_all(dir);
}

TEST(Convert, OptionErrors) {
  std::string dir = temp_dir("opts");
  write_st(dir + "/in.safetensors", {{"a", DType::F32, {1}, raw(std::vector<float>{1})}});
  ConvertOptions opt;
  opt.input = dir + "/in.safetensors";
  opt.output = dir + "/in.safetensors";
  EXPECT_EQ(convert_checkpoint(opt).code(), StatusCode::InvalidArgument);  // output == input
  opt.output = dir + "/./in.safetensors";
  EXPECT_EQ(convert_checkpoint(opt).code(), StatusCode::InvalidArgument);  // same file, other spelling
  opt.output = dir + "/o.safetensors";
  opt.target = DType::F8_E4M3;
  EXPECT_EQ(convert_checkpoint(opt).code(), StatusCode::InvalidArgument);
  opt.target = DType::BF16;
  opt.input = dir + "/missing.safetensors";
  EXPECT_EQ(convert_checkpoint(opt).code(), StatusCode::NotFound);
  EXPECT_EQ(parse_convert_target("BF16").value(), DType::BF16);
  EXPECT_EQ(parse_convert_target("fp16").value(), DType::F16);
  EXPECT_EQ(parse_convert_target("float32").value(), DType::F32);
  EXPECT_FALSE(parse_convert_target("int8").is_ok());
  EXPECT_EQ(listing(dir), std::vector<std::string>{"in.safetensors"});
  fs::remove_all(dir);
}

TEST(ConvertCli, BadInputExitsTwoAndLeavesNothing) {
  std::string dir = temp_dir("cli");
  std::vector<float> v(1000, 1.0f);
  write_st(dir + "/good.safetensors", {{"a", DType::F32, {1000}, raw(v)}});
  // Truncated: the data section is shorter than the header declares.
  fs::copy_file(dir + "/good.safetensors", dir + "/trunc.safetensors");
  fs::resize_file(dir + "/trunc.safetensors", fs::file_size(dir + "/good.safetensors") - 100);
  std::ofstream(dir + "/garbage.safetensors") << "this is not a safetensors file at all";
  fs::create_directories(dir + "/out");
  std::string out;
  EXPECT_EQ(run_vlac({"convert", dir + "/trunc.safetensors", dir + "/out/o.safetensors", "--dtype", "bf16"}, &out), 2);
  EXPECT_NE(out.find("trunc.safetensors"), std::string::npos) << out;
  EXPECT_EQ(run_vlac({"convert", dir + "/garbage.safetensors", dir + "/out/o.safetensors", "--dtype", "bf16"}), 2);
  EXPECT_EQ(run_vlac({"convert", dir + "/missing.safetensors", dir + "/out/o.safetensors", "--dtype", "bf16"}), 2);
  EXPECT_EQ(run_vlac({"convert", dir + "/good.safetensors", dir + "/out/o.safetensors", "--dtype", "int3"}), 2);
  EXPECT_EQ(run_vlac({"convert", dir + "/good.safetensors", dir + "/out/o.safetensors", "--dtype", "bf16",
                      "--max-shard-size", "lots"}), 2);
  EXPECT_EQ(run_vlac({"convert", dir + "/good.safetensors", dir + "/out/o.safetensors", "--dtype", "bf16",
                      "--prefix", "nothing."}, &out), 2);
  EXPECT_NE(out.find("nothing."), std::string::npos) << out;
  EXPECT_EQ(run_vlac({"convert", dir + "/good.safetensors", dir + "/good.safetensors", "--dtype", "bf16"}), 2);
  EXPECT_EQ(run_vlac({"convert", dir + "/good.safetensors", dir + "/no/such/dir/o.safetensors", "--dtype", "bf16"}), 2);
  EXPECT_TRUE(fs::is_empty(dir + "/out")) << "something was left in the output folder";
  // And a good run prints one line with tensors, bytes and rate, and writes the report extras.
  EXPECT_EQ(run_vlac({"convert", dir + "/good.safetensors", dir + "/out/o.safetensors", "--dtype", "bf16",
                      "--report-json", dir + "/r.json"}, &out), 0);
  EXPECT_NE(out.find("converted 1 tensors"), std::string::npos) << out;
  auto report = nlohmann::json::parse(std::ifstream(dir + "/r.json"));
  EXPECT_EQ(report["input_bytes"].get<uint64_t>(), 4000u);
  EXPECT_EQ(report["output_bytes"].get<uint64_t>(), fs::file_size(dir + "/out/o.safetensors"));
  EXPECT_EQ(report["tensors"].get<uint64_t>(), 1u);
  EXPECT_TRUE(report.contains("throughput_bytes_per_second"));
  std::vector<std::string> phases;
  for (const auto& p : report["phases"]) phases.push_back(p["name"]);
  EXPECT_EQ(phases, (std::vector<std::string>{"open", "convert"}));
  fs::remove_all(dir);
}

TEST(DemoCli, WritesCompilesRuns) {
  std::string dir = temp_dir("demo");
  std::string out;
  ASSERT_EQ(run_vlac({"demo", dir + "/d", "--report-json", dir + "/r.json"}, &out), 0) << out;
  // 1. a lerobot-layout policy folder and an observation
  ASSERT_TRUE(fs::exists(dir + "/d/policy/config.json"));
  auto config = nlohmann::json::parse(std::ifstream(dir + "/d/policy/config.json"));
  EXPECT_EQ(config["type"], "pi05");
  auto fp32 = SafetensorsFile::open(dir + "/d/policy/model.safetensors");
  ASSERT_TRUE(fp32.is_ok());
  EXPECT_GT(fp32->tensors().size(), 50u);
  for (const auto& t : fp32->tensors()) EXPECT_EQ(t.dtype, DType::F32);
  EXPECT_NE(fp32->find("model.action_in_proj.weight"), nullptr);
  EXPECT_TRUE(fs::exists(dir + "/d/observation.safetensors"));
  // 2. a package with several engines, 3. actions
  EXPECT_TRUE(fs::exists(dir + "/d/policy.vlac"));
  auto actions = SafetensorsFile::open(dir + "/d/actions.safetensors");
  ASSERT_TRUE(actions.is_ok());
  const TensorInfo* a = actions->find("action_normalized");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{50, 32}));
  EXPECT_NE(out.find("memory and latency per phase"), std::string::npos) << out;
  auto report = nlohmann::json::parse(std::ifstream(dir + "/r.json"));
  std::vector<std::string> phases;
  for (const auto& p : report["phases"]) phases.push_back(p["name"]);
  EXPECT_EQ(phases, (std::vector<std::string>{"write-demo", "compile", "load", "prefix", "denoise"}));
  EXPECT_GT(report["engines"].get<int>(), 1);
  // Deterministic: the same seed gives the same policy, package and actions.
  ASSERT_EQ(run_vlac({"demo", dir + "/again", "--quiet"}), 0);
  for (const char* f : {"policy/model.safetensors", "policy.vlac", "actions.safetensors"}) {
    std::ifstream x(dir + "/d/" + f, std::ios::binary), y(dir + "/again/" + f, std::ios::binary);
    std::string bx((std::istreambuf_iterator<char>(x)), {}), by((std::istreambuf_iterator<char>(y)), {});
    EXPECT_FALSE(bx.empty());
    EXPECT_TRUE(bx == by) << f << " differs between two demos";
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace vlac
