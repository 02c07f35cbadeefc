// The validation layer: checks of API use that are too costly to make on
// every call, on request. Turn it on for a whole program with the
// environment:
//
//   TPUHAL_VALIDATE=1      report each misuse (log, error level) and go on
//   TPUHAL_VALIDATE=abort  report, then abort(): for CI runs
//
// or from code with validation::enable(). What it checks (docs/validation.md):
//   - a buffer used while submitted work still uses it: mapped for the host
//     while a submission that writes it has not completed, or written (read)
//     on one queue while another queue's unfinished submission reads or
//     writes (writes) the same bytes, with no wait between the two;
//   - timeline values going backwards: write_value() of a word lower than
//     the value the same word was last given, or a queue's completed value
//     moving backwards (a driver or firmware bug);
//   - wrong-thread use: one Batch used by two threads at once;
//   - leaks: buffers still allocated at exit, with where each was allocated.
// Each report names the objects involved and the call site in the caller's
// code (file and line where the program has debug information).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tpuhal/export.hpp"

namespace tpuhal::validation {

enum class Check : std::uint8_t {
  BufferInFlight,  // host map or another queue's use while work uses it
  ValueBackwards,  // a timeline word or a queue's completed value decreased
  WrongThread,     // a Batch used by two threads at once
  Leak,            // allocations outstanding at exit
};
TPUHAL_API const char* to_string(Check check) noexcept;

struct Report {
  Check check;
  std::string message;                 // what was misused, and how
  std::vector<std::string> call_site;  // innermost first: the caller's frame, then its callers
};

// True when validation is on: TPUHAL_VALIDATE was set when the library
// first looked, or enable(true) was called since.
TPUHAL_API bool enabled() noexcept;

// Turns validation on or off for the process. Objects created while it was
// off are checked only as far as what is known about them allows (buffers
// allocated then have no allocation site).
TPUHAL_API void enable(bool on) noexcept;

// Where reports go. The default handler logs each at error level (logger
// "validate") and, under TPUHAL_VALIDATE=abort, aborts. A handler replaces
// that; an empty function restores it. Called on the thread that misused the
// API, with no library lock held. Returns the previous handler (empty for
// the default).
using Handler = std::function<void(const Report&)>;
TPUHAL_API Handler set_handler(Handler handler);

// Frames of the caller in a higher-level language, for language bindings:
// called on the calling thread while a report is made, and when validation
// starts tracking a new buffer. The frames it returns ("fn at file.py:12",
// innermost first) go before the C++ frames of Report::call_site, and the
// innermost names where a leaked buffer was allocated. It may be called with
// library locks held, so it must not block (a Python binding must not wait
// for the GIL there). Returns the previous provider.
using CallSiteProvider = std::function<std::vector<std::string>()>;
TPUHAL_API CallSiteProvider set_call_site_provider(CallSiteProvider provider);

// Reports made since the process started.
TPUHAL_API std::uint64_t report_count() noexcept;

// Reports every buffer still allocated on any open device, with where it
// was allocated, as a Check::Leak report per device; returns how many
// buffers it found. Runs by itself at exit while validation is on.
TPUHAL_API std::size_t report_leaks();

}  // namespace tpuhal::validation
