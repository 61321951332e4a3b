// A count of bytes as text (stowage/byte_count.h): the unit picked at each boundary, the
// rounding to a tenth, and the exact form's count to the byte.
#include <stowage/byte_count.h>

#include <gtest/gtest.h>

#include <cstdint>

namespace stowage {
namespace {

TEST(ByteCount, InUnitsPicksTheLargestUnitTheCountReaches) {
  EXPECT_EQ(bytes_in_units(0), "0 B");
  EXPECT_EQ(bytes_in_units(1023), "1023 B");
  EXPECT_EQ(bytes_in_units(1024), "1.0 KiB");
  EXPECT_EQ(bytes_in_units(1536), "1.5 KiB");
  EXPECT_EQ(bytes_in_units((int64_t(1) << 20) - 1), "1024.0 KiB");  // rounds to a tenth, not up a unit
  EXPECT_EQ(bytes_in_units(int64_t(384) << 20), "384.0 MiB");
  EXPECT_EQ(bytes_in_units(int64_t(5) << 30), "5.0 GiB");
  EXPECT_EQ(bytes_in_units(int64_t(3) << 50), "3072.0 TiB");  // TiB is the largest unit
}

TEST(ByteCount, ExactlyGivesTheCountAndItsUnitsAboveAKiB) {
  EXPECT_EQ(bytes_exactly(512), "512 bytes");
  EXPECT_EQ(bytes_exactly(402653184), "402653184 bytes (384.0 MiB)");
  EXPECT_EQ(bytes_exactly(434176), "434176 bytes (424.0 KiB)");
}

}  // namespace
}  // namespace stowage
