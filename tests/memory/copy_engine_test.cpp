#include <stowage/error.h>
#include <stowage/memory/copy_engine.h>
#include <stowage/memory/host_buffer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace stowage::memory {
namespace {

const c10::Device kDevice(c10::kCPU);

TEST(CopyEngine, CopiesOnOneLaneRunInOrder) {
  CopyEngine engine(kDevice);
  auto dst = torch::zeros({1 << 20});
  for (int i = 1; i <= 20; ++i) {
    engine.copy(CopyLane::kHostToDevice, dst, torch::full({1 << 20}, static_cast<float>(i)));
  }
  engine.synchronize(engine.record(CopyLane::kHostToDevice));
  EXPECT_TRUE(torch::equal(dst, torch::full({1 << 20}, 20.0f)));
}

TEST(CopyEngine, ALaneWaitOrdersADownloadAfterAnUpload) {
  CopyEngine engine(kDevice);
  auto host_in = allocate_host({1 << 21}, torch::kFloat);
  auto on_device = torch::zeros({1 << 21});
  auto host_out = allocate_host({1 << 21}, torch::kFloat);
  for (int i = 0; i < 20; ++i) {
    host_in.fill_(static_cast<float>(i));
    engine.copy(CopyLane::kHostToDevice, on_device, host_in);
    engine.wait(CopyLane::kDeviceToHost, engine.record(CopyLane::kHostToDevice));
    engine.copy(CopyLane::kDeviceToHost, host_out, on_device);
    engine.synchronize(engine.record(CopyLane::kDeviceToHost));
    ASSERT_EQ(host_out.min().item<float>(), static_cast<float>(i)) << "iteration " << i;
    ASSERT_EQ(host_out.max().item<float>(), static_cast<float>(i)) << "iteration " << i;
  }
}

TEST(CopyEngine, ComputeWaitSeesTheCopiedData) {
  CopyEngine engine(kDevice);
  auto host = torch::arange(1 << 20, torch::kFloat);
  auto on_device = torch::zeros({1 << 20});
  engine.copy(CopyLane::kHostToDevice, on_device, host);
  const CopyEvent done = engine.record(CopyLane::kHostToDevice);
  engine.wait_compute(done);
  EXPECT_TRUE(done.query());
  EXPECT_TRUE(torch::equal(on_device, host));
}

TEST(CopyEngine, EventsCompleteOnlyAfterTheWorkBeforeThem) {
  CopyEngine engine(kDevice);
  const CopyEvent nothing_before = engine.record(CopyLane::kDeviceToHost);
  engine.synchronize(nothing_before);
  EXPECT_TRUE(nothing_before.query());
  EXPECT_TRUE(CopyEvent().query());
  EXPECT_TRUE(engine.record_compute().query());  // the calling thread's work is done
}

TEST(CopyEngine, CountsCopiesAndBytesPerDirection) {
  CopyEngine engine(kDevice);
  auto a = torch::zeros({100});
  auto b = torch::zeros({50}, torch::kDouble);
  engine.copy(CopyLane::kHostToDevice, a, torch::ones({100}));
  engine.copy(CopyLane::kHostToDevice, b, torch::ones({50}, torch::kDouble));
  engine.copy(CopyLane::kDeviceToHost, torch::zeros({100}, torch::kHalf), a);  // casts; counts dst bytes
  engine.synchronize(engine.record(CopyLane::kDeviceToHost));
  const CopyStats stats = engine.stats();
  EXPECT_EQ(stats.h2d_copies, 2);
  EXPECT_EQ(stats.h2d_bytes, 400 + 400);
  EXPECT_EQ(stats.d2h_copies, 1);
  EXPECT_EQ(stats.d2h_bytes, 200);
}

TEST(CopyEngine, RejectsMismatchedOrUndefinedTensorsAtOnce) {
  CopyEngine engine(kDevice);
  EXPECT_THROW(engine.copy(CopyLane::kHostToDevice, torch::zeros({3}), torch::zeros({4})), InvalidArgument);
  EXPECT_THROW(engine.copy(CopyLane::kDeviceToHost, at::Tensor(), torch::zeros({4})), InvalidArgument);
  EXPECT_EQ(engine.stats().h2d_copies, 0);
}

TEST(CopyEngine, RejectsANullEnv) {
  EXPECT_THROW(CopyEngine(kDevice, nullptr), InvalidArgument);
}

TEST(CopyEngine, AFailedCopySurfacesAtSynchronize) {
  CopyEngine engine(kDevice);
  // Same element count, shapes that do not broadcast: only copy_ itself can tell.
  engine.copy(CopyLane::kHostToDevice, torch::zeros({2, 3}), torch::zeros({3, 2}));
  EXPECT_THROW(engine.synchronize(engine.record(CopyLane::kHostToDevice)), c10::Error);
  // The other lane is unaffected.
  auto dst = torch::zeros({4});
  engine.copy(CopyLane::kDeviceToHost, dst, torch::ones({4}));
  EXPECT_NO_THROW(engine.synchronize(engine.record(CopyLane::kDeviceToHost)));
  EXPECT_TRUE(torch::equal(dst, torch::ones({4})));
}

TEST(CopyEngine, DestructionFinishesEnqueuedCopies) {
  auto dst = torch::zeros({1 << 20});
  {
    CopyEngine engine(kDevice);
    engine.copy(CopyLane::kDeviceToHost, dst, torch::full({1 << 20}, 3.0f));
  }
  EXPECT_TRUE(torch::equal(dst, torch::full({1 << 20}, 3.0f)));
}

TEST(CopyEngine, KeepsTheTensorsOfAPendingCopyAlive) {
  CopyEngine engine(kDevice);
  auto dst = torch::zeros({1 << 20});
  engine.copy(CopyLane::kHostToDevice, dst, torch::full({1 << 20}, 5.0f));  // the source is a temporary
  engine.synchronize(engine.record(CopyLane::kHostToDevice));
  EXPECT_TRUE(torch::equal(dst, torch::full({1 << 20}, 5.0f)));
}

// Fails the copy numbered `failing` on `lane`, once armed, after writing -1 into its
// destination.
class FailingCopyEnv : public CopyEnv {
 public:
  void fail(CopyLane lane, int64_t failing) {
    lane_ = lane;
    failing_ = failing;
    armed_ = true;
  }
  void disarm() { armed_ = false; }

