// A group save reports each rank's failure as a message: a c10::Error's without the
// C++ backtrace LibTorch appends to what() (kilobytes of stack frames).

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stowage::dcp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ScratchDir;

class C10ThrowingStateful : public Stateful {
 public:
  StateDict state_dict() override { TORCH_CHECK(false, "injected c10 failure"); }
  void load_state_dict(const StateDict&) override {}
};

TEST(DcpErrorMessages, ARanksC10ErrorIsReportedWithoutLibTorchsBacktrace) {
  const ScratchDir dir;
  const dist::ProcessGroup group = dist::init_process_group(
      "127.0.0.1", testing::free_port(), 0, 1, dist::ProcessGroupOptions().timeout(std::chrono::seconds(20)));
  StateDict state;
  state.insert("w", torch::ones({4}));
  state.insert("throws", as_ivalue(c10::make_intrusive<C10ThrowingStateful>()));
  try {
    save(state, dir.path(), group);
    ADD_FAILURE() << "the save did not fail";
  } catch (const DistributedCheckpointError& e) {
    ASSERT_EQ(e.failures().count(0), 1u) << e.what();
    EXPECT_THAT(e.failures().at(0).message, HasSubstr("injected c10 failure"));
    EXPECT_THAT(e.failures().at(0).message, Not(HasSubstr("Exception raised from")));
    EXPECT_THAT(std::string(e.what()), Not(HasSubstr("frame #")));
  }
}

}  // namespace
}  // namespace stowage::dcp
