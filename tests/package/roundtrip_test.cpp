// PackageWriter -> Package round trips: memory and file segments (a 64 MiB sparse one),
// alignment, checksums, manifest fields, determinism, sendfile fallback, writer-side errors,
// bounded memory while verifying.
#include <sys/stat.h>
#include <xxhash.h>

#include <gtest/gtest.h>

#include "mem/meter.h"
#include "package/package.h"
#include "package/package_writer.h"
#include "package_test_util.h"

namespace vlac {
namespace {

using namespace pkgtest;
using package::SegmentKind;

uint64_t file_xxh64(const std::string& path) {
  std::string s = read_file(path);
  return XXH64(s.data(), s.size(), 0);
}

struct Inputs {
  std::vector<uint8_t> e0 = pattern(100'000, 7);
  std::vector<uint8_t> stats = pattern(5'000, 8);
  std::string big_path, tok_path;
};

Inputs make_inputs(const TempDir& dir, uint64_t big = 64ull << 20) {
  Inputs in;
  in.big_path = dir.file("engine1.bin");
  in.tok_path = dir.file("tok.model");
  make_sparse(in.big_path, big);
  auto t = pattern(12'345, 9);
  write_file(in.tok_path, std::string(t.begin(), t.end()));
  return in;
}

Result<PackageWriteSummary> write_package(const std::string& out, const Inputs& in, PackageWriterOptions opt = {}) {
  PackageWriter w(out, std::move(opt));
  VLAC_RETURN_IF_ERROR(w.add_bytes("engine/0", SegmentKind::Engine, in.e0));
  VLAC_RETURN_IF_ERROR(w.add_file("engine/1", SegmentKind::Engine, in.big_path));
  VLAC_RETURN_IF_ERROR(w.add_view("stats", SegmentKind::Stats, in.stats.data(), in.stats.size()));
  VLAC_RETURN_IF_ERROR(w.add_file("tokenizer", SegmentKind::Tokenizer, in.tok_path));
  w.set_manifest(two_engine_manifest("stats", "tokenizer"));
  return w.finish();
}

TEST(PackageRoundTrip, MemoryAndFileSegments) {
  TempDir dir;
  Inputs in = make_inputs(dir);
  std::string out = dir.file("p.vlac");
  auto sum = write_package(out, in);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  EXPECT_EQ(sum->bytes_from_files, (64ull << 20) + 12'345);
  EXPECT_EQ(sum->bytes_from_memory, 105'000u);
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), sum->file_size);

  auto pkg = Package::open(out);
  ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
  EXPECT_EQ(pkg->version(), package::kFormatVersion);
  ASSERT_EQ(pkg->segments().size(), 4u);
  const char* names[] = {"engine/0", "engine/1", "stats", "tokenizer"};
  uint64_t prev_end = 0;
  for (size_t i = 0; i < 4; ++i) {
    const auto& s = pkg->segments()[i];
    EXPECT_EQ(s.name, names[i]);
    EXPECT_EQ(s.offset % package::kSegmentAlignment, 0u) << s.name;
    EXPECT_GE(s.offset, prev_end);
    EXPECT_EQ(s.offset, sum->segments[i].offset);
    EXPECT_EQ(s.checksum, sum->segments[i].checksum);
    prev_end = s.offset + s.size;
  }
  EXPECT_EQ(prev_end, pkg->file_size());
  // Bytes in place, identical to the sources.
  auto e0 = pkg->data("engine/0");
  ASSERT_TRUE(e0.is_ok());
  ASSERT_EQ(e0->size(), in.e0.size());
  EXPECT_EQ(std::memcmp(e0->data(), in.e0.data(), in.e0.size()), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(e0->data()) % package::kSegmentAlignment, 0u);
  const PackageSegment* big = pkg->find("engine/1");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->size, 64ull << 20);
  EXPECT_EQ(big->kind, SegmentKind::Engine);
  EXPECT_EQ(big->checksum, file_xxh64(in.big_path));
  auto bytes = pkg->data(*big);
  EXPECT_EQ(bytes[0], 'A');
  EXPECT_EQ(bytes[big->size - 1], static_cast<uint8_t>('A' + (big->size - 1) % 26));
  pkg->drop(*big);
  EXPECT_EQ(bytes[0], 'A');  // dropped pages come back on the next touch
  EXPECT_EQ(pkg->find("tokenizer")->checksum, file_xxh64(in.tok_path));
  EXPECT_EQ(pkg->find("stats")->kind, SegmentKind::Stats);
  EXPECT_FALSE(pkg->data("nope").is_ok());
  EXPECT_EQ(pkg->data("nope").status().code(), StatusCode::NotFound);

  Status v = pkg->verify();
  EXPECT_TRUE(v.is_ok()) << v.message();

  // Manifest fields survive.
  const PackageManifest& m = pkg->manifest();
  ASSERT_EQ(m.engines.size(), 2u);
  EXPECT_EQ(m.engines[0].name, "prefix");
  EXPECT_EQ(m.engines[1].segment, "engine/1");
  EXPECT_EQ(m.engines[0].inputs[0].shape, (std::vector<int64_t>{1, 3, 224, 224}));
  EXPECT_EQ(m.engines[0].outputs[0].dtype, DType::BF16);
  EXPECT_EQ(m.engines[1].extra["weight_bytes"], 123);
  ASSERT_EQ(m.crossing.size(), 1u);
  EXPECT_EQ(m.crossing[0].bytes, 4096u);
  EXPECT_EQ(m.crossing[0].consumers, std::vector<std::string>{"expert"});
  EXPECT_EQ(m.policy["type"], "pi05");
  EXPECT_EQ(m.normalization_segment.value_or(""), "stats");
  EXPECT_EQ(m.tokenizer_segment.value_or(""), "tokenizer");
  EXPECT_EQ(m.tokenizer["type"], "sentencepiece");
  EXPECT_EQ(m.to_json(), pkg->manifest_json());
  EXPECT_TRUE(has_package_magic(out));
  EXPECT_FALSE(has_package_magic(in.tok_path));
  // Only OUT is left in the folder (no temporaries).
  for (const auto& e : dir.entries()) EXPECT_EQ(e.find("vlac-tmp"), std::string::npos) << e;
}

TEST(PackageRoundTrip, DeterministicAndSendfileIdentical) {
  TempDir dir;
  Inputs in = make_inputs(dir, 3ull << 20);
  std::string a = dir.file("a.vlac"), b = dir.file("b.vlac"), c = dir.file("c.vlac");
  ASSERT_TRUE(write_package(a, in).is_ok());
  ASSERT_TRUE(write_package(b, in).is_ok());
  PackageWriterOptions opt;
  opt.force_sendfile = true;
  opt.window_bytes = 1 << 20;  // several windows per file segment
  auto sc = write_package(c, in, opt);
  ASSERT_TRUE(sc.is_ok()) << sc.status().message();
  EXPECT_TRUE(sc->used_sendfile);
  std::string ba = read_file(a);
  EXPECT_EQ(ba, read_file(b));
  EXPECT_EQ(ba, read_file(c));
  EXPECT_GT(ba.size(), 3ull << 20);
}

TEST(PackageRoundTrip, EmptyAndZeroSizeAndLargeAlignment) {
  TempDir dir;
  {
    PackageWriter w(dir.file("empty.vlac"));
    PackageManifest m;
    w.set_manifest(m);
    ASSERT_TRUE(w.finish().is_ok());
    auto p = Package::open(dir.file("empty.vlac"));
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_TRUE(p->segments().empty());
    EXPECT_TRUE(p->verify().is_ok());
  }
  PackageWriter w(dir.file("z.vlac"));
  ASSERT_TRUE(w.add_bytes("zero", SegmentKind::Data, {}).is_ok());
  ASSERT_TRUE(w.add_bytes("big-aligned", SegmentKind::Weights, pattern(10, 3), 2u << 20).is_ok());
  ASSERT_TRUE(w.add_bytes("zero-at-end", SegmentKind::Data, {}).is_ok());
  w.set_manifest(PackageManifest{});
  ASSERT_TRUE(w.finish().is_ok());
  auto p = Package::open(dir.file("z.vlac"));
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->find("zero")->size, 0u);
  EXPECT_EQ(p->find("big-aligned")->offset % (2u << 20), 0u);
  EXPECT_EQ(p->find("big-aligned")->alignment, 2u << 20);
  EXPECT_TRUE(p->verify().is_ok());
  EXPECT_TRUE(p->verify(*p->find("big-aligned")).is_ok());
}

TEST(PackageWriter, RejectsBadSegmentsAndLeavesNothing) {
  TempDir dir;
  std::string out = dir.file("bad.vlac");
  PackageWriter w(out);
  ASSERT_TRUE(w.add_bytes("a", SegmentKind::Engine, {1, 2}).is_ok());
  Status dup = w.add_bytes("a", SegmentKind::Engine, {3});
  EXPECT_EQ(dup.code(), StatusCode::InvalidArgument);
  EXPECT_NE(dup.message().find("duplicate"), std::string::npos) << dup.message();
  EXPECT_FALSE(w.add_bytes("has space", SegmentKind::Data, {}).is_ok());
  EXPECT_FALSE(w.add_bytes("", SegmentKind::Data, {}).is_ok());
  EXPECT_FALSE(w.add_bytes(std::string(2000, 'x'), SegmentKind::Data, {}).is_ok());
  EXPECT_FALSE(w.add_bytes("small-align", SegmentKind::Data, {}, 4096).is_ok());
  EXPECT_FALSE(w.add_bytes("odd-align", SegmentKind::Data, {}, 65536 * 3).is_ok());
  EXPECT_FALSE(w.add_bytes("kind", static_cast<SegmentKind>(99), {}).is_ok());

  // Manifest naming a segment that is not there: nothing written.
  PackageManifest m = two_engine_manifest();
  w.set_manifest(m);
  auto r = w.finish();
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("engine/0"), std::string::npos) << r.status().message();
  EXPECT_FALSE(exists(out));
  EXPECT_EQ(w.finish().status().code(), StatusCode::InvalidArgument);

