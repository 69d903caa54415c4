// safetensors reader: one crafted bad file per rule (the error names the file, the tensor where
// there is one, and is bad-input), good files (zero-size, scalars, metadata, every dtype), and a
// check that opening reads only the header (data pages of a large sparse file stay untouched).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "st_test_util.h"

namespace vlac {
namespace {

using testing::good_st;
using testing::le64;
using testing::st_bytes;
using testing::StTensor;
using testing::TempDir;
using testing::write_bytes;

// Writes `bytes` to a file, opens it, and checks the error: bad input, names the file (first),
// names the tensor if given, mentions `problem`, one line.
void expect_bad(const std::string& bytes, const std::string& problem, const std::string& tensor = "") {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  auto r = SafetensorsFile::open(path);
  ASSERT_FALSE(r.is_ok()) << "accepted a bad file; expected: " << problem;
  const Status& st = r.status();
  EXPECT_EQ(st.code(), StatusCode::InvalidFormat) << st.message();
  EXPECT_TRUE(st.is_bad_input());
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_EQ(st.message().rfind(path + ": ", 0), 0u) << st.message();
  if (!tensor.empty()) {
    EXPECT_NE(st.message().find("tensor '" + tensor + "'"), std::string::npos) << st.message();
  }
  EXPECT_NE(st.message().find(problem), std::string::npos) << "want '" << problem << "' in: " << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  // The in-memory parser says the same.
  auto h = parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
  ASSERT_FALSE(h.is_ok());
  EXPECT_EQ(h.status().message(), st.message());
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

// --- framing ---------------------------------------------------------------------------------

TEST(SafetensorsReaderBad, FileShorterThanEightBytes) {
  expect_bad("", "too short");
  expect_bad("abc", "too short");
  expect_bad(std::string(7, '\0'), "too short");
}

TEST(SafetensorsReaderBad, HeaderTooLong) {
  expect_bad(le64(kSafetensorsMaxHeaderBytes + 1) + "{}", "exceeds the limit");
  expect_bad(le64(~0ull) + "{}", "exceeds the limit");
}

TEST(SafetensorsReaderBad, HeaderBeyondFile) {
  expect_bad(le64(100) + "{}", "beyond the end of the file");
  expect_bad(le64(3) + "{}", "beyond the end of the file");
}

TEST(SafetensorsReaderBad, HeaderNotStartingWithBrace) {
  expect_bad(st_bytes(" {}"), "does not start with '{'");
  expect_bad(st_bytes("[]"), "does not start with '{'");   // a JSON array
  expect_bad(st_bytes("\"x\""), "does not start with '{'");
  expect_bad(le64(0), "does not start with '{'");
}

TEST(SafetensorsReaderBad, InvalidUtf8) {
  expect_bad(st_bytes("{\"a\xff\":1}"), "UTF-8");
  expect_bad(st_bytes("{\"\xC0\xAF\":1}"), "UTF-8");          // overlong '/'
  expect_bad(st_bytes("{\"\xED\xA0\x80\":1}"), "UTF-8");      // UTF-16 surrogate
  expect_bad(st_bytes("{\"\xF4\x90\x80\x80\":1}"), "UTF-8");  // > U+10FFFF
  expect_bad(st_bytes("{\"a\":1} \xE2\x82"), "UTF-8");        // truncated sequence at the end
}

TEST(SafetensorsReaderBad, InvalidJson) {
  expect_bad(st_bytes("{\"a\":"), "not valid JSON");
  expect_bad(st_bytes("{a:1}"), "not valid JSON");
  expect_bad(st_bytes("{\"a\":{\"dtype\":\"F32\",}}"), "not valid JSON");
  expect_bad(st_bytes("{} x"), "after the header");
  expect_bad(st_bytes("{}{}"), "after the header");
  expect_bad(st_bytes(std::string("{}\0\0", 4)), "NUL byte");
  expect_bad(st_bytes(std::string("{\"a\0\":1}", 8)), "NUL byte");
}

// --- __metadata__ ----------------------------------------------------------------------------

TEST(SafetensorsReaderBad, MetadataNotStringToString) {
  expect_bad(st_bytes("{\"__metadata__\":{\"a\":1}}"), "__metadata__: value of 'a' is not a string");
  expect_bad(st_bytes("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}"), "is not a string");
  expect_bad(st_bytes("{\"__metadata__\":{\"a\":[\"x\"]}}"), "is not a string");
  expect_bad(st_bytes("{\"__metadata__\":{\"a\":null}}"), "is not a string");
  expect_bad(st_bytes("{\"__metadata__\":[]}"), "__metadata__ is not an object");
  expect_bad(st_bytes("{\"__metadata__\":\"x\"}"), "__metadata__ is not an object");
  expect_bad(st_bytes("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}"), "duplicate key 'a'");
  expect_bad(st_bytes("{\"__metadata__\":{},\"__metadata__\":{}}"), "duplicate __metadata__");
}

// --- entries ---------------------------------------------------------------------------------

TEST(SafetensorsReaderBad, EntryNotAnObject) {
  expect_bad(st_bytes("{\"w\":5}"), "entry is not an object", "w");
  expect_bad(st_bytes("{\"w\":[]}"), "entry is not an object", "w");
}

TEST(SafetensorsReaderBad, UnknownDType) {
  expect_bad(st_bytes("{" + entry("w", "F33", "[1]", "[0,4]") + "}", std::string(4, 'x')), "unknown dtype 'F33'", "w");
  expect_bad(st_bytes("{" + entry("w", "f32", "[1]", "[0,4]") + "}", std::string(4, 'x')), "unknown dtype", "w");
  expect_bad(st_bytes("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", "xxxx"), "dtype is not a string", "w");
}

TEST(SafetensorsReaderBad, NegativeShape) {
  expect_bad(st_bytes("{" + entry("w", "F32", "[-1]", "[0,0]") + "}"), "negative dimension", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[2,-3]", "[0,0]") + "}"), "negative dimension", "w");
}

TEST(SafetensorsReaderBad, NonIntegerShape) {
  expect_bad(st_bytes("{" + entry("w", "F32", "[1.0]", "[0,4]") + "}", "xxxx"), "non-integer", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[1e0]", "[0,4]") + "}", "xxxx"), "non-integer", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[true]", "[0,4]") + "}", "xxxx"), "boolean", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[\"1\"]", "[0,4]") + "}", "xxxx"), "string", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[null]", "[0,4]") + "}", "xxxx"), "null", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[[1]]", "[0,4]") + "}", "xxxx"), "array", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "4", "[0,4]") + "}", "xxxx"), "shape is not an array", "w");
}

