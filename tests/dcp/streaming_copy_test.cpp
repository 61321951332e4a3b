// util::copy_streaming, the copy of a checkpoint's bytes into a mapping and of a load's
// into its tensors: every byte lands, whatever the lengths and the alignments of either
// end, and nothing past the destination's end is touched.

#include "util/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

namespace stowage::util {
namespace {

TEST(StreamingCopy, CopiesEveryByteAtAnyLengthAndAlignmentAndNothingPastTheEnd) {
  constexpr size_t kGuard = 256;
  const size_t largest = 3 * kStreamingCopyMinBytes + 4096 * 5 + 77;
  std::vector<uint8_t> source(largest + 64);
  std::mt19937 random(7);
  for (uint8_t& byte : source) byte = static_cast<uint8_t>(random());
  const std::vector<size_t> lengths = {0,
                                       1,
                                       63,
                                       4096,
                                       kStreamingCopyMinBytes - 1,
                                       kStreamingCopyMinBytes,
                                       kStreamingCopyMinBytes + 1,
                                       2 * kStreamingCopyMinBytes + 16384 + 4095,
                                       largest};
  for (const size_t length : lengths) {
    for (const size_t source_offset : {0, 3, 16, 64}) {
      for (const size_t destination_offset : {0, 5, 48, 64}) {
        std::vector<uint8_t> destination(kGuard + destination_offset + length + kGuard, 0xA5);
        copy_streaming(destination.data() + kGuard + destination_offset, source.data() + source_offset, length);
        const uint8_t* copied = destination.data() + kGuard + destination_offset;
        size_t wrong = 0;
        for (size_t i = 0; i < length; ++i) wrong += copied[i] != source[source_offset + i];
        size_t touched = 0;
        for (size_t i = 0; i < kGuard + destination_offset; ++i) touched += destination[i] != 0xA5;
        for (size_t i = kGuard + destination_offset + length; i < destination.size(); ++i) {
          touched += destination[i] != 0xA5;
        }
        EXPECT_EQ(wrong, 0u) << "length " << length << ", offsets " << source_offset << " -> " << destination_offset;
        EXPECT_EQ(touched, 0u) << "length " << length << ", offsets " << source_offset << " -> " << destination_offset;
      }
    }
  }
}

}  // namespace
}  // namespace stowage::util
