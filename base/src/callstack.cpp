#include "tpuhal/base/callstack.h"

#include <dlfcn.h>

#include <boost/stacktrace.hpp>
#include <cstdio>

namespace tpuhal::base {

CallStack CallStack::capture() {
  CallStack cs;
  // Skip this function itself; 48 frames are plenty to get past any
  // library-internal frames to the caller.
  const boost::stacktrace::stacktrace st(1, 48);
  cs.pcs_.reserve(st.size());
  for (const auto& f : st) cs.pcs_.push_back(const_cast<void*>(reinterpret_cast<const void*>(f.address())));
  return cs;
}

namespace {

std::string module_of(const void* pc) {
  Dl_info info{};
  if (dladdr(pc, &info) && info.dli_fname && *info.dli_fname) return info.dli_fname;
  return "?";
}

std::string text(const boost::stacktrace::frame& f, std::string name) {
  const std::string file = f.source_file();
  const std::size_t line = f.source_line();
  if (name.empty()) {
    char addr[32];
    std::snprintf(addr, sizeof addr, "%p", reinterpret_cast<const void*>(f.address()));
    name = addr;
  }
  if (!file.empty() && line != 0) return name + " at " + file + ":" + std::to_string(line);
  return name + " in " + module_of(reinterpret_cast<const void*>(f.address()));
}

}  // namespace

std::vector<std::string> CallStack::describe(std::size_t max_frames,
                                             const std::function<bool(std::string_view, const void*)>& skip) const {
  std::vector<std::string> out;
  bool at_caller = false;
  for (void* pc : pcs_) {
    if (out.size() >= max_frames) break;
    const boost::stacktrace::frame f(pc);
    std::string name = f.name();
    if (!at_caller && skip && skip(name, pc)) continue;
    at_caller = true;
    out.push_back(text(f, std::move(name)));
  }
  return out;
}

std::string CallStack::source_file(const void* pc) { return boost::stacktrace::frame(pc).source_file(); }

}  // namespace tpuhal::base
