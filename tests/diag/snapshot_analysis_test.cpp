// Snapshot analysis on REAL torch 2.11 snapshots (tools/make_memory_snapshots.py on an H200):
// each fixture's shape, the peak against torch's own counters, the planted leak's site, the OOM;
// plus synthetic snapshots for version tolerance (old key names, legacy layouts, no trace).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "diag/pickle_reader.h"
#include "diag/snapshot_analysis.h"
#include "diag/snapshot_data.h"
#include "diag/snapshot_report.h"

namespace vlac {
namespace {

using nlohmann::json;

std::string fixture(const std::string& name) { return std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/snapshots/" + name; }

json truth(const std::string& scenario) {
  std::ifstream f(fixture("truth.json"));
  return json::parse(f)[scenario];
}

SnapshotAnalysis analyse_fixture(const std::string& scenario, bool drop_annotations = false) {
  auto data = load_snapshot_file(fixture(scenario + ".pickle"));
  EXPECT_TRUE(data.is_ok()) << data.status().message();
  if (drop_annotations) data.value().annotations.clear();
  auto a = analyze_snapshot(data.value());
  EXPECT_TRUE(a.is_ok()) << a.status().message();
  return a.value();
}

uint64_t parts_sum(const SnapshotAnalysis& a) { return a.part_bytes[0] + a.part_bytes[1] + a.part_bytes[2]; }

// --- a minimal pickle writer for synthetic snapshots (test-only; our data is shallow) ---
void put(const json& v, std::string* out) {
  auto le = [&](uint64_t x, int n) {
    for (int i = 0; i < n; ++i) out->push_back(static_cast<char>((x >> (8 * i)) & 0xFF));
  };
  if (v.is_null()) {
    out->push_back('N');
  } else if (v.is_boolean()) {
    out->push_back(v.get<bool>() ? '\x88' : '\x89');
  } else if (v.is_number_integer()) {
    out->push_back('\x8a');
    out->push_back(8);
    le(static_cast<uint64_t>(v.get<int64_t>()), 8);
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    out->push_back('G');
    for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  } else if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    out->push_back('X');
    le(s.size(), 4);
    *out += s;
  } else if (v.is_array()) {
    out->append("](");
    for (const json& x : v) put(x, out);
    out->push_back('e');
  } else {
    out->append("}(");
    for (auto it = v.begin(); it != v.end(); ++it) {
      put(it.key(), out);
      put(it.value(), out);
    }
    out->push_back('u');
  }
}

Result<SnapshotAnalysis> analyse_json(const json& snapshot, SnapshotData* keep = nullptr) {
  std::string p = "\x80\x02";
  put(snapshot, &p);
  p.push_back('.');
  std::vector<uint8_t> b(p.begin(), p.end());
  auto doc = read_pickle(b);
  if (!doc.is_ok()) return doc.status();
  auto data = decode_snapshot(doc.value());
  if (!data.is_ok()) return data.status();
  if (keep) *keep = data.value();
  return analyze_snapshot(data.value());
}

json frames(const std::string& file, int line, const std::string& fn) {
  return json::array({{{"filename", "/usr/lib/python3/site-packages/torch/nn/functional.py"}, {"line", 1}, {"name", "linear"}},
                      {{"filename", file}, {"line", line}, {"name", fn}},
                      {{"filename", file}, {"line", 99}, {"name", "main"}}});
}

// --- the real fixtures ---

TEST(SnapshotFixtures, SteadyTrainingIsFlat) {
  SnapshotAnalysis a = analyse_fixture("steady");
  EXPECT_EQ(a.shape, "flat");
  EXPECT_EQ(a.peak_allocated, truth("steady")["max_memory_allocated"].get<uint64_t>());
  EXPECT_EQ(a.peak_reserved, truth("steady")["max_memory_reserved"].get<uint64_t>());
  EXPECT_EQ(parts_sum(a), a.peak_allocated);
  EXPECT_GT(a.part_bytes[0], a.part_bytes[1]);
  EXPECT_EQ(a.part_bytes[2], 0u);
  // weights (128 MiB) + AdamW moments (256 MiB) + inputs existed before recording began
  EXPECT_GE(a.pre_recording_bytes, 384ull << 20);
  EXPECT_EQ(a.allocated_end, truth("steady")["memory_allocated_at_dump"].get<uint64_t>());
  EXPECT_EQ(a.step_source, "optimizer.step() annotations");
  EXPECT_GE(a.steps.size(), 6u);
  ASSERT_FALSE(a.levers.empty());
  EXPECT_EQ(a.levers[0].part, "flat");
  EXPECT_FALSE(a.oom.has_value());
}

TEST(SnapshotFixtures, ActivationHeavyTrainingIsSawtooth) {
  SnapshotAnalysis a = analyse_fixture("activations");
  EXPECT_EQ(a.shape, "sawtooth");
  EXPECT_EQ(a.peak_allocated, truth("activations")["max_memory_allocated"].get<uint64_t>());
  EXPECT_EQ(a.peak_reserved, truth("activations")["max_memory_reserved"].get<uint64_t>());
  EXPECT_EQ(parts_sum(a), a.peak_allocated);
  EXPECT_GT(a.part_bytes[1], a.part_bytes[0]);
  ASSERT_FALSE(a.top_sites.empty());
  EXPECT_EQ(a.top_sites[0].function, "activation_train_step");
  EXPECT_EQ(a.top_sites[0].dominant, MemPart::Sawtooth);
  ASSERT_FALSE(a.levers.empty());
  EXPECT_EQ(a.levers[0].part, "sawtooth");
}

TEST(SnapshotFixtures, LeakIsStaircaseAndNamesTheLeakingLine) {
  SnapshotAnalysis a = analyse_fixture("leak");
  EXPECT_EQ(a.shape, "staircase");
  EXPECT_EQ(a.peak_allocated, truth("leak")["max_memory_allocated"].get<uint64_t>());
  EXPECT_EQ(parts_sum(a), a.peak_allocated);
  EXPECT_GT(a.part_bytes[2], a.part_bytes[0] + a.part_bytes[1]);
  EXPECT_GE(a.leak_steps, 6u);
  EXPECT_GT(a.leak_bytes_per_step, 16ull << 20);
  EXPECT_NE(a.leak_site.find("leaky_train_step"), std::string::npos) << a.leak_site;
  ASSERT_FALSE(a.top_sites.empty());
  EXPECT_EQ(a.top_sites[0].function, "leaky_train_step");
  EXPECT_EQ(a.top_sites[0].dominant, MemPart::Staircase);
  EXPECT_NE(a.top_sites[0].filename.find("make_memory_snapshots.py"), std::string::npos);
  ASSERT_FALSE(a.levers.empty());
  EXPECT_EQ(a.levers[0].part, "staircase");
  EXPECT_NE(a.levers[0].why.find("detach"), std::string::npos);
  // The staircase rises step after step: every complete step ends higher than the one before.
  ASSERT_GE(a.steps.size(), 8u);
  for (size_t s = 1; s + 1 < a.steps.size(); ++s) EXPECT_GT(a.steps[s].end_bytes, a.steps[s - 1].end_bytes) << s;
}

TEST(SnapshotFixtures, OomEntryIsReported) {
  SnapshotAnalysis a = analyse_fixture("oom");
  ASSERT_TRUE(a.oom.has_value());
  EXPECT_EQ(a.oom->n_ooms, 1u);
  EXPECT_EQ(a.oom->requested_bytes, 512ull << 20);  // "Tried to allocate 512.00 MiB" in truth.json
  EXPECT_GT(a.oom->device_free_bytes, 100ull << 30);  // the card was nearly empty: the fraction cap refused it
  EXPECT_EQ(a.oom->site, "make_memory_snapshots.py:46 train_step");
  EXPECT_EQ(a.peak_allocated, truth("oom")["max_memory_allocated"].get<uint64_t>());
  EXPECT_LE(a.oom->allocated_bytes, truth("oom")["allowed_bytes"].get<uint64_t>());
  EXPECT_EQ(a.shape, "sawtooth");  // the step with the huge batch
  bool fraction_note = false;
  for (const auto& n : a.notes) fraction_note |= n.find("set_per_process_memory_fraction") != std::string::npos;
  EXPECT_TRUE(fraction_note);
}

TEST(SnapshotFixtures, NoHistoryMeansSegmentsOnly) {
  SnapshotAnalysis a = analyse_fixture("noprofile");
  EXPECT_FALSE(a.has_trace);
  EXPECT_EQ(a.shape, "unknown");
  EXPECT_EQ(a.dump_allocated, truth("noprofile")["memory_allocated_at_dump"].get<uint64_t>());
  EXPECT_EQ(a.dump_reserved, truth("noprofile")["memory_reserved_at_dump"].get<uint64_t>());
  ASSERT_FALSE(a.notes.empty());
  EXPECT_NE(a.notes[0].find("_record_memory_history"), std::string::npos);
}

TEST(SnapshotFixtures, StepsFromPeriodicityWhenAnnotationsAreMissing) {
  for (const char* name : {"steady", "activations", "leak"}) {
    SnapshotAnalysis with = analyse_fixture(name);
    SnapshotAnalysis without = analyse_fixture(name, /*drop_annotations=*/true);
    EXPECT_EQ(without.step_source, "periodicity of allocation sites") << name;
    EXPECT_GE(without.steps.size(), 5u) << name;
    EXPECT_EQ(without.shape, with.shape) << name;
    EXPECT_EQ(without.peak_allocated, with.peak_allocated) << name;
  }
}

TEST(SnapshotFixtures, ReportsRenderEveryFixture) {
  for (const char* name : {"steady", "activations", "leak", "oom", "noprofile"}) {
    SnapshotAnalysis a = analyse_fixture(name);
    std::string text = snapshot_text(a, name);
    EXPECT_NE(text.find("shape:"), std::string::npos);
    json j = snapshot_json(a, name);
    EXPECT_EQ(j["shape"], a.shape);
    EXPECT_EQ(j["peak_allocated_bytes"].get<uint64_t>(), a.peak_allocated);
    std::string html = snapshot_html(a, name);
    EXPECT_NE(html.find("<svg"), std::string::npos);
    EXPECT_EQ(html.find("<script"), std::string::npos);
  }
}

// --- synthetic snapshots: version tolerance ---

json synthetic_flat(const std::string& pending_state) {
  // 40 MiB of weights alive at the dump (one as active_awaiting_free, the docstring's spelling),
  // then 5 steps that each allocate and free 10 MiB of activations.
  const int64_t MiB = 1 << 20;
  json blocks = json::array({{{"address", 1000 * MiB}, {"size", 30 * MiB}, {"requested_size", 30 * MiB},
                              {"state", "active_allocated"}, {"frames", frames("/src/train.py", 10, "build_model")}},
                             {{"address", 1030 * MiB}, {"size", 10 * MiB}, {"state", pending_state}, {"frames", json::array()}},
                             {{"address", 1040 * MiB}, {"size", 60 * MiB}, {"state", "inactive"}}});
  json seg = {{"device", 0}, {"address", 1000 * MiB}, {"total_size", 100 * MiB}, {"segment_type", "large"},
              {"segment_pool_id", json::array({0, 0})}, {"blocks", blocks}, {"some_future_key", {{"x", 1}}}};
  json trace = json::array();
  for (int s = 0; s < 5; ++s) {
    trace.push_back({{"action", "alloc"}, {"addr", 1040 * MiB}, {"size", 10 * MiB}, {"frames", frames("/src/train.py", 20, "forward")}});
    trace.push_back({{"action", "annotate"}, {"addr", 1040 * MiB}, {"user_metadata", "x"}});
    trace.push_back({{"action", "free_requested"}, {"addr", 1040 * MiB}, {"size", 10 * MiB}});
    trace.push_back({{"action", "free_completed"}, {"addr", 1040 * MiB}, {"size", 10 * MiB}});
  }
  return {{"segments", json::array({seg})}, {"device_traces", json::array({trace})}, {"unknown_top_level", 3},
          {"allocator_settings", {{"expandable_segments", true}}}};
}

TEST(SnapshotSynthetic, OldAndNewBlockStateNamesAndUnknownKeys) {
  for (const char* state : {"active_pending_free", "active_awaiting_free"}) {
    auto r = analyse_json(synthetic_flat(state));
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    const SnapshotAnalysis& a = r.value();
    EXPECT_EQ(a.dump_allocated, 40u << 20) << state;
    EXPECT_EQ(a.allocated_start, 40u << 20);
    EXPECT_EQ(a.peak_allocated, 50u << 20);
    EXPECT_EQ(a.reserved_start, 100u << 20);
    EXPECT_EQ(a.part_bytes[0], 40u << 20);
    EXPECT_EQ(a.part_bytes[1], 10u << 20);
    EXPECT_EQ(a.shape, "flat");
    EXPECT_TRUE(a.expandable_segments);
    bool other = false;
    for (const auto& n : a.notes) other |= n.find("other kinds ignored") != std::string::npos;
    EXPECT_TRUE(other);
    // the weights' site is the first frame outside torch
    bool build_model = false;
    for (const auto& s : a.top_sites) build_model |= s.site == "train.py:10 build_model";
    EXPECT_TRUE(build_model);
  }
}

TEST(SnapshotSynthetic, LegacyLayouts) {
  const int64_t MiB = 1 << 20;
  // torch 1.x: the root is the segment list; blocks without addresses; torch 2.0 `history`.
  json seg = {{"device", 0}, {"address", 0}, {"total_size", 4 * MiB},
              {"blocks", json::array({{{"size", 2 * MiB}, {"state", "active_allocated"},
                                       {"history", json::array({{{"addr", 0}, {"real_size", 123}, {"frames", frames("/a.py", 5, "f")}}})}},
                                      {{"size", 2 * MiB}, {"state", "inactive"}}})}};
  SnapshotData data;
  auto r = analyse_json(json::array({seg}), &data);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(data.legacy_segment_list);
  ASSERT_EQ(data.segments[0].blocks.size(), 2u);
  EXPECT_EQ(data.segments[0].blocks[1].address, 2u * MiB);  // running sum
  EXPECT_EQ(data.segments[0].blocks[0].requested_size, 123u);
  EXPECT_FALSE(r->has_trace);
  EXPECT_EQ(r->dump_allocated, 2u * MiB);
  ASSERT_FALSE(r->top_sites.empty());
  EXPECT_EQ(r->top_sites[0].site, "a.py:5 f");

  // A dict without device_traces (include_traces=False).
  auto r2 = analyse_json({{"segments", json::array({seg})}});
  ASSERT_TRUE(r2.is_ok());
  EXPECT_NE(r2->notes[0].find("no device_traces"), std::string::npos);
}

TEST(SnapshotSynthetic, SegmentEventsMoveReserved) {
  const int64_t MiB = 1 << 20;
  json trace = json::array({{{"action", "segment_alloc"}, {"addr", 0}, {"size", 20 * MiB}},
                            {{"action", "alloc"}, {"addr", 0}, {"size", 20 * MiB}},
                            {{"action", "free_completed"}, {"addr", 0}, {"size", 20 * MiB}},
                            {{"action", "segment_free"}, {"addr", 0}, {"size", 20 * MiB}},
                            {{"action", "segment_map"}, {"addr", 64 * MiB}, {"size", 2 * MiB}},
                            {{"action", "oom"}, {"device_free", 1 * MiB}, {"size", 8 * MiB}}});
  json seg = {{"device", 0}, {"address", 64 * MiB}, {"total_size", 2 * MiB}, {"is_expandable", true},
              {"blocks", json::array({{{"address", 64 * MiB}, {"size", 2 * MiB}, {"state", "inactive"}}})}};
  auto r = analyse_json({{"segments", json::array({seg})}, {"device_traces", json::array({trace})}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->reserved_start, 0u);
  EXPECT_EQ(r->peak_reserved, 20u * MiB);
  EXPECT_EQ(r->reserved_end, 2u * MiB);
  EXPECT_EQ(r->peak_allocated, 20u * MiB);
  EXPECT_EQ(r->allocated_end, 0u);
  ASSERT_TRUE(r->oom.has_value());
  EXPECT_EQ(r->oom->requested_bytes, 8u * MiB);
  EXPECT_EQ(r->oom->device_free_bytes, 1u * MiB);
}

TEST(SnapshotSynthetic, RingBufferOverflowFreesBeforeAllocs) {
  // The trace starts with the free of a block whose alloc fell out of the ring buffer.
  const int64_t MiB = 1 << 20;
  json trace = json::array({{{"action", "free_completed"}, {"addr", 5 * MiB}, {"size", 4 * MiB}},
                            {{"action", "alloc"}, {"addr", 9 * MiB}, {"size", 1 * MiB}}});
  json seg = {{"device", 0}, {"address", 0}, {"total_size", 20 * MiB},
              {"blocks", json::array({{{"address", 9 * MiB}, {"size", 1 * MiB}, {"state", "active_allocated"}}})}};
  auto r = analyse_json({{"segments", json::array({seg})}, {"device_traces", json::array({trace})}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->allocated_start, 4u * MiB);
  EXPECT_EQ(r->peak_allocated, 4u * MiB);
  EXPECT_EQ(r->peak_event, -1);
  EXPECT_EQ(r->allocated_end, 1u * MiB);
  EXPECT_EQ(r->n_inconsistent, 0u);
}

TEST(SnapshotSynthetic, BadShapesAreClearErrors) {
  auto r = analyse_json(json::array({1, 2}));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "segments[0] is a int, not a dict");
  r = analyse_json({{"segments", "nope"}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "'segments' is a str, not a list");
  r = analyse_json({{"device_traces", json::array()}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("no 'segments' key"), std::string::npos);
  r = analyse_json(42);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not a PyTorch memory snapshot"), std::string::npos);
  auto bad_dev = analyze_snapshot(SnapshotData{}, SnapshotOptions{.device = 3});
  EXPECT_EQ(bad_dev.status().code(), StatusCode::InvalidArgument);
}

TEST(SnapshotSynthetic, InternalFramesAreSkipped) {
  EXPECT_TRUE(is_internal_frame({"/x/site-packages/torch/nn/modules/linear.py", 1, "forward"}));
  EXPECT_TRUE(is_internal_frame({"??", 0, "at::native::empty"}));
  EXPECT_TRUE(is_internal_frame({"/usr/lib/python3.12/contextlib.py", 81, "inner"}));
  EXPECT_TRUE(is_internal_frame({"<frozen runpy>", 1, "_run_code"}));
  EXPECT_FALSE(is_internal_frame({"/x/site-packages/lerobot/policies/pi05/modeling_pi05.py", 1, "forward"}));
  EXPECT_FALSE(is_internal_frame({"/home/me/train.py", 12, "train_step"}));
}

TEST(SnapshotSynthetic, JsonSurvivesInvalidUtf8) {
  // Found by fuzz_pickle: a frame name that is not UTF-8 made nlohmann::json::dump throw.
  const int64_t MiB = 1 << 20;
  json trace = json::array({{{"action", "alloc"}, {"addr", 0}, {"size", MiB}, {"frames", frames("/x/a.py", 1, "PLACEHOLDER")}}});
  json seg = {{"device", 0}, {"address", 0}, {"total_size", 2 * MiB},
              {"blocks", json::array({{{"address", 0}, {"size", MiB}, {"state", "active_allocated"}}})}};
  std::string p = "\x80\x02";
  put({{"segments", json::array({seg})}, {"device_traces", json::array({trace})}}, &p);
  p.push_back('.');
  size_t at = p.find("PLACEHOLDER");
  ASSERT_NE(at, std::string::npos);
  p.replace(at, 11, "bad\xff\xc0namexx");  // same length, invalid UTF-8
  std::vector<uint8_t> b(p.begin(), p.end());
  auto doc = read_pickle(b);
  ASSERT_TRUE(doc.is_ok()) << doc.status().message();
  auto data = decode_snapshot(doc.value());
  ASSERT_TRUE(data.is_ok());
  auto a = analyze_snapshot(data.value());
  ASSERT_TRUE(a.is_ok());
  std::string out = snapshot_json(a.value(), "x").dump();
  EXPECT_NE(out.find("bad\xef\xbf\xbd"), std::string::npos) << out;
}

TEST(SnapshotSynthetic, HtmlEscapesSnapshotStrings) {
  const int64_t MiB = 1 << 20;
  json trace = json::array({{{"action", "alloc"}, {"addr", 0}, {"size", MiB},
                             {"frames", frames("/x/<script>alert(1)</script>.py", 1, "f\"<b>")}}});
  json seg = {{"device", 0}, {"address", 0}, {"total_size", 2 * MiB},
              {"blocks", json::array({{{"address", 0}, {"size", MiB}, {"state", "active_allocated"}}})}};
  auto r = analyse_json({{"segments", json::array({seg})}, {"device_traces", json::array({trace})}});
  ASSERT_TRUE(r.is_ok());
  std::string html = snapshot_html(r.value(), "<evil>.pickle");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<evil>"), std::string::npos);
  EXPECT_NE(html.find("&lt;evil&gt;.pickle"), std::string::npos);
  EXPECT_NE(html.find("f&quot;&lt;b&gt;"), std::string::npos);
}

}  // namespace
}  // namespace vlac
