// The simulated accelerator itself: registration and bad input, capacity and statistics,
// asynchronous copies, streams and events, poisoned frees, pinned memory, the generator.
#include <stowage/build_info.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#if defined(STOWAGE_WITH_SIM)
#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/sim/sim.h>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#endif

namespace {

#if !defined(STOWAGE_WITH_SIM)

TEST(SimDevice, NeedsLibTorch2) {
  GTEST_SKIP() << "the simulated device needs LibTorch 2.x (PrivateUse1 hooks, c10::DeviceAllocator); this build "
                  "is against "
               << stowage::build_info().libtorch_version;
}

#else

namespace sim = stowage::sim;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// Registered while the program loads, before any backward (see register_device).
const bool kSimRegisteredAtLoad = (sim::register_device(), true);

c10::Device sim1() {
  sim::register_device();
  return sim::device(1);
}

at::Tensor pinned_ones(int64_t numel) {
  return torch::ones({numel}).pin_memory();
}

// Copies held by a gate until something waits for them: a queued copy is still queued
// when the test looks, however long the test took to look.
class HeldCopies : public ::testing::Test {
 protected:
  void TearDown() override {
    sim::synchronize_all();
    sim::clear_hazards();
  }
  sim::CopyGate held_;
};

TEST(SimDevice, RegistersOnceUnderItsName) {
  sim::register_device();
  sim::register_device(sim::SimOptions{});  // harmless
  EXPECT_EQ(c10::Device("sim:1"), sim1());
  EXPECT_EQ(sim::device_type(), c10::DeviceType::PrivateUse1);
  EXPECT_GE(sim::device_count(), 2);
  try {
    sim::device(7);
    FAIL() << "sim:7 exists";
  } catch (const stowage::InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("sim:7"));
  }
}

TEST(SimDevice, RefusesBadCapacitiesNamingTheValue) {
  EXPECT_EQ(sim::parse_capacity("64MiB", "X"), int64_t(64) << 20);
  EXPECT_EQ(sim::parse_capacity("4096", "X"), 4096);
  for (const std::string text : {"0", "-5", "12XB", "MiB", "", "99999999999999999999GiB"}) {
    try {
      sim::parse_capacity(text, "STOWAGE_SIM_CAPACITY");
      FAIL() << "'" << text << "' parsed";
    } catch (const stowage::InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("STOWAGE_SIM_CAPACITY='" + text + "'"));
    }
  }
  sim1();
  EXPECT_THROW(sim::set_capacity(0, 1), stowage::InvalidArgument);
  EXPECT_THROW(sim::set_capacity(-1, 1), stowage::InvalidArgument);
  EXPECT_THROW(sim::set_capacity(1 << 20, 9), stowage::InvalidArgument);
}

TEST(SimDevice, AllocatingPastTheCapacityThrowsLibTorchsOutOfMemoryError) {
  const c10::Device device = sim1();
  const int64_t capacity = sim::capacity(1);
  sim::set_capacity(int64_t(1) << 20, 1);
  at::Tensor first = torch::empty({600 * 1024}, torch::TensorOptions().dtype(torch::kByte).device(device));
  try {
    torch::empty({600 * 1024}, torch::TensorOptions().dtype(torch::kByte).device(device));
    FAIL() << "a second 600 KiB fit in 1 MiB";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_THAT(e.what(), HasSubstr("sim:1 is out of memory: tried to allocate 614400 bytes"));
    EXPECT_THAT(e.what(), HasSubstr("434176 bytes (424.0 KiB) are free"));
  }
  first.reset();
  at::Tensor again = torch::empty({600 * 1024}, torch::TensorOptions().dtype(torch::kByte).device(device));
  EXPECT_EQ(again.numel(), 600 * 1024);
  sim::set_capacity(capacity, 1);
}

TEST(SimDevice, StatisticsComeThroughTheDeviceAllocator) {
  const c10::Device device = sim1();
  const int64_t before = stowage::memory::memory_allocated(device);
  stowage::memory::reset_peak_memory_stats(device);
  {
    at::Tensor t = torch::empty({1000}, torch::TensorOptions().device(device));  // 4000 bytes, 4096 accounted
    EXPECT_EQ(stowage::memory::memory_allocated(device) - before, 4096);
    const auto stats = c10::getDeviceAllocator(c10::DeviceType::PrivateUse1)->getDeviceStats(1);
    EXPECT_EQ(stats.allocated_bytes[0].current - before, 4096);
  }
  EXPECT_EQ(stowage::memory::memory_allocated(device), before);
  EXPECT_EQ(stowage::memory::max_memory_allocated(device) - before, 4096);
  stowage::memory::reset_peak_memory_stats(device);
  EXPECT_EQ(stowage::memory::max_memory_allocated(device), before);
}

