// The CUDA shim against the stand-in driver (fake_driver.cpp): what it asks
// of the driver and what it makes of the answers. The conformance suite runs
// on the same stand-in from CMake; these are the shim's own behaviours.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tpuhal/tpuhal.hpp"
#include "support/error_of.hpp"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Before anything loads the driver: the stand-in, with two devices, and
// the stand-in cuBLAS.
const bool configured = [] {
  setenv("TPUHAL_CUDA_LIBRARY", TPUHAL_FAKE_CUDA, 1);
  setenv("TPUHAL_CUBLAS_LIBRARY", TPUHAL_FAKE_CUBLAS, 1);
  setenv("TPUHAL_FAKE_CUDA_DEVICES", "2", 1);
  return true;
}();

// The stand-in's test controls and entry points, from the copy the shim
// loaded (RTLD_NOLOAD: never a second one).
struct Fake {
  void (*fail)(int) = nullptr;
  void (*refuse_modules)(int) = nullptr;
  void (*reset)() = nullptr;
  unsigned long long (*live)() = nullptr;
  PFN_cuCtxPushCurrent_v4000 push = nullptr;
  PFN_cuCtxPopCurrent_v4000 pop = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 release = nullptr;
};
const Fake& fake() {
  static const Fake f = [] {
    (void)enumerate();  // makes the shim load the library
    void* lib = dlopen(TPUHAL_FAKE_CUDA, RTLD_NOW | RTLD_NOLOAD);
    Fake x;
    if (!lib) return x;
    x.fail = reinterpret_cast<void (*)(int)>(dlsym(lib, "tpuhal_fake_cuda_fail"));
    x.reset = reinterpret_cast<void (*)()>(dlsym(lib, "tpuhal_fake_cuda_reset"));
    x.refuse_modules = reinterpret_cast<void (*)(int)>(dlsym(lib, "tpuhal_fake_cuda_refuse_modules"));
    x.live = reinterpret_cast<unsigned long long (*)()>(dlsym(lib, "tpuhal_fake_cuda_live_allocations"));
    auto get = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
    auto resolve = [&](const char* name) {
      void* fn = nullptr;
      CUdriverProcAddressQueryResult found{};
      get(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found);
      return fn;
    };
    x.push = reinterpret_cast<PFN_cuCtxPushCurrent_v4000>(resolve("cuCtxPushCurrent"));
    x.pop = reinterpret_cast<PFN_cuCtxPopCurrent_v4000>(resolve("cuCtxPopCurrent"));
    x.retain = reinterpret_cast<PFN_cuDevicePrimaryCtxRetain_v7000>(resolve("cuDevicePrimaryCtxRetain"));
    x.release = reinterpret_cast<PFN_cuDevicePrimaryCtxRelease_v11000>(resolve("cuDevicePrimaryCtxRelease"));
    return x;
  }();
  return f;
}

using test::error_of;

class CudaShim : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(configured);
    ASSERT_NE(fake().fail, nullptr) << "the stand-in driver was not loaded";
    live_before_ = fake().live();
  }
  void TearDown() override {
    fake().reset();
    // Every allocation, registration and timeline word goes with the
    // handles that own it.
    EXPECT_EQ(fake().live(), live_before_);
  }
  unsigned long long live_before_ = 0;
};

TEST_F(CudaShim, EnumerationListsTheDriversDevices) {
  std::vector<std::string> cuda;
  for (auto& d : enumerate())
    if (d.driver == "cuda") {
      cuda.push_back(d.uri);
      EXPECT_EQ(d.board, "tpuhal fake CUDA device");
      EXPECT_EQ(d.memory_bytes, 256u << 20);
    }
  EXPECT_THAT(cuda, ::testing::ElementsAre("cuda:0", "cuda:1"));
}

