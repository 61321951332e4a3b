// What the build says it is against what the process really loaded.
#include <stowage/build_info.h>
#include <stowage/memory/host_buffer.h>

#include <torch/version.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace {

// Whether a shared library whose file name starts with `name` is mapped into this process.
bool library_is_loaded(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.rfind('/');
    if (slash != std::string::npos && line.compare(slash + 1, name.size(), name) == 0) return true;
  }
  return false;
}

TEST(BuildInfo, CudaIsCompiledInExactlyWhenTheLibTorchHasCuda) {
  // A CUDA LibTorch links its CUDA half into every program built on it, whatever stowage
  // decided at configure time: that is the independent evidence.
  const bool libtorch_has_cuda = library_is_loaded("libtorch_cuda.so") || library_is_loaded("libc10_cuda.so");
  EXPECT_EQ(stowage::build_info().with_cuda, libtorch_has_cuda)
      << "the LibTorch loaded into this process " << (libtorch_has_cuda ? "has" : "has no")
      << " CUDA, but stowage was built " << (stowage::build_info().with_cuda ? "with" : "without") << " it";
}

TEST(BuildInfo, NamesTheLibTorchAndCudaVersions) {
  const stowage::BuildInfo info = stowage::build_info();
  EXPECT_EQ(info.libtorch_version, TORCH_VERSION);
  EXPECT_EQ(info.with_cuda, !info.cuda_version.empty());
  const std::string text = stowage::describe_build();
  EXPECT_NE(text.find("stowage " + info.version + "\nLibTorch " + info.libtorch_version + "\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find(info.with_cuda ? "CUDA " + info.cuda_version + " (" : "CUDA: not compiled in"), std::string::npos)
      << text;
}

TEST(BuildInfo, HostMemoryIsPinnableExactlyWhenACudaDeviceIsVisible) {
  EXPECT_EQ(stowage::memory::can_pin_memory(), stowage::build_info().with_cuda && stowage::cuda_device_count() > 0);
}

}  // namespace
