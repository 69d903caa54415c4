// Pickle reader: every protocol, memo sharing, hand-built opcodes, hostile input (truncation at
// every offset, code-execution payloads, deep nesting, cycles, limits) -> values or errors, never a crash.
// The pickles here are built as `"opcode" + le(...) + ...` throughout; GCC 12's -Wrestrict
// misfires on `"literal" + std::string&&` (GCC PR 105651), so it is off for this file alone.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "diag/pickle_reader.h"

using namespace std::string_literals;

namespace vlac {
namespace {

std::vector<uint8_t> read_file(const std::string& rel) {
  std::ifstream f(std::string(VLAC_SOURCE_DIR) + "/" + rel, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

Result<PickleDoc> parse(const std::string& s, const PickleLimits& lim = {}) {
  std::vector<uint8_t> b = bytes(s);
  return read_pickle(b, lim);
}

std::string le(uint64_t v, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return out;
}
std::string short_str(const std::string& s) { return "\x8c" + std::string(1, static_cast<char>(s.size())) + s; }

// --- every protocol: the same value, written by CPython's pickle (make_pickles.py) ---

class Protocols : public ::testing::TestWithParam<int> {};

TEST_P(Protocols, DecodesTheReferenceValue) {
  auto data = read_file("tests/fixtures/snapshots/pickles/proto" + std::to_string(GetParam()) + ".pickle");
  ASSERT_FALSE(data.empty());
  auto r = read_pickle(data);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const PickleDoc& d = r.value();
  PickleId root = d.root();
  ASSERT_EQ(d.kind(root), PickleKind::Dict);

  auto ints = d.items(*d.get(root, "ints"));
  std::vector<int64_t> want = {0, 1, -1, 255, 256, 65535, 65536, INT32_MIN, INT32_MAX, 1ll << 40, INT64_MAX, INT64_MIN};
  ASSERT_EQ(ints.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(d.as_int(ints[i]), want[i]) << "ints[" << i << "]";

  PickleId big = *d.get(root, "big");  // 2**70 does not fit int64: approximate float
  EXPECT_EQ(d.kind(big), PickleKind::Float);
  EXPECT_TRUE(d.lossy(big));
  EXPECT_NEAR(*d.as_number(big), 1180591620717411303424.0, 1e7);

  EXPECT_EQ(d.as_number(*d.get(root, "float")), 1.5);
  auto bools = d.items(*d.get(root, "bools"));
  ASSERT_EQ(bools.size(), 3u);
  EXPECT_EQ(d.as_bool(bools[0]), true);
  EXPECT_EQ(d.as_bool(bools[1]), false);
  EXPECT_EQ(d.kind(bools[2]), PickleKind::None);
  EXPECT_EQ(*d.as_str(*d.get(root, "text")), "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c");

  PickleId b = *d.get(root, "bytes");
  ASSERT_EQ(d.kind(b), PickleKind::Bytes) << d.repr(b);
  EXPECT_EQ(*d.as_text(b), std::string("\x00\x01\xff", 3));
  PickleId ba = *d.get(root, "bytearray");
  ASSERT_EQ(d.kind(ba), PickleKind::Bytes) << d.repr(ba);
  EXPECT_EQ(*d.as_text(ba), "ab");

  auto tuples = d.items(*d.get(root, "tuples"));
  ASSERT_EQ(tuples.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(d.kind(tuples[i]), PickleKind::Tuple);
    EXPECT_EQ(d.items(tuples[i]).size(), i);
  }
  PickleId set = *d.get(root, "set");
  EXPECT_EQ(d.kind(set), PickleKind::Set) << d.repr(set);
  ASSERT_EQ(d.items(set).size(), 1u);
  EXPECT_EQ(d.as_int(d.items(set)[0]), 3);
  EXPECT_EQ(d.kind(*d.get(root, "frozen")), PickleKind::Set);

  PickleId od = *d.get(root, "ordered");  // collections.OrderedDict becomes a plain dict
  ASSERT_EQ(d.kind(od), PickleKind::Dict) << d.repr(od);
  EXPECT_EQ(d.as_int(*d.get(od, "x")), 1);

  // Memo: the list referenced twice is ONE value, as in Python.
  EXPECT_EQ(*d.get(root, "shared_a"), *d.get(root, "shared_b"));

  PickleId nested = *d.get(root, "nested");
  PickleId k0 = d.items(*d.get(nested, "k"))[0];
  EXPECT_EQ(d.repr(*d.get(k0, "deep"), 5), "[1, [2, [3]]]");
}

INSTANTIATE_TEST_SUITE_P(AllProtocols, Protocols, ::testing::Range(0, 6));

// --- hand-built opcodes ---

TEST(PickleReader, TextOpcodesOfProtocolZero) {
  // (lp0\nI12\naL-5L\naF2.25\naS'ab'\naVx\\u00e9\nag0\na(I1\nI2\ntp1\na(dp2\nS'k'\nI01\nsa.
  std::string p = "(lp0\nI12\naL-5L\naF2.25\naS'ab'\naVx\\u00e9\nag0\na(I1\nI2\ntp1\na(dS'k'\nI01\nsa.";
  auto r = parse(p);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const PickleDoc& d = r.value();
  auto it = d.items(d.root());
  ASSERT_EQ(it.size(), 8u) << d.repr(d.root());
  EXPECT_EQ(d.as_int(it[0]), 12);
  EXPECT_EQ(d.as_int(it[1]), -5);
  EXPECT_EQ(d.as_number(it[2]), 2.25);
  EXPECT_EQ(*d.as_text(it[3]), "ab");
  EXPECT_EQ(*d.as_str(it[4]), "x\xc3\xa9");
  EXPECT_EQ(it[5], d.root());  // g0: the list itself (a cycle)
  EXPECT_EQ(d.items(it[6]).size(), 2u);
  EXPECT_EQ(d.as_bool(*d.get(it[7], "k")), true);
  // repr of a cyclic value stays bounded
  EXPECT_LT(d.repr(d.root(), 4, 10).size(), 4000u);
}

TEST(PickleReader, BinaryOpcodesOfProtocolsTwoToFive) {
  std::string p = "\x80\x05\x95" + le(10, 8);  // PROTO 5, FRAME (length checked, then ignored)
  p += "]\x94(";                              // EMPTY_LIST, MEMOIZE(0), MARK
  p += "\x8a\x09"s + le(0xFFFFFFFFFFFFFFFFull, 8) + "\x00"s;  // LONG1 2**64-1
  p += "\x8a\x00"s;                            // LONG1 0 bytes = 0
  p += "\x8a\x01\xff";                        // LONG1 -1
  p += "\x8b" + le(2, 4) + "\x00\x80"s;        // LONG4 -32768
  p += "\x8d" + le(2, 8) + "hi";              // BINUNICODE8
  p += "\x8e" + le(1, 8) + "z";               // BINBYTES8
  p += "\x96" + le(1, 8) + "y";               // BYTEARRAY8
  p += "\x98";                                // READONLY_BUFFER (no-op)
  p += "\x8f(K\x01K\x02\x90";                 // EMPTY_SET, MARK, 1, 2, ADDITEMS
  p += "(K\x03\x91";                          // FROZENSET {3}
  p += "h\x00"s;                               // BINGET 0 -> the list
  p += "2" "0";                               // DUP, POP
  p += "(K\x09" "1";                          // MARK, 9, POP_MARK
  p += "e.";                                  // APPENDS, STOP
  auto r = parse(p);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const PickleDoc& d = r.value();
  auto it = d.items(d.root());
  ASSERT_EQ(it.size(), 10u) << d.repr(d.root(), 2, 20);
  EXPECT_EQ(d.kind(it[0]), PickleKind::Float);
  EXPECT_TRUE(d.lossy(it[0]));
  EXPECT_EQ(d.as_int(it[1]), 0);
  EXPECT_EQ(d.as_int(it[2]), -1);
  EXPECT_EQ(d.as_int(it[3]), -32768);
  EXPECT_EQ(*d.as_str(it[4]), "hi");
  EXPECT_EQ(*d.as_text(it[5]), "z");
  EXPECT_EQ(*d.as_text(it[6]), "y");
  EXPECT_EQ(d.items(it[7]).size(), 2u);
  EXPECT_EQ(d.kind(it[8]), PickleKind::Set);
  EXPECT_EQ(it[9], d.root());
}

TEST(PickleReader, MemoVariantsShareOneValue) {
  // EMPTY_DICT BINPUT 1, LONG_BINPUT 70000 (same dict), MEMOIZE, then a list of three GETs.
  std::string p = "\x80\x04}q\x01r" + le(70000, 4) + "\x94" + "0" + "(h\x01j" + le(70000, 4) + "g1\nt.";
  auto r = parse(p);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  auto it = r->items(r->root());
  ASSERT_EQ(it.size(), 3u);
  EXPECT_EQ(it[0], it[1]);
  EXPECT_EQ(it[1], it[2]);
}

// --- hostile input ---

TEST(PickleReader, CodeExecutionBecomesInertObjects) {
  const std::string marker = ::testing::TempDir() + "vlac-pickle-pwned";
  std::remove(marker.c_str());
  // Protocol 0: cos\nsystem\n(S'touch MARKER'\ntR.
  std::string p0 = "cos\nsystem\n(S'touch " + marker + "'\ntR.";
  // Protocol 4: STACK_GLOBAL + REDUCE, then BUILD with a state, NEWOBJ, INST, OBJ, PERSID, EXT1.
  std::string p4 = "\x80\x04(" + short_str("os") + short_str("system") + "\x93" + short_str("touch " + marker) +
                   "\x85R" + "}b" +                                        // REDUCE, BUILD({})
                   "cbuiltins\neval\n" + short_str("1+1") + "\x85\x81" +   // NEWOBJ
                   "(K\x01isubprocess\nPopen\n" +                          // INST
                   "(csubprocess\ncall\nK\x02o" +                          // OBJ
                   "Ppid-1\n" + "\x82\x07" +                               // PERSID, EXT1
                   "l.";
  for (const std::string& p : {p0, p4}) {
    auto r = parse(p);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    const PickleDoc& d = r.value();
    EXPECT_GT(d.n_opaque(), 0u);
    struct stat st;
    EXPECT_NE(stat(marker.c_str(), &st), 0) << "the payload ran";
  }
  auto r0 = parse(p0);
  EXPECT_EQ(r0->kind(r0->root()), PickleKind::Object);
  EXPECT_EQ(*r0->as_text(r0->root()), "os.system");
  EXPECT_EQ(r0->repr(r0->root()), "<object os.system ('touch " + marker + "'), None>");

  auto r4 = parse(p4);
  auto it = r4->items(r4->root());
  ASSERT_EQ(it.size(), 6u) << r4->repr(r4->root());
  EXPECT_EQ(*r4->as_text(it[0]), "os.system");
  EXPECT_EQ(r4->kind(r4->items(it[0])[1]), PickleKind::Dict);  // BUILD state kept as data
  EXPECT_EQ(*r4->as_text(it[1]), "builtins.eval");
  EXPECT_EQ(*r4->as_text(it[2]), "subprocess.Popen");
  EXPECT_EQ(*r4->as_text(it[3]), "subprocess.call");
  EXPECT_EQ(*r4->as_text(it[4]), "pickle.persistent_load");
  EXPECT_EQ(*r4->as_text(it[5]), "copyreg.extension_7");
}

TEST(PickleReader, TruncationAtEveryOffsetIsAnError) {
  std::vector<std::string> files = {"tests/fixtures/snapshots/noprofile.pickle"};
  for (int p = 0; p < 6; ++p) files.push_back("tests/fixtures/snapshots/pickles/proto" + std::to_string(p) + ".pickle");
  for (const std::string& f : files) {
    auto data = read_file(f);
    ASSERT_FALSE(data.empty()) << f;
    ASSERT_TRUE(read_pickle(data).is_ok()) << f;
    for (size_t n = 0; n < data.size(); ++n) {
      auto r = read_pickle(std::span<const uint8_t>(data.data(), n));
      ASSERT_FALSE(r.is_ok()) << f << " cut at " << n;
      EXPECT_EQ(r.status().code(), StatusCode::InvalidFormat);
      EXPECT_NE(r.status().message().find("offset"), std::string::npos) << r.status().message();
    }
  }
}

TEST(PickleReader, TruncatedRealSnapshotNamesOffsetAndOpcode) {
  auto data = read_file("tests/fixtures/snapshots/leak.pickle");
  ASSERT_GT(data.size(), 1000u);
  for (size_t n = 1; n < data.size(); n += 97) {
    auto r = read_pickle(std::span<const uint8_t>(data.data(), n));
    ASSERT_FALSE(r.is_ok());
  }
  auto r = read_pickle(std::span<const uint8_t>(data.data(), 20));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("pickle: truncated"), std::string::npos) << r.status().message();
}

TEST(PickleReader, ErrorsNameOffsetAndOpcode) {
  auto r = parse("\x80\x04K");  // BININT1 without its byte
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "pickle: truncated: needs 1 bytes, 0 left at offset 2 in BININT1");
  r = parse("\x80\x04\xff.");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "pickle: unknown opcode at offset 2 in opcode 0xff");
  r = parse("\x80\x09.");
  EXPECT_NE(r.status().message().find("unsupported pickle protocol 9"), std::string::npos);
  r = parse("");
  EXPECT_FALSE(r.is_ok());
  r = parse("a.");  // APPEND on an empty stack
  EXPECT_NE(r.status().message().find("stack underflow at offset 0 in APPEND"), std::string::npos) << r.status().message();
  r = parse("K\x01" "h\x05.");  // memo reference never stored
  EXPECT_NE(r.status().message().find("memo reference 5 was never stored"), std::string::npos);
  r = parse("K\x01K\x02" "a.");  // APPEND to an int
  EXPECT_NE(r.status().message().find("cannot add items to a int"), std::string::npos);
  r = parse("\x97.");
  EXPECT_NE(r.status().message().find("out-of-band"), std::string::npos);
  r = parse("(K\x01.");  // STOP with an open MARK
  EXPECT_FALSE(r.is_ok());
}

TEST(PickleReader, HugeLengthsFailWithoutAllocating) {
  auto r = parse("\x8d" + le(1ull << 62, 8) + "x.");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("BINUNICODE8"), std::string::npos);
  r = parse("\x95" + le(~0ull, 8) + "N.");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("FRAME"), std::string::npos);
  r = parse("Kar" + le(0xFFFFFFFFu, 4) + ".");  // LONG_BINPUT at index 4 billion
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("memo index"), std::string::npos);
}