TEST(SafetensorsReaderBad, HugeShape) {
  // Beyond int64, beyond uint64 (parsed as a float by JSON), and a product that overflows.
  expect_bad(st_bytes("{" + entry("w", "U8", "[9223372036854775808]", "[0,0]") + "}"), "too large", "w");
  expect_bad(st_bytes("{" + entry("w", "U8", "[18446744073709551616]", "[0,0]") + "}"), "non-integer", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[4294967296,4294967296,16]", "[0,0]") + "}"), "overflows", "w");
  expect_bad(st_bytes("{" + entry("w", "F64", "[2305843009213693952]", "[0,0]") + "}"), "overflows", "w");
}

TEST(SafetensorsReaderBad, Offsets) {
  expect_bad(st_bytes("{" + entry("w", "F32", "[1]", "[0,4,8]") + "}", "xxxx"), "more than two", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[1]", "[4]") + "}", "xxxx"), "exactly two values, has 1", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[1]", "[]") + "}", "xxxx"), "exactly two values, has 0", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[1]", "[\"0\",\"4\"]") + "}", "xxxx"), "data_offsets has a value", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[1]", "[0,4.0]") + "}", "xxxx"), "non-integer", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[1]", "[-4,0]") + "}", "xxxx"), "negative value", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[1]", "[8,4]") + "}", "xxxxxxxx"), "begin 8 > end 4", "w");
  expect_bad(st_bytes("{" + entry("w", "F32", "[1]", "{}") + "}", "xxxx"), "data_offsets is not an array", "w");
}

TEST(SafetensorsReaderBad, SpanSizeMismatch) {
  expect_bad(st_bytes("{" + entry("w", "F32", "[2,3]", "[0,20]") + "}", std::string(20, 'x')),
             "is 24 bytes, but data_offsets [0, 20) span 20", "w");
  expect_bad(st_bytes("{" + entry("w", "BF16", "[]", "[0,4]") + "}", "xxxx"), "is 2 bytes", "w");
}

TEST(SafetensorsReaderBad, OutOfBounds) {
  expect_bad(st_bytes("{" + entry("w", "F32", "[2]", "[0,8]") + "}", "xxxx"), "beyond the data section (4 bytes)", "w");
  expect_bad(st_bytes("{" + entry("w", "U8", "[1]", "[18446744073709551614,18446744073709551615]") + "}", "x"),
             "beyond the data section", "w");
}

