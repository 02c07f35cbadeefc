// Errors: tpuhal.Status (an IntEnum of tpuhal::Status), tpuhal.Error and one
// subclass per status, and the translator that raises them for tpuhal::Error.
#include <array>
#include <string>
#include <string_view>

#include "common.hpp"

namespace tpuhal::python {
namespace {

struct StatusInfo {
  Status status;
  const char* name;  // as in C++: tpuhal::Status::InvalidArgument
  PyObject* also;    // a built-in exception it also is, or nullptr
  std::string doc;
};

// The list is tpuhal/status.inc (Ok has no class). A function rather than a
// constant: the built-in classes exist only once the interpreter runs.
PyObject* python_also(std::string_view name) {
  if (name == "ValueError") return PyExc_ValueError;
  if (name == "IndexError") return PyExc_IndexError;
  if (name == "LookupError") return PyExc_LookupError;
  if (name == "TimeoutError") return PyExc_TimeoutError;
  if (name == "PermissionError") return PyExc_PermissionError;
  return nullptr;  // "Error": tpuhal.Error only
}

std::array<StatusInfo, kStatusCount - 1> status_table() {
  std::array<StatusInfo, kStatusCount - 1> table{};
  std::size_t i = 0;
#define TPUHAL_STATUS(name, c_name, value, text, also, doc)   \
  if (Status::name != Status::Ok)                             \
    table.at(i++) = {Status::name, #name, python_also(#also), \
                     std::string(doc) + (python_also(#also) ? " (catchable as " #also ")." : ".")};
#include "tpuhal/status.inc"
#undef TPUHAL_STATUS
  return table;
}

// The classes, indexed by status code. Module state for the life of the
// process: the references are never released (the module is never unloaded).
PyObject* g_error = nullptr;
std::array<PyObject*, kStatusCount> g_by_status{};
std::array<PyObject*, kStatusCount> g_status_members{};

PyObject* class_for(Status s) {
  const auto i = static_cast<std::size_t>(s);
  return i < g_by_status.size() && g_by_status[i] ? g_by_status[i] : g_error;
}

}  // namespace

void fail(Status status, const std::string& message) { throw Error(status, message); }

py::object from_status(Status s) {
  const auto i = static_cast<std::size_t>(s);
  if (i < g_status_members.size() && g_status_members[i])
    return py::reinterpret_borrow<py::object>(g_status_members[i]);
  return py::int_(static_cast<int>(s));
}

void bind_errors(py::module_& m) {
  const auto table = status_table();

  py::list members;
  members.append(py::make_tuple("Ok", 0));
  for (const auto& s : table) members.append(py::make_tuple(s.name, static_cast<int>(s.status)));
  py::object status_enum = py::module_::import("enum").attr("IntEnum")("Status", members, py::arg("module") = "tpuhal");
  status_enum.attr("__doc__") =
      "tpuhal::Status: why a call failed. Every tpuhal.Error subclass has its status as the "
      "class attribute `status` and its numeric value as `code`.";
  m.attr("Status") = status_enum;
  for (const auto& s : table)
    g_status_members[static_cast<std::size_t>(s.status)] = py::object(status_enum.attr(s.name)).release().ptr();
  g_status_members[0] = py::object(status_enum.attr("Ok")).release().ptr();

  py::dict base_attrs;
  base_attrs["status"] = py::none();
  base_attrs["code"] = py::none();
  g_error =
      PyErr_NewExceptionWithDoc("tpuhal.Error",
                                "Base of every error tpuhal raises. `status` (a tpuhal.Status) and `code` (its number) "
                                "say which; str(error) is the message, which names the value at fault.",
                                PyExc_Exception, base_attrs.ptr());
  if (!g_error) throw py::error_already_set();
  m.attr("Error") = py::handle(g_error);

  for (const auto& s : table) {
    py::dict attrs;
    attrs["status"] = from_status(s.status);
    attrs["code"] = static_cast<int>(s.status);
    py::tuple bases =
        s.also ? py::make_tuple(py::handle(g_error), py::handle(s.also)) : py::make_tuple(py::handle(g_error));
    const std::string qualified = std::string("tpuhal.") + s.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), s.doc.c_str(), bases.ptr(), attrs.ptr());
    if (!cls) throw py::error_already_set();
    g_by_status[static_cast<std::size_t>(s.status)] = cls;
    m.attr(s.name) = py::handle(cls);
  }

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(class_for(e.status()), e.what());
    }
  });
}

}  // namespace tpuhal::python
