// tpuhal-simd --trace (board_trace.h).
#include "board_trace.h"

#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "tpuhal/base/output_file.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/status.h"

namespace tpuhal::simd {

struct BoardTrace::Observer final : sim::CommandObserver {
  BoardTrace* trace = nullptr;
  std::int64_t pid = 0;
  std::uint32_t board = 0, vf = 0;
  std::vector<std::string> queue_names;
  void on_command(const sim::CommandRecord& r) noexcept override { trace->push(*this, r); }
};

BoardTrace::BoardTrace(std::string path) : path_(std::move(path)) {
  // A new file renamed over the name at once, then written as clients run:
  // a link planted at the name (the daemon may run as another user than
  // whoever shares the directory) is replaced, never written through.
  try {
    base::OutputFile out(path_);
    out.publish();
    const int fd = out.release();
    file_ = ::fdopen(fd, "w");
    if (!file_) {
      const int err = errno;
      ::close(fd);
      throw std::system_error(err, std::generic_category(), "cannot create " + path_);
    }
  } catch (const std::system_error& e) {
    throw std::runtime_error(std::string("--trace: ") + e.what());
  }
  std::fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", file_);
  writer_ = std::thread([this] { run(); });
}

BoardTrace::~BoardTrace() { finish(); }

sim::CommandObserver* BoardTrace::observe(pid_t pid, std::uint32_t board, std::uint32_t vf,
                                          const sim::BoardProfile& profile) {
  std::lock_guard lock(mu_);
  Observer& o = observers_.emplace_back();
  o.trace = this;
  o.pid = pid;
  o.board = board;
  o.vf = vf;
  for (std::uint32_t q = 0; q < profile.total_queues(); ++q)
    o.queue_names.push_back("board " + std::to_string(board) + " vf " + std::to_string(vf) + " " +
                            fw::to_string(profile.engine_of_queue(q)) + " queue " + std::to_string(q));
  return &o;
}

void BoardTrace::push(const Observer& from, const sim::CommandRecord& r) noexcept {
  std::lock_guard lock(mu_);
  if (finished_ || pending_.size() >= kPendingLimit) {
    ++dropped_;
    return;
  }
  try {
    pending_.push_back({r, &from});
  } catch (...) {
    ++dropped_;
  }
}

namespace {
void micros(std::string& out, std::uint64_t ns) { out += fmt::format("{}.{:03}", ns / 1000, ns % 1000); }
}  // namespace

void BoardTrace::write_pending(std::vector<Record>& batch) {
  for (const Record& rec : batch) {
    const Observer& o = *rec.from;
    const std::uint32_t tid = rec.cmd.queue + 1;
    auto begin = [&] {
      out_ += first_ ? "\n" : ",\n";
      first_ = false;
      ++events_;
    };
    if (named_pids_.insert(o.pid).second) {
      begin();
      out_ += fmt::format(
          "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"client pid {} "
          "(tpuhal-simd)\"}}}}",
          o.pid, o.pid);
    }
    // One track per queue of each VF the process holds.
    const std::uint32_t track = o.board * 100000 + o.vf * 1000 + tid;
    if (named_tracks_.insert({o.pid, track}).second) {
      begin();
      out_ +=
          fmt::format("{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                      o.pid, track, rec.cmd.queue < o.queue_names.size() ? o.queue_names[rec.cmd.queue] : "queue");
    }
    // The board's clock is the host's CLOCK_MONOTONIC less its reset time.
    const auto host = [&](std::uint64_t board_ns) { return board_ns + rec.cmd.epoch_ns; };
    begin();
    out_ += fmt::format("{{\"ph\":\"X\",\"name\":\"{}\",\"cat\":\"board\",\"ts\":",
                        fw::to_string(static_cast<fw::Opcode>(rec.cmd.opcode)));
    micros(out_, host(rec.cmd.start_ns));
    out_ += ",\"dur\":";
    micros(out_, rec.cmd.end_ns - rec.cmd.start_ns);
    out_ += fmt::format(",\"pid\":{},\"tid\":{},\"args\":{{\"submission\":{}", o.pid, track, rec.cmd.fence_value);
    if (rec.cmd.bytes) out_ += fmt::format(",\"bytes\":{}", rec.cmd.bytes);
    if (rec.cmd.status)
      out_ += fmt::format(",\"status\":\"{}\"", fw::to_string(static_cast<fw::CmdStatus>(rec.cmd.status)));
    out_ += "}}";
  }
  batch.clear();
  if (!out_.empty() && file_) {
    if (std::fwrite(out_.data(), 1, out_.size(), file_) != out_.size()) {
      std::fprintf(stderr, "tpuhal-simd: --trace: cannot write %s: %s; the trace stops\n", path_.c_str(),
                   std::strerror(errno));
      std::fclose(file_);
      file_ = nullptr;
    }
  }
  out_.clear();
}

void BoardTrace::run() {
  std::vector<Record> batch;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(10), [&] { return stopping_; });
    batch.swap(pending_);
    lock.unlock();
    write_pending(batch);
    lock.lock();
  }
}

void BoardTrace::finish() {
  {
    std::lock_guard lock(mu_);
    if (finished_) return;
    stopping_ = true;
  }
  wake_.notify_one();
  if (writer_.joinable()) writer_.join();
  std::vector<Record> rest;
  std::uint64_t dropped;
  {
    std::lock_guard lock(mu_);
    finished_ = true;
    rest.swap(pending_);
    dropped = dropped_;
  }
  write_pending(rest);
  if (!file_) return;
  std::fprintf(file_,
               "\n],\"otherData\":{\"clock\":\"CLOCK_MONOTONIC\",\"source\":\"tpuhal-simd\",\"events\":%llu,"
               "\"dropped_events\":%llu}}\n",
               static_cast<unsigned long long>(events_), static_cast<unsigned long long>(dropped));
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace tpuhal::simd
