// The planner against measured training steps: tests/fixtures/train_memory/measured.json holds
// torch.cuda's own counters for 20 lerobot 0.6.1 configurations run on an H200 by
// tools/measure_train_memory.py (versions and commands inside). Every plan is held to its
// measurement within 10%: peak allocated over 5 steps, peak reserved (a model of PyTorch's
// caching allocator, diag/alloc_sim.h), weights after load, and each phase -- forward, backward,
// optimizer step -- of step 1 and of a steady step.
// The GR00T table is held to the model code's own tensor list, and the snapshot analyser to the
// measured snapshots.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "diag/snapshot_analysis.h"
#include "diag/snapshot_data.h"
#include "diag/train_plan.h"
#include "models/groot_arch.h"

namespace vlac::diag {
namespace {

std::string fixture(const std::string& rel) { return std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/" + rel; }

nlohmann::json load(const std::string& rel) {
  std::ifstream f(fixture(rel));
  EXPECT_TRUE(f.good()) << rel;
  return nlohmann::json::parse(f);
}

// The measured configuration as planner options (lerobot's flags -> ours).
struct Case {
  PolicyKind kind;
  TrainOptions opts;
};

Case case_of(const nlohmann::json& run) {
  const nlohmann::json& c = run["config"];
  const std::string pol = c["policy"];
  Case k{};
  if (pol == "pi05") k.kind = PolicyKind::Pi05;
  else if (pol == "smolvla") k.kind = PolicyKind::SmolVla;
  else if (pol == "act") k.kind = PolicyKind::Act;
  else k.kind = PolicyKind::GrootN17;
  k.opts = default_train_options(k.kind);
  k.opts.batch = c["batch"].get<int64_t>();
  if (c.value("dtype", "float32") == "bfloat16") k.opts.dtype = WeightDtype::Bf16;
  k.opts.gradient_checkpointing = c.value("gradient_checkpointing", false);
  k.opts.freeze_vision = c.value("freeze_vision_encoder", false);
  k.opts.train_expert_only = c.value("train_expert_only", false);
  if (c.value("lora", false)) k.opts.lora_r = 16;  // lerobot PeftConfig default, default targets
  k.opts.tune_llm = c.value("tune_llm", false);
  k.opts.tune_vision = c.value("tune_visual", false);
  k.opts.vlm_bf16 = c.value("vlm_bf16", false);
  return k;
}

TrainPlan plan_of(const Case& k) {
  auto arch = build_policy_arch(k.kind, PolicyInputs{}, nullptr, "");
  EXPECT_TRUE(arch.is_ok()) << arch.status().message();
  auto p = plan_training(arch.value(), k.opts);
  EXPECT_TRUE(p.is_ok()) << p.status().message();
  return p.value();
}

double rel(uint64_t plan, uint64_t meas) { return static_cast<double>(plan) / static_cast<double>(meas) - 1.0; }

TEST(TrainMemory, FixtureHasVersionsCommandsAndEveryConfiguration) {
  const nlohmann::json m = load("train_memory/measured.json");
  ASSERT_EQ(m["calls"].size(), 3u);
  for (const auto& call : m["calls"]) {
    EXPECT_EQ(call["versions"]["torch"], "2.11.0+cu130");
    EXPECT_EQ(call["versions"]["transformers"], "5.17.0");
    EXPECT_EQ(call["versions"]["lerobot"], "0.6.1");
    EXPECT_EQ(call["versions"]["gpu"], "NVIDIA H200");
    EXPECT_NE(call["device_command"].get<std::string>().find("measure_train_memory.py"), std::string::npos);
  }
  std::set<std::string> names;
  for (const auto& r : m["runs"]) {
    names.insert(r["name"].get<std::string>());
    EXPECT_TRUE(r["ok"].get<bool>()) << r["name"];
    EXPECT_FALSE(r["command"].get<std::string>().empty()) << r["name"];
  }
  for (const char* n : {"act_b8", "act_b64", "smolvla_b8", "smolvla_b64", "pi05_fp32_b1", "pi05_fp32_b4",
                        "pi05_fp32_b8", "pi05_bf16_b1", "pi05_bf16_b4", "pi05_bf16_b8", "pi05_fp32_b8_gc",
                        "pi05_bf16_b8_gc", "pi05_bf16_b8_freezevis", "pi05_bf16_b8_expertonly", "pi05_bf16_b8_lora",
                        "groot_b32"})
    EXPECT_TRUE(names.count(n)) << n;
}

TEST(TrainMemory, EveryPlanWithinTenPercentOfItsMeasurement) {
  const nlohmann::json m = load("train_memory/measured.json");
  size_t steady = 0;
  for (const auto& r : m["runs"]) {
    const std::string name = r["name"];
    SCOPED_TRACE(name);
    const TrainPlan p = plan_of(case_of(r));
    const auto& ph = r["phases"];
    auto peak = [&](const nlohmann::json& x) { return x["peak_allocated"].get<uint64_t>(); };
    // The whole run: peak allocated over the 5 steps, peak reserved (the caching-allocator
    // model, no margin), weights after load.
    EXPECT_NEAR(rel(p.peak_allocated_bytes, r["peak_allocated"]), 0.0, 0.10) << "peak allocated";
    EXPECT_NEAR(rel(p.peak_allocated_bytes, peak(ph["steps"])), 0.0, 0.10) << "steady peak";
    EXPECT_NEAR(rel(p.peak_reserved_bytes, r["peak_reserved"]), 0.0, 0.10) << "peak reserved";
    EXPECT_NEAR(rel(p.weight_bytes, ph["load"]["allocated"]), 0.0, 0.10) << "weights";
    // Per phase, step 1 (torch.cuda.reset_peak_memory_stats between phases): the optimizer state
    // does not exist before the first optimizer.step(), so the plan's forward and backward
    // phases are compared without it; the optimizer phase creates it, as every later step has it.
    EXPECT_NEAR(rel(p.forward_peak_bytes - p.optimizer_bytes, peak(ph["forward"])), 0.0, 0.10) << "forward, step 1";
    EXPECT_NEAR(rel(p.backward_peak_bytes - p.optimizer_bytes, peak(ph["backward"])), 0.0, 0.10) << "backward, step 1";
    EXPECT_NEAR(rel(p.optimizer_peak_bytes, peak(ph["optimizer"])), 0.0, 0.10) << "optimizer step";
    // The steady step (call3 measured the last step phase by phase), less the saved-tensor
    // census's garbage that call3's pi0.5/SmolVLA runs held (see measured.json, call3's note).
    if (r.contains("call3")) {
      const auto& c = r["call3"];
      const int64_t art = c["census_artifact_bytes"].get<int64_t>();
      auto clean = [&](const char* k) { return static_cast<uint64_t>(static_cast<int64_t>(peak(c["phases"][k])) - art); };
      EXPECT_GE(art, 0);
      EXPECT_NEAR(rel(p.forward_peak_bytes, clean("forward_steady")), 0.0, 0.10) << "forward, steady";
      EXPECT_NEAR(rel(p.backward_peak_bytes, clean("backward_steady")), 0.0, 0.10) << "backward, steady";
      EXPECT_NEAR(rel(p.optimizer_peak_bytes, clean("optimizer_steady")), 0.0, 0.10) << "optimizer, steady";
      ++steady;
    }
    // Parameters: the census of named_parameters().
    EXPECT_EQ(p.params, r["census"]["total_params"].get<uint64_t>());
  }
  EXPECT_EQ(steady, 17u);
}

// GR00T's activations, re-derived tensor by tensor, against the census of what its first forward
// saved for backward (saved_tensors_hooks, call3): the census holds the activations plus the
// bf16 casts of the Linear weights that autograd keeps for the inputs' gradients.
TEST(TrainMemory, GrootActivationsMatchTheSavedTensorCensus) {
  const nlohmann::json m = load("train_memory/measured.json");
  for (const auto& r : m["runs"]) {
    const std::string name = r["name"];
    if (name.rfind("groot", 0) != 0) continue;
    SCOPED_TRACE(name);
    const TrainPlan p = plan_of(case_of(r));
    const uint64_t census = r["call3"]["saved_census"]["total_bytes"];
    EXPECT_NEAR(rel(p.activation_bytes + p.autocast_copy_bytes, census), 0.0, 0.05);
  }
}

// Issue 16 point 4: GR00T N1.7 re-derived from the model code. The table must list exactly the
// tensors (name, shape) of lerobot's port, and the default recipe must not fit a 24 GB card.
TEST(TrainMemory, GrootTableMatchesTheModelCode) {
  const nlohmann::json t = load("train_memory/groot_n17_tensors.json");
  std::map<std::string, std::vector<int64_t>> code;
  uint64_t trainable = 0;
  for (const auto& e : t["tensors"]) {
    code[e[0].get<std::string>()] = e[1].get<std::vector<int64_t>>();
    if (e[3].get<bool>()) {
      uint64_t n = 1;
      for (int64_t s : e[1].get<std::vector<int64_t>>()) n *= static_cast<uint64_t>(s);
      trainable += n;
    }
  }
  auto arch = build_policy_arch(PolicyKind::GrootN17, PolicyInputs{}, nullptr, "");
  ASSERT_TRUE(arch.is_ok());
  std::map<std::string, std::vector<int64_t>> table;
  for (const ParamTensor& p : arch->params) table[p.name] = p.shape;
  for (const auto& [name, shape] : code) {
    auto it = table.find(name);
    ASSERT_NE(it, table.end()) << "missing from the table: " << name;
    EXPECT_EQ(it->second, shape) << name;
  }
  EXPECT_EQ(table.size(), code.size());
  auto p = plan_of({PolicyKind::GrootN17, default_train_options(PolicyKind::GrootN17)});
  EXPECT_EQ(p.trainable_params, trainable);
}

TEST(TrainMemory, GrootDefaultRecipeNeedsTheFortyGigabyteCard) {
  const TrainOptions def = default_train_options(PolicyKind::GrootN17);
  auto rtx = plan_for_gpu(PolicyKind::GrootN17, {}, nullptr, "", def, parse_gpu("RTX4090").value());
  ASSERT_TRUE(rtx.is_ok());
  EXPECT_FALSE(rtx->fits);
  ASSERT_TRUE(rtx->smallest_gpu_as_is.has_value());
  EXPECT_GE(rtx->smallest_gpu_as_is->bytes, 40ull * 1000 * 1000 * 1000);
}

// The shape torch's own counters of a run imply: a leak when what stays allocated between
// steps grew by more than 5% of the peak from step 1 to step 5; else sawtooth when the bytes that
// come and go within a step (steady peak minus what stays allocated) outweigh those that stay.
std::string shape_from_counters(const nlohmann::json& phases) {
  const double flat = phases["steps"]["allocated"].get<double>(), peak = phases["steps"]["peak_allocated"].get<double>();
  const double after1 = phases["after_step1"]["allocated"].get<double>();
  if (flat - after1 > 0.05 * peak) return "staircase";
  return peak - flat > flat ? "sawtooth" : "flat";
}

std::string base(const std::string& f) { return f.substr(f.rfind('/') + 1); }

// The measured snapshots shipped as fixtures (tests/fixtures/snapshots/measured_*.pickle.xz, the
// traces of call3 cut to their last N events as a ring buffer of that size keeps them): shape
// against the run's counters, the peak against torch.cuda.max_memory_allocated, the top site.
TEST(TrainMemory, SnapshotAnalyserOnMeasuredRuns) {
#ifndef VLAC_HAVE_LZMA
  GTEST_SKIP() << "built without liblzma: the measured snapshots are xz-compressed";
#endif
  const nlohmann::json m = load("train_memory/measured.json");
  std::map<std::string, nlohmann::json> c3;
  for (const auto& r : m["runs"]) if (r.contains("call3")) c3[r["name"]] = r["call3"];
  for (const auto& r : m["extra_runs"]) c3[r["name"]] = r["call3"];
  struct Want {
    std::string top_file, top_function;
  };
  // act: the ResNet backbone call of ACT's forward; SmolVLA: its VLM+expert layer; pi0.5 bf16
  // batch 1 peaks in the optimizer step, where AdamW's state and foreach temporaries (allocated
  // inside torch.optim, first user frame: the script's opt.step() line) lead.
  const std::map<std::string, Want> fixtures = {{"act_b8", {"modeling_act.py", "forward"}},
                                                {"act_b64", {"modeling_act.py", "forward"}},
                                                {"act_b8_leak", {"modeling_act.py", "forward"}},
                                                {"smolvla_b8", {"smolvlm_with_expert.py", "forward"}},
                                                {"pi05_bf16_b1", {"measure_train_memory.py", "run_one"}}};
  for (const auto& [name, want] : fixtures) {
    SCOPED_TRACE(name);
    auto data = load_snapshot_file(fixture("snapshots/measured_" + name + ".pickle.xz"));
    ASSERT_TRUE(data.is_ok()) << data.status().message();
    auto a = analyze_snapshot(data.value());
    ASSERT_TRUE(a.is_ok()) << a.status().message();
    const auto& ph = c3.at(name)["phases"];
    EXPECT_EQ(a->shape, shape_from_counters(ph));
    EXPECT_EQ(a->step_source, "optimizer.step() annotations");
    EXPECT_NEAR(rel(a->peak_allocated, ph["steps"]["peak_allocated"].get<uint64_t>()), 0.0, 0.02);
    // The top site that is not bookkeeping (bytes alive before recording have no stack).
    const SnapshotSite* top = nullptr;
    for (const SnapshotSite& s : a->top_sites)
      if (!s.filename.empty() && (top == nullptr || (base(top->filename) != want.top_file && base(s.filename) == want.top_file)))
        if (top == nullptr || s.bytes * 2 >= top->bytes) top = &s;
    ASSERT_NE(top, nullptr);
    EXPECT_EQ(base(top->filename), want.top_file);
    EXPECT_EQ(top->function, want.top_function);
    if (name == "act_b8_leak") {
      // retain_graph=True + the loss kept: every step's saved activations stay; the analyser's
      // per-step growth against the counters' (what stays allocated, step 1 to step 5).
      const double grow = (ph["steps"]["allocated"].get<double>() - ph["after_step1"]["allocated"].get<double>()) / 4;
      EXPECT_NEAR(static_cast<double>(a->leak_bytes_per_step) / grow - 1.0, 0.0, 0.10);
      EXPECT_EQ(base(a->leak_site.substr(0, a->leak_site.find(':'))), "modeling_act.py");
    }
    if (name == "pi05_bf16_b1") {
      // At the optimizer-step peak: AdamW's two moments per trainable parameter plus the foreach
      // sqrt temporaries (one more copy of the gradients): what backward leaves allocated beyond
      // the weights, i.e. state + gradients.
      const double state_plus_temp =
          ph["backward_steady"]["allocated"].get<double>() - ph["load"]["allocated"].get<double>();
      EXPECT_NEAR(static_cast<double>(top->bytes) / state_plus_temp - 1.0, 0.0, 0.10);
    }
  }
}

// vlac mem snapshot ran on the device on every snapshot of call3 (pickles of up to 16 MB that
// do not ship): its verdicts, kept in measured.json, against the same runs' counters.
TEST(TrainMemory, SnapshotVerdictsOfEveryMeasuredRun) {
  const nlohmann::json m = load("train_memory/measured.json");
  size_t n = 0;
  std::set<std::string> shapes;
  auto check = [&](const nlohmann::json& r) {
    if (!r.contains("call3") || !r["call3"].contains("vlac_snapshot")) return;
    SCOPED_TRACE(r["name"].get<std::string>());
    const auto& c = r["call3"];
    const auto& v = c["vlac_snapshot"];
    EXPECT_EQ(v["shape"], shape_from_counters(c["phases"]));
    EXPECT_NEAR(rel(v["peak_allocated_bytes"].get<uint64_t>(), c["phases"]["steps"]["peak_allocated"].get<uint64_t>()), 0.0, 0.02);
    ASSERT_FALSE(v["top_sites"].empty());
    shapes.insert(v["shape"].get<std::string>());
    ++n;
  };
  for (const auto& r : m["runs"]) check(r);
  for (const auto& r : m["extra_runs"]) check(r);
  EXPECT_EQ(n, 18u);
  EXPECT_EQ(shapes, (std::set<std::string>{"flat", "sawtooth", "staircase"}));
}

}  // namespace
}  // namespace vlac::diag
