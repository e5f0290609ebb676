// Tensors with a device, host-side (issue 12 item 1): device names, the caching device allocator
// and copies between devices against a fake GPU backend (host memory that tracks which device
// owns each block, so a copy given the wrong device fails), and errors that name both devices
// when an op mixes them. The real CUDA backend runs in tests/gpu/run.sh where a GPU is lent.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/device_cache.h"
#include "error_of.h"
#include "fake_gpus.h"

using namespace chorus;
using chorus::test::error_of;
using chorus::test::UseFake;

TEST_CASE("device names: cpu, cuda, cuda:N and auto; anything else refused by name", "[device]") {
  CHECK(Device::parse("cpu", 3) == Device::cpu());
  CHECK(Device::parse("cuda", 2) == Device::cuda(2));
  CHECK(Device::parse("cuda:3", 0).str() == "cuda:3");
  CHECK(Device::cpu().str() == "cpu");
  // auto: cuda:LOCAL_RANK where a GPU is visible, else cpu.
  if (cuda_backend().count() == 0) CHECK(Device::parse("auto", 1) == Device::cpu());
  {
    UseFake fake;
    CHECK(Device::parse("auto", 1) == Device::cuda(1));
  }
  for (const char* bad : {"gpu", "CPU", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999999999", ""})
    CHECK(error_of([&] { Device::parse(bad, 0); }) ==
          std::string("device: expected cpu, cuda, cuda:N or auto, got '") + bad + "'");
}

TEST_CASE("device tensors come from a caching allocator: a repeated step allocates nothing new",
          "[device]") {
  UseFake fake;
  const DeviceCacheStats before = device_cache_stats();
  const Device gpu = Device::cuda(0);
  for (int step = 0; step < 10; ++step) {
    // A step's tensors: a few sizes, some alive at once, all freed at the end of the step.
    Tensor a = Tensor::empty(Shape{64, 3, 32, 32}, gpu);
    Tensor b = Tensor::empty(Shape{64, 3, 32, 32}, gpu);
    Tensor c = Tensor::empty(Shape{10}, gpu);
    Tensor d = Tensor::empty(Shape{1000}, gpu);  // 4000 bytes: the same 4096-byte class as 1024
    CHECK(a.device() == gpu);
    CHECK(a.data() != b.data());
    if (step == 0) CHECK(fake.gpus.allocs == 4);
  }
  CHECK(fake.gpus.allocs == 4);  // steps 2..10 reused every block
  const DeviceCacheStats after = device_cache_stats();
  CHECK(after.backend_allocs - before.backend_allocs == 4);
  CHECK(after.reused - before.reused == 36);
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.bytes_cached > 0);
  // Another device never gets this device's blocks.
  Tensor other = Tensor::empty(Shape{10}, Device::cuda(1));
  CHECK(fake.gpus.allocs == 5);
  other = Tensor();
  device_cache_release();
  CHECK(fake.gpus.live() == 0);
  CHECK(fake.gpus.frees == 5);
  CHECK(device_cache_stats().bytes_cached == 0);
  CHECK(device_size_class(1) == 512);
  CHECK(device_size_class(4000) == 4096);
  CHECK(device_size_class(3 << 20) == (4u << 20));
}

TEST_CASE("to(), clone, fill and copy_from move values between devices", "[device]") {
  UseFake fake;
  Tensor host = Tensor::from(Shape{2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor g0 = host.to(Device::cuda(0));
  CHECK(g0.device() == Device::cuda(0));
  CHECK(g0.to_vector() == host.to_vector());
  CHECK(g0.to(Device::cuda(0)).impl() == g0.impl());  // already there: itself
  Tensor g1 = g0.to(Device::cuda(1));
  CHECK(g1.device() == Device::cuda(1));
  CHECK(g1.to(Device::cpu()).to_vector() == host.to_vector());
  CHECK(g1.clone().to_vector() == host.to_vector());
  Tensor z = Tensor::full(Shape{4}, 2.5f, Device::cuda(1));
  CHECK(z.to_vector() == std::vector<float>(4, 2.5f));
  Tensor one = Tensor::full(Shape{1}, 7.0f, Device::cuda(0));
  CHECK(one.item() == 7.0f);
  Tensor back = Tensor::zeros(Shape{2, 3});
  back.copy_from(g1);  // cuda:1 -> cpu
  CHECK(back.to_vector() == host.to_vector());
  CHECK(fake.gpus.copies > 0);
}

TEST_CASE("an op given tensors on two devices names both; one with no kernels names its device",
          "[device]") {
  UseFake fake;
  Tensor x = Tensor::full(Shape{2, 3}, 1.0f);
  Tensor w = Tensor::full(Shape{4, 3}, 1.0f, Device::cuda(0));
  Tensor b = Tensor::zeros(Shape{4});
  CHECK(error_of([&] { linear(x, w, b); }) ==
        "linear: input is on cpu but weight is on cuda:0: every input must be on one device "
        "(move one with .to())");
  CHECK(error_of([&] { add(x, x.to(Device::cuda(1))); }) ==
        "add: a is on cpu but b is on cuda:1: every input must be on one device (move one with "
        ".to())");
  Tensor img = Tensor::zeros(Shape{1, 1, 4, 4});
  Tensor k = Tensor::zeros(Shape{1, 1, 3, 3}, Device::cuda(0));
  CHECK(error_of([&] { conv2d(img, k, Tensor(), 1, 0); }) ==
        "conv2d: input is on cpu but weight is on cuda:0: every input must be on one device "
        "(move one with .to())");
  // The fake GPUs' memory is no real device's: where CUDA's kernels cannot run (no device, no
  // CUDA build) the op names the device and why.
  if (!kernels_unavailable(Device::cuda(0)).empty())
    CHECK_THAT(error_of([&] { relu(w); }),
               Catch::StartsWith("dispatch: no kernels for cuda:0: ") &&
                   Catch::Contains("(move the tensors with .to(Device::cpu()))"));
  // Moved to one device, the op runs.
  CHECK(linear(x, w.to(Device::cpu()), b).to_vector() == std::vector<float>(8, 3.0f));
}

TEST_CASE("without a GPU, a cuda tensor is refused naming the device and the count", "[device]") {
  if (cuda_backend().count() > 0) {
    WARN("skipped: this machine has a GPU, so the refusal without one cannot happen here");
    return;
  }
  CHECK(error_of([] { Tensor::empty(Shape{4}, Device::cuda(0)); }) ==
        "device cuda:0: this process sees 0 CUDA device(s) (no GPU, no driver, or a build "
        "without CUDA)");
  UseFake fake;
  CHECK(error_of([] { Tensor::empty(Shape{4}, Device::cuda(2)); }) ==
        "device cuda:2: this process sees 2 CUDA device(s)");
}

TEST_CASE("CHORUS_ALLOW_TF32: off unless 1; another value is refused naming it at cuda dispatch",
          "[device]") {
  UseFake fake;
  Tensor w = Tensor::full(Shape{4}, 1.0f, Device::cuda(0));
  const char* before = std::getenv("CHORUS_ALLOW_TF32");
  const std::string saved = before ? before : "";
  auto restore = [&] {
    if (before)
      setenv("CHORUS_ALLOW_TF32", saved.c_str(), 1);
    else
      unsetenv("CHORUS_ALLOW_TF32");
  };
  set_allow_tf32(false);
  CHECK_FALSE(allow_tf32());  // set_allow_tf32 wins over the environment, read or not
  set_allow_tf32(true);
  CHECK(allow_tf32());
  // The environment is read where nothing was set: the test resets through the same door the
  // first cuda dispatch of a process takes (allow_tf32 at kernel_table_for).
  reset_allow_tf32_for_test();
  setenv("CHORUS_ALLOW_TF32", "yes", 1);
  CHECK_THAT(error_of([&] { kernel_table_for(Device::cuda(0)); }),
             Catch::Contains("CHORUS_ALLOW_TF32") && Catch::Contains("yes"));
  CHECK_THAT(error_of([] { allow_tf32(); }), Catch::Contains("CHORUS_ALLOW_TF32"));
  // The cpu never reads it.
  CHECK(error_of([] { kernel_table_for(Device::cpu()); }) == "no error");
  setenv("CHORUS_ALLOW_TF32", "1", 1);
  CHECK(allow_tf32());
  reset_allow_tf32_for_test();
  unsetenv("CHORUS_ALLOW_TF32");
  CHECK_FALSE(allow_tf32());  // unset: off
  restore();
  set_allow_tf32(false);
}
