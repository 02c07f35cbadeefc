// Call stacks for diagnostics (the validation layer's reports, allocation
// sites in leak reports): captured cheaply as return addresses, turned into
// "function at file:line" text only when a report is printed.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tpuhal::base {

class CallStack {
 public:
  CallStack() = default;

  // The calling thread's stack, innermost frame first, without this call.
  // Costs an unwind (a few microseconds); no symbols are looked up.
  static CallStack capture();

  bool empty() const noexcept { return pcs_.empty(); }

  // Up to `max_frames` frames as text, innermost first, after dropping the
  // innermost frames for which `skip(function_name, pc)` is true: pass a
  // test that recognises the library's own frames and the first frame left
  // is the call site in the caller's code. A frame reads
  //   "run_pipeline() at /src/app.cpp:42"      (with debug information)
  //   "run_pipeline() in ./app"                 (symbols only)
  //   "0x55d0c2a1b4f3 in ./app"                (neither)
  std::vector<std::string> describe(std::size_t max_frames,
                                    const std::function<bool(std::string_view, const void*)>& skip) const;

  // The source file of the code at `pc` from its debug information; empty
  // without it.
  static std::string source_file(const void* pc);

 private:
  std::vector<void*> pcs_;
};

}  // namespace tpuhal::base
