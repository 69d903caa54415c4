// The strict reader against hostile bytes: flipped bytes (segment, header, table, manifest),
// truncation at many offsets, lying offsets/sizes, duplicate names, wrong magic/version,
// bad manifests. Each is rejected with a one-line error naming the file; none crashes.
#include <gtest/gtest.h>

#include "package/package.h"
#include "package_test_util.h"

namespace vlac {
namespace {

using namespace pkgtest;
using package::Header;
using package::Record;

const std::string kPath = "/pkg/x.vlac";

Result<PackageLayout> parse(const std::string& b) {
  return parse_package(reinterpret_cast<const uint8_t*>(b.data()), b.size(), kPath);
}

/// Parses and expects a bad-input error whose message names the file and contains `want`.
void expect_bad(const std::string& bytes, const std::string& want, const char* label) {
  auto r = parse(bytes);
  ASSERT_FALSE(r.is_ok()) << label;
  EXPECT_TRUE(r.status().is_bad_input()) << label << ": " << r.status().message();
  const std::string& m = r.status().message();
  EXPECT_EQ(m.rfind(kPath + ": ", 0), 0u) << label << ": " << m;
  EXPECT_NE(m.find(want), std::string::npos) << label << ": '" << m << "' lacks '" << want << "'";
  EXPECT_EQ(m.find('\n'), std::string::npos) << label;
}

std::string with_lie(const std::function<void(Header&, std::vector<Record>&, std::string&)>& lie) {
  RawPackage p = raw_good();
  p.lie = lie;
  return p.encode();
}

TEST(PackageCorruption, RawGoodIsValid) {
  std::string b = raw_good().encode();
  auto r = parse(b);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->segments.size(), 2u);
  Status v = verify_package_segments(reinterpret_cast<const uint8_t*>(b.data()), b.size(), *r, kPath, 4096, {});
  EXPECT_TRUE(v.is_ok()) << v.message();
}

TEST(PackageCorruption, FlippedSegmentByteFailsVerifyNamingTheSegment) {
  TempDir dir;
  RawPackage p = raw_good();
  std::string b = p.encode();
  auto lay = parse(b);
  ASSERT_TRUE(lay.is_ok());
  const auto& seg = lay->segments[1];
  b[seg.offset + seg.size / 2] ^= 0x10;
  std::string path = dir.file("flip.vlac");
  write_file(path, b);
  auto pkg = Package::open(path);  // open checks the layout only
  ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
  Status v = pkg->verify();
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.code(), StatusCode::InvalidFormat);
  EXPECT_NE(v.message().find(path + ": segment 'engine/1': checksum mismatch"), std::string::npos) << v.message();
  EXPECT_TRUE(pkg->verify(pkg->segments()[0]).is_ok());
  EXPECT_FALSE(pkg->verify(pkg->segments()[1]).is_ok());

  // A non-zero byte in the padding between segments is found too.
  std::string c = p.encode();
  c[lay->segments[0].offset + lay->segments[0].size + 5] = 1;
  auto lc = parse(c);
  ASSERT_TRUE(lc.is_ok());
  Status vc = verify_package_segments(reinterpret_cast<const uint8_t*>(c.data()), c.size(), *lc, kPath, 4096, {});
  EXPECT_NE(vc.message().find("segment 'engine/1': padding"), std::string::npos) << vc.message();
}

TEST(PackageCorruption, EveryFlippedHeaderTableOrManifestByteIsRejected) {
  std::string good = raw_good().encode();
  auto lay = parse(good);
  ASSERT_TRUE(lay.is_ok());
  for (uint64_t i = 0; i < lay->manifest_end; ++i) {
    std::string b = good;
    b[i] ^= 0x01;
    auto r = parse(b);
    EXPECT_FALSE(r.is_ok()) << "flip at " << i;
    if (!r.is_ok()) {
      EXPECT_TRUE(r.status().is_bad_input()) << i;
      EXPECT_EQ(r.status().message().rfind(kPath + ": ", 0), 0u) << r.status().message();
    }
  }
}