  void copy(CopyLane lane, int64_t copy_number, const at::Tensor& dst, const at::Tensor& src) override {
    if (armed_ && lane == lane_ && copy_number == failing_) {
      dst.fill_(-1);
      throw std::runtime_error("injected fault");
    }
    CopyEnv::copy(lane, copy_number, dst, src);
  }

 private:
  // Set by the test's thread before the copies it fails are enqueued, read by the lanes.
  std::atomic<bool> armed_{false};
  std::atomic<CopyLane> lane_{CopyLane::kHostToDevice};
  std::atomic<int64_t> failing_{-1};
};

TEST(CopyEngine, AnInjectedFaultFailsItsCopyAndTheLaneUntilDrained) {
  FailingCopyEnv env;
  CopyEngine engine(kDevice, &env);
  env.fail(CopyLane::kHostToDevice, 1);
  std::vector<torch::Tensor> dst;
  for (int i = 0; i < 3; ++i) {
    dst.push_back(torch::zeros({1024}));
    engine.copy(CopyLane::kHostToDevice, dst.back(), torch::full({1024}, float(i + 1)));
  }
  const CopyEvent after = engine.record(CopyLane::kHostToDevice);
  try {
    engine.synchronize(after);
    ADD_FAILURE() << "no failure surfaced";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "injected fault");
  }
  EXPECT_TRUE(torch::equal(dst[0], torch::full({1024}, 1.0f)));   // before the fault: done
  EXPECT_TRUE(torch::equal(dst[1], torch::full({1024}, -1.0f)));  // the fault's partial write
  EXPECT_TRUE(torch::equal(dst[2], torch::zeros({1024})));        // after it: skipped
  EXPECT_THROW(engine.synchronize(engine.record(CopyLane::kHostToDevice)), std::runtime_error);

  env.disarm();
  const std::exception_ptr cleared = engine.drain();
  ASSERT_NE(cleared, nullptr);
  EXPECT_THROW(std::rethrow_exception(cleared), std::runtime_error);
  EXPECT_EQ(engine.drain(), nullptr);  // cleared once
  engine.copy(CopyLane::kHostToDevice, dst[2], torch::full({1024}, 7.0f));
  EXPECT_NO_THROW(engine.synchronize(engine.record(CopyLane::kHostToDevice)));
  EXPECT_TRUE(torch::equal(dst[2], torch::full({1024}, 7.0f)));
}

TEST(CopyEngine, ALaneThatWaitsForAFailedCopyFailsToo) {
  FailingCopyEnv env;
  CopyEngine engine(kDevice, &env);
  env.fail(CopyLane::kDeviceToHost, 0);
  auto host = torch::zeros({1024});
  engine.copy(CopyLane::kDeviceToHost, host, torch::ones({1024}));
  const CopyEvent download = engine.record(CopyLane::kDeviceToHost);
  // An upload that must not overwrite the device tensor before the download has read it.
  auto on_device = torch::full({1024}, 5.0f);
  engine.wait(CopyLane::kHostToDevice, download);
  engine.copy(CopyLane::kHostToDevice, on_device, torch::full({1024}, 9.0f));
  EXPECT_THROW(engine.synchronize(engine.record(CopyLane::kHostToDevice)), std::runtime_error);
  EXPECT_TRUE(torch::equal(on_device, torch::full({1024}, 5.0f)));  // skipped
  EXPECT_NE(engine.drain(), nullptr);
  EXPECT_EQ(engine.stats().h2d_copies, 1);
  EXPECT_EQ(engine.stats().d2h_copies, 1);
}

TEST(CopyEngine, CopiesWithoutACastAreExact) {
  CopyEngine engine(kDevice);
  auto src = torch::randn({3, 1000}, torch::kDouble);
  auto dst = torch::empty({3, 1000}, torch::kDouble);
  auto strided = torch::empty({1000, 3}, torch::kDouble).t();  // not contiguous: copy_ path
  engine.copy(CopyLane::kHostToDevice, dst, src);
  engine.copy(CopyLane::kHostToDevice, strided, src);
  engine.synchronize(engine.record(CopyLane::kHostToDevice));
  EXPECT_TRUE(torch::equal(dst, src));
  EXPECT_TRUE(torch::equal(strided, src));
}

}  // namespace
}  // namespace stowage::memory
