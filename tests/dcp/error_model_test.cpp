// The error model: util::throw_errno (src/util), the one place an errno becomes an error
// (NotFound for a missing file, IoError for the rest, each naming the path, the operation
// and the errno), the library's calls that fail on the system reporting that way, and the
// two errors once both called CheckpointError, whose old names still compile (deprecated).

#include "util/errno_error.h"

#include <stowage/activation/checkpoint.h>
#include <stowage/dcp/checkpoint.h>
#include <stowage/error.h>
#include <stowage/interop/open_checkpoint.h>
#include <stowage/memory/host_buffer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <type_traits>

namespace stowage::util {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;

TEST(ThrowErrno, AMissingFileIsNotFoundAndTheRestIoError) {
  for (const int error_number : {ENOENT, ENOTDIR, EACCES, ENOSPC}) {
    SCOPED_TRACE(std::strerror(error_number));
    try {
      throw_errno("cannot open '/x/y'", "/x/y", "open", error_number);
    } catch (const IoError& e) {
      EXPECT_EQ(dynamic_cast<const NotFound*>(&e) != nullptr, error_number == ENOENT || error_number == ENOTDIR);
      EXPECT_EQ(std::string(e.what()), std::string("cannot open '/x/y': ") + std::strerror(error_number));
      EXPECT_EQ(e.path(), "/x/y");
      EXPECT_EQ(e.operation(), "open");
      EXPECT_EQ(e.error_number(), error_number);
    }
  }
}

TEST(ThrowErrno, ADirectoryWithoutACheckpointIsNotFound) {
  const std::string empty = (std::filesystem::temp_directory_path() / "stowage-errno-test-empty").string();
  std::filesystem::create_directories(empty);
  try {
    dcp::open_checkpoint(empty);
    ADD_FAILURE() << "opened a checkpoint in an empty directory";
  } catch (const NotFound& e) {
    EXPECT_THAT(e.what(), HasSubstr("holds no checkpoint"));
    EXPECT_EQ(e.error_number(), ENOENT);
  }
  std::filesystem::remove_all(empty);
}

TEST(ThrowErrno, HostMemoryThatCannotBeMappedIsAnIoErrorOfMmap) {
  try {
    memory::allocate_host({int64_t(1) << 60}, c10::kByte);  // an exabyte
    ADD_FAILURE() << "mapped an exabyte";
  } catch (const IoError& e) {
    EXPECT_EQ(e.operation(), "mmap");
    EXPECT_EQ(e.error_number(), ENOMEM);
    EXPECT_THAT(e.what(), EndsWith(std::strerror(ENOMEM)));
  }
}

// The old names, deprecated for one release.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static_assert(std::is_same_v<dcp::CheckpointError, dcp::DistributedCheckpointError>);
static_assert(std::is_same_v<activation::CheckpointError, activation::RecomputationError>);
#pragma GCC diagnostic pop

}  // namespace
}  // namespace stowage::util