TEST(PickleReader, LimitsAreEnforced) {
  PickleLimits lim;
  lim.max_objects = 10;
  std::string many = "(";
  for (int i = 0; i < 20; ++i) many += "N";
  many += "l.";
  auto r = parse(many, lim);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("too many values"), std::string::npos);

  lim = {};
  lim.max_depth = 100;
  r = parse(std::string(1000, '('), lim);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("nesting deeper than 100"), std::string::npos);

  lim = {};
  lim.max_input_bytes = 4;
  r = parse("N....", lim);
  EXPECT_FALSE(r.is_ok());
}

TEST(PickleReader, DeepNestingNeverRecurses) {
  // A million nested 1-tuples and a million-deep chain of lists built with APPEND: the reader,
  // the arena and its destructor must not recurse.
  std::string p = "N";
  p += std::string(1000000, '\x85');
  p += ".";
  auto r = parse(p);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->n_values(), 1000001u);
  EXPECT_EQ(r->repr(r->root(), 3), "(((...)))");

  std::string q = "]";
  for (int i = 0; i < 200000; ++i) q += "]";
  for (int i = 0; i < 200000; ++i) q += "a";
  q += ".";
  auto r2 = parse(q);
  ASSERT_TRUE(r2.is_ok()) << r2.status().message();
  EXPECT_EQ(r2->repr(r2->root(), 2), "[[...]]");
}

TEST(PickleReader, RandomMutationsNeverCrash) {
  auto base = read_file("tests/fixtures/snapshots/noprofile.pickle");
  ASSERT_FALSE(base.empty());
  std::mt19937 rng(1234);
  size_t ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> m = base;
    int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) m[rng() % m.size()] = static_cast<uint8_t>(rng());
    auto r = read_pickle(m);
    if (r.is_ok()) {
      ++ok;
      (void)r->repr(r->root(), 6, 50);
    } else {
      EXPECT_FALSE(r.status().message().empty());
    }
  }
  SUCCEED() << ok << " mutants still parsed";
}

TEST(PickleReader, OpcodeNames) {
  EXPECT_STREQ(pickle_opcode_name('X'), "BINUNICODE");
  EXPECT_STREQ(pickle_opcode_name(0x94), "MEMOIZE");
  EXPECT_EQ(pickle_opcode_name(0xff), nullptr);
}

}  // namespace
}  // namespace vlac