TEST_F(HeldCopies, ANonBlockingCopyFromPinnedMemoryRunsLaterOnTheCurrentStream) {
  const c10::Device device = sim1();
  const c10::impl::VirtualGuardImpl guard(device.type());
  at::Tensor on_device = torch::zeros({256}, torch::TensorOptions().device(device));
  on_device.copy_(pinned_ones(256), /*non_blocking=*/true);
  EXPECT_FALSE(guard.queryStream(guard.getStream(device))) << "the copy already ran";
  // Compute on the same stream is ordered after it.
  EXPECT_EQ(on_device.sum().item<float>(), 256);
  EXPECT_TRUE(guard.queryStream(guard.getStream(device)));
}

TEST_F(HeldCopies, ACopyFromPageableMemoryOrABlockingOneHasRunWhenItReturns) {
  const c10::Device device = sim1();
  const c10::impl::VirtualGuardImpl guard(device.type());
  at::Tensor on_device = torch::zeros({256}, torch::TensorOptions().device(device));
  on_device.copy_(torch::ones({256}), /*non_blocking=*/true);  // pageable
  EXPECT_TRUE(guard.queryStream(guard.getStream(device)));
  on_device.copy_(pinned_ones(256) * 2, /*non_blocking=*/false);
  EXPECT_TRUE(guard.queryStream(guard.getStream(device)));
  EXPECT_EQ(on_device.sum().item<float>(), 512);
}

TEST_F(HeldCopies, AnOpReadingWhatACopyOnAnotherStreamStillWritesIsAHazard) {
  const c10::Device device = sim1();
  const c10::impl::VirtualGuardImpl guard(device.type());
  const c10::Stream side = guard.getStreamFromGlobalPool(device);
  at::Tensor on_device = torch::zeros({256}, torch::TensorOptions().device(device));
  {
    const c10::StreamGuard on_side(side);
    on_device.copy_(pinned_ones(256), /*non_blocking=*/true);
  }
  try {
    (void)(on_device * 2);
    FAIL() << "reading a tensor a queued copy writes went unnoticed";
  } catch (const sim::SimHazardError& e) {
    EXPECT_THAT(e.what(), ContainsRegex("aten::mul on stream 0 reads memory that a copy (queued|running) on stream " +
                                        std::to_string(side.id()) + " is still writing"));
  }
  // With the wait, the same read sees the copy's values.
  c10::Event copied(device.type());
  copied.record(side);
  copied.block(guard.getStream(device));
  EXPECT_EQ((on_device * 2).sum().item<float>(), 512);
}

// What the tests above stand on: a held copy waits for a wait, not for a time.
TEST(SimDevice, ACopyGateHoldsACopyUntilSomethingWaitsForIt) {
  const c10::Device device = sim1();
  const c10::impl::VirtualGuardImpl guard(device.type());
  const c10::Stream side = guard.getStreamFromGlobalPool(device);
  const c10::Stream compute = guard.getStream(device);
  at::Tensor on_device = torch::zeros({256}, torch::TensorOptions().device(device));
  sim::CopyGate gate;
  EXPECT_THROW(sim::CopyGate(), stowage::Error) << "two gates closed at once";
  const c10::StreamGuard on_side(side);
  on_device.copy_(pinned_ones(256), /*non_blocking=*/true);
  EXPECT_FALSE(guard.queryStream(side));
  // Another stream waiting for an event after it releases it.
  c10::Event copied(device.type());
  copied.record(side);
  EXPECT_FALSE(copied.query());
  copied.block(compute);
  guard.synchronizeStream(compute);
  EXPECT_TRUE(copied.query());
  // The host synchronizing its stream does too.
  on_device.copy_(torch::full({256}, 2.0f).pin_memory(), /*non_blocking=*/true);
  EXPECT_FALSE(guard.queryStream(side));
  guard.synchronizeStream(side);
  EXPECT_EQ(on_device.sum().item<float>(), 512);
  gate.open();
  EXPECT_NO_THROW(sim::CopyGate()) << "an open gate let no other close";
}

