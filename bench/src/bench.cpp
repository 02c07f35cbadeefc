#include <algorithm>
#include <cstdio>
#include <cstring>

#include "tpuhal/base/units.h"
#include "tpuhal/base/wait.h"
#include "raw_cuda.h"
#include "results.h"

namespace tpuhal::bench {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void emit(std::vector<Result>& out, Result r, const Options& o) {
  if (r.ratio == 0) r.ratio = r.baseline > 0 ? r.value / r.baseline : 0;
  if (o.on_result) o.on_result(r);
  out.push_back(std::move(r));
}

namespace {

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// The raw-driver baseline for a CUDA device, or null (saying why on stderr:
// the figures then stand beside the machine's floors alone).
std::unique_ptr<RawCuda> raw_cuda(Device& device, std::uint64_t max_bytes) {
  std::string why;
  auto raw = RawCuda::open(device.uri(), max_bytes, &why);
  if (!raw) std::fprintf(stderr, "tpuhal bench: no raw CUDA baseline for %s: %s\n", device.uri().c_str(), why.c_str());
  return raw;
}

}  // namespace

std::string to_json(const Result& r) {
  std::string s = "{\"bench\":\"" + json_escape(r.bench) + "\"";
  for (auto& [k, v] : r.params) {
    const bool numeric = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
    s += ",\"" + json_escape(k) + "\":" + (numeric ? v : "\"" + json_escape(v) + "\"");
  }
  s += ",\"value\":" + number(r.value) + ",\"unit\":\"" + json_escape(r.unit) + "\"";
  s += ",\"baseline\":" + number(r.baseline) + ",\"baseline_name\":\"" + json_escape(r.baseline_name) + "\"";
  s += ",\"ratio\":" + number(r.ratio);
  for (auto& [k, v] : r.extra) s += ",\"" + json_escape(k) + "\":" + number(v);
  return s + "}";
}

std::vector<Result> run_dma(Device& device, const Options& o) {
  std::vector<Result> out;
  // Up to 64 MiB, or the largest size of the series that fits twice in the
  // default heap of a small board.
  std::uint64_t heap = 0;
  for (const HeapInfo& h : device.properties().heaps)
    if (h.is_default) heap = h.size;
  std::uint64_t max_bytes = 64ull << 20;
  while (max_bytes > 4096 && max_bytes > heap / 2) max_bytes /= 4;
  Buffer host = device.allocate(max_bytes, Memory::HostPinned);
  Buffer dram = device.allocate(max_bytes);
  std::memset(host.map().data(), 0x5a, max_bytes);
  Queue q = device.queue(Engine::Copy);
  q.copy(host, dram).submit().wait();  // first touch of every page on both sides
  q.copy(dram, host).submit().wait();

  MemcpyFloor floor(max_bytes);
  // On a GPU the same copies through the raw driver API are the baseline
  // the shim answers to; memcpy stays beside them.
  std::unique_ptr<RawCuda> raw;
  if (device.properties().driver == "cuda") raw = raw_cuda(device, max_bytes);
  const int rounds = o.quick ? 3 : 21;
  for (std::uint64_t size = 4096; size <= max_bytes; size *= 4) {
    const std::uint64_t budget = o.quick ? (32ull << 20) : (128ull << 20);
    for (int dir = 0; dir < 2; ++dir) {
      const Buffer& src = dir == 0 ? host : dram;
      const Buffer& dst = dir == 0 ? dram : host;
      // As many copies as the byte budget asks, but no more than fit in a
      // time budget on a slow link (a USB board: milliseconds per copy).
      const auto p0 = base::monotonic_ns();
      q.copy(src, 0, dst, 0, size).submit().wait();
      const double one = std::max(1e-9, static_cast<double>(base::monotonic_ns() - p0) * 1e-9);
      const double seconds = o.quick ? 0.25 : 1.0;
      const int reps = static_cast<int>(std::clamp<std::uint64_t>(
          std::min<std::uint64_t>(budget / size, static_cast<std::uint64_t>(seconds / one) + 1), 2, 4096));
      std::vector<double> dma, cpu, paired, direct, vs_direct;
      // Each round measures the floor just before and just after the device,
      // so that the memory bandwidth other tenants of this machine leave us
      // (it drifts from one millisecond to the next) is the same for both;
      // the ratio is the median of the rounds' ratios.
      double before = floor.gbps(size, reps);
      for (int r = 0; r < rounds; ++r) {
        const auto t0 = base::monotonic_ns();
        Fence last;
        for (int i = 0; i < reps; ++i) last = q.copy(src, 0, dst, 0, size).submit();
        last.wait();
        const double sec = static_cast<double>(base::monotonic_ns() - t0) * 1e-9;
        dma.push_back(static_cast<double>(size) * reps / sec / 1e9);
        const double after = floor.gbps(size, reps);
        cpu.push_back((before + after) / 2);
        paired.push_back(dma.back() / cpu.back());
        before = after;
        if (raw) {
          direct.push_back(raw->copy_gbps(dir == 0, size, reps));
          vs_direct.push_back(dma.back() / direct.back());
        }
      }
      Result res;
      res.bench = "dma";
      res.params = {{"direction", dir == 0 ? "h2d" : "d2h"}, {"bytes", std::to_string(size)}};
      res.value = median(dma);
      res.unit = "GB/s";
      if (raw) {
        res.baseline = median(direct);
        res.baseline_name = "raw cuMemcpyAsync";
        res.extra = {{"memcpy", median(cpu)}, {"vs_memcpy", median(paired)}};
        res.ratio = median(vs_direct);
        emit(out, std::move(res), o);
        continue;
      }
      res.baseline = median(cpu);
      res.baseline_name = "memcpy";
      res.ratio = median(paired);
      emit(out, std::move(res), o);
    }
  }
  return out;
}

std::vector<Result> run_submit(Device& device, const Options& o) {
  std::vector<Result> out;
  Queue q = device.queue(Engine::Compute);
  const int iterations = o.quick ? 2000 : 20000;

  // Round trip: submit one empty command, wait for its fence. The warm-up
  // and the samples also stop at a time budget, for slow links.
  const std::uint64_t budget_ns = o.quick ? 2'000'000'000ull : 10'000'000'000ull;
  const auto warm = base::monotonic_ns();
  for (int i = 0; i < 200 && base::monotonic_ns() - warm < budget_ns / 10; ++i) q.submit().wait();
  std::vector<double> rt;
  rt.reserve(iterations);
  const auto start = base::monotonic_ns();
  for (int i = 0; i < iterations && (i < 50 || base::monotonic_ns() - start < budget_ns); ++i) {
    const auto t0 = base::monotonic_ns();
    q.submit().wait();
    rt.push_back(static_cast<double>(base::monotonic_ns() - t0) / 1000.0);
  }
  Result r;
  r.bench = "round_trip";
  r.params = {{"policy", to_string(device.wait_policy().mode)}};
  r.value = median(rt);
  r.unit = "us";
  r.baseline = atomic_pingpong_ns(iterations) / 1000.0;
  r.baseline_name = "atomic ping-pong";
  r.extra = {{"p99", percentile(rt, 0.99)}, {"eventfd_pingpong", eventfd_pingpong_ns(iterations) / 1000.0}};
  // On a GPU: an empty kernel through the raw driver API (launch, then
  // synchronise) is the floor, and the figure that matters is how far above
  // it the shim's round trip is.
  std::unique_ptr<RawCuda> raw;
  if (device.properties().driver == "cuda") raw = raw_cuda(device, 4096);
  if (raw) {
    std::vector<double> launches;
    launches.reserve(iterations);
    for (int i = 0; i < 200; ++i) raw->launch_round_trip_us();
    for (int i = 0; i < iterations; ++i) launches.push_back(raw->launch_round_trip_us());
    r.extra["atomic_pingpong"] = r.baseline;
    r.baseline = median(launches);
    r.baseline_name = "raw cuLaunchKernel";
    r.extra["overhead_us"] = r.value - r.baseline;
  }
  emit(out, std::move(r), o);

  // Sustained rate: empty commands back to back on one queue, all completed.
  // As many as the count asks, or as fit in about a second a round at the
  // rate a probe of 1000 shows.
  std::uint64_t n = o.quick ? 200'000 : 2'000'000;
  {
    const auto t0 = base::monotonic_ns();
    Fence last;
    for (int i = 0; i < 1000; ++i) last = q.submit();
    last.wait();
    const double per = static_cast<double>(base::monotonic_ns() - t0) * 1e-9 / 1000;
    n = std::clamp<std::uint64_t>(static_cast<std::uint64_t>((o.quick ? 0.5 : 2.0) / per), 1000, n);
  }
  std::vector<double> rates, floors, launches;
  for (int round = 0; round < 3; ++round) {
    floors.push_back(spsc_rate_mps(n));
    if (raw) launches.push_back(raw->launch_rate_mps(n));
    const auto t0 = base::monotonic_ns();
    Fence last;
    for (std::uint64_t i = 0; i < n; ++i) last = q.submit();
    last.wait();
    const double sec = static_cast<double>(base::monotonic_ns() - t0) * 1e-9;
    rates.push_back(static_cast<double>(n) / sec / 1e6);
  }
  Result s;
  s.bench = "submit_rate";
  s.params = {{"commands", std::to_string(n)}};
  s.value = median(rates);
  s.unit = "Mcmd/s";
  s.baseline = median(floors);
  s.baseline_name = "spsc ring";
  if (raw) {
    s.extra["spsc_ring"] = s.baseline;
    s.baseline = median(launches);
    s.baseline_name = "raw cuLaunchKernel";
  }
  emit(out, std::move(s), o);
  return out;
}

}  // namespace tpuhal::bench
