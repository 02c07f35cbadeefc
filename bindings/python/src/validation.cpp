// tpuhal.validation: the validation layer (tpuhal/validation.hpp) from
// Python, with reports that point at the Python line that misused the API.
#include "tpuhal/validation.hpp"

#include <filesystem>

#include "common.hpp"  // Python.h first, then the frame API

#include <pybind11/stl.h>

#include <frameobject.h>

namespace tpuhal::python {
namespace {

// The directory of the tpuhal package: its own frames are not call sites.
std::string& package_dir() {
  static auto* dir = new std::string;
  return *dir;
}

// What PythonFramesKept keeps: the frames of the thread's call that
// released the GIL (the outermost such call on the thread).
thread_local std::vector<std::string>* t_kept = nullptr;

// Up to four frames of this thread's Python stack, innermost first, outside
// the tpuhal package; the thread must hold the GIL.
std::vector<std::string> frames_with_gil() {
  std::vector<std::string> out;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  while (frame && out.size() < 4) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    const char* name = PyUnicode_AsUTF8(code->co_name);
    if (file && name && (package_dir().empty() || std::string_view(file).rfind(package_dir(), 0) != 0))
      out.push_back(std::string(name) + " at " + file + ":" + std::to_string(PyFrame_GetLineNumber(frame)));
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyErr_Clear();
  return out;
}

// The call-site provider: this thread's Python frames if it holds the GIL,
// else those kept when its call released the GIL. Never takes the GIL: the
// caller may hold locks a thread with the GIL is waiting for. Empty on a
// thread that never ran Python (the driver's) or while the interpreter is
// finalizing.
std::vector<std::string> python_frames() {
  if (!python_alive()) return {};
  if (PyGILState_Check()) return frames_with_gil();
  return t_kept ? *t_kept : std::vector<std::string>{};
}

}  // namespace

PythonFramesKept::PythonFramesKept() {
  if (!validation::enabled() || t_kept) return;  // the outermost call's frames are the user's
  t_kept = new std::vector<std::string>(frames_with_gil());
  kept_ = true;
}

PythonFramesKept::~PythonFramesKept() {
  if (!kept_) return;
  delete t_kept;
  t_kept = nullptr;
}

namespace {

struct PyReport {
  std::string check;
  std::string message;
  std::vector<std::string> call_site;
};

}  // namespace

void bind_validation(py::module_& m) {
  auto v = m.def_submodule(
      "validation",
      "The validation layer (docs/validation.md): checks of API use that are too costly for every call, "
      "on request. Turn it on with TPUHAL_VALIDATE=1 (report and go on) or TPUHAL_VALIDATE=abort in the "
      "environment, or with tpuhal.validation.enable(). Each report names the objects involved and the "
      "Python line that made the call.");
  py::class_<PyReport>(v, "Report",
                       "One misuse found: `check` says which kind, `message` what, `call_site` where "
                       "(the caller's frames, innermost first: Python's, then C++'s).")
      .def_readonly("check", &PyReport::check, "'buffer in flight', 'value backwards', 'wrong thread' or 'leak'.")
      .def_readonly("message", &PyReport::message)
      .def_readonly("call_site", &PyReport::call_site)
      .def("__repr__",
           [](const PyReport& r) { return "<tpuhal.validation.Report " + r.check + ": " + r.message + ">"; });

  v.def("enabled", &validation::enabled, "True while validation is on.");
  v.def("enable", &validation::enable, py::arg("on") = true,
        "Turns validation on (or off) for the process. Objects made while it was off are checked as far as "
        "what is known of them allows.");
  v.def("report_count", &validation::report_count, "Reports made since the process started.");
  v.def(
      "report_leaks", [] { return without_gil([] { return validation::report_leaks(); }); },
      "Reports every buffer still allocated on an open device, with where it was allocated; returns how "
      "many it found. Runs by itself at exit while validation is on.");
  v.def(
      "set_handler",
      [](py::object handler) {
        if (handler.is_none()) {
          validation::set_handler({});
          return;
        }
        // Shared by the copies a report in flight on another thread holds;
        // the last one lets go of the Python object under the GIL (or leaks
        // it once the interpreter is finalizing, as CPython allows).
        std::shared_ptr<py::object> keep(new py::object(std::move(handler)), [](py::object* o) {
          if (!python_alive()) return;
          py::gil_scoped_acquire gil;
          delete o;
        });
        validation::set_handler([keep](const validation::Report& r) {
          if (!python_alive()) return;
          py::gil_scoped_acquire gil;
          try {
            (*keep)(PyReport{validation::to_string(r.check), r.message, r.call_site});
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("tpuhal.validation handler");
          }
        });
      },
      py::arg("handler"),
      "Sends each report to `handler(report)` instead of the log (called on the thread that misused the "
      "API, with the GIL held; an exception it raises is printed as unraisable). None restores the "
      "default: log each report, and abort under TPUHAL_VALIDATE=abort.");

  // Reports from Python calls start with the Python frames.
  try {
    const auto file = py::module_::import("tpuhal").attr("__file__").cast<std::string>();
    package_dir() = std::filesystem::path(file).parent_path().string() + "/";
  } catch (py::error_already_set&) {
    // Imported on its own (tpuhal._tpuhal): no package frames to leave out.
  }
  validation::set_call_site_provider(python_frames);
}

}  // namespace tpuhal::python