TEST(SafetensorsReaderBad, Overlap) {
  std::string h = "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}";
  expect_bad(st_bytes(h, std::string(12, 'x')), "overlap tensor 'a'", "b");
  // A zero-size tensor inside another one overlaps too.
  h = "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("z", "F32", "[0]", "[4,4]") + "}";
  expect_bad(st_bytes(h, std::string(8, 'x')), "overlap", "z");
  // The same span twice.
  h = "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[0,4]") + "}";
  expect_bad(st_bytes(h, std::string(4, 'x')), "overlap", "b");
}

TEST(SafetensorsReaderBad, Gap) {
  std::string h = "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}";
  expect_bad(st_bytes(h, std::string(12, 'x')), "gap of 4 unused bytes", "b");
  h = "{" + entry("a", "F32", "[1]", "[4,8]") + "}";
  expect_bad(st_bytes(h, std::string(8, 'x')), "gap of 4", "a");
}

TEST(SafetensorsReaderBad, TrailingBytes) {
  expect_bad(st_bytes("{" + entry("a", "F32", "[1]", "[0,4]") + "}", std::string(8, 'x')), "4 trailing bytes");
  expect_bad(st_bytes("{}", "x"), "1 trailing bytes");
}

TEST(SafetensorsReaderBad, DuplicateNames) {
  std::string h = "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("a", "F32", "[1]", "[4,8]") + "}";
  expect_bad(st_bytes(h, std::string(8, 'x')), "duplicate tensor name", "a");
}

TEST(SafetensorsReaderBad, EntryKeys) {
  expect_bad(st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"foo\":1}}", "xxxx"),
             "unknown key 'foo'", "w");
  expect_bad(st_bytes("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "xxxx"),
             "duplicate key 'dtype'", "w");
  expect_bad(st_bytes("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", "xxxx"), "missing 'shape'", "w");
  expect_bad(st_bytes("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "xxxx"), "missing 'dtype'", "w");
  expect_bad(st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", "xxxx"), "missing 'data_offsets'", "w");
  expect_bad(st_bytes("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "xxxx"), "empty tensor name");
}

TEST(SafetensorsReaderBad, HostileNameStaysOneLine) {
  // A name with an escaped newline and control byte: the message must stay one line.
  // Appended, not `"{" + entry(...)`: GCC 12's -Wrestrict misfires on that (GCC PR 105651).
  const std::string header = std::string("{").append(entry("a\\nb\\u0001", "F99", "[1]", "[0,4]")).append("}");
  expect_bad(st_bytes(header, "xxxx"), "tensor 'a\\x0Ab\\x01'");
}

// --- good files -------------------------------------------------------------------------------

Result<SafetensorsFile> open_bytes(const TempDir& dir, const std::string& bytes, const std::string& name = "ok.safetensors") {
  write_bytes(dir.file(name), bytes);
  return SafetensorsFile::open(dir.file(name));
}

TEST(SafetensorsReaderGood, EmptyHeader) {
  TempDir dir;
  auto f = open_bytes(dir, st_bytes("{}"));
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->data_offset(), 10u);
  auto g = open_bytes(dir, st_bytes("{\"__metadata__\":{}}     "), "b.safetensors");
  ASSERT_TRUE(g.is_ok()) << g.status().message();
}

TEST(SafetensorsReaderGood, TensorsMetadataAndData) {
  TempDir dir;
  std::string bytes = good_st({{"b.weight", "F32", {2, 3}, 4}, {"a.bias", "BF16", {3}, 2}, {"s", "I64", {}, 8}},
                              "{\"format\":\"pt\",\"note\":\"h\\u00e9\"}");
  auto f = open_bytes(dir, bytes);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "h\xC3\xA9");
  const TensorInfo* w = f->find("b.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::F32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->numel(), 6u);
  EXPECT_EQ(w->nbytes(), 24u);
  EXPECT_EQ(w->data_begin, 0u);
  const TensorInfo* s = f->find("s");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1u);
  EXPECT_EQ(s->data_begin, 30u);
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_EQ(f->find("b.weigh"), nullptr);
  // data() points at the right bytes in the file.
  const uint8_t* p = f->data(*f->find("a.bias"));
  EXPECT_EQ(p - f->map().data(), static_cast<ptrdiff_t>(f->data_offset() + 24));
  EXPECT_EQ(p[0], static_cast<uint8_t>(24 * 31 + 7));
  // Sorted by data_begin.
  for (size_t i = 1; i < f->tensors().size(); ++i)
    EXPECT_LE(f->tensors()[i - 1].data_begin, f->tensors()[i].data_begin);
  f->drop(*w);  // harmless, and the data reads the same afterwards
  EXPECT_EQ(f->data(*w)[1], static_cast<uint8_t>(1 * 31 + 7));
}

TEST(SafetensorsReaderGood, JsonOrderDoesNotMatter) {
  TempDir dir;
  std::string h = "{" + entry("second", "U8", "[4]", "[4,8]") + "," + entry("first", "U8", "[4]", "[0,4]") + "}";
  auto f = open_bytes(dir, st_bytes(h, "abcdefgh"));
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->tensors()[0].name, "first");
  EXPECT_EQ(f->tensors()[1].name, "second");
  EXPECT_EQ(f->data(*f->find("second"))[0], 'e');
}

TEST(SafetensorsReaderGood, ZeroSizeTensors) {
  TempDir dir;
  std::string h = "{" + entry("z0", "F32", "[0]", "[0,0]") + "," + entry("a", "F32", "[1]", "[0,4]") + "," +
                  entry("z1", "F16", "[3,0,2]", "[4,4]") + "," + entry("b", "U8", "[2]", "[4,6]") + "," +
                  entry("z2", "I64", "[0,5]", "[6,6]") + "}";
  auto f = open_bytes(dir, st_bytes(h, "xxxxyy"));
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->find("z1")->nbytes(), 0u);
  EXPECT_EQ(f->find("z1")->numel(), 0u);
  // A file of only zero-size tensors and no data.
  auto g = open_bytes(dir, st_bytes("{" + entry("z", "BF16", "[0]", "[0,0]") + "}"), "z.safetensors");
  ASSERT_TRUE(g.is_ok()) << g.status().message();
}

TEST(SafetensorsReaderGood, EveryDType) {
  const std::vector<std::pair<std::string, uint32_t>> kAll = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},  {"BOOL", 1}};
  std::vector<StTensor> ts;
  for (const auto& [name, size] : kAll) ts.push_back({"t_" + name, name, {3, 2}, size});
  TempDir dir;
  auto f = open_bytes(dir, good_st(ts));
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), kAll.size());
  for (const auto& [name, size] : kAll) {
    const TensorInfo* t = f->find("t_" + name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_STREQ(dtype_name(t->dtype), name.c_str());
    EXPECT_EQ(t->nbytes(), 6u * size) << name;
  }
}

