// Explanation tests: derived numbers (exact bytes, computed independently from the printed
// values), the caching allocator's sizing rules, the allocator variable per wording, and the
// lever order for characteristic real messages.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "diag/oom_explain.h"

namespace vlac::diag {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::string fixture_path(const std::string& name) { return std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/oom/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Parsed {
  OomMessage msg;
  OomExplanation ex;
};

Parsed explain_fixture(const std::string& name) {
  auto r = parse_oom(read_file(fixture_path(name)), name);
  EXPECT_TRUE(r.is_ok()) << name << ": " << r.status().message();
  Parsed p{r.is_ok() ? r.value() : OomMessage{}, {}};
  p.ex = explain_oom(p.msg);
  return p;
}

std::vector<std::string> names(const OomExplanation& ex) {
  std::vector<std::string> out;
  for (const auto& l : ex.levers) out.push_back(l.name);
  return out;
}

bool has_lever(const OomExplanation& ex, const std::string& name) {
  for (const auto& l : ex.levers)
    if (l.name == name) return true;
  return false;
}

TEST(OomExplain, CachingAllocatorSizing) {
  EXPECT_EQ(caching_allocator_round_size(1), 512u);
  EXPECT_EQ(caching_allocator_round_size(512), 512u);
  EXPECT_EQ(caching_allocator_round_size(513), 1024u);
  EXPECT_EQ(caching_allocator_round_size(kMiB + 1), kMiB + 512);
  EXPECT_EQ(caching_allocator_segment_size(512), 2 * kMiB);
  EXPECT_EQ(caching_allocator_segment_size(kMiB), 2 * kMiB);            // <= 1 MiB: small pool
  EXPECT_EQ(caching_allocator_segment_size(kMiB + 512), 20 * kMiB);     // < 10 MiB: kLargeBuffer
  EXPECT_EQ(caching_allocator_segment_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(caching_allocator_segment_size(10 * kMiB), 10 * kMiB);      // >= 10 MiB: 2 MiB multiples
  EXPECT_EQ(caching_allocator_segment_size(10 * kMiB + 512), 12 * kMiB);
  EXPECT_EQ(caching_allocator_segment_size(2512555868), 2514485248u);
  EXPECT_EQ(caching_allocator_round_size(UINT64_MAX), UINT64_MAX);
}

TEST(OomExplain, GuideMessageDerivedNumbersAndAllocatorFirst) {
  Parsed p = explain_fixture("guide_80gb.txt");
  const auto& ex = p.ex;
  EXPECT_EQ(ex.torch_generation, "2.2+");
  EXPECT_EQ(ex.reserved_bytes, 82280835973u);             // 71.02 GiB + 5.61 GiB
  EXPECT_EQ(ex.reserved_unallocated_bytes, 6023691633u);  // 5.61 GiB
  EXPECT_EQ(ex.this_process_bytes, 84127671910u);         // "Process 21874", read as this process
  EXPECT_TRUE(ex.this_process_inferred);
  EXPECT_EQ(ex.non_pytorch_bytes, 1846835937);            // 78.35 - 71.02 - 5.61 GiB
  EXPECT_EQ(ex.other_processes_bytes, 0u);
  EXPECT_FALSE(ex.other_processes_estimated);
  EXPECT_EQ(ex.unexplained_bytes, 7549748);               // 79.15 GiB - 812 MiB - 78.35 GiB
  ASSERT_TRUE(ex.fragmentation_ratio);
  EXPECT_NEAR(*ex.fragmentation_ratio, 6023691633.0 / 82280835973.0, 1e-12);
  EXPECT_EQ(ex.request_min_bytes, 2506096641u);           // (2.34 GiB +- rounding) as 2 MiB multiples, minus 2 MiB
  EXPECT_EQ(ex.request_max_bytes, 2516582400u);
  EXPECT_EQ(ex.allocator_env_var, "PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_EQ(ex.allocator_setting, "expandable_segments:True");
  ASSERT_FALSE(ex.levers.empty());
  EXPECT_EQ(ex.levers[0].name, "allocator");
  EXPECT_TRUE(ex.levers[0].pointed);
  EXPECT_NE(ex.levers[0].why.find("5.61 GiB"), std::string::npos);  // why cites the numbers
  EXPECT_NE(ex.levers[0].how.find("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), std::string::npos);
  EXPECT_EQ(names(ex), (std::vector<std::string>{"allocator", "free_card", "dtype", "halve_batch", "grad_accumulation",
                                                 "gradient_checkpointing", "freeze", "lora", "shrink_inputs",
                                                 "bigger_card"}));
}

TEST(OomExplain, OtherProcessesPointToFreeingTheCard) {
  Parsed p = explain_fixture("18_keys_values_92_rank_multi_process.txt");
  const auto& ex = p.ex;
  EXPECT_EQ(ex.torch_generation, "2.10");
  EXPECT_EQ(ex.this_process_bytes, 40222368727u);  // 37.46 GiB
  EXPECT_FALSE(ex.this_process_inferred);
  EXPECT_EQ(ex.reserved_bytes, 39034636206u);
  EXPECT_EQ(ex.non_pytorch_bytes, 1187732521);
  EXPECT_EQ(ex.other_processes_bytes, 1736441856u);  // 4 x 414 MiB
  EXPECT_EQ(ex.unexplained_bytes, 106336092);
  EXPECT_EQ(ex.allocator_env_var, "PYTORCH_ALLOC_CONF");
  ASSERT_FALSE(ex.levers.empty());
  EXPECT_EQ(ex.levers[0].name, "free_card");
  EXPECT_TRUE(ex.levers[0].pointed);
  EXPECT_NE(ex.levers[0].why.find("4 other processes"), std::string::npos) << ex.levers[0].why;
  EXPECT_NE(ex.levers[0].why.find("pid 3721648 414.00 MiB"), std::string::npos);
  // the allocator variable in the lever names the 2.9.x trap
  for (const auto& l : ex.levers)
    if (l.name == "allocator") {
      EXPECT_NE(l.how.find("183387"), std::string::npos);
    }
}

TEST(OomExplain, RequestLargerThanTheCard) {
  for (const char* f : {"16_neurolens_2_request_gt_card.txt", "22_framepack_369_request_gt_card.txt",
                        "25_therock_1054_hip_request_gt_card.txt"}) {
    Parsed p = explain_fixture(f);
    auto n = names(p.ex);
    ASSERT_GE(n.size(), 3u) << f;
    EXPECT_EQ((std::vector<std::string>(n.begin(), n.begin() + 3)),
              (std::vector<std::string>{"shrink_inputs", "halve_batch", "bigger_card"}))
        << f;
    EXPECT_FALSE(has_lever(p.ex, "free_card")) << f;
    EXPECT_FALSE(has_lever(p.ex, "allocator")) << f;
    EXPECT_NE(p.ex.levers[0].why.find("larger than the whole"), std::string::npos) << f;
  }
}

TEST(OomExplain, FragmentationPointsToTheAllocator) {
  Parsed mg = explain_fixture("12_mgfn_35_capacty_zero_free.txt");  // 2.30 GiB unallocated >= 1.70 GiB request
  EXPECT_EQ(mg.ex.torch_generation, "2.1");
  EXPECT_EQ(mg.ex.levers[0].name, "allocator");
  EXPECT_EQ(mg.ex.allocator_env_var, "PYTORCH_CUDA_ALLOC_CONF");
  Parsed cads = explain_fixture("15_cads_4_large_reserved_unallocated.txt");  // 9.35 GiB, half the pool
  EXPECT_EQ(cads.ex.torch_generation, "2.2-2.9");
  EXPECT_EQ(cads.ex.levers[0].name, "allocator");
  EXPECT_NE(cads.ex.levers[0].why.find("even defragmented"), std::string::npos);
  EXPECT_EQ(cads.ex.non_pytorch_bytes, 322122548);  // 18.73 - 9.08 - 9.35 GiB
}

TEST(OomExplain, NonPyTorchMemoryInTheProcessComesBeforeFragmentation) {
  Parsed p = explain_fixture("32_lerf_73_capacty_non_pytorch.txt");
  EXPECT_EQ(p.ex.non_pytorch_bytes, 4166118277);  // 20.81 - 12.09 - 4.84 GiB
  auto n = names(p.ex);
  ASSERT_GE(n.size(), 2u);
  EXPECT_EQ(n[0], "free_card");
  EXPECT_NE(p.ex.levers[0].why.find("outside PyTorch's allocator"), std::string::npos);
  EXPECT_EQ(n[1], "allocator");
}

TEST(OomExplain, MemoryFractionCap) {
  Parsed rocm = explain_fixture("26_therock_2118_hip_ci_allowed_private_pools.txt");
  EXPECT_EQ(rocm.ex.levers[0].name, "raise_memory_fraction");
  EXPECT_FALSE(rocm.ex.levers[0].changes_policy);
  EXPECT_EQ(rocm.ex.torch_generation, "2.9+ (rocm)");
  EXPECT_EQ(rocm.ex.allocator_env_var, "PYTORCH_CUDA_ALLOC_CONF");  // ROCm 2.9+ prints and reads the CUDA name
  EXPECT_EQ(rocm.ex.request_min_bytes, 1u);                          // "2.00 MiB": a tensor <= 1 MiB
  EXPECT_EQ(rocm.ex.request_max_bytes, kMiB);
  EXPECT_TRUE(rocm.ex.other_processes_estimated);
  Parsed xpu = explain_fixture("30_torch_xpu_ops_2392_xpu_allowed.txt");
  EXPECT_EQ(xpu.ex.levers[0].name, "raise_memory_fraction");
  EXPECT_NE(xpu.ex.levers[0].how.find("torch.xpu"), std::string::npos);
}

TEST(OomExplain, AllocatorVariablePerWording) {
  struct C { const char* file; const char* var; const char* gen; const char* setting_has; };
  const C cases[] = {
      {"01_pytorch_16417_cached.txt", "PYTORCH_CUDA_ALLOC_CONF", "1.0-1.3", "upgrade"},
      {"05_pytorch_59778_reserved.txt", "PYTORCH_CUDA_ALLOC_CONF", "1.4-2.0", "max_split_size_mb"},
      {"07_pct_pytorch_27_max_split.txt", "PYTORCH_CUDA_ALLOC_CONF", "1.10-2.0", "max_split_size_mb"},
      {"14_mygirlgpt_11_capacty_self.txt", "PYTORCH_CUDA_ALLOC_CONF", "2.1", "expandable_segments:True"},
      {"20_pytorch_16417_comment_2x.txt", "PYTORCH_CUDA_ALLOC_CONF", "2.2-2.9", "expandable_segments:True"},
      {"18_keys_values_92_rank_multi_process.txt", "PYTORCH_ALLOC_CONF", "2.10", "expandable_segments:True"},
      {"23_comfyui_9529_hip_hip_conf.txt", "PYTORCH_HIP_ALLOC_CONF", "2.2-2.8 (rocm)", "expandable_segments:True"},
      {"24_z_image_103_hip_cuda_conf.txt", "PYTORCH_CUDA_ALLOC_CONF", "2.9+ (rocm)", "expandable_segments:True"},
      {"27_comfyui_7440_mps_gib_repeated.txt", "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "mps", "0.0"},
      {"28_fooocus_1139_mps_gb.txt", "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "mps-old-units", "0.0"},
      {"31_torch_xpu_ops_3011_xpu.txt", "PYTORCH_ALLOC_CONF", "xpu", "expandable_segments"},
  };
  for (const auto& c : cases) {
    Parsed p = explain_fixture(c.file);
    EXPECT_EQ(p.ex.allocator_env_var, c.var) << c.file;
    EXPECT_EQ(p.ex.torch_generation, c.gen) << c.file;
    EXPECT_NE(p.ex.allocator_setting.find(c.setting_has), std::string::npos) << c.file << ": " << p.ex.allocator_setting;
  }
}

TEST(OomExplain, OldWordingsDeriveTheirReserve) {
  Parsed r = explain_fixture("05_pytorch_59778_reserved.txt");
  EXPECT_EQ(r.ex.reserved_bytes, 1331439862u);              // 1.24 GiB reserved in total
  EXPECT_EQ(r.ex.reserved_unallocated_bytes, 511883346u);   // 1.24 GiB - 781.59 MiB
  EXPECT_EQ(r.ex.other_processes_bytes, 1857573355u);       // 6.00 - 3.03 - 1.24 GiB, an estimate
  EXPECT_TRUE(r.ex.other_processes_estimated);
  Parsed c = explain_fixture("01_pytorch_16417_cached.txt");
  EXPECT_EQ(c.ex.reserved_bytes, 8986296u + 4907336u);      // already allocated + cached
  EXPECT_EQ(c.ex.reserved_unallocated_bytes, 4907336u);
  EXPECT_NE(c.ex.request_meaning.find("request itself"), std::string::npos);
  EXPECT_EQ(c.ex.request_max_bytes, 13107200u + 5242u);    // 12.50 MiB, +- half a printed digit
  Parsed h = explain_fixture("06_self_explaining_6_no_header.txt");  // 20.00 MiB = kLargeBuffer
  EXPECT_EQ(h.ex.request_min_bytes, kMiB + 1);
  EXPECT_EQ(h.ex.request_max_bytes, 10 * kMiB - 1);
}

TEST(OomExplain, ImpossibleValuesAreNotTrusted) {
  Parsed s = explain_fixture("13_seamless_341_nvml_sentinel.txt");
  EXPECT_FALSE(s.ex.this_process_bytes.has_value());
  EXPECT_FALSE(s.ex.non_pytorch_bytes.has_value());
  EXPECT_FALSE(s.ex.unexplained_bytes.has_value());
  EXPECT_EQ(s.ex.warnings.size(), 1u);
  Parsed m = explain_fixture("17_meshgen_7_allocated_gt_capacity.txt");
  EXPECT_FALSE(m.ex.other_processes_bytes.has_value());
  EXPECT_FALSE(m.ex.unexplained_bytes.has_value());
  EXPECT_FALSE(m.ex.levers.empty());
  EXPECT_FALSE(m.ex.levers[0].pointed);  // nothing trustworthy to point at: the guide's order
  Parsed t = explain_fixture("21_isaac_gr00t_536_truncated.txt");  // cut inside the process list
  EXPECT_EQ(t.ex.this_process_bytes, 33436320399u);                   // 31.14 GiB
  EXPECT_FALSE(t.ex.other_processes_bytes.has_value());
  EXPECT_FALSE(t.ex.unexplained_bytes.has_value());
}

TEST(OomExplain, MpsOtherAllocations) {
  Parsed p = explain_fixture("27_comfyui_7440_mps_gib_repeated.txt");
  EXPECT_EQ(p.ex.levers[0].name, "free_card");
  EXPECT_NE(p.ex.levers[0].why.find("17.35 GiB"), std::string::npos);
  EXPECT_NE(p.ex.notes[0].find("4 out-of-memory messages"), std::string::npos);
  EXPECT_NE(p.ex.notes[0].find("repeat"), std::string::npos);
}

TEST(OomExplain, ChangesPolicyTable) {
  // docs/mem-oom.md "Which levers change what the policy learns".
  const std::pair<const char*, bool> table[] = {
      {"free_card", false}, {"dtype", true},  {"halve_batch", true},  {"grad_accumulation", false},
      {"gradient_checkpointing", false},      {"freeze", true},       {"lora", true},
      {"shrink_inputs", true},                {"allocator", false},   {"bigger_card", false},
  };
  Parsed p = explain_fixture("11_pytorch_pr99699_wrapped.txt");
  for (const auto& [name, changes] : table) {
    bool seen = false;
    for (const auto& l : p.ex.levers)
      if (l.name == name) {
        seen = true;
        EXPECT_EQ(l.changes_policy, changes) << name;
      }
    EXPECT_TRUE(seen) << name;
  }
}

TEST(OomExplain, EveryFixtureExplainsAndRendersValidJson) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/oom")) {
    if (e.path().extension() != ".txt") continue;
    ++n;
    std::string name = e.path().filename().string();
    Parsed p = explain_fixture(name);
    ASSERT_FALSE(p.ex.levers.empty()) << name;
    std::set<std::string> uniq;
    for (const auto& l : p.ex.levers) {
      EXPECT_TRUE(uniq.insert(l.name).second) << name << " repeats " << l.name;
      EXPECT_FALSE(l.why.empty()) << name << " " << l.name;
      EXPECT_FALSE(l.how.empty()) << name << " " << l.name;
    }
    auto j = nlohmann::json::parse(oom_report_json(p.msg, p.ex), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << name;
    for (const char* k : {"kind", "tried_to_allocate_bytes", "total_capacity_bytes", "free_bytes",
                          "allocated_by_pytorch_bytes", "reserved_unallocated_bytes", "processes", "levers",
                          "reserved_bytes", "this_process_bytes", "non_pytorch_bytes", "other_processes_bytes",
                          "fragmentation_ratio", "allocator_env_var", "torch_generation", "warnings"})
      EXPECT_TRUE(j.contains(k)) << name << " lacks " << k;
    EXPECT_EQ(j["kind"], to_string(p.msg.kind));
    EXPECT_EQ(j["levers"].size(), p.ex.levers.size());
    std::string text = oom_report_text(p.msg, p.ex);
    EXPECT_NE(text.find("levers, in order"), std::string::npos) << name;
  }
  EXPECT_GE(n, 34u);
}

}  // namespace
}  // namespace vlac::diag
