// tpuhal stress: the workload. How a worker draws its operations and what
// each one does, on the device and to the host-side model of every buffer.
#include <algorithm>
#include <cstring>
#include <thread>

#include "stress_worker.h"

namespace tpuhal::cli::stress {

void Worker::run() {
  try {
    setup();
    loop();
  } catch (const Error& e) {
    fail(e);
  } catch (const std::exception& e) {
    s_.report(s_.who(index_) + ", operation #" + std::to_string(op_) + " (" + name_of(kind_) + ", " + detail_ +
              "): " + e.what());
    ++c_.errors;
  }
  phase_.store(1);
  finish();
  phase_.store(2);
}

Kind Worker::pick_kind() {
  unsigned total = 0;
  for (std::size_t i = 0; i < kKinds; ++i) total += allowed(static_cast<Kind>(i)) ? kWeight[i] : 0;
  unsigned r = static_cast<unsigned>(uniform(0, total - 1));
  for (std::size_t i = 0; i < kKinds; ++i) {
    if (!allowed(static_cast<Kind>(i))) continue;
    if (r < kWeight[i]) return static_cast<Kind>(i);
    r -= kWeight[i];
  }
  return Kind::Fill;
}

Memory Worker::pick_memory() {
  const unsigned r = static_cast<unsigned>(uniform(0, 9));
  if (r < 2) return Memory::HostPinned;
  if (r < 5 && s_.host_visible) return Memory::DeviceHostVisible;
  return Memory::Device;
}

std::string Worker::describe(const Tracked& t) const {
  return "buffer " + std::to_string(t.id) + " (" + std::to_string(t.size()) + "-byte " + to_string(t.buf.memory()) +
         " buffer at " + hex(t.buf.device_address()) + ")";
}

void Worker::allocate(Tracked& t) {
  const Memory m = pick_memory();
  const std::uint64_t size = pick_size(max_for(m));
  t.buf = s_.dev.allocate(size, m);
  t.model.assign(size, std::byte{0});
  t.fences.clear();
  t.history.clear();
  t.id = next_id_++;
  // Its contents must be known: wait for a queue (slots emptied by a
  // recycle are claimed again once the last handles of their queue go).
  const auto pattern = static_cast<std::uint32_t>(uniform(0, 255));
  const std::uint64_t skipped = c_.skipped;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fill(t, 0, size, pattern, 1, Kind::Free)) {
    if (std::chrono::steady_clock::now() > give_up)
      throw Error(Status::ResourceExhausted, s_.dev.uri() + ": no queue of the pool could be claimed for 30 s");
    sweep();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  c_.skipped = skipped;
}

std::optional<Queue> Worker::pool_queue(bool compute) {
  auto q = s_.pool->pick(rng_, compute);
  if (q) cur_queue_ = *q;
  return q;
}

void Worker::setup() {
  kind_ = Kind::Free;
  detail_ = "allocating the thread's buffers";
  for (auto& t : own_) allocate(t);
  pinned_.buf = s_.dev.allocate(std::max({s_.max_device, s_.max_host_visible, s_.max_pinned}), Memory::HostPinned);
  pinned_.model.resize(pinned_.buf.size());
  if (s_.host_visible) {
    visible_.buf = s_.dev.allocate(s_.max_host_visible, Memory::DeviceHostVisible);
    visible_.model.resize(visible_.buf.size());
  }
  if (s_.dev.properties().caps.wait_value) {
    marker_ = s_.dev.allocate(8, Memory::HostPinned);
    std::memset(marker_.map().data(), 0, 8);
  }
}

void Worker::loop() {
  while (!s_.stop.load(std::memory_order_relaxed)) {
    if (Clock::now() >= s_.deadline) break;
    ++op_;
    kind_ = pick_kind();
    op_seen_.store(op_, std::memory_order_relaxed);
    kind_seen_.store(static_cast<int>(kind_), std::memory_order_relaxed);
    cur_queue_ = Queue();
    detail_.clear();
    const std::uint64_t skipped = c_.skipped;
    switch (kind_) {
      case Kind::Fill: op_fill(); break;
      case Kind::Upload: op_upload(); break;
      case Kind::Download: op_download(); break;
      case Kind::Copy: op_copy(); break;
      case Kind::Tensor: op_tensor(); break;
      case Kind::HostWait: op_host_wait(); break;
      case Kind::CrossWait: op_cross_wait(); break;
      case Kind::Drop: op_drop(); break;
      case Kind::Free: op_free(); break;
      case Kind::Abandon: op_abandon(); break;
      case Kind::Release: op_release(); break;
      case Kind::Recycle: op_recycle(); break;
      case Kind::Map: op_map(); break;
      case Kind::kCount: break;
    }
    if (c_.skipped == skipped) ++c_.ops[static_cast<std::size_t>(kind_)];
    if (op_ % 4 == 0) sweep();
  }
}

bool Worker::fill(Tracked& t, std::uint64_t offset, std::uint64_t size, std::uint32_t pattern, std::uint32_t width,
                  Kind as) {
  auto q = pool_queue();
  if (!q) {
    skip();
    return false;
  }
  detail_ = "fill " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " of " + describe(t) +
            " with " + hex(pattern) + " x" + std::to_string(width);
  Batch b = q->batch();
  depend(b, t);
  b.fill(t.buf, offset, size, pattern, width);
  const Fence f = b.submit();
  submitted(f);
  touched(t, f);
  for (std::uint64_t i = 0; i < size; ++i) t.model[offset + i] = static_cast<std::byte>(pattern >> (8 * (i % width)));
  wrote(t, offset, size, *q, as);
  return true;
}

void Worker::op_fill() {
  Tracked& t = any_buffer();
  std::uint32_t width = std::array<std::uint32_t, 3>{1, 2, 4}[uniform(0, 2)];
  if (t.size() < width) width = 1;
  const std::uint64_t units = t.size() / width;
  const std::uint64_t n = pick_size(units);
  const std::uint64_t at = uniform(0, units - n);
  const std::uint32_t pattern = static_cast<std::uint32_t>(width == 4 ? rng_() : rng_() & ((1u << (8 * width)) - 1));
  fill(t, at * width, n * width, pattern, width, Kind::Fill);
}

Tracked& Worker::staging(std::uint64_t size) {
  Tracked& s = s_.host_visible && size <= visible_.size() && coin(30) ? visible_ : pinned_;
  settle(s);
  return s;
}

void Worker::op_upload() {
  Tracked& t = any_buffer();
  const std::uint64_t n = pick_size(t.size());
  const std::uint64_t at = uniform(0, t.size() - n);
  detail_ = "upload " + std::to_string(n) + " bytes to offset " + std::to_string(at) + " of " + describe(t);
  Tracked& st = staging(n);
  const std::uint64_t from = uniform(0, st.size() - n);
  auto q = pool_queue();
  if (!q) return skip();
  detail_ = "upload " + std::to_string(n) + " bytes from offset " + std::to_string(from) + " of the " +
            to_string(st.buf.memory()) + " staging buffer to offset " + std::to_string(at) + " of " + describe(t);
  auto host = st.buf.map().subspan(from, n);
  random_bytes(host);
  Batch b = q->batch();
  depend(b, t);
  b.copy(st.buf, from, t.buf, at, n);
  const Fence f = b.submit();
  submitted(f);
  touched(t, f);
  touched(st, f);
  std::memcpy(t.model.data() + at, host.data(), n);
  wrote(t, at, n, *q);
}

bool Worker::download(Tracked& t, std::uint64_t at, std::uint64_t n) {
  detail_ = "read back " + std::to_string(n) + " bytes at offset " + std::to_string(at) + " of " + describe(t);
  Tracked& st = staging(n);
  auto q = pool_queue();
  if (!q) {
    skip();
    return true;
  }
  detail_ = "read back " + std::to_string(n) + " bytes at offset " + std::to_string(at) + " of " + describe(t) +
            " into the " + to_string(st.buf.memory()) + " staging buffer";
  Batch b = q->batch();
  depend(b, t);
  b.copy(t.buf, at, st.buf, 0, n);
  const Fence f = b.submit();
  submitted(f);
  touched(t, f);
  f.wait();
  return compare(t, at, st.buf.map().subspan(0, n), "on " + queue_name(*q));
}

void Worker::op_download() {
  Tracked& t = any_buffer();
  if (coin(25)) {
    download(t, 0, t.size());
    return;
  }
  const std::uint64_t n = pick_size(t.size());
  download(t, uniform(0, t.size() - n), n);
}

void Worker::op_copy() {
  Tracked& src = any_buffer();
  Tracked& dst = coin(15) ? src : any_buffer();
  const std::uint64_t n = pick_size(std::min(src.size(), dst.size()));
  const std::uint64_t from = uniform(0, src.size() - n), to = uniform(0, dst.size() - n);
  auto q = pool_queue();
  if (!q) return skip();
  detail_ = "copy " + std::to_string(n) + " bytes from offset " + std::to_string(from) + " of " + describe(src) +
            " to offset " + std::to_string(to) + " of " + describe(dst);
  Batch b = q->batch();
  depend(b, src);
  if (&dst != &src) depend(b, dst);
  b.copy(src.buf, from, dst.buf, to, n);
  const Fence f = b.submit();
  submitted(f);
  touched(src, f);
  if (&dst != &src) touched(dst, f);
  std::memmove(dst.model.data() + to, src.model.data() + from, n);
  wrote(dst, to, n, *q);
}

void Worker::op_tensor() {
  auto q = pool_queue(/*compute=*/true);
  if (!q) return skip();
  const std::int64_t rows = static_cast<std::int64_t>(uniform(1, 16));
  const std::int64_t cols = static_cast<std::int64_t>(uniform(1, 64));
  const auto n = static_cast<std::uint64_t>(rows * cols);
  const unsigned which = static_cast<unsigned>(uniform(0, 3));  // add, mul, max, relu
  const char* names[] = {"add", "mul", "max", "relu"};
  const bool unary = which == 3;
  const bool broadcast = !unary && coin(50);
  const std::uint64_t nb = unary ? 0 : broadcast ? static_cast<std::uint64_t>(cols) : n;
  const std::uint64_t off_a = 4 * uniform(0, 16), off_b = 4 * uniform(0, 16), off_y = 4 * uniform(0, 16);
  detail_ = std::string(names[which]) + " of f32[" + std::to_string(rows) + ", " + std::to_string(cols) + "]" +
            (broadcast ? " and f32[" + std::to_string(cols) + "]" : "");

  // Small multiples of 1/16, never zero: sums, products and maxima are exact.
  auto value = [&] {
    const auto k = static_cast<std::int32_t>(uniform(1, 2000)) - 1001;
    return static_cast<float>(k >= 0 ? k + 1 : k) / 16.0f;
  };
  std::vector<float> a(n), bv(nb), want(n);
  for (auto& v : a) v = value();
  for (auto& v : bv) v = value();
  for (std::uint64_t i = 0; i < n; ++i) {
    const float x = a[i];
    const float y = unary ? 0.0f : bv[broadcast ? i % static_cast<std::uint64_t>(cols) : i];
    want[i] = which == 0 ? x + y : which == 1 ? x * y : which == 2 ? std::max(x, y) : std::max(x, 0.0f);
  }

  Buffer in = s_.dev.allocate((n + nb) * 4, Memory::HostPinned);
  Buffer out = s_.dev.allocate(n * 4, Memory::HostPinned);
  Buffer ba = s_.dev.allocate(off_a + n * 4);
  Buffer bb = unary ? Buffer() : s_.dev.allocate(off_b + nb * 4);
  Buffer by = s_.dev.allocate(off_y + n * 4);
  std::memcpy(in.map().data(), a.data(), n * 4);
  if (nb) std::memcpy(in.map().data() + n * 4, bv.data(), nb * 4);
  std::memset(out.map().data(), 0xFF, n * 4);
  Fence f;
  {
    const tpuhal::Tensor ta(ba, DType::F32, {rows, cols}, off_a);
    const tpuhal::Tensor ty(by, DType::F32, {rows, cols}, off_y);
    std::optional<tpuhal::Tensor> tb;
    if (!unary)
      tb.emplace(bb, DType::F32, broadcast ? std::vector<std::int64_t>{cols} : std::vector<std::int64_t>{rows, cols},
                 off_b);
    const Op op = which == 0   ? ops::add(ta, *tb, ty)
                  : which == 1 ? ops::mul(ta, *tb, ty)
                  : which == 2 ? ops::max(ta, *tb, ty)
                               : ops::relu(ta, ty);
    Batch b = q->batch();
    b.copy(in, 0, ba, off_a, n * 4);
    if (nb) b.copy(in, n * 4, bb, off_b, nb * 4);
    b.run(op).copy(by, off_y, out, 0, n * 4);
    f = b.submit();
    submitted(f);
  }
  // Freed with the work in flight.
  in.free();
  ba.free();
  bb.free();
  by.free();
  f.wait();
  const auto got = out.map();
  c_.bytes_verified += n * 4;
  for (std::uint64_t i = 0; i < n; ++i) {
    float g;
    std::memcpy(&g, got.data() + i * 4, 4);
    if (g != want[i]) {
      mismatch(s_.dev.uri() + ": " + detail_ + " on " + queue_name(*q) + ": element " + std::to_string(i) +
               " (byte offset " + std::to_string(i * 4) + " of y) is " + std::to_string(g) + ", expected " +
               std::to_string(want[i]) + " (a " + std::to_string(a[i]) + ")");
      return;
    }
  }
}

void Worker::op_host_wait() {
  auto q = pool_queue();
  if (!q) return skip();
  const Fence f = q->last_fence();
  detail_ = "host wait for fence " + std::to_string(f.value());
  f.wait();
  if (!f.is_complete() || q->completed_value() < f.value())
    mismatch(queue_name(*q) + ": fence " + std::to_string(f.value()) + " waited for but the queue reports " +
             std::to_string(q->completed_value()));
}

void Worker::op_cross_wait() {
  auto qa = pool_queue();
  auto qb = s_.pool->pick(rng_);
  if (!qa || !qb) return skip();
  if (qa->index() == qb->index()) return;  // the same queue: in order anyway
  Fence fb = qb->last_fence();
  if (fb.empty()) {
    fb = qb->submit();
    submitted(fb);
  }
  Tracked& t = any_buffer();
  const std::uint64_t n = pick_size(std::min<std::uint64_t>(t.size(), 4096));
  const std::uint64_t at = uniform(0, t.size() - n);
  const auto pattern = static_cast<std::uint32_t>(uniform(0, 255));
  detail_ = "wait on the device for " + queue_name(*qb) + " fence " + std::to_string(fb.value()) + ", then fill " +
            std::to_string(n) + " bytes at offset " + std::to_string(at) + " of " + describe(t);
  Batch b = qa->batch();
  b.wait(fb);
  depend(b, t);
  b.fill(t.buf, at, n, pattern, 1);
  const Fence fa = b.submit();
  submitted(fa);
  touched(t, fa);
  std::memset(t.model.data() + at, static_cast<int>(pattern), n);
  wrote(t, at, n, *qa);
  fa.wait();
  if (!fb.is_complete())
    mismatch(queue_name(*qa) + " reached fence " + std::to_string(fa.value()) + ", which waits for " + queue_name(*qb) +
             " fence " + std::to_string(fb.value()) + ", but that fence is not complete (" +
             std::to_string(qb->completed_value()) + " reached)");
}

void Worker::op_drop() {
  auto q = pool_queue();
  if (!q) return skip();
  detail_ = "empty submission, fence dropped";
  // Only the bookkeeping keeps it: nothing waits for this fence.
  submitted(q->submit());
}

void Worker::op_free() {
  const std::size_t i = uniform(0, own_.size() - 1), j = (i + 1 + uniform(0, own_.size() - 2)) % own_.size();
  Tracked& t = own_[i];
  Tracked& other = own_[j];
  auto q = pool_queue();
  if (!q) return skip();
  const std::uint64_t n = pick_size(std::min(t.size(), other.size()));
  const std::uint64_t from = uniform(0, t.size() - n), to = uniform(0, other.size() - n);
  detail_ = "copy " + std::to_string(n) + " bytes from offset " + std::to_string(from) + " of " + describe(t) +
            " to offset " + std::to_string(to) + " of " + describe(other) + ", fill the first, free it";
  Batch b = q->batch();
  depend(b, t);
  depend(b, other);
  b.copy(t.buf, from, other.buf, to, n).fill(t.buf, 0, t.size(), 0xEE);
  const Fence f = b.submit();
  submitted(f);
  touched(other, f);
  std::memcpy(other.model.data() + to, t.model.data() + from, n);
  wrote(other, to, n, *q);
  t.buf.free();
  allocate(t);
}

void Worker::op_abandon() {
  Tracked& t = any_buffer();
  auto q = pool_queue();
  if (!q) return skip();
  detail_ = "record a fill and a copy into " + describe(t) + " and drop the batch unsubmitted";
  Batch b = q->batch();
  b.fill(t.buf, 0, t.size(), 0xAB).copy(pinned_.buf, 0, t.buf, 0, std::min(t.size(), pinned_.size()));
  // Destroyed here: nothing reaches the device; the model stays as it was.
}

void Worker::op_release() {
  static constexpr Engine kEngines[] = {Engine::Compute, Engine::Copy, Engine::Video};
  Queue q;
  const std::size_t first = uniform(0, 2);
  for (std::size_t i = 0; i < 3 && !claimed(q); ++i) {
    try {
      q = s_.dev.queue(kEngines[(first + i) % 3]);
    } catch (const Error& e) {
      if (e.status() != Status::ResourceExhausted && e.status() != Status::Unsupported) throw;
    }
  }
  if (!claimed(q)) return skip();
  cur_queue_ = q;
  struct Range {
    Tracked* t;
    std::uint64_t at, n;
  };
  std::vector<Range> written;
  const unsigned batches = static_cast<unsigned>(uniform(1, 3));
  detail_ = std::to_string(batches) + " batches on a queue released with them pending";
  for (unsigned k = 0; k < batches; ++k) {
    Tracked& t = any_buffer();
    Batch b = q.batch();
    depend(b, t);
    const std::uint64_t n = pick_size(t.size());
    const std::uint64_t at = uniform(0, t.size() - n);
    if (coin(50)) {
      const auto pattern = static_cast<std::uint32_t>(uniform(0, 255));
      b.fill(t.buf, at, n, pattern, 1);
      std::memset(t.model.data() + at, static_cast<int>(pattern), n);
    } else {
      Tracked& src = any_buffer();
      const std::uint64_t m = std::min(n, src.size());
      const std::uint64_t from = uniform(0, src.size() - m);
      if (&src != &t) depend(b, src);
      b.copy(src.buf, from, t.buf, at, m);
      std::memmove(t.model.data() + at, src.model.data() + from, m);
      // Later writes to the source must wait for this read; the queue
      // is gone by then, so its release is the wait.
    }
    // The last batch says that it ran: a failure of work on a released
    // queue has no one to report to.
    if (k + 1 == batches && marker_.valid()) b.write_value(marker_, 0, op_);
    (void)b.submit();  // fence dropped
    ++c_.submitted;
    wrote(t, at, n, q);
    written.push_back({&t, at, n});
  }
  const std::string name = queue_name(q);
  q = Queue();  // released with its work pending: this waits for it
  cur_queue_ = Queue();
  s_.releases.fetch_add(1, std::memory_order_relaxed);
  if (marker_.valid()) {
    std::uint64_t seen;
    std::memcpy(&seen, marker_.map().data(), 8);
    if (seen != op_) {
      c_.failed += batches;
      mismatch(name + ": released with " + std::to_string(batches) +
               " batch(es) pending, but the last one did not run before the release returned (its marker "
               "reads " +
               std::to_string(seen) + "): the queue failed or was aborted, and the release said nothing");
      return;
    }
  }
  // Its work is done: read back what it wrote (a read-back skipped for
  // want of a queue does not make the release a skipped operation).
  const std::uint64_t skipped = c_.skipped;
  bool ok = true;
  for (auto& r : written) ok = download(*r.t, r.at, std::min(r.n, r.t->size() - r.at)) && ok;
  c_.skipped = skipped;
  if (ok) c_.completed += batches;
}

void Worker::op_recycle() {
  Queue q = s_.pool->take(rng_);
  if (!claimed(q)) return skip();
  cur_queue_ = q;
  Tracked& t = any_buffer();
  const std::uint64_t n = pick_size(t.size());
  const std::uint64_t at = uniform(0, t.size() - n);
  const auto pattern = static_cast<std::uint32_t>(uniform(0, 255));
  detail_ = "fill " + std::to_string(n) + " bytes at offset " + std::to_string(at) + " of " + describe(t) +
            ", then take the queue out of the pool";
  Batch b = q.batch();
  depend(b, t);
  b.fill(t.buf, at, n, pattern, 1);
  const Fence f = b.submit();
  submitted(f);
  touched(t, f);
  std::memset(t.model.data() + at, static_cast<int>(pattern), n);
  wrote(t, at, n, q);
  cur_queue_ = Queue();
}

void Worker::op_map() {
  Tracked* t = nullptr;
  for (std::size_t tries = 0; tries < own_.size() && !t; ++tries) {
    Tracked& c = any_buffer();
    if (mappable(c)) t = &c;
  }
  if (!t) return skip();
  detail_ = "check " + describe(*t) + " through its host mapping";
  settle(*t);
  auto view = t->buf.map();
  if (!compare(*t, 0, view, "through its host mapping")) return;
  if (coin(50)) {  // and write part of it from the host
    const std::uint64_t n = pick_size(t->size());
    const std::uint64_t at = uniform(0, t->size() - n);
    random_bytes(view.subspan(at, n));
    std::memcpy(t->model.data() + at, view.data() + at, n);
    t->history.push_back({op_, kind_, at, n, Engine::Compute, Tracked::kHost});
    if (t->history.size() > 6) t->history.pop_front();
  }
}

}  // namespace tpuhal::cli::stress