TEST_F(CudaShim, PropertiesComeFromTheDriver) {
  Device dev = open("cuda:1");
  const Properties& p = dev.properties();
  EXPECT_EQ(p.driver, "cuda");
  EXPECT_EQ(p.board, "tpuhal fake CUDA device");
  EXPECT_EQ(p.bus, "pcie 0000:11:00.0");
  EXPECT_EQ(p.firmware_version, "12.8");
  EXPECT_EQ(p.serial, "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfe01") << "the UUID, as nvidia-smi -L shows it";
  EXPECT_EQ(p.pci_vendor, 0x10de);
  EXPECT_EQ(p.memory_bytes, 256u << 20);
  ASSERT_EQ(p.heaps.size(), 1u);
  EXPECT_EQ(p.heaps[0].name, "device");
  EXPECT_GE(p.heaps[0].size, p.memory_bytes);
  EXPECT_TRUE(p.caps.wait_value);
  EXPECT_TRUE(p.caps.import_host_memory);
  EXPECT_TRUE(p.caps.timestamps) << "the clock kernels loaded";
  if (TPUHAL_CUDA_KERNELS) {
    EXPECT_TRUE(p.caps.tensor) << "the tensor-op kernels loaded (their host build, on the stand-in)";
    EXPECT_THAT(p.dtypes,
                ::testing::ElementsAre(DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32));
  } else {
    EXPECT_FALSE(p.caps.tensor) << "built without nvcc: no tensor-op kernels";
  }
  EXPECT_FALSE(p.caps.map_device_memory);
  EXPECT_FALSE(p.caps.host_visible_device_memory);
}

TEST_F(CudaShim, BadUrisAreNamed) {
  Error e = error_of([] { open("cuda:x"); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("CUDA URIs are cuda:N"));
  e = error_of([] { open("cuda:7"); });
  EXPECT_EQ(e.status(), Status::NotFound);
  EXPECT_THAT(e.what(), HasSubstr("cuda:7: no such CUDA device (2 found: cuda:0 to cuda:1)"));
  EXPECT_EQ(error_of([] { open("cuda:-1"); }).status(), Status::InvalidArgument);
}

TEST_F(CudaShim, TheCallersContextIsLeftAsItWas) {
  // An application's own CUDA code has a context current; every shim call
  // that needs one pushes its own and pops it again.
  CUdevice d1 = 1;
  CUcontext mine = nullptr;
  ASSERT_EQ(fake().retain(&mine, d1), CUDA_SUCCESS);
  ASSERT_EQ(fake().push(mine), CUDA_SUCCESS);
  {
    Device dev = open("cuda:0");
    Buffer h = dev.allocate(4096, Memory::HostPinned), d = dev.allocate(4096);
    std::memset(h.map().data(), 7, 4096);
    dev.queue().copy(h, d).fill(h, 0, 4096, 0).copy(d, h).submit().wait();
    EXPECT_EQ(static_cast<int>(h.map()[4095]), 7);
  }
  CUcontext top = nullptr;
  EXPECT_EQ(fake().pop(&top), CUDA_SUCCESS);
  EXPECT_EQ(top, mine);
  EXPECT_EQ(fake().release(d1), CUDA_SUCCESS);
}

TEST_F(CudaShim, AFaultInTheStreamFailsTheFenceAndNamesTheCudaError) {
  Device dev = open("cuda:0");
  Buffer gate = dev.allocate(4096, Memory::HostPinned), d = dev.allocate(1 << 16);
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(gate.map().data())).store(0);
  Queue q = dev.queue();
  Fence f = q.batch().wait_value(gate, 0, 1).fill(d, 0, 1 << 16, 0xAB).submit();
  fake().fail(CUDA_ERROR_ILLEGAL_ADDRESS);
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(gate.map().data())).store(1);
  Error e = error_of([&] { f.wait(5s); });
  EXPECT_EQ(e.status(), Status::DeviceFault);
  EXPECT_THAT(e.what(), HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"));
  // The queue stays failed and says so at the next submission.
  EXPECT_EQ(error_of([&] { q.submit(); }).status(), Status::DeviceFault);
}

TEST_F(CudaShim, ProgramsReplayAsGraphs) {
  Device dev = open("cuda:0");
  const std::uint64_t n = 1 << 14;
  Buffer src = dev.allocate(n, Memory::HostPinned), dst = dev.allocate(n, Memory::HostPinned);
  Buffer d = dev.allocate(n), words = dev.allocate(4096, Memory::HostPinned);
  Program p = dev.record([&](Batch& b) { b.copy(src, d).fill(d, 0, 64, 0xEE).copy(d, dst).write_value(words, 0, 9); });
  EXPECT_EQ(p.size(), 4u);
  Queue q = dev.queue();
  for (int round = 0; round < 3; ++round) {
    std::memset(src.map().data(), round + 1, n);
    std::memset(dst.map().data(), 0, n);
    q.run(p).submit().wait();
    EXPECT_EQ(static_cast<int>(dst.map()[0]), 0xEE);
    EXPECT_EQ(static_cast<int>(dst.map()[64]), round + 1);
    EXPECT_EQ(static_cast<int>(dst.map()[n - 1]), round + 1);
  }
  EXPECT_EQ(*reinterpret_cast<std::uint64_t*>(words.map().data()), 9u);
}

