// Tracing: what the HAL does, on the host and on each board, written as a
// Chrome trace (the JSON that ui.perfetto.dev and chrome://tracing open).
// docs/tracing.md says what each track and event means.
//
// Turn it on for a whole program with the environment, before it starts:
//
//   TPUHAL_TRACE=run.json ./my_program     ("%p" in the name becomes the pid)
//   tpuhal trace -o run.json -- ./my_program args...
//
// or from code:
//
//   tpuhal::trace::start("run.json");
//   ...                                    // submissions, waits, allocations
//   tpuhal::trace::Summary s = tpuhal::trace::stop();
//
// A trace holds one track per host thread (submit, wait, allocate, map, free
// as slices) and one per hardware queue (each command's execution on the
// board's own clock, with a flow arrow from the submission), plus sampled
// counters (device memory per heap, queue depth) and instants for faults,
// validation findings and decoded frames.
//
// Cost: off, one relaxed atomic load per call. On, each event goes to a
// buffer of the calling thread (bounded: kThreadBufferEvents) that a
// background writer drains; when the writer falls behind, events are
// dropped and counted in the trace (Summary::dropped), never blocking the
// program. On devices with timestamps each command of a submission of up to
// kStampedCommands commands is bracketed by board timestamps (one more
// command each) written to a small host buffer per queue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tpuhal/export.hpp"

namespace tpuhal::trace {

// Events one thread may hold before the writer takes them; further events
// are dropped and counted.
inline constexpr std::size_t kThreadBufferEvents = 16384;
// Submissions of up to this many commands get a board timestamp between
// each two commands (a slice per command); longer ones get one slice.
inline constexpr std::size_t kStampedCommands = 32;

struct Summary {
  std::string path;             // the file written ("" if no trace was on)
  std::uint64_t events = 0;     // events written
  std::uint64_t dropped = 0;    // events lost because the writer fell behind
  std::uint64_t unstamped = 0;  // submissions with no board timestamps
  std::string error;            // why writing stopped early, "" if it did not
};

// Starts a trace written to `path` ("%p" becomes the process id): a new
// file created beside it and renamed over it at once (whatever was at
// `path`, a link included, is replaced, never followed or written through).
// Throws FailedPrecondition if a trace is already on, and NotFound,
// PermissionDenied or InvalidArgument (with the system's reason) if the file
// cannot be created; the program goes on untraced then.
TPUHAL_API void start(std::string_view path);

// Stops the trace: takes what is left in every buffer, records the board
// time of work still in flight as unfinished, writes the file's end and
// closes it. Returns what was written; harmless when no trace is on.
TPUHAL_API Summary stop();

// True while a trace is on.
TPUHAL_API bool active() noexcept;

// A slice of the caller's own on its thread's track, from construction to
// destruction: `{ tpuhal::trace::Scope s("preprocess"); ... }`. Costs one
// atomic load when no trace is on.
class TPUHAL_API Scope {
 public:
  explicit Scope(std::string_view name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool on_ = false;
};

// An instant event of the caller's own on its thread's track.
TPUHAL_API void mark(std::string_view name);

}  // namespace tpuhal::trace