TEST(PackageCorruption, TruncatedAtManyOffsets) {
  std::string good = raw_good().encode();
  for (uint64_t n = 0; n < good.size(); n += (n < 4096 ? 1 : 331)) {
    std::string b = good.substr(0, n);
    auto r = parse(b);
    ASSERT_FALSE(r.is_ok()) << "truncated to " << n;
    EXPECT_TRUE(r.status().is_bad_input()) << n;
    if (n >= package::kHeaderSize) {
      EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
    }
  }
  expect_bad(good.substr(0, 100), "truncated", "short header");
  expect_bad(good + "xyz", "unexpected bytes", "trailing bytes");
  TempDir dir;
  write_file(dir.file("t.vlac"), good.substr(0, good.size() - 1));
  auto p = Package::open(dir.file("t.vlac"));
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("t.vlac: truncated"), std::string::npos) << p.status().message();
  write_file(dir.file("empty.vlac"), "");
  EXPECT_EQ(Package::open(dir.file("empty.vlac")).status().code(), StatusCode::InvalidFormat);
}

TEST(PackageCorruption, WrongMagicAndVersion) {
  std::string good = raw_good().encode();
  std::string b = good;
  b[0] = 'X';
  expect_bad(b, "not a vlac package", "magic");
  expect_bad(std::string("GGUF\x03\0\0\0 and more bytes", 23), "not a vlac package", "other format");
  for (uint32_t v : {0u, 2u, 7u}) {
    std::string s = with_lie([v](Header& h, std::vector<Record>&, std::string&) { h.version = v; });
    auto r = parse(s);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::Unsupported);
    EXPECT_NE(r.status().message().find(v > 1 ? "is newer than this vlac reads (1)" : "is older than this vlac reads (1)"),
              std::string::npos)
        << r.status().message();
  }
  RawPackage p = raw_good();
  p.lie = [](Header& h, std::vector<Record>&, std::string&) { h.header_checksum = 42; };
  p.keep_header_checksum = true;
  expect_bad(p.encode(), "header checksum mismatch", "header checksum");
}

TEST(PackageCorruption, LyingHeaderFields) {
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.flags = 4; }), "unknown header flags", "flags");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.header_size = 256; }), "header size", "header size");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.file_size += 1; }), "truncated", "file size up");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.file_size -= 1; }), "unexpected bytes", "file size down");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.segment_alignment = 4096; }), "segment alignment", "alignment");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.table_offset = 0; }), "segment table at offset", "table off");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.segment_count = 1ull << 40; }), "more than the limit", "count");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.segment_count = 5; }), "cannot hold", "count vs size");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.table_size = ~0ull - 64; }), "extends past the end", "table size");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.manifest_offset += 8; }), "manifest at offset", "manifest off");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.manifest_size = ~0ull; }), "manifest size", "manifest size");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.manifest_size = 1ull << 25; }), "extends past the end",
             "manifest past end");
  expect_bad(with_lie([](Header& h, auto&, auto&) { h.manifest_checksum ^= 1; }), "manifest checksum", "msum");
  RawPackage t = raw_good();
  t.lie = [](Header&, std::vector<Record>& r, std::string&) { r[0].checksum ^= 1; };  // table bytes change
  t.keep_table_checksum = true;  // ... but the stored table checksum stays (zero: never computed)
  expect_bad(t.encode(), "segment table checksum", "tsum");
}

TEST(PackageCorruption, LyingRecords) {
  using Recs = std::vector<Record>;
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[1].offset = r[0].offset; }), "overlaps segment 'engine/0'",
             "overlap");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[0].offset = 0; }), "overlaps the manifest", "overlap manifest");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[1].offset += 65536; }), "extend past the end", "out of bounds");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[1].size += 1; }), "extend past the end", "size past end");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[1].size = ~0ull - 10; }), "overflows", "overflow");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[0].offset += 1; }), "not a multiple of its alignment",
             "misaligned");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[1].size -= 1; }), "bytes after the end of segment 'engine/1'",
             "short size leaves tail");
  expect_bad(with_lie([](Header& h, Recs& r, auto&) {
               r[1].offset += 65536;
               h.file_size += 65536;
             }),
             "", "gap (file longer than bytes written)");
  // Equal-size file but a gap: move segment 1 later while its bytes stay: truncated/out-of-bounds or gap.
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[0].alignment = 1u << 20; }), "not a multiple", "alignment lie");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[0].alignment = 3 << 16; }), "power of two", "alignment npot");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[0].kind = 77; }), "unknown kind 77", "kind");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[0].reserved = 1; }), "reserved record bytes", "reserved");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[1].name_offset = 0; }), "name offset", "name offset");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[1].name_size = 0; }), "name size 0", "name size");
  expect_bad(with_lie([](Header&, Recs& r, auto&) { r[1].name_size = 100; }), "name runs past", "name size big");
  expect_bad(with_lie([](Header&, Recs&, std::string& names) { names[3] = ' '; }), "printable ASCII", "name bytes");
  expect_bad(with_lie([](Header&, Recs&, std::string& names) { names.replace(8, 8, "engine/0"); }),
             "segment 'engine/0': duplicate segment name", "duplicate");
}

