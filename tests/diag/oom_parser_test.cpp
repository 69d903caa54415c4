// Parser tests: every field of every real message in tests/fixtures/oom (see SOURCES.md), plus
// wording variants, log noise, sizes at unit boundaries, non-OOM input and hostile input.
// Expected bytes were computed independently (Python integers) from the printed values.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "diag/oom_parser.h"

namespace vlac::diag {
namespace {

std::string read_fixture(const std::string& name) {
  std::ifstream f(std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/oom/" + name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct S {
  const char* text = nullptr;  // nullptr: the field is absent
  uint64_t bytes = 0;
};
struct P {
  std::optional<uint64_t> pid;
  S used;
  bool self;
};
struct Expect {
  const char* file;
  OomKind kind;
  bool kind_assumed;
  OomWording wording;
  const char* exception;
  int device;  // -1: none
  S tried, capacity, free, allowed;
  S allocated, private_pools, unallocated, reserved_total;
  std::vector<P> processes;
  S mps_allocated, mps_other, mps_max;
  const char* mps_pool;
  std::vector<bool> flags;  // max_split, expandable, empty_cache, mps_watermark, graphs_hip, capacity_typo
  const char* env_var;
  const char* docs_url;
  bool truncated;
  size_t n_messages;
  bool differ;
  std::vector<const char*> warnings;  // exactly this many warnings, each containing the text
};

const std::vector<Expect>& expectations() {
  static const std::vector<Expect> kAll = {
    {"01_pytorch_16417_cached.txt", OomKind::Cuda, false, OomWording::Cached, "RuntimeError", 0,
     S{"12.50 MiB", 13107200ull}, S{"10.92 GiB", 11725260718ull}, S{"9.28 GiB", 9964324127ull}, S{},
     S{"8.57 MiB", 8986296ull}, S{}, S{"4.68 MiB", 4907336ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, false, false, false, false, false}, "", "", false, 1, false,
     {}},
    {"02_afm_cvpr2019_8_cached_kib.txt", OomKind::Cuda, false, OomWording::Cached, "RuntimeError", 0,
     S{"25.00 MiB", 26214400ull}, S{"3.94 GiB", 4230542787ull}, S{"21.56 MiB", 22607299ull}, S{},
     S{"3.14 GiB", 3371549327ull}, S{}, S{"634.00 KiB", 649216ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, false, false, false, false, false}, "", "", false, 1, false,
     {}},
    {"03_generativegraph_5_cached_1024kib.txt", OomKind::Cuda, false, OomWording::Cached, "RuntimeError", 0,
     S{"1024.00 KiB", 1048576ull}, S{"11.17 GiB", 11993696174ull}, S{"576.00 KiB", 589824ull}, S{},
     S{"10.90 GiB", 11703785882ull}, S{}, S{"30.96 MiB", 32463913ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, false, false, false, false, false}, "", "", false, 1, false,
     {}},
    {"04_bert_ner_10_cached.txt", OomKind::Cuda, false, OomWording::Cached, "RuntimeError", 0,
     S{"85.00 MiB", 89128960ull}, S{"4.00 GiB", 4294967296ull}, S{"9.21 MiB", 9657385ull}, S{},
     S{"3.04 GiB", 3264175145ull}, S{}, S{"15.31 MiB", 16053699ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, false, false, false, false, false}, "", "", false, 1, false,
     {}},
    {"05_pytorch_59778_reserved.txt", OomKind::Cuda, false, OomWording::ReservedTotal, "", 0,
     S{"2.26 GiB", 2426656522ull}, S{"6.00 GiB", 6442450944ull}, S{"3.03 GiB", 3253437727ull}, S{},
     S{"781.59 MiB", 819556516ull}, S{}, S{}, S{"1.24 GiB", 1331439862ull},
     {},
     S{}, S{}, S{}, "",
     {false, false, false, false, false, false}, "", "", false, 1, false,
     {}},
    {"06_self_explaining_6_no_header.txt", OomKind::Cuda, true, OomWording::ReservedTotal, "", 0,
     S{"20.00 MiB", 20971520ull}, S{"1.96 GiB", 2104533975ull}, S{"2.88 MiB", 3019899ull}, S{},
     S{"1.24 GiB", 1331439862ull}, S{}, S{}, S{"1.25 GiB", 1342177280ull},
     {},
     S{}, S{}, S{}, "",
     {false, false, false, false, false, false}, "", "", false, 1, false,
     {"first words are cut off"}},
    {"07_pct_pytorch_27_max_split.txt", OomKind::Cuda, false, OomWording::ReservedTotal, "RuntimeError", 0,
     S{"16.00 MiB", 16777216ull}, S{"3.94 GiB", 4230542787ull}, S{"14.25 MiB", 14942208ull}, S{},
     S{"2.98 GiB", 3199750636ull}, S{}, S{}, S{"3.00 GiB", 3221225472ull},
     {},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {}},
    {"08_ipassr_9_allocated_gt_capacity.txt", OomKind::Cuda, false, OomWording::ReservedTotal, "torch.cuda.OutOfMemoryError", 0,
     S{"10.73 GiB", 11521249772ull}, S{"8.00 GiB", 8589934592ull}, S{"0 bytes", 0ull}, S{},
     S{"17.20 GiB", 18468359373ull}, S{}, S{}, S{"19.15 GiB", 20562155930ull},
     {},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {"allocated by PyTorch (17.20 GiB) exceeds the total capacity", "reserved in total by PyTorch (19.15 GiB) exceeds the total capacity"}},
    {"09_rlafford_5_truncated.txt", OomKind::Cuda, false, OomWording::ReservedTotal, "torch.cuda.OutOfMemoryError", 2,
     S{"1.42 GiB", 1524713390ull}, S{"11.78 GiB", 12648678687ull}, S{"1.32 GiB", 1417339208ull}, S{},
     S{"8.01 GiB", 8600672010ull}, S{}, S{}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, false, false, false, false, false}, "", "", true, 1, false,
     {"cut inside the field '9.29 GiB res"}},
    {"10_vlm_rl_12_html_entities.txt", OomKind::Cuda, false, OomWording::ReservedTotal, "torch.cuda.OutOfMemoryError", 0,
     S{"258.00 MiB", 270532608ull}, S{"23.54 GiB", 25275882537ull}, S{"572.50 MiB", 600309760ull}, S{},
     S{"11.75 GiB", 12616466432ull}, S{}, S{}, S{"12.40 GiB", 13314398618ull},
     {},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {}},
    {"11_pytorch_pr99699_wrapped.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.cuda.OutOfMemoryError", 0,
     S{"138.00 MiB", 144703488ull}, S{"15.90 GiB", 17072495002ull}, S{"8.44 MiB", 8849981ull}, S{},
     S{"14.12 GiB", 15161234555ull}, S{}, S{"410.41 MiB", 430346076ull}, S{},
     {P{1246069ull, S{"577.00 MiB", 605028352ull}, false}, P{std::nullopt, S{"15.32 GiB", 16449724744ull}, true}},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, true}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {}},
    {"12_mgfn_35_capacty_zero_free.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.cuda.OutOfMemoryError", 0,
     S{"1.70 GiB", 1825361101ull}, S{"6.00 GiB", 6442450944ull}, S{"0 bytes", 0ull}, S{},
     S{"2.93 GiB", 3146063544ull}, S{}, S{"2.30 GiB", 2469606195ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, true}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {}},
    {"13_seamless_341_nvml_sentinel.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.cuda.OutOfMemoryError", 0,
     S{"318.00 MiB", 333447168ull}, S{"6.00 GiB", 6442450944ull}, S{"0 bytes", 0ull}, S{},
     S{"5.00 GiB", 5368709120ull}, S{}, S{"271.88 MiB", 285086843ull}, S{},
     {P{std::nullopt, S{}, true}},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, true}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {"17179869184.00 GiB memory in use: that is 2^64 bytes"}},
    {"14_mygirlgpt_11_capacty_self.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.cuda.OutOfMemoryError", 0,
     S{"32.00 MiB", 33554432ull}, S{"4.00 GiB", 4294967296ull}, S{"41.56 MiB", 43578819ull}, S{},
     S{"2.58 GiB", 2770253906ull}, S{}, S{"1.90 MiB", 1992294ull}, S{},
     {P{std::nullopt, S{"3.44 GiB", 3693671875ull}, true}},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, true}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {}},
    {"15_cads_4_large_reserved_unallocated.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"22.78 GiB", 24459838751ull}, S{"31.47 GiB", 33790655201ull}, S{"12.73 GiB", 13668733420ull}, S{},
     S{"9.08 GiB", 9749575762ull}, S{}, S{"9.35 GiB", 10039486054ull}, S{},
     {P{std::nullopt, S{"18.73 GiB", 20111184364ull}, true}},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {}},
    {"16_neurolens_2_request_gt_card.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.cuda.OutOfMemoryError", 0,
     S{"55.57 GiB", 59667833160ull}, S{"12.00 GiB", 12884901888ull}, S{"9.02 GiB", 9685151252ull}, S{},
     S{"984.52 MiB", 1032344044ull}, S{}, S{"463.48 MiB", 485994004ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, true}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {}},
    {"17_meshgen_7_allocated_gt_capacity.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"1002.00 MiB", 1050673152ull}, S{"8.00 GiB", 8589934592ull}, S{"0 bytes", 0ull}, S{},
     S{"13.98 GiB", 15010910700ull}, S{}, S{"129.48 MiB", 135769620ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {"allocated by PyTorch (13.98 GiB) exceeds the total capacity (8.00 GiB)"}},
    {"18_keys_values_92_rank_multi_process.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"572.00 MiB", 599785472ull}, S{"39.49 GiB", 42402064630ull}, S{"321.31 MiB", 336917955ull}, S{},
     S{"36.04 GiB", 38697655337ull}, S{}, S{"321.37 MiB", 336980869ull}, S{},
     {P{3721648ull, S{"414.00 MiB", 434110464ull}, false}, P{std::nullopt, S{"37.46 GiB", 40222368727ull}, true}, P{1374765ull, S{"414.00 MiB", 434110464ull}, false}, P{1374763ull, S{"414.00 MiB", 434110464ull}, false}, P{1374764ull, S{"414.00 MiB", 434110464ull}, false}},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {}},
    {"19_llava_next_2_colab_process.txt", OomKind::Cuda, false, OomWording::Sentence, "OutOfMemoryError", 0,
     S{"224.00 MiB", 234881024ull}, S{"14.75 GiB", 15837691904ull}, S{"7.06 MiB", 7402947ull}, S{},
     S{"14.04 GiB", 15075335209ull}, S{}, S{"580.33 MiB", 608520110ull}, S{},
     {P{130036ull, S{"14.74 GiB", 15826954486ull}, false}},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {}},
    {"20_pytorch_16417_comment_2x.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.cuda.OutOfMemoryError", 0,
     S{"22.00 MiB", 23068672ull}, S{"23.65 GiB", 25393994138ull}, S{"11.06 MiB", 11597251ull}, S{},
     S{"22.90 GiB", 24588687770ull}, S{}, S{"194.87 MiB", 204336005ull}, S{},
     {P{std::nullopt, S{"23.60 GiB", 25340307046ull}, true}},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {}},
    {"21_isaac_gr00t_536_truncated.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"20.00 MiB", 20971520ull}, S{"31.34 GiB", 33651068764ull}, S{"31.38 MiB", 32904315ull}, S{},
     S{}, S{}, S{}, S{},
     {P{std::nullopt, S{"31.14 GiB", 33436320399ull}, true}},
     S{}, S{}, S{}, "",
     {false, false, false, false, false, false}, "", "", true, 1, false,
     {"the paste ends after 'this process has 31.14 GiB'"}},
    {"22_framepack_369_request_gt_card.txt", OomKind::Cuda, false, OomWording::Sentence, "", 0,
     S{"30.29 GiB", 32523639849ull}, S{"10.74 GiB", 11531987190ull}, S{"3.69 GiB", 3962107331ull}, S{},
     S{"6.10 GiB", 6549825126ull}, S{}, S{"396.58 MiB", 415844270ull}, S{},
     {P{std::nullopt, S{"6.68 GiB", 7172595384ull}, true}},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {}},
    {"23_comfyui_9529_hip_hip_conf.txt", OomKind::Hip, false, OomWording::Sentence, "", 0,
     S{"432.00 MiB", 452984832ull}, S{"15.92 GiB", 17093969838ull}, S{"7.12 GiB", 7645041787ull}, S{},
     S{"8.08 GiB", 8675833938ull}, S{}, S{"321.96 MiB", 337599529ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_HIP_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {}},
    {"24_z_image_103_hip_cuda_conf.txt", OomKind::Hip, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"1.88 GiB", 2018634629ull}, S{"23.98 GiB", 25748328940ull}, S{"1.70 GiB", 1825361101ull}, S{},
     S{"21.65 GiB", 23246510490ull}, S{}, S{"279.78 MiB", 293370593ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {}},
    {"25_therock_1054_hip_request_gt_card.txt", OomKind::Hip, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"16.00 GiB", 17179869184ull}, S{"15.24 GiB", 16363825398ull}, S{"15.09 GiB", 16202764124ull}, S{},
     S{"0 bytes", 0ull}, S{}, S{"0 bytes", 0ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_HIP_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 1, false,
     {}},
    {"26_therock_2118_hip_ci_allowed_private_pools.txt", OomKind::Hip, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"2.00 MiB", 2097152ull}, S{"255.98 GiB", 274856432108ull}, S{"244.65 GiB", 262690937242ull}, S{"1.05 GiB", 1127428915ull},
     S{"1017.01 MiB", 1066412278ull}, S{"17.00 MiB", 17825792ull}, S{"54.99 MiB", 57661194ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, true, false, false, true, false}, "PYTORCH_CUDA_ALLOC_CONF", "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables", false, 2, true,
     {}},
    {"27_comfyui_7440_mps_gib_repeated.txt", OomKind::Mps, false, OomWording::Mps, "", -1,
     S{"292.50 MiB", 306708480ull}, S{}, S{}, S{},
     S{}, S{}, S{}, S{},
     {},
     S{"9.57 GiB", 10275709256ull}, S{"17.35 GiB", 18629420646ull}, S{"27.20 GiB", 29205777613ull}, "private",
     {false, false, false, true, false, false}, "", "", false, 4, false,
     {}},
    {"28_fooocus_1139_mps_gb.txt", OomKind::Mps, false, OomWording::Mps, "RuntimeError", -1,
     S{"6.25 MB", 6553600ull}, S{}, S{}, S{},
     S{}, S{}, S{}, S{},
     {},
     S{"8.89 GB", 9545564815ull}, S{"172.98 MB", 181382676ull}, S{"9.07 GB", 9738838344ull}, "private",
     {false, false, false, true, false, false}, "", "", false, 1, false,
     {}},
    {"29_pinokio_941_mps_bytes_shared.txt", OomKind::Mps, false, OomWording::Mps, "", -1,
     S{"256 bytes", 256ull}, S{}, S{}, S{},
     S{}, S{}, S{}, S{},
     {},
     S{"16.00 GB", 17179869184ull}, S{"3.31 GB", 3554085437ull}, S{"18.13 GB", 19466939269ull}, "shared",
     {false, false, false, true, false, false}, "", "", false, 1, false,
     {}},
    {"30_torch_xpu_ops_2392_xpu_allowed.txt", OomKind::Xpu, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"8.11 GiB", 8708046193ull}, S{"16.54 GiB", 17759689769ull}, S{"16.54 GiB", 17759689769ull}, S{"8.27 GiB", 8879844884ull},
     S{"0 bytes", 0ull}, S{}, S{"0 bytes", 0ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, false, true, false, false, false}, "", "", false, 1, false,
     {}},
    {"31_torch_xpu_ops_3011_xpu.txt", OomKind::Xpu, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"4.66 GiB", 5003636900ull}, S{"5.65 GiB", 6066641306ull}, S{"5.65 GiB", 6066641306ull}, S{},
     S{"195.50 KiB", 200192ull}, S{}, S{"1.81 MiB", 1897923ull}, S{},
     {},
     S{}, S{}, S{}, "",
     {false, false, true, false, false, false}, "", "", false, 1, false,
     {}},
    {"32_lerf_73_capacty_non_pytorch.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.cuda.OutOfMemoryError", 0,
     S{"3.00 GiB", 3221225472ull}, S{"23.65 GiB", 25393994138ull}, S{"1.66 GiB", 1782411428ull}, S{},
     S{"12.09 GiB", 12981538652ull}, S{}, S{"4.84 GiB", 5196910428ull}, S{},
     {P{std::nullopt, S{"20.81 GiB", 22344567357ull}, true}},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, true}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {}},
    {"33_cogvideo_36_reserved_hint_cut.txt", OomKind::Cuda, false, OomWording::ReservedTotal, "torch.cuda.OutOfMemoryError", 0,
     S{"4.56 GiB", 4896262717ull}, S{"23.68 GiB", 25426206392ull}, S{"2.84 GiB", 3049426780ull}, S{},
     S{"18.96 GiB", 20358144983ull}, S{}, S{}, S{"18.97 GiB", 20368882401ull},
     {},
     S{}, S{}, S{}, "",
     {true, false, false, false, false, false}, "", "", false, 1, false,
     {}},
    {"guide_80gb.txt", OomKind::Cuda, false, OomWording::Sentence, "torch.OutOfMemoryError", 0,
     S{"2.34 GiB", 2512555868ull}, S{"79.15 GiB", 84986665370ull}, S{"812.00 MiB", 851443712ull}, S{},
     S{"71.02 GiB", 76257144340ull}, S{}, S{"5.61 GiB", 6023691633ull}, S{},
     {P{21874ull, S{"78.35 GiB", 84127671910ull}, false}},
     S{}, S{}, S{}, "",
     {false, true, false, false, false, false}, "PYTORCH_CUDA_ALLOC_CONF", "", false, 1, false,
     {}},
  };
  return kAll;
}

