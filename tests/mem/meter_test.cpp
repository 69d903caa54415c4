// The meter's GPU figures: absent -> null with the reason in gpu_probe; a probe -> numbers per phase.
#include <gtest/gtest.h>

#include <atomic>

#include "mem/meter.h"

namespace vlac {
namespace {

TEST(MemMeter, WithoutAProbeTheReportSaysWhyTheGpuFiguresAreNull) {
  MemMeter m("test");
  m.begin_phase("a");
  MemReport r = m.finish();
  ASSERT_EQ(r.phases.size(), 1u);
  EXPECT_FALSE(r.phases[0].peak_gpu_above_idle_bytes);
  EXPECT_FALSE(r.peak_gpu_above_idle_bytes);
  const std::string j = r.to_json();
  EXPECT_NE(j.find("\"peak_gpu_above_idle_bytes\": null"), std::string::npos);
  EXPECT_NE(j.find("\"gpu_probe\": \"none: no GPU probe installed"), std::string::npos) << j;
}

TEST(MemMeter, ANotedReasonIsReported) {
  MemMeter m("test");
  m.note_no_gpu_probe("the package's engines run on the host (cpu)");
  EXPECT_FALSE(m.gpu_above_idle_now());
  const std::string j = m.finish().to_json();
  EXPECT_NE(j.find("\"gpu_probe\": \"none: the package's engines run on the host (cpu)\""), std::string::npos) << j;
}

TEST(MemMeter, AProbeGivesGpuAboveIdlePerPhase) {
  std::atomic<uint64_t> used{1000};
  MemMeter m("test", std::chrono::microseconds(200));
  m.set_gpu_probe([&]() -> std::optional<uint64_t> { return used.load(); }, "fake");
  m.begin_phase("load");
  used = 1500;
  EXPECT_EQ(m.gpu_above_idle_now().value_or(-1), 500);
  m.begin_phase("run");  // the end of "load" samples 1500
  used = 1200;
  MemReport r = m.finish();
  ASSERT_EQ(r.phases.size(), 2u);
  ASSERT_TRUE(r.phases[0].peak_gpu_above_idle_bytes);
  EXPECT_EQ(*r.phases[0].peak_gpu_above_idle_bytes, 500);
  ASSERT_TRUE(r.phases[1].peak_gpu_above_idle_bytes);
  EXPECT_GE(*r.phases[1].peak_gpu_above_idle_bytes, 200);
  EXPECT_LE(*r.phases[1].peak_gpu_above_idle_bytes, 500);
  EXPECT_EQ(r.peak_gpu_above_idle_bytes.value_or(-1), 500);
  EXPECT_EQ(r.gpu_probe, "fake");
}

TEST(MemMeter, AProbeWithoutAnIdleReadingSaysSo) {
  MemMeter m("test");
  m.set_gpu_probe([]() -> std::optional<uint64_t> { return std::nullopt; }, "nvml");
  m.begin_phase("a");
  MemReport r = m.finish();
  EXPECT_FALSE(r.phases[0].peak_gpu_above_idle_bytes);
  EXPECT_NE(r.gpu_probe.find("none: the GPU probe (nvml) gave no reading at start"), std::string::npos) << r.gpu_probe;
}

}  // namespace
}  // namespace vlac
