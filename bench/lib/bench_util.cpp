#include "bench_util.h"

#include <cstdlib>

namespace stowage::bench {

std::string temp_directory() {
  const char* dir = std::getenv("TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

}  // namespace stowage::bench