void check_size(const std::string& ctx, const char* field, const std::optional<PrintedSize>& got, const S& want) {
  if (!want.text) {
    EXPECT_FALSE(got.has_value()) << ctx << ": " << field << " should be absent, got " << (got ? got->text : "");
    return;
  }
  ASSERT_TRUE(got.has_value()) << ctx << ": " << field << " missing";
  EXPECT_EQ(got->text, want.text) << ctx << ": " << field;
  EXPECT_EQ(got->bytes, want.bytes) << ctx << ": " << field;
}

TEST(OomParser, EveryFieldOfEveryRealMessage) {
  ASSERT_GE(expectations().size(), 33u);
  for (const Expect& e : expectations()) {
    std::string ctx = e.file;
    std::string text = read_fixture(e.file);
    ASSERT_FALSE(text.empty()) << ctx;
    auto r = parse_oom(text, e.file);
    ASSERT_TRUE(r.is_ok()) << ctx << ": " << r.status().message();
    const OomMessage& m = r.value();
    EXPECT_EQ(m.kind, e.kind) << ctx;
    EXPECT_EQ(m.kind_assumed, e.kind_assumed) << ctx;
    EXPECT_EQ(m.wording, e.wording) << ctx;
    EXPECT_EQ(m.exception_type, e.exception) << ctx;
    if (e.device < 0) EXPECT_FALSE(m.device.has_value()) << ctx;
    else EXPECT_EQ(m.device, e.device) << ctx;
    check_size(ctx, "tried_to_allocate", m.tried_to_allocate, e.tried);
    check_size(ctx, "total_capacity", m.total_capacity, e.capacity);
    check_size(ctx, "free", m.free, e.free);
    check_size(ctx, "allowed", m.allowed, e.allowed);
    check_size(ctx, "allocated_by_pytorch", m.allocated_by_pytorch, e.allocated);
    check_size(ctx, "private_pools", m.private_pools, e.private_pools);
    check_size(ctx, "reserved_unallocated", m.reserved_unallocated, e.unallocated);
    check_size(ctx, "reserved_total", m.reserved_total, e.reserved_total);
    check_size(ctx, "mps_allocated", m.mps_allocated, e.mps_allocated);
    check_size(ctx, "mps_other", m.mps_other, e.mps_other);
    check_size(ctx, "mps_max_allowed", m.mps_max_allowed, e.mps_max);
    EXPECT_EQ(m.mps_pool, e.mps_pool) << ctx;
    ASSERT_EQ(m.processes.size(), e.processes.size()) << ctx;
    for (size_t i = 0; i < e.processes.size(); ++i) {
      std::string pctx = ctx + " process #" + std::to_string(i);
      EXPECT_EQ(m.processes[i].pid, e.processes[i].pid) << pctx;
      EXPECT_EQ(m.processes[i].is_self, e.processes[i].self) << pctx;
      check_size(pctx, "used", m.processes[i].used, e.processes[i].used);
    }
    ASSERT_EQ(e.flags.size(), 6u);
    EXPECT_EQ(m.hint_max_split, e.flags[0]) << ctx;
    EXPECT_EQ(m.hint_expandable, e.flags[1]) << ctx;
    EXPECT_EQ(m.hint_empty_cache, e.flags[2]) << ctx;
    EXPECT_EQ(m.hint_mps_watermark, e.flags[3]) << ctx;
    EXPECT_EQ(m.graphs_hip, e.flags[4]) << ctx;
    EXPECT_EQ(m.capacity_typo, e.flags[5]) << ctx;
    EXPECT_EQ(m.hint_env_var, e.env_var) << ctx;
    EXPECT_EQ(m.docs_url, e.docs_url) << ctx;
    EXPECT_EQ(m.truncated, e.truncated) << ctx;
    EXPECT_EQ(m.n_messages, e.n_messages) << ctx;
    EXPECT_EQ(m.messages_differ, e.differ) << ctx;
    EXPECT_EQ(m.warnings.size(), e.warnings.size()) << ctx << ": " << (m.warnings.empty() ? "" : m.warnings[0]);
    for (const char* w : e.warnings) {
      bool found = false;
      for (const auto& g : m.warnings) found |= g.find(w) != std::string::npos;
      EXPECT_TRUE(found) << ctx << ": no warning containing '" << w << "'";
    }
  }
}