  // A missing source file: NotFound naming it; nothing written.
  PackageWriter w2(out);
  ASSERT_TRUE(w2.add_file("engine/0", SegmentKind::Engine, dir.file("missing.bin")).is_ok());
  auto r2 = w2.finish();
  ASSERT_FALSE(r2.is_ok());
  EXPECT_EQ(r2.status().code(), StatusCode::NotFound);
  EXPECT_NE(r2.status().message().find("missing.bin"), std::string::npos);
  EXPECT_FALSE(exists(out));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(PackageVerify, MemoryStaysBounded) {
  TempDir dir;
  std::string src = dir.file("dense.bin");
  {
    std::ofstream f(src, std::ios::binary);
    auto chunk = pattern(1 << 20, 5);
    for (int i = 0; i < 96; ++i) f.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(chunk.size()));
  }
  std::string out = dir.file("dense.vlac");
  PackageWriter w(out);
  ASSERT_TRUE(w.add_file("w", SegmentKind::Weights, src).is_ok());
  w.set_manifest(PackageManifest{});
  ASSERT_TRUE(w.finish().is_ok());
  auto p = Package::open(out);
  ASSERT_TRUE(p.is_ok());
  uint64_t before = process_rss_bytes();
  bool peak_ok = reset_peak_rss();
  ASSERT_TRUE(p->verify().is_ok());
  uint64_t after = process_rss_bytes();
  // 96 MiB verified; pages are dropped chunk by chunk (8 MiB), so RSS does not follow the size.
  EXPECT_LT(after, before + (24ull << 20)) << "before " << before << " after " << after;
  if (peak_ok) {
    EXPECT_LT(process_peak_rss_bytes(), before + (40ull << 20));
  }
}

}  // namespace
}  // namespace vlac