// An op that finds bad input while it runs (a gather index outside its
// axis) fails its submission with the op and the values, in a batch or in
// a program the batch calls; the queue stays failed, the program's fault
// record is cleared for its next run, and a new queue works.
TEST_F(CudaShim, AFaultAnOpRaisesFailsItsSubmissionInABatchOrAProgram) {
  if (!TPUHAL_CUDA_KERNELS) GTEST_SKIP() << "built without nvcc: no tensor-op kernels";
  Device dev = open("cuda:0");
  Buffer x = dev.allocate(64, Memory::HostPinned), idx = dev.allocate(64, Memory::HostPinned),
         y = dev.allocate(64, Memory::HostPinned);
  auto* xv = reinterpret_cast<float*>(x.map().data());
  auto* iv = reinterpret_cast<std::int32_t*>(idx.map().data());
  for (int i = 0; i < 4; ++i) xv[i] = static_cast<float>(10 + i);
  const Op op = ops::gather(Tensor(x, DType::F32, {4}), Tensor(idx, DType::I32, {2}), Tensor(y, DType::F32, {2}));
  const Program program = dev.record([&](Batch& b) { b.fill(y, 0, 8, 0).run(op); });
  auto submit = [&](bool in_program, std::int32_t index) {
    iv[0] = 1;
    iv[1] = index;
    std::memset(y.map().data(), 0xA5, 8);
    Queue q = dev.queue();
    Batch b = q.batch();
    b.fill(x, 32, 4, 0);
    if (in_program)
      b.run(program);
    else
      b.run(op);
    b.submit().wait();
  };
  auto run_once = [&](bool in_program, std::int32_t bad) { return error_of([&] { submit(in_program, bad); }); };
  Error e = run_once(false, 7);
  EXPECT_EQ(e.status(), Status::DeviceFault);
  EXPECT_THAT(e.what(), HasSubstr("failed at command 2 of 2 (gather, ring position "));
  EXPECT_THAT(e.what(), HasSubstr("gather: tensor 1 holds the index 7, outside [-4, 4)"));
  EXPECT_EQ(y.map()[0], std::byte{0xA5}) << "a gather that failed wrote nothing";
  e = run_once(true, -5);
  EXPECT_EQ(e.status(), Status::DeviceFault);
  EXPECT_THAT(e.what(), HasSubstr("failed at command 2 of 2 of the program called by command 2 (gather"));
  EXPECT_THAT(e.what(), HasSubstr("holds the index -5, outside [-4, 4)"));
  EXPECT_EQ(y.map()[4], std::byte{0}) << "the program's fill ran, its gather wrote nothing";
  submit(true, -1);  // the program's record was cleared: it runs again
  EXPECT_EQ(xv[1], 11.0f);
  EXPECT_EQ(reinterpret_cast<const float*>(y.map().data())[1], 13.0f);
}