TEST_F(HeldCopies, AFreedBlockIsPoisonedOnceTheStreamsItWasRecordedOnHaveDrained) {
  const c10::Device device = sim1();
  const c10::impl::VirtualGuardImpl guard(device.type());
  const c10::Stream side = guard.getStreamFromGlobalPool(device);
  for (const bool record : {true, false}) {
    at::Tensor on_device = torch::full({256}, 3.0f, torch::TensorOptions().device(device));
    at::Tensor host = torch::empty({256}).pin_memory();
    {
      const c10::StreamGuard on_side(side);
      host.copy_(on_device, /*non_blocking=*/true);
    }
    if (record) guard.recordDataPtrOnStream(on_device.storage().data_ptr(), side);
    on_device.reset();  // freed while the side stream still has to read it
    guard.synchronizeStream(side);
    if (record) {
      EXPECT_TRUE(torch::equal(host, torch::full({256}, 3.0f)));
    } else {  // the copy read the poison: NaN
      EXPECT_TRUE(torch::isnan(host).all().item<bool>()) << host.slice(0, 0, 4);
    }
  }
}

TEST(SimDevice, PinnedMemoryComesFromTheDevicesHostAllocator) {
  sim1();
  EXPECT_TRUE(stowage::memory::can_pin_memory(c10::DeviceType::PrivateUse1));
  EXPECT_TRUE(stowage::memory::is_pinned(torch::ones({8}).pin_memory()));
  EXPECT_FALSE(stowage::memory::is_pinned(torch::ones({8})));
  stowage::memory::HostAllocOptions options;
  options.pin_memory = true;
  options.pin_for = c10::DeviceType::PrivateUse1;
  const int64_t pinned_before = stowage::memory::host_buffer_stats().pinned_bytes;
  at::Tensor buffer = stowage::memory::allocate_host({1000}, torch::kFloat, options);
  EXPECT_TRUE(stowage::memory::is_pinned(buffer));
  EXPECT_EQ(stowage::memory::host_buffer_stats().pinned_bytes - pinned_before, 4096);
  buffer.reset();
  EXPECT_EQ(stowage::memory::host_buffer_stats().pinned_bytes, pinned_before);
}

TEST(SimDevice, RandomOpsDrawFromTheDeviceGeneratorAndReplayFromItsState) {
  const c10::Device device = sim1();
  torch::manual_seed(3);
  at::Generator generator = at::globalContext().defaultGenerator(device);
  const at::Tensor device_state = generator.get_state();
  const at::Tensor cpu_state = at::globalContext().defaultGenerator(c10::kCPU).get_state();
  const at::Tensor x = torch::ones({4096}, torch::TensorOptions().device(device));
  const at::Tensor first = torch::dropout(x, 0.5, /*train=*/true).cpu();
  EXPECT_TRUE(torch::equal(at::globalContext().defaultGenerator(c10::kCPU).get_state(), cpu_state))
      << "the device's dropout drew from the CPU's generator";
  generator.set_state(device_state);
  const at::Tensor again = torch::dropout(x, 0.5, /*train=*/true).cpu();
  EXPECT_TRUE(torch::equal(first, again));
  EXPECT_GT(first.eq(0).sum().item<int64_t>(), 1500);
}

TEST(SimDevice, ComputeAndAutogradMatchTheCpuBitForBit) {
  const c10::Device device = sim1();
  torch::manual_seed(1);
  torch::nn::Linear cpu_layer(64, 32);
  torch::nn::Linear device_layer(64, 32);
  device_layer->to(device);
  {
    torch::NoGradGuard no_grad;
    device_layer->weight.copy_(cpu_layer->weight);
    device_layer->bias.copy_(cpu_layer->bias);
  }
  const at::Tensor input = torch::randn({16, 64});
  torch::tanh(cpu_layer(input)).sum().backward();
  torch::tanh(device_layer(input.to(device))).sum().backward();
  EXPECT_EQ(device_layer->weight.grad().device(), device);
  EXPECT_TRUE(torch::equal(device_layer->weight.grad().cpu(), cpu_layer->weight.grad()));
  EXPECT_TRUE(torch::equal(device_layer->bias.grad().cpu(), cpu_layer->bias.grad()));
}

#endif

}  // namespace
