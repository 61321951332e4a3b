#include "util/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace stowage::util {
namespace {

#if defined(__SSE2__)
constexpr size_t kLineBytes = 64;
constexpr size_t kPageBytes = 4096;
constexpr size_t kPagesAtATime = 4;

// Four pages, line by line across them. REQUIRES: `to` is line-aligned.
void stream_pages(char* to, const char* from) {
  for (size_t line = 0; line < kPageBytes; line += kLineBytes) {
    for (size_t page = 0; page < kPagesAtATime; ++page) {
      const size_t at = page * kPageBytes + line;
      const auto* source = reinterpret_cast<const __m128i*>(from + at);
      auto* destination = reinterpret_cast<__m128i*>(to + at);
      const __m128i a = _mm_loadu_si128(source);
      const __m128i b = _mm_loadu_si128(source + 1);
      const __m128i c = _mm_loadu_si128(source + 2);
      const __m128i d = _mm_loadu_si128(source + 3);
      _mm_stream_si128(destination, a);
      _mm_stream_si128(destination + 1, b);
      _mm_stream_si128(destination + 2, c);
      _mm_stream_si128(destination + 3, d);
    }
  }
}
#endif

}  // namespace

void copy_streaming(void* destination, const void* source, size_t length) {
#if defined(__SSE2__)
  if (length < kStreamingCopyMinBytes) {
    std::memcpy(destination, source, length);
    return;
  }
  auto* to = static_cast<char*>(destination);
  const auto* from = static_cast<const char*>(source);
  const size_t head = (kLineBytes - reinterpret_cast<uintptr_t>(to) % kLineBytes) % kLineBytes;
  std::memcpy(to, from, head);
  size_t done = head;
  for (; done + kPagesAtATime * kPageBytes <= length; done += kPagesAtATime * kPageBytes) {
    stream_pages(to + done, from + done);
  }
  _mm_sfence();  // streaming stores are weakly ordered: they land before what follows
  std::memcpy(to + done, from + done, length - done);
#else
  std::memcpy(destination, source, length);
#endif
}

}  // namespace stowage::util