TEST(SafetensorsReaderGood, ReadsWhatTheWriterWrites) {
  TempDir dir;
  std::string path = dir.file("w.safetensors");
  std::vector<TensorSpec> specs = {{"x", DType::F32, {2, 2}}, {"y", DType::U8, {3}}, {"e", DType::BF16, {0}}};
  auto w = SafetensorsWriter::create(path, specs, {{"format", "pt"}});
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  std::string data(19, 'q');
  ASSERT_TRUE(w->write(data.data(), data.size()).is_ok());
  ASSERT_TRUE(w->finish().is_ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->find("y")->nbytes(), 3u);
}

TEST(SafetensorsReader, NotFoundAndFolder) {
  TempDir dir;
  auto r = SafetensorsFile::open(dir.file("missing.safetensors"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::NotFound);
  EXPECT_NE(r.status().message().find("missing.safetensors"), std::string::npos);
  auto d = SafetensorsFile::open(dir.path());
  ASSERT_FALSE(d.is_ok());
  EXPECT_TRUE(d.status().is_bad_input());
}

// Opening validates the header only: the data pages of a large sparse file are never read.
TEST(SafetensorsReader, OpenTouchesOnlyTheHeader) {
  TempDir dir;
  const uint64_t kData = 256ull << 20;
  std::string h = "{" + entry("big", "U8", "[" + std::to_string(kData) + "]", "[0," + std::to_string(kData) + "]") + "}";
  while ((8 + h.size()) % 8) h += ' ';
  std::string path = dir.file("big.safetensors");
  write_bytes(path, le64(h.size()) + h);
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(8 + h.size() + kData)), 0);
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t skip = 8ull << 20;  // generous room for kernel readahead around the header
  std::vector<unsigned char> vec((f->file_size() - skip + page - 1) / page);
  ASSERT_EQ(mincore(const_cast<uint8_t*>(f->map().data()) + skip, f->file_size() - skip, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  EXPECT_EQ(resident, 0u) << "pages of tensor data were read while opening";
}

}  // namespace
}  // namespace vlac