TEST(OomParser, SizesAsPyTorchPrintsThem) {
  // format_size: <= 1024 -> "N bytes"; <= 1 MiB -> KiB; <= 1 GiB -> MiB; else GiB, two decimals.
  struct C { const char* text; uint64_t bytes; uint64_t unc; };
  const C cases[] = {
      {"0 bytes", 0, 0},
      {"1024 bytes", 1024, 0},
      {"1.00 KiB", 1024, 5},
      {"1024.00 KiB", 1048576, 5},
      {"1024.00 MiB", 1073741824, 5242},
      {"2.34 GiB", 2512555868, 5368709},
      {"812.00 MiB", 851443712, 5242},
      {"0.01 KiB", 10, 5},
      {"9.07 GB", 9738838344, 5368709},  // old MPS: "GB" but 1024-based
      {"172.98 MB", 181382676, 5242},
      {"256 bytes", 256, 0},
      {"12.5 MiB", 13107200, 52428},
      {"17179869183.99 GiB", 18446744073698814198ull, 5368709},
  };
  for (const auto& c : cases) {
    auto s = parse_printed_size(c.text);
    ASSERT_TRUE(s.has_value()) << c.text;
    EXPECT_EQ(s->bytes, c.bytes) << c.text;
    EXPECT_EQ(s->uncertainty, c.unc) << c.text;
  }
  EXPECT_FALSE(parse_printed_size("17179869184.00 GiB"));  // 2^64: does not fit
  EXPECT_FALSE(parse_printed_size("99999999999999999999999 GiB"));
  EXPECT_FALSE(parse_printed_size("12 parsecs"));
  EXPECT_FALSE(parse_printed_size("GiB"));
  EXPECT_FALSE(parse_printed_size(""));
  EXPECT_FALSE(parse_printed_size("1.5 GiB extra"));
}

