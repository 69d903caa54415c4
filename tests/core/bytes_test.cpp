// Size formatting/parsing and Status plumbing.
#include <gtest/gtest.h>

#include "core/bytes.h"
#include "core/status.h"

namespace vlac {

TEST(Bytes, FormatsHumanReadable1024Based) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(static_cast<uint64_t>(41.2 * 1024 * 1024)), "41.2 MiB");
  EXPECT_EQ(format_bytes(3ull << 30), "3.00 GiB");
  EXPECT_EQ(format_bytes_signed(-2048), "-2.00 KiB");
  EXPECT_EQ(format_bytes_signed(38 << 20), "+38.0 MiB");
}

TEST(Bytes, ParsesSizes) {
  EXPECT_EQ(parse_size("512MiB").value(), 512ull << 20);
  EXPECT_EQ(parse_size("2GiB").value(), 2ull << 30);
  EXPECT_EQ(parse_size("1.5G").value(), 3ull << 29);
  EXPECT_EQ(parse_size("4096").value(), 4096u);
  EXPECT_FALSE(parse_size("").is_ok());
  EXPECT_FALSE(parse_size("-1").is_ok());
  EXPECT_FALSE(parse_size("12XB").is_ok());
  EXPECT_FALSE(parse_size("99999999999999999999TiB").is_ok());
  EXPECT_EQ(parse_size("1x").status().exit_code(), 2);
}

TEST(Status, ExitCodes) {
  EXPECT_EQ(Status::ok().exit_code(), 0);
  EXPECT_EQ(invalid_format("x").exit_code(), 2);
  EXPECT_EQ(io_error("x").exit_code(), 1);
  EXPECT_EQ(invalid_format("bad").with_context("f.safetensors").message(), "f.safetensors: bad");
}

}  // namespace vlac
