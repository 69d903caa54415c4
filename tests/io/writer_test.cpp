// SafetensorsWriter: header layout (metadata first, declaration order, contiguous offsets,
// space padding to 8), byte accounting, and atomicity. Parses the bytes itself (not the reader).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors_writer.h"

namespace vlac {
namespace {

namespace fs = std::filesystem;

std::string read_all(const std::string& path) {
  std::string out(fs::file_size(path), '\0');
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return {};
  size_t n = std::fread(out.data(), 1, out.size(), f);
  std::fclose(f);
  out.resize(n);
  return out;
}

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("vlac_writer_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

TEST(SafetensorsWriter, LayoutAndBytes) {
  std::string dir = temp_dir("layout");
  std::string path = dir + "/m.safetensors";
  std::vector<TensorSpec> specs = {{"z.w", DType::F32, {2, 3}}, {"a.b", DType::BF16, {5}}, {"i", DType::I64, {}}};
  auto w = SafetensorsWriter::create(path, specs, {{"format", "pt"}});
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  EXPECT_EQ(w->data_bytes_expected(), 24u + 10u + 8u);
  EXPECT_FALSE(fs::exists(path));  // nothing at the final path before finish()
  std::vector<uint8_t> data(42);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  // Odd splits across tensor boundaries.
  ASSERT_TRUE(w->write(data.data(), 7).is_ok());
  ASSERT_TRUE(w->write(data.data() + 7, 30).is_ok());
  ASSERT_TRUE(w->write(data.data() + 37, 5).is_ok());
  ASSERT_TRUE(w->finish().is_ok());

  std::string bytes = read_all(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(8 + n, w->header_bytes());
  ASSERT_EQ(bytes.size(), 8 + n + 42);
  std::string json = bytes.substr(8, n);
  EXPECT_EQ(json.rfind("{\"__metadata__\"", 0), 0u) << json;  // metadata first
  auto j = nlohmann::ordered_json::parse(json);
  std::vector<std::string> keys;
  for (auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "z.w", "a.b", "i"}));
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["z.w"]["dtype"], "F32");
  EXPECT_EQ(j["z.w"]["shape"], nlohmann::ordered_json({2, 3}));
  EXPECT_EQ(j["z.w"]["data_offsets"], nlohmann::ordered_json({0, 24}));
  EXPECT_EQ(j["a.b"]["data_offsets"], nlohmann::ordered_json({24, 34}));
  EXPECT_EQ(j["i"]["shape"], nlohmann::ordered_json::array());
  EXPECT_EQ(j["i"]["data_offsets"], nlohmann::ordered_json({34, 42}));
  EXPECT_EQ(bytes.substr(8 + n), std::string(data.begin(), data.end()));
  // Padding is spaces only.
  auto last = json.find_last_of('}');
  for (size_t i = last + 1; i < json.size(); ++i) EXPECT_EQ(json[i], ' ');
  fs::remove_all(dir);
}

TEST(SafetensorsWriter, NoMetadataNoKey) {
  auto h = build_safetensors_header({{"x", DType::U8, {1}}}, {});
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(h->find("__metadata__"), std::string::npos);
  EXPECT_EQ(h->size() % 8, 0u);
}

TEST(SafetensorsWriter, EmptyTensorList) {
  std::string dir = temp_dir("empty");
  auto w = SafetensorsWriter::create(dir + "/e.safetensors", {});
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE(w->finish().is_ok());
  std::string bytes = read_all(dir + "/e.safetensors");
  EXPECT_EQ(bytes.size(), w->header_bytes());
  EXPECT_EQ(bytes[8], '{');
  fs::remove_all(dir);
}

TEST(SafetensorsWriter, RejectsBadSpecs) {
  EXPECT_EQ(build_safetensors_header({{"a", DType::F32, {1}}, {"a", DType::F32, {1}}}, {}).status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(build_safetensors_header({{"a", DType::F32, {-1}}}, {}).status().code(), StatusCode::InvalidArgument);
  EXPECT_EQ(build_safetensors_header({{"", DType::F32, {1}}}, {}).status().code(), StatusCode::InvalidArgument);
  EXPECT_EQ(build_safetensors_header({{"__metadata__", DType::F32, {1}}}, {}).status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(build_safetensors_header({{"a", DType::F64, {int64_t{1} << 40, int64_t{1} << 40}}}, {}).status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(build_safetensors_header({{std::string("bad\xff"), DType::F32, {1}}}, {}).status().code(),
            StatusCode::InvalidArgument);
}

TEST(SafetensorsWriter, ShortOrLongWriteIsNotCommitted) {
  std::string dir = temp_dir("short");
  std::string path = dir + "/s.safetensors";
  {
    auto w = SafetensorsWriter::create(path, {{"a", DType::F32, {4}}});
    ASSERT_TRUE(w.is_ok());
    float v[3] = {1, 2, 3};
    ASSERT_TRUE(w->write(v, sizeof v).is_ok());
    EXPECT_FALSE(w->finish().is_ok());
    float more[2] = {4, 5};
    EXPECT_FALSE(w->write(more, sizeof more).is_ok());  // past the declared size
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir)) << "temporary left behind";
  fs::remove_all(dir);
}

TEST(SafetensorsWriter, LargeStreamedFileCrossesWritebackWindows) {
  std::string dir = temp_dir("large");
  std::string path = dir + "/l.safetensors";
  const int64_t n = (80ll << 20) / 4;  // 80 MiB: crosses several write-behind windows
  auto w = SafetensorsWriter::create(path, {{"big", DType::F32, {n}}, {"tail", DType::U8, {3}}});
  ASSERT_TRUE(w.is_ok());
  std::vector<uint32_t> buf(1 << 18);
  for (int64_t i = 0; i < n; i += static_cast<int64_t>(buf.size())) {
    for (size_t k = 0; k < buf.size(); ++k) buf[k] = static_cast<uint32_t>(i + static_cast<int64_t>(k));
    ASSERT_TRUE(w->write(buf.data(), buf.size() * 4).is_ok());
  }
  uint8_t tail[3] = {7, 8, 9};
  ASSERT_TRUE(w->write(tail, 3).is_ok());
  ASSERT_TRUE(w->finish().is_ok());
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(w->header_bytes() + 4 * 12345678));
  uint32_t v = 0;
  in.read(reinterpret_cast<char*>(&v), 4);
  EXPECT_EQ(v, 12345678u);
  EXPECT_EQ(fs::file_size(path), w->header_bytes() + static_cast<uint64_t>(n) * 4 + 3);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace vlac