TEST(OomParser, NormalizeStripsLogPrefixesAndJoinsLines) {
  EXPECT_EQ(normalize_log_text("[rank3]: a\n[rank3]:   b"), "a b");
  EXPECT_EQ(normalize_log_text("2025-11-12T11:25:13.4971964Z hello\n2025-07-18 11:07:06.132422: W x"), "hello W x");
  EXPECT_EQ(normalize_log_text("(Worker_TP0 pid=548) ERROR 07-29 21:48:54 [multiproc_executor.py:962] text"), "text");
  EXPECT_EQ(normalize_log_text("E       torch.OutOfMemoryError: x\n> quoted"), "torch.OutOfMemoryError: x quoted");
  EXPECT_EQ(normalize_log_text("a &gt;&gt; b **bold** `code` max\\_split"), "a >> b bold code max_split");
  EXPECT_EQ(normalize_log_text("  many   spaces\t\ttabs\r\n"), "many spaces tabs");
}

// The 2.x template as CUDACachingAllocator.cpp assembles it (see docs/mem-oom.md).
std::string sentence(const std::string& procs, const std::string& middle, const std::string& env) {
  return "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of "
         "23.64 GiB of which 3.12 MiB is free. " + procs + middle +
         "and 1.02 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
         "setting " + env + "=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
         "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";
}

