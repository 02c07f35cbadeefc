// Recorded programs: replays, kept buffers, what a program refuses.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, ProgramsReplayLikeDirectRunsAndKeepTheirBuffersAlive) {
  const Shape xs{1, 2, 6, 6}, ws{3, 2, 3, 3}, cs{1, 3, 6, 6}, bs{6, 5}, ms{18, 5};
  const std::uint64_t x_bytes = 72 * 4, out_bytes = 90 * 4;
  const Host w = rand(DType::F32, ws, -0.5, 0.5), bias = rand(DType::F32, {3}, -0.5, 0.5), bm = rand(DType::F32, bs);
  struct Pipeline {
    Buffer in, out;  // host memory: the input written and the output read between replays
    Tensor x, w, bias, conv, relu, b, mm, sm;
  };
  auto make = [&] {
    Pipeline p;
    p.in = dev().allocate(x_bytes, Memory::HostPinned);
    p.out = dev().allocate(out_bytes, Memory::HostPinned);
    p.x = Tensor(dev().allocate(x_bytes), DType::F32, xs);
    p.w = lab().upload(w);
    p.bias = lab().upload(bias);
    p.b = lab().upload(bm);
    p.conv = lab().output(DType::F32, cs);
    p.relu = lab().output(DType::F32, cs);
    p.mm = lab().output(DType::F32, ms);
    p.sm = lab().output(DType::F32, ms);
    return p;
  };
  auto record = [&](Batch& b, const Pipeline& p) {
    b.copy(p.in, 0, p.x.buffer(), 0, x_bytes);
    Conv2dOptions o;
    o.pads = {1, 1, 1, 1};
    o.bias = p.bias;
    b.run(ops::conv2d(p.x, p.w, p.conv, o));
    b.run(ops::relu(p.conv, p.relu));
    b.run(ops::matmul(p.relu.reshape({18, 6}), p.b, p.mm));
    b.run(ops::softmax(p.mm, p.sm, -1));
    b.copy(p.sm.buffer(), 0, p.out, 0, out_bytes);
  };
  Buffer prog_in, prog_out;
  Program program;
  const std::uint64_t used_before = dev().memory_stats().device_used;
  {
    Pipeline p = make();
    prog_in = p.in;
    prog_out = p.out;
    program = dev().record([&](Batch& b) { record(b, p); });
  }  // every other handle to the program's buffers goes here
  ASSERT_EQ(program.size(), 6u);
  EXPECT_GE(dev().memory_stats().device_used, used_before + 8 * 64) << "the program's buffers were freed";
  // Were its buffers freed, these would get their memory and scribble on it.
  std::vector<Buffer> scribble;
  for (int i = 0; i < 8; ++i) {
    scribble.push_back(dev().allocate(4096));
    lab().q.fill(scribble.back(), 0, 4096, 0x7F).submit().wait();
  }
  Pipeline direct = make();
  std::vector<std::byte> previous;
  for (int rep = 0; rep < 4; ++rep) {
    const Host x = rand(DType::F32, xs, -2, 2);
    for (std::size_t i = 0; i < x.size(); ++i) {
      store(DType::F32, x.v[i], prog_in.map().data() + 4 * i);
      store(DType::F32, x.v[i], direct.in.map().data() + 4 * i);
    }
    lab().q.run(program).submit().wait();
    {
      Batch b = lab().q.batch();
      record(b, direct);
      b.submit().wait();
    }
    const auto pm = prog_out.map(), dm = direct.out.map();
    EXPECT_EQ(std::memcmp(pm.data(), dm.data(), out_bytes), 0) << "replay " << rep << " differs from the direct run";
    const std::vector<std::byte> now(pm.begin(), pm.begin() + static_cast<std::ptrdiff_t>(out_bytes));
    EXPECT_NE(now, previous) << "replay " << rep << " did not see its new input";
    previous = now;
    // And the chain is right: conv -> relu -> matmul -> softmax in double.
    // Each stage's f32 error stays below 2e-4 here (|conv| <= 10 from 18
    // products of magnitude <= 1, then 6 more products), so softmax
    // outputs (in [0, 1], Lipschitz 1 in the logits) are within 1e-3.
    Host got(DType::F32, ms);
    for (std::size_t i = 0; i < got.size(); ++i) got.v[i] = load(DType::F32, pm.data() + 4 * i);
    ConvGeom g;
    g.pads = {1, 1, 1, 1};
    const Ref conv = ref_conv(x, w, bias, g, ActivationParams::relu(), DType::F32, cs);
    Host relu(DType::F32, {18, 6});
    relu.v = conv.v;
    Shape mys;
    const Ref logits = ref_matmul(relu, bm, MatMulSpec{}, mys);
    Host lg(DType::F32, ms);
    lg.v = logits.v;
    Ref want = ref_softmax(lg, -1, false, DType::F32);
    std::fill(want.tol.begin(), want.tol.end(), 1e-3);
    expect("program replay " + std::to_string(rep) + " against the reference", got, want);
  }
}

TEST_P(Ops, ProgramsRefuseFenceWaitsAndNonComputeQueues) {
  Buffer buf = dev().allocate(4096);
  const Fence f = lab().q.fill(buf, 0, 4096, 1).submit();
  Error e = error_of([&] { dev().record([&](Batch& b) { b.fill(buf, 0, 64, 2).wait(f); }); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("a program cannot wait on a fence"));
  f.wait();

  const Host x = rand(DType::F32, {4, 8}, -1, 1);
  const Tensor tx = lab().upload(x), ty = lab().output(DType::F32, {4, 8});
  const Program p = dev().record([&](Batch& b) { b.run(ops::relu(tx, ty)); });
  Queue copy_q;
  try {
    copy_q = dev().queue(Engine::Copy);
  } catch (const Error& err) {
    GTEST_SKIP() << GetParam() << " has no free copy queue: " << err.what();
  }
  e = error_of([&] { copy_q.run(p); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("programs need a compute queue"));
  e = error_of([&] { copy_q.run(ops::relu(tx, ty)); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("activation needs a compute queue"));
  // Where it may, the program runs.
  lab().q.run(p).submit().wait();
  std::vector<double> want;
  for (double v : x.v) want.push_back(v > 0 ? v : 0.0);
  expect_exact("relu program", lab().download(ty), want);
}

}  // namespace
}  // namespace tpuhal::ops_test