TEST(PackageCorruption, GapBetweenSegmentsIsRejected) {
  RawPackage p = raw_good();
  p.segments[0].alignment = 1u << 20;  // the honest layout puts segment 0 at 1 MiB
  std::string b = p.encode();
  ASSERT_TRUE(parse(b).is_ok());
  // Claim segment 1 starts one alignment unit later than the next aligned place (bytes moved too).
  auto lay = parse(b);
  const auto& s1 = lay->segments[1];
  std::string moved = b.substr(0, s1.offset) + std::string(65536, '\0') + b.substr(s1.offset);
  RawPackage q = p;
  q.lie = [](Header& h, std::vector<Record>& r, std::string&) {
    r[1].offset += 65536;
    h.file_size += 65536;
  };
  std::string lied = q.encode();
  // Header/table from `lied`, bytes as moved.
  std::string fin = lied.substr(0, lay->manifest_end) + moved.substr(lay->manifest_end);
  expect_bad(fin, "leaves a gap", "gap");
}

TEST(PackageCorruption, BadManifests) {
  auto with_manifest = [](const std::string& m) {
    RawPackage p = raw_good();
    p.manifest = m;
    return p.encode();
  };
  nlohmann::json good = two_engine_manifest().to_json();
  expect_bad(with_manifest("{\"engines\": ["), "not valid JSON", "syntax");
  expect_bad(with_manifest(std::string("{\"a\":\"b\0\"}", 10)), "NUL byte", "nul");
  expect_bad(with_manifest("[1,2]"), "must be a JSON object", "array");
  expect_bad(with_manifest("{\"engines\":[],\"engines\":[]}"), "duplicate key \"engines\"", "dup key");
  expect_bad(with_manifest("{\"x\":\"\xff\xfe\"}"), "not valid JSON", "utf8");
  expect_bad(with_manifest(std::string(200, '[') + std::string(200, ']')), "nested deeper", "depth");
  auto without = [&](const char* key) {
    nlohmann::json j = good;
    j.erase(key);
    return with_manifest(j.dump());
  };
  for (const char* k : {"engines", "crossing", "policy", "metadata", "normalization", "tokenizer"})
    expect_bad(without(k), k, k);
  auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = good;
    f(j);
    return with_manifest(j.dump());
  };
  expect_bad(edit([](auto& j) { j["engines"][0]["segment"] = "nope"; }), "segment 'nope' is not in the package",
             "missing segment");
  expect_bad(edit([](auto& j) { j["engines"][1]["name"] = "prefix"; }), "duplicate engine name", "dup engine");
  expect_bad(edit([](auto& j) { j["engines"][0]["inputs"][0]["dtype"] = "F33"; }), "unknown dtype", "dtype");
  expect_bad(edit([](auto& j) { j["engines"][0]["inputs"][0]["shape"][0] = -1; }), "negative dimension", "shape");
  expect_bad(edit([](auto& j) { j["engines"][0]["inputs"][0]["shape"][0] = "1"; }), "must be an integer", "shape t");
  expect_bad(edit([](auto& j) {
               j["engines"][0]["inputs"][0]["shape"] = {1ll << 40, 1ll << 40};
             }),
             "overflows", "shape overflow");
  expect_bad(edit([](auto& j) { j["crossing"][0]["bytes"] = 7; }), "bytes 7 != shape x dtype size 4096", "bytes");
  expect_bad(edit([](auto& j) { j["crossing"][0]["producer"] = "ghost"; }), "producer 'ghost'", "producer");
  expect_bad(edit([](auto& j) { j["crossing"][0]["consumers"] = {"ghost"}; }), "consumer 'ghost'", "consumer");
  expect_bad(edit([](auto& j) { j["tokenizer"] = {{"segment", "engine/0"}}; }), "is of kind engine, expected tokenizer",
             "kind ref");
  expect_bad(edit([](auto& j) { j["policy"] = 3; }), "policy: must be an object", "policy");
}

}  // namespace
}  // namespace vlac