TEST(OomParser, PrivatePoolsAllowedAndNewLink) {
  std::string t = sentence("Process 7 has 14.85 GiB memory in use. Including non-PyTorch memory, this process has 8.70 GiB memory in use. ",
                           "1.00 GiB allowed; Of the allocated memory 7.10 GiB is allocated by PyTorch, with 512.00 MiB allocated in private pools (e.g., CUDA Graphs), ",
                           "PYTORCH_CUDA_ALLOC_CONF");
  auto r = parse_oom(t, "x");
  ASSERT_TRUE(r.is_ok());
  const auto& m = r.value();
  EXPECT_EQ(m.device, 1);
  ASSERT_TRUE(m.private_pools);
  EXPECT_EQ(m.private_pools->bytes, 512ull << 20);
  EXPECT_FALSE(m.graphs_hip);
  ASSERT_TRUE(m.allowed);
  EXPECT_EQ(m.allowed->bytes, 1ull << 30);
  ASSERT_EQ(m.processes.size(), 2u);
  EXPECT_EQ(m.processes[0].pid, 7u);
  EXPECT_TRUE(m.processes[1].is_self);
  EXPECT_EQ(m.docs_url, "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf");
  EXPECT_FALSE(m.truncated);
  EXPECT_TRUE(m.warnings.empty()) << m.warnings[0];
}

