// The board's own checks of parameter blocks the HAL would never produce,
// and the same convolution on every compute queue.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_F(OpsBoard, AValidBlockInMemoryRuns) {
  auto q = rig_.dev->create_queue(Engine::Compute, {});
  expect_add_runs(*q);
}

TEST_F(OpsBoard, AnOutputOverlappingAnInputIsRefused) {
  AddBlock b = add_block();
  b.t[2].address = base_ + kA + 16;  // y over the tail of a
  expect_refused(b, {"bad argument", "output tensor 2 overlaps input tensor 0"}, kNoCheck);
  // a's bytes are as they were.
  auto m = mem_->map();
  for (int i = 0; i < 16; ++i) {
    float a;
    std::memcpy(&a, m.data() + kA + 4 * i, 4);
    EXPECT_EQ(a, static_cast<float>(i));
  }
}

TEST_F(OpsBoard, ATensorPastTheEndOfDramIsADmaFaultNamingIt) {
  AddBlock b = add_block();
  const std::uint64_t dram = rig_.board->profile().dram_bytes;
  b.t[0].address = dram - 32;  // 64 bytes from 32 before the end
  std::ostringstream hex;
  hex << std::hex << "0x" << dram - 32;
  expect_refused(b, {"DMA fault", "tensor 0 address", hex.str(), "not mapped for DMA (read)"});
}

TEST_F(OpsBoard, AnUnmappedHostAddressIsADmaFaultNamingTheTensor) {
  AddBlock b = add_block();
  b.t[1].address = fw::kHostWindowBase + (1ull << 40);
  expect_refused(b, {"DMA fault", "tensor 1 address", "0x1010000000000", "(read)"});
  b = add_block();
  b.t[2].address = fw::kHostWindowBase + (1ull << 40);
  expect_refused(b, {"DMA fault", "tensor 2 address", "(write)"});
}

TEST_F(OpsBoard, AWrongMagicIsRefused) {
  AddBlock b = add_block();
  b.h.magic = 0xDEADBEEF;
  expect_refused(b, {"bad argument", "op header = 3735928559"});
}

TEST_F(OpsBoard, AnUnknownOpKindIsRefused) {
  AddBlock b = add_block();
  b.h.kind = 99;
  expect_refused(b, {"bad argument", "op kind = 99"});
}

TEST_F(OpsBoard, InconsistentConvolutionShapesAreRefusedNamingTheField) {
  ConvBlock b{};
  b.h.magic = fw::kOpMagic;
  b.h.kind = static_cast<std::uint32_t>(fw::OpKind::kConv2d);
  b.h.num_tensors = 4;
  b.h.attr_bytes = sizeof(fw::ConvAttrs);
  b.t[0] = tensor_ref(base_ + 4096, fw::DType::kF32, {1, 1, 6, 6});
  b.t[1] = tensor_ref(base_ + 8192, fw::DType::kF32, {1, 1, 3, 3});
  b.t[3] = tensor_ref(base_ + kY, fw::DType::kF32, {1, 1, 5, 4});  // 4x4 is what a 3x3 kernel leaves of 6x6
  b.at.groups = 1;
  b.at.stride[0] = b.at.stride[1] = 1;
  b.at.dilation[0] = b.at.dilation[1] = 1;
  expect_refused(b, {"bad argument", "tensor 3 shape[2] = 5 is not valid (expected 4)"});
  // Input channels that do not match the weights.
  b.t[3] = tensor_ref(base_ + kY, fw::DType::kF32, {1, 1, 4, 4});
  b.t[1] = tensor_ref(base_ + 8192, fw::DType::kF32, {1, 2, 3, 3});
  expect_refused(b, {"bad argument", "tensor 1 shape[1] = 2 is not valid (expected 1)"});
}

TEST_F(OpsBoard, OtherQueuesAndLaterWorkStayIntact) {
  auto good = rig_.dev->create_queue(Engine::Compute, {});
  expect_add_runs(*good);
  AddBlock b = add_block();
  b.h.kind = 0;
  expect_refused(b, {"op kind = 0"});
  b = add_block();
  b.t[2].address = base_ + kB;
  expect_refused(b, {"output tensor 2 overlaps input tensor 1"}, kNoCheck);
  // The queue that never failed still runs ops, twice.
  expect_add_runs(*good);
  expect_add_runs(*good);
  EXPECT_FALSE(good->timeline().failed);
}

// A convolution's oneDNN primitive is made on the thread of the queue that
// first runs it and kept; other compute queues (other board threads) must be
// able to run it too, in any order, with the same result.
TEST(OpsAcrossQueues, ConvolutionRunsAlikeOnEveryComputeQueue) {
  Device dev = open("sim:0");
  Queue a = dev.queue(Engine::Compute), b = dev.queue(Engine::Compute);
  const std::int64_t n = 1, c = 16, h = 32, w = 32, o = 32;
  Buffer xb = dev.allocate(n * c * h * w * 4, Memory::DeviceHostVisible);
  Buffer wb = dev.allocate(o * c * 9 * 4, Memory::DeviceHostVisible);
  auto* xp = reinterpret_cast<float*>(xb.map().data());
  auto* wp = reinterpret_cast<float*>(wb.map().data());
  for (std::int64_t i = 0; i < n * c * h * w; ++i) xp[i] = static_cast<float>((i * 37) % 11) - 5.0f;
  for (std::int64_t i = 0; i < o * c * 9; ++i) wp[i] = static_cast<float>((i * 13) % 7) - 3.0f;
  Conv2dOptions opt;
  opt.pads = {1, 1, 1, 1};
  std::vector<std::vector<float>> results;
  for (Queue* q : {&a, &b, &a, &b}) {
    Buffer yb = dev.allocate(n * o * h * w * 4, Memory::DeviceHostVisible);
    q->run(ops::conv2d(Tensor(xb, DType::F32, {n, c, h, w}), Tensor(wb, DType::F32, {o, c, 3, 3}),
                       Tensor(yb, DType::F32, {n, o, h, w}), opt))
        .submit()
        .wait();
    const auto* yp = reinterpret_cast<const float*>(yb.map().data());
    results.emplace_back(yp, yp + n * o * h * w);
  }
  // One element against the definition (integers: exact in f32).
  double want = 0;
  for (std::int64_t ci = 0; ci < c; ++ci)
    for (int kh = 0; kh < 3; ++kh)
      for (int kw = 0; kw < 3; ++kw)
        want += xp[(ci * h + 4 + kh - 1) * w + 7 + kw - 1] * wp[((5 * c + ci) * 3 + kh) * 3 + kw];
  EXPECT_EQ(results[0][(5 * h + 4) * w + 7], want);
  for (std::size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << "run " << i;
}

}  // namespace
}  // namespace tpuhal::ops_test
