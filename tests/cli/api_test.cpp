// The public API (include/vlac/vlac.h): errors come back as values with the CLI's exit codes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "io/safetensors_writer.h"
#include "vlac/vlac.h"

namespace fs = std::filesystem;

TEST(PublicApi, ConvertAndSummarize) {
  std::string dir_t = (fs::temp_directory_path() / "vlac-api-XXXXXX").string();
  fs::path dir = mkdtemp(dir_t.data());
  fs::path in = dir / "in.safetensors";
  {
    auto w = vlac::SafetensorsWriter::create(in.string(), {{"a.w", vlac::DType::F32, {2, 2}}});
    ASSERT_TRUE(w.is_ok()) << w.status().message();
    const float v[4] = {1.0f, -2.5f, 3.0e-3f, 65536.0f};
    ASSERT_TRUE(w->write(v, sizeof v).is_ok());
    ASSERT_TRUE(w->finish().is_ok());
  }
  vlac::api::ConvertRequest req;
  req.input = in.string();
  req.output = (dir / "out.safetensors").string();
  EXPECT_FALSE(vlac::api::convert(req));
  vlac::api::CheckpointSummary s;
  ASSERT_FALSE(vlac::api::summarize_checkpoint(req.output, &s));
  EXPECT_EQ(s.n_tensors, 1u);
  EXPECT_EQ(s.total_bytes, 8u);  // 4 bf16 values

  req.dtype = "int3";
  vlac::api::Error e = vlac::api::convert(req);
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_FALSE(e.message.empty());
  vlac::api::Error missing = vlac::api::summarize_checkpoint((dir / "nope.safetensors").string(), &s);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.message.find("nope.safetensors"), std::string::npos);
  fs::remove_all(dir);
}