TEST(OomParser, MidWordWrapsAndPrefixedContinuationLines) {
  std::string t =
      "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capac\n"
      "[rank1]: ity of 79.19 GiB of which 39.06 MiB is free. Including non-PyTorch memory, this process ha\n"
      "[rank1]: s 79.14 GiB memory in use. Of the allocated memory 72.36 GiB is allocated by PyTorch, with 436.00 MiB\n"
      "[rank1]: allocated in private pools (e.g., CUDA Graphs), and 71.59 MiB is reserved by PyTorch but unallocated. If re\n"
      "[rank1]: served but unallocated memory is large try setting PYTOR\n"
      "[rank1]: CH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n";
  auto r = parse_oom(t, "x");
  ASSERT_TRUE(r.is_ok());
  const auto& m = r.value();
  EXPECT_FALSE(m.capacity_typo);
  ASSERT_TRUE(m.total_capacity);
  EXPECT_EQ(m.total_capacity->text, "79.19 GiB");
  ASSERT_EQ(m.processes.size(), 1u);
  EXPECT_EQ(m.processes[0].used->text, "79.14 GiB");
  EXPECT_EQ(m.private_pools->text, "436.00 MiB");
  EXPECT_EQ(m.reserved_unallocated->text, "71.59 MiB");
  EXPECT_EQ(m.hint_env_var, "PYTORCH_ALLOC_CONF");
  EXPECT_TRUE(m.hint_expandable);
  EXPECT_FALSE(m.truncated);
}