// A matmul cuBLAS can take goes to cuBLAS (the stand-in counts its
// products), and its c and activation follow in the epilogue: here into
// f16, through an f32 scratch block, with b transposed and c broadcast.
TEST_F(CudaShim, AMatrixProductGoesThroughCublasAndTheEpilogueAfterIt) {
  if (!TPUHAL_CUDA_KERNELS) GTEST_SKIP() << "built without nvcc: no tensor-op kernels";
  Device dev = open("cuda:0");
  void* lib = dlopen(TPUHAL_FAKE_CUBLAS, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr) << "the shim loaded the stand-in cuBLAS";
  auto gemms = reinterpret_cast<unsigned long long (*)()>(dlsym(lib, "tpuhal_fake_cublas_gemms"));
  ASSERT_NE(gemms, nullptr);
  Buffer h = dev.allocate(4096, Memory::HostPinned);
  // a = [[1, 2, 3], [4, 5, 6]] and b^T = [[1, 0, -1], [2, 1, 0]] in f16; c = [1, -1] in f32.
  const std::uint16_t a[] = {0x3C00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
  const std::uint16_t bt[] = {0x3C00, 0x0000, 0xBC00, 0x4000, 0x3C00, 0x0000};
  const float c[] = {1, -1};
  std::memcpy(h.map().data(), a, sizeof a);
  std::memcpy(h.map().data() + 32, bt, sizeof bt);
  std::memcpy(h.map().data() + 64, c, sizeof c);
  ops::MatMulOptions o;
  o.transpose_b = true;
  o.c = Tensor(h, DType::F32, {2, 2}, {0, 1}, 64);
  o.activation = ActivationParams::relu();
  const Tensor y(h, DType::F16, {2, 2}, 128);
  const unsigned long long before = gemms();
  dev.queue().run(ops::matmul(Tensor(h, DType::F16, {2, 3}), Tensor(h, DType::F16, {2, 3}, 32), y, o)).submit().wait();
  EXPECT_EQ(gemms(), before + 1);
  // relu(a @ bt^T + c) = relu([[-2, 4], [-2, 13]] + [1, -1]) = [[0, 3], [0, 12]], in f16.
  const auto* out = reinterpret_cast<const std::uint16_t*>(h.map().data() + 128);
  EXPECT_EQ(out[0], 0x0000);
  EXPECT_EQ(out[1], 0x4200);
  EXPECT_EQ(out[2], 0x0000);
  EXPECT_EQ(out[3], 0x4a00);
}

// Each fence keeps the board time it was reached at (the fence-stamp kernel
// before the timeline write), for the queue's last 128 values; a timestamp
// command writes the time in stream order, in a batch or a program.
TEST_F(CudaShim, EachFenceKeepsItsBoardTimeForTheLast128Values) {
  Device dev = open("cuda:0");
  ASSERT_TRUE(dev.properties().caps.timestamps);
  Queue q = dev.queue();
  const int n = 200;
  Buffer stamps = dev.allocate(n * 8, Memory::HostPinned);
  std::vector<Fence> fences;
  for (int i = 0; i < n; ++i) fences.push_back(q.batch().timestamp(stamps, 8 * i).submit());
  fences.back().wait();
  const auto* written = reinterpret_cast<const std::uint64_t*>(stamps.map().data());
  std::uint64_t last = 0;
  for (int i = 0; i < n; ++i) {
    const auto t = fences[i].timestamp_ns();
    if (i < n - 128) {
      EXPECT_FALSE(t.has_value()) << "fence " << i << " is older than the last 128";
      continue;
    }
    ASSERT_TRUE(t.has_value()) << "fence " << i;
    EXPECT_LE(written[i], *t) << "fence " << i << ": its batch's stamp comes first";
    EXPECT_LE(last, *t) << "fence " << i;
    last = *t;
  }
  // Not yet reached: no time.
  Buffer gate = dev.allocate(4096, Memory::HostPinned);
  std::atomic_ref<std::uint64_t> open_gate(*reinterpret_cast<std::uint64_t*>(gate.map().data()));
  open_gate.store(0);
  Fence held = q.batch().wait_value(gate, 0, 1).submit();
  EXPECT_FALSE(held.timestamp_ns().has_value());
  open_gate.store(1);
  held.wait();
  ASSERT_TRUE(held.timestamp_ns().has_value());
  EXPECT_LE(last, *held.timestamp_ns());
  // In a program: each replay stamps again.
  Program p = dev.record([&](Batch& b) { b.timestamp(stamps, 0); });
  q.run(p).submit().wait();
  const std::uint64_t first = written[0];
  EXPECT_LE(*held.timestamp_ns(), first);
  std::memset(stamps.map().data(), 0, 8);
  q.run(p).submit().wait();
  EXPECT_NE(written[0], 0u) << "the replay stamps again";
  EXPECT_LE(first, written[0]);
}

// A driver that cannot load the clock kernels leaves a device that works,
// without timestamps, and says so up front.
TEST_F(CudaShim, WithoutTheClockKernelsTheDeviceWorksWithoutTimestamps) {
  fake().refuse_modules(1);
  Device dev = open("cuda:1");
  fake().refuse_modules(0);
  EXPECT_FALSE(dev.properties().caps.timestamps);
  EXPECT_FALSE(dev.properties().caps.tensor) << "the tensor-op kernels did not load either";
  Buffer h = dev.allocate(4096, Memory::HostPinned), d = dev.allocate(4096);
  Queue q = dev.queue();
  Error e = error_of([&] { q.batch().timestamp(h, 0).submit(); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("timestamp"));
  const Tensor t(d, DType::U8, {16});
  e = error_of([&] { q.batch().run(ops::where(t, t, t, Tensor(h, DType::U8, {16}))); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr(TPUHAL_CUDA_KERNELS
                                      ? "cuda:1 has no tensor engine (caps.tensor is false): cuModuleLoadData (the "
                                        "tensor-op kernels, built for sm_80 and sm_90 with PTX): "
                                        "CUDA_ERROR_NO_BINARY_FOR_GPU"
                                      : "cuda:1 has no tensor engine (caps.tensor is false): this build of tpuhal has "
                                        "no GPU kernels"));
  std::memset(h.map().data(), 5, 4096);
  Fence f = q.batch().copy(h, d).fill(h, 0, 4096, 0).copy(d, h).submit();
  f.wait();
  EXPECT_EQ(static_cast<int>(h.map()[100]), 5);
  EXPECT_FALSE(f.timestamp_ns().has_value());
}

TEST_F(CudaShim, SmallAllocationsShareAChunkAndLargeOnesSpanSeveral) {
  Device dev = open("cuda:0");
  const auto before = fake().live();
  std::vector<Buffer> small;
  for (int i = 0; i < 16; ++i) small.push_back(dev.allocate(1000));
  EXPECT_EQ(fake().live(), before + 1) << "one physical chunk backs all of them";
  Buffer big = dev.allocate(5u << 20);
  EXPECT_GE(fake().live(), before + 3);
  small.clear();
  big = Buffer();
  EXPECT_EQ(fake().live(), before);
  EXPECT_EQ(dev.memory_stats().device_used, 0u);
}

TEST_F(CudaShim, AQueueReleasedWhileItsStreamWaitsKeepsItsMemoryUntilTheStreamMoves) {
  Device dev = open("cuda:0");
  Buffer gate = dev.allocate(4096, Memory::HostPinned);
  auto* word = reinterpret_cast<std::uint64_t*>(gate.map().data());
  std::atomic_ref<std::uint64_t>(*word).store(0);
  WaitPolicy p = dev.wait_policy();
  p.timeout = 100ms;
  dev.set_wait_policy(p);
  {
    Buffer d = dev.allocate(1 << 20);
    Queue q = dev.queue();
    q.batch().wait_value(gate, 0, 1).fill(d, 0, 1 << 20, 1).submit();
  }  // released with work the stream cannot finish: aborted after the timeout
  // The stream still holds the fill's memory; once it moves, the next
  // queue release reaps it.
  EXPECT_GT(dev.memory_stats().device_used, 0u);
  std::atomic_ref<std::uint64_t>(*word).store(1);
  // The stream moves on its own thread, however late: each queue released
  // after it has reaps the memory.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    dev.queue().submit().wait();
    if (dev.memory_stats().device_used == 0 || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(dev.memory_stats().device_used, 0u);
}

TEST_F(CudaShim, QueuesReleasedWhileOneWaitsOnTheOtherLetTheDeviceClose) {
  // A stream waiting on another queue's fence keeps that queue's timeline
  // word, not the queue (which holds the device): once both streams move,
  // the device closes and gives everything back (TearDown checks).
  Buffer gate;
  std::uint64_t* word = nullptr;
  {
    Device dev = open("cuda:0");
    gate = dev.allocate(4096, Memory::HostPinned);
    word = reinterpret_cast<std::uint64_t*>(gate.map().data());
    std::atomic_ref<std::uint64_t>(*word).store(0);
    WaitPolicy p = dev.wait_policy();
    p.timeout = 50ms;
    dev.set_wait_policy(p);
    Queue a = dev.queue(), b = dev.queue();
    Fence fa = a.batch().wait_value(gate, 0, 1).submit();
    b.batch().wait(fa).submit();
    b = Queue();  // released waiting on a's timeline
    a = Queue();
  }
  std::atomic_ref<std::uint64_t>(*word).store(1);
  gate = Buffer();  // the last handle: the device closes now
}

TEST_F(CudaShim, ExhaustedGpuMemorySaysWhatIsUsedAndFree) {
  Device dev = open("cuda:0");
  Error e = error_of([&] { dev.allocate(300u << 20); });
  EXPECT_EQ(e.status(), Status::OutOfMemory);
  EXPECT_THAT(e.what(), HasSubstr("in heap 'device'"));
  EXPECT_THAT(e.what(), HasSubstr("largest free block"));
  Buffer most = dev.allocate(200u << 20);
  e = error_of([&] { dev.allocate(100u << 20); });
  EXPECT_EQ(e.status(), Status::OutOfMemory);
  EXPECT_THAT(e.what(), HasSubstr("200 MiB used in 1 allocation(s)"));
  most = Buffer();
  Buffer again = dev.allocate(100u << 20);
}

}  // namespace
}  // namespace tpuhal
