// tpuhal.trace: tracing (tpuhal/trace.hpp, docs/tracing.md) from Python.
#include "tpuhal/trace.hpp"

#include <optional>

#include "common.hpp"

namespace tpuhal::python {

namespace {

// `with tpuhal.trace.scope("preprocess"):` — a slice on the calling
// thread's track for the body.
class PyScope {
 public:
  explicit PyScope(std::string name) : name_(std::move(name)) {}
  PyScope& enter() {
    if (scope_) throw Error(Status::FailedPrecondition, "trace.scope: this scope is already entered");
    scope_.emplace(name_);
    return *this;
  }
  void exit() { scope_.reset(); }

 private:
  std::string name_;
  std::optional<trace::Scope> scope_;
};

}  // namespace

void bind_trace(py::module_& m) {
  auto t =
      m.def_submodule("trace",
                      "Tracing (docs/tracing.md): what the HAL does on the host and on each board, written as a Chrome "
                      "trace that ui.perfetto.dev and chrome://tracing open. Set TPUHAL_TRACE=FILE in the environment "
                      "to trace a whole program, or call start() and stop().");
  t.def(
      "start", [](const std::string& path) { trace::start(path); }, py::arg("path"),
      "Starts writing a trace to `path` ('%p' becomes the process id). Raises FailedPrecondition if a "
      "trace is already on, NotFound, PermissionDenied or InvalidArgument if the file cannot be created.");
  t.def(
      "stop",
      [] {
        const trace::Summary s = without_gil([] { return trace::stop(); });
        py::dict d;
        d["path"] = s.path;
        d["events"] = s.events;
        d["dropped"] = s.dropped;
        d["unstamped"] = s.unstamped;
        d["error"] = s.error;
        return d;
      },
      "Stops the trace and finishes its file. Returns {'path', 'events', 'dropped', 'unstamped', "
      "'error'}: events written, events lost because the writer fell behind, submissions without board "
      "timestamps, and why writing stopped early ('' if it did not). Harmless when no trace is on.");
  t.def("active", &trace::active, "True while a trace is on.");
  t.def(
      "mark", [](const std::string& name) { trace::mark(name); }, py::arg("name"),
      "An instant event of your own on the calling thread's track.");
  py::class_<PyScope>(t, "scope",
                      "`with tpuhal.trace.scope(name):` puts a slice of your own on the calling thread's "
                      "track around the body (costs next to nothing when no trace is on).")
      .def(py::init<std::string>(), py::arg("name"))
      .def("__enter__", &PyScope::enter, py::return_value_policy::reference_internal)
      .def("__exit__", [](PyScope& s, py::args) { s.exit(); });
}

}  // namespace tpuhal::python