TEST(OomParser, ReprInsideAnotherLogAndPytestPrefix) {
  std::string t =
      "[W 2024-05-01 10:00:00,000] Trial 3 failed with value OutOfMemoryError('CUDA out of memory. Tried to allocate "
      "1.50 GiB. GPU 0 has a total capacity of 15.77 GiB of which 1.02 GiB is free. Of the allocated memory 13.90 GiB "
      "is allocated by PyTorch, and 420.55 MiB is reserved by PyTorch but unallocated.')\n";
  auto r = parse_oom(t, "x");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().exception_type, "OutOfMemoryError");
  EXPECT_EQ(r.value().free->text, "1.02 GiB");
  std::string p = "E       torch.OutOfMemoryError: XPU out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 15.11 GiB. "
                  "Of the allocated memory 14.90 GiB is allocated by PyTorch, and 12.00 MiB is reserved by PyTorch but unallocated. "
                  "Please use `empty_cache` to release all unoccupied cached memory.";
  auto x = parse_oom(p, "x");
  ASSERT_TRUE(x.is_ok());
  EXPECT_EQ(x.value().kind, OomKind::Xpu);
  EXPECT_FALSE(x.value().free.has_value());  // the early XPU wording prints no free memory
  EXPECT_TRUE(x.value().hint_empty_cache);
  EXPECT_FALSE(x.value().truncated);
}

TEST(OomParser, MpsWithoutWatermark) {
  auto r = parse_oom("RuntimeError: MPS backend out of memory (MPS allocated: 1.20 GiB, other allocations: 30.00 MiB). "
                     "Tried to allocate 2.00 GiB on shared pool.", "x");
  ASSERT_TRUE(r.is_ok());
  const auto& m = r.value();
  EXPECT_EQ(m.kind, OomKind::Mps);
  EXPECT_FALSE(m.mps_max_allowed.has_value());
  EXPECT_EQ(m.mps_pool, "shared");
  EXPECT_EQ(m.tried_to_allocate->bytes, 2ull << 30);
  EXPECT_FALSE(m.truncated);
}

TEST(OomParser, ImpossibleRequestIsFlagged) {
  auto r = parse_oom("CUDA out of memory. Tried to allocate 37252902.99 GiB. GPU 0 has a total capacity of 23.65 GiB "
                     "of which 21.50 GiB is free. Of the allocated memory 1.00 GiB is allocated by PyTorch, and 2.00 MiB "
                     "is reserved by PyTorch but unallocated.", "x");
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r.value().warnings.size(), 1u);
  EXPECT_NE(r.value().warnings[0].find("shape bug"), std::string::npos);
}

TEST(OomParser, DeviceGenericHeaderIsReadAsCuda) {
  auto r = parse_oom("torch.OutOfMemoryError: Out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                     "10.00 GiB of which 1.00 GiB is free. Of the allocated memory 8.00 GiB is allocated by PyTorch, and "
                     "512.00 MiB is reserved by PyTorch but unallocated.", "x");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().kind, OomKind::Cuda);
  EXPECT_TRUE(r.value().kind_assumed);
  ASSERT_EQ(r.value().warnings.size(), 1u);
  EXPECT_NE(r.value().warnings[0].find("names no device type"), std::string::npos);
}

TEST(OomParser, NotAnOomMessage) {
  struct C { std::string text; std::string has; };
  const std::vector<C> cases = {
      {"", ""},
      {"hello world\n", ""},
      {"RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", "CUDA error: out of memory"},
      {"RuntimeError: [enforce fail at alloc_cpu.cpp:114] . DefaultCPUAllocator: can't allocate memory: you tried to "
       "allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)", "DefaultCPUAllocator"},
      {"E0718 11:07:06.132657  193878 pjrt_stream_executor_client.cc:3077] Execution of replica 0 failed: "
       "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 535486464 bytes.", "JAX/XLA"},
      {"RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.", "OOM-killer"},
      {"Tried to allocate 5 textures", ""},
      {"CUDA out of memory.", ""},
  };
  for (const auto& c : cases) {
    auto r = parse_oom(c.text, "in.log");
    ASSERT_FALSE(r.is_ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::InvalidFormat);
    EXPECT_EQ(r.status().message().rfind("no PyTorch out-of-memory message found in in.log", 0), 0u) << r.status().message();
    if (!c.has.empty()) {
      EXPECT_NE(r.status().message().find(c.has), std::string::npos) << r.status().message();
    }
  }
}

TEST(OomParser, CutsAtEveryPositionNeverCrashAndStayConsistent) {
  // Every prefix of a real message: parsed or rejected, never a crash; a parsed prefix that is
  // shorter than the message is marked truncated unless only the hints were cut.
  std::string full = read_fixture("18_keys_values_92_rank_multi_process.txt");
  size_t core_end = full.find(" If reserved");
  for (size_t n = 0; n <= full.size(); ++n) {
    auto r = parse_oom(std::string_view(full).substr(0, n), "x");
    if (!r.is_ok()) continue;
    if (n < core_end) EXPECT_TRUE(r.value().truncated) << n;
    else EXPECT_FALSE(r.value().truncated) << n;
  }
}

TEST(OomParser, GarbageBinaryAndHugeInputs) {
  std::mt19937_64 rng(42);
  std::string bin(1 << 16, '\0');
  for (auto& c : bin) c = static_cast<char>(rng());
  EXPECT_FALSE(parse_oom(bin, "bin").is_ok());
  // Binary noise around a real message still finds it.
  std::string msg = read_fixture("guide_80gb.txt");
  auto r = parse_oom(bin + "\n" + msg + "\n" + bin, "bin");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().tried_to_allocate->text, "2.34 GiB");
  // 8 MiB of log with thousands of messages and near-misses: linear time, counts them all.
  std::string big;
  std::string line = "INFO step 12 loss 0.3 Tried to allocate memory out of memory CUDA out of memory. Tried to allocate\n";
  while (big.size() < (8u << 20)) big += line;
  big += msg;
  for (int i = 0; i < 2000; ++i) big += msg;
  auto b = parse_oom(big, "big");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b.value().n_messages, 2001u);
  EXPECT_FALSE(b.value().messages_differ);
  // Pathological repeats of pattern prefixes.
  std::string rep;
  for (int i = 0; i < 200000; ++i) rep += "Tried to allocate 1.0";
  EXPECT_FALSE(parse_oom(rep, "rep").is_ok());
  std::string digits = "CUDA out of memory. Tried to allocate " + std::string(100000, '9') + " GiB";
  EXPECT_FALSE(parse_oom(digits, "digits").is_ok() && parse_oom(digits, "digits").value().tried_to_allocate);
}

}  // namespace
}  // namespace vlac::diag
