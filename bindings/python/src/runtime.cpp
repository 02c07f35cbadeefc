// Compiled models from Python: tpuhal.compile(), tpuhal.load_model(),
// Model and Instance (runtime/include/tpuhal/rt/{compile,model}.hpp).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <limits>
#include <mutex>

#include "arrays.hpp"
#include "common.hpp"
#include "tpuhal/rt/compile.hpp"
#include "tpuhal/rt/model.hpp"

namespace tpuhal::python {
namespace {

// A compiled model in host memory: what compile() returns, ready to save or
// to load onto devices.
struct PyCompiled {
  rt::ModelFile file;
  std::vector<rt::LayerError> report;
  std::vector<std::string> notes;
  std::string name;
};

// tpuhal.Instance: one thread at a time runs a C++ Instance; Python threads
// sharing one take turns here rather than corrupting its buffers.
struct PyInstance {
  rt::Instance instance;
  std::mutex mu;
};

std::vector<std::int64_t> shape_of(const py::handle& h, const std::string& what) {
  std::vector<std::int64_t> shape;
  try {
    for (auto d : py::iter(h)) shape.push_back(d.cast<std::int64_t>());
  } catch (const py::cast_error&) {
    fail(Status::InvalidArgument, what + " must be a sequence of integers, not " +
                                      py::str(py::type::of(h).attr("__name__")).cast<std::string>());
  }
  return shape;
}

// Any array-like of real numbers as float32 values in C order.
rt::NdArray to_ndarray(const py::handle& obj, const std::string& what) {
  py::array a = device_array(obj, what.c_str());
  if (a.dtype().kind() == 'c') fail(Status::InvalidArgument, what + ": complex values; give real numbers");
  py::array_t<float, py::array::c_style | py::array::forcecast> f(a);
  rt::NdArray out;
  out.shape.assign(f.shape(), f.shape() + f.ndim());
  out.values.assign(f.data(), f.data() + f.size());
  return out;
}

// compile(detect=...): None, a head's name, or a dict of "head" and any of
// "score", "iou", "max_boxes", "agnostic" and "anchors".
rt::DetectOptions detect_options(const py::object& detect) {
  rt::DetectOptions d;
  if (detect.is_none()) return d;
  if (py::isinstance<py::str>(detect)) {
    d.head = detect.cast<std::string>();
    if (d.head.empty()) fail(Status::InvalidArgument, "detect: a head's name ('yolov8', 'yolov5'), not ''");
    return d;
  }
  if (!py::isinstance<py::dict>(detect))
    fail(Status::InvalidArgument, "detect is a head's name ('yolov8', 'yolov5') or a dict with 'head'");
  for (const auto& [key, value] : detect.cast<py::dict>()) {
    const auto k = py::str(key).cast<std::string>();
    const char* want = k == "head"        ? "a string"
                       : k == "max_boxes" ? "an integer"
                       : k == "agnostic"  ? "a bool"
                       : k == "anchors"   ? "a list of numbers"
                                          : "a number";
    try {
      if (k == "head")
        d.head = value.cast<std::string>();
      else if (k == "score")
        d.score_threshold = value.cast<float>();
      else if (k == "iou")
        d.iou_threshold = value.cast<float>();
      else if (k == "max_boxes")
        d.max_boxes = value.cast<std::int64_t>();
      else if (k == "agnostic")
        d.class_agnostic = value.cast<bool>();
      else if (k == "anchors")
        d.anchors = value.cast<std::vector<float>>();
      else
        fail(Status::InvalidArgument,
             "detect: unknown key '" + k + "' (head, score, iou, max_boxes, agnostic, anchors)");
    } catch (const py::cast_error&) {
      fail(Status::InvalidArgument, "detect: '" + k + "' is " + py::repr(value).cast<std::string>() + ", not " + want);
    }
  }
  if (d.head.empty()) fail(Status::InvalidArgument, "detect: the dict names no 'head'");
  return d;
}

PyCompiled compile_model(const py::object& source, const std::string& precision, const py::object& shapes,
                         const py::object& calibration, const std::string& method, double percentile, bool report,
                         const std::string& device, const std::vector<std::string>& keep_fp16, double target_snr_db,
                         bool strict_qdq, std::int64_t max_batch, const py::object& detect) {
  rt::CompileOptions o;
  o.detect = detect_options(detect);
  o.precision = rt::parse_precision(precision);
  if (method == "percentile") {
    o.method = rt::CalibrationMethod::Percentile;
  } else if (method == "minmax") {
    o.method = rt::CalibrationMethod::MinMax;
  } else if (method == "entropy") {
    o.method = rt::CalibrationMethod::Entropy;
  } else {
    fail(Status::InvalidArgument,
         "unknown calibration method '" + method + "'; expected 'percentile', 'minmax' or 'entropy'");
  }
  o.keep_fp16 = keep_fp16;
  o.target_snr_db = target_snr_db;
  o.strict_qdq = strict_qdq;
  o.max_batch = max_batch;
  o.percentile = percentile;
  o.report = report;
  o.device = device;
  if (!shapes.is_none()) {
    if (!py::isinstance<py::dict>(shapes))
      throw py::type_error("shapes must be a dict of input name to shape, e.g. {'image': (64, 1, 28, 28)}");
    for (auto [k, v] : shapes.cast<py::dict>())
      o.shapes[py::str(k).cast<std::string>()] = shape_of(v, "shapes['" + py::str(k).cast<std::string>() + "']");
  }
  if (!calibration.is_none()) {
    // One array per input; a single array for a single-input model.
    if (py::isinstance<py::list>(calibration) || py::isinstance<py::tuple>(calibration)) {
      std::size_t i = 0;
      for (auto item : calibration)
        o.calibration.push_back(to_ndarray(item, "calibration[" + std::to_string(i++) + "]"));
    } else {
      o.calibration.push_back(to_ndarray(calibration, "calibration"));
    }
  }

  PyCompiled out;
  rt::CompileResult r;
  if (py::isinstance<py::bytes>(source) || py::isinstance<py::bytearray>(source)) {
    std::string bytes = py::isinstance<py::bytes>(source) ? source.cast<std::string>() : std::string(py::bytes(source));
    out.name = "model";
    r = without_gil(
        [&] { return rt::compile_onnx(std::as_bytes(std::span(bytes.data(), bytes.size())), o, out.name); });
  } else {
    const std::filesystem::path path = py::module_::import("os").attr("fspath")(source).cast<std::string>();
    out.name = path.string();
    r = without_gil([&] { return rt::compile_onnx(path, o); });
  }
  out.file = std::move(r.model);
  out.report = std::move(r.report);
  out.notes = std::move(r.notes);
  return out;
}

rt::Model load(const std::shared_ptr<PyDevice>& dev, const py::object& model) {
  Device d = dev->get();
  if (py::isinstance<PyCompiled>(model)) {
    const PyCompiled& c = model.cast<const PyCompiled&>();
    return without_gil([&] { return rt::Model::load(d, c.file, c.name); });
  }
  const std::filesystem::path path = py::module_::import("os").attr("fspath")(model).cast<std::string>();
  return without_gil([&] { return rt::Model::load(d, path); });
}

py::tuple spec_shape(const rt::TensorSpec& s) {
  py::tuple t(s.shape.size());
  for (std::size_t i = 0; i < s.shape.size(); ++i) t[i] = s.shape[i];
  return t;
}

// Integers (any integer or bool array) as int32 in C order, for an i32
// input (token ids): floats and values outside int32 are refused.
py::array int32_input(const py::array& a, const std::string& what) {
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u' && kind != 'b')
    fail(Status::InvalidArgument,
         what + " takes integers (i32); the array holds " + py::str(a.dtype()).cast<std::string>() + " values");
  py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> wide(a);
  py::array_t<std::int32_t> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
  const std::int64_t* src = wide.data();
  std::int32_t* dst = out.mutable_data();
  for (py::ssize_t i = 0; i < wide.size(); ++i) {
    if (src[i] < std::numeric_limits<std::int32_t>::min() || src[i] > std::numeric_limits<std::int32_t>::max())
      fail(Status::InvalidArgument, what + " holds " + std::to_string(src[i]) + ", outside int32");
    dst[i] = static_cast<std::int32_t>(src[i]);
  }
  return out;
}

// A spec's shape for a run of `batch` samples (0: as compiled).
std::vector<std::int64_t> shape_at(const rt::TensorSpec& spec, std::int64_t batch) {
  std::vector<std::int64_t> s = spec.shape;
  if (batch > 0 && !s.empty()) s[0] = batch;
  return s;
}

// The arrays of one run, checked against the model's specs: inputs by
// position (a list or tuple) or by name (a dict); f32 inputs as float32,
// i32 ones as int32. A model compiled for several batch sizes takes 1 to
// max_batch samples, the same in every input; `batch` is set to it.
std::vector<py::array> inputs_of(const rt::Model& model, const py::object& given, std::int64_t& batch) {
  const auto& specs = model.inputs();
  std::vector<py::object> items(specs.size());
  if (py::isinstance<py::dict>(given)) {
    auto d = given.cast<py::dict>();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (!d.contains(specs[i].name))
        fail(Status::InvalidArgument, "run: no array for input '" + specs[i].name + "' (" + specs[i].describe() + ")");
      items[i] = d[py::str(specs[i].name)];
    }
    for (auto [k, v] : d) {
      const auto name = py::str(k).cast<std::string>();
      bool known = false;
      for (const auto& s : specs) known |= s.name == name;
      if (!known) fail(Status::InvalidArgument, "run: the model has no input '" + name + "'");
    }
  } else {
    std::vector<py::object> list;
    if (py::isinstance<py::list>(given) || py::isinstance<py::tuple>(given)) {
      for (auto item : given) list.push_back(py::reinterpret_borrow<py::object>(item));
    } else {
      list.push_back(given);
    }
    if (list.size() != specs.size())
      fail(Status::InvalidArgument, "run: the model takes " + std::to_string(specs.size()) + " input(s), " +
                                        std::to_string(list.size()) + " given");
    for (std::size_t i = 0; i < specs.size(); ++i) items[i] = list[i];
  }
  std::vector<py::array> out;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::string what = "run: input '" + specs[i].name + "'";
    py::array a = device_array(items[i], what.c_str());
    if (a.dtype().kind() == 'c') fail(Status::InvalidArgument, what + ": complex values; give real numbers");
    std::vector<std::int64_t> shape(a.shape(), a.shape() + a.ndim());
    const std::int64_t most = model.max_batch();
    const bool earlier = batch > 0;  // the batch came from an input before this one
    if (most > 0 && batch == 0 && !shape.empty() && shape.size() == specs[i].shape.size() && shape[0] >= 1 &&
        shape[0] <= most)
      batch = shape[0];
    if (most > 0 && shape != shape_at(specs[i], batch)) {
      std::string sample = shape_string(specs[i].shape);
      sample = "(N" + sample.substr(sample.find_first_of(",)"));
      fail(Status::InvalidArgument, what + " has shape " + shape_string(shape) + "; the model takes " + sample +
                                        ", N from 1 to " + std::to_string(most) +
                                        (earlier ? " (" + std::to_string(batch) + " as the inputs before it)" : ""));
    }
    if (most == 0 && shape != specs[i].shape)
      fail(Status::InvalidArgument,
           what + " has shape " + shape_string(shape) + "; the model was compiled for " + shape_string(specs[i].shape));
    if (specs[i].dtype == DType::I32)
      out.push_back(int32_input(a, what));
    else
      out.push_back(py::array_t<float, py::array::c_style | py::array::forcecast>(a));
  }
  return out;
}

// A run of a model with a host stage: its ONNX outputs as new arrays,
// float32 or int64, of the shapes the run gave them.
py::list run_whole(PyInstance& self, const std::vector<py::array>& in) {
  std::vector<rt::HostArray> hin;
  for (auto& a : in)
    hin.push_back({reinterpret_cast<std::byte*>(const_cast<void*>(a.data())), static_cast<std::uint64_t>(a.nbytes())});
  std::vector<rt::Result> results = without_gil([&] {
    std::lock_guard lock(self.mu);
    return self.instance.run(hin);
  });
  py::list out;
  for (auto& r : results) {
    if (r.integer) {
      py::array_t<std::int64_t> a(r.shape);
      std::copy(r.ints.begin(), r.ints.end(), a.mutable_data());
      out.append(a);
    } else {
      py::array_t<float> a(r.shape);
      std::copy(r.floats.begin(), r.floats.end(), a.mutable_data());
      out.append(a);
    }
  }
  return out;
}

py::list run(PyInstance& self, const py::object& inputs, const py::object& outputs) {
  const rt::Model model = self.instance.model();
  std::int64_t batch = 0;
  auto in = inputs_of(model, inputs, batch);
  if (model.host_stage()) {
    if (!outputs.is_none())
      fail(Status::InvalidArgument,
           "run: the model has a host stage, whose outputs' shapes depend on the data; it returns new arrays "
           "(outputs= is not taken)");
    return run_whole(self, in);
  }
  const auto& specs = model.outputs();
  std::vector<py::array_t<float>> out;
  if (outputs.is_none()) {
    for (const auto& s : specs) out.emplace_back(shape_at(s, batch));
  } else {
    std::size_t i = 0;
    for (auto item : outputs) {
      if (i >= specs.size()) break;
      const std::string what = "run: output '" + specs[i].name + "'";
      if (!py::isinstance<py::array_t<float>>(item) || !(item.cast<py::array>().flags() & py::array::c_style) ||
          !item.cast<py::array>().writeable())
        fail(Status::InvalidArgument, what + " must be a writable C-contiguous float32 numpy array");
      auto a = item.cast<py::array_t<float>>();
      std::vector<std::int64_t> shape(a.shape(), a.shape() + a.ndim());
      if (shape != shape_at(specs[i], batch))
        fail(Status::InvalidArgument, what + " has shape " + shape_string(shape) + "; the model gives " +
                                          shape_string(shape_at(specs[i], batch)));
      out.push_back(a);
      ++i;
    }
    if (i != specs.size() || py::len(outputs) != specs.size())
      fail(Status::InvalidArgument, "run: the model gives " + std::to_string(specs.size()) + " output(s), " +
                                        std::to_string(py::len(outputs)) + " arrays given");
  }
  std::vector<rt::HostArray> hin, hout;
  for (auto& a : in)
    hin.push_back({reinterpret_cast<std::byte*>(const_cast<void*>(a.data())), static_cast<std::uint64_t>(a.nbytes())});
  for (auto& a : out)
    hout.push_back({reinterpret_cast<std::byte*>(a.mutable_data()), static_cast<std::uint64_t>(a.nbytes())});
  // The arrays stay referenced here (and NumPy cannot free them) while the
  // GIL is released.
  without_gil([&] {
    std::lock_guard lock(self.mu);
    self.instance.run(hin, hout);
  });
  py::list result;
  for (auto& a : out) result.append(a);
  return result;
}

py::list tensors_of(const std::vector<Tensor>& tensors) {
  py::list out;
  for (const auto& t : tensors) out.append(PyTensor{t, std::make_shared<PyBuffer>(t.buffer())});
  return out;
}

}  // namespace

void bind_runtime(py::module_& m) {
  py::class_<rt::TensorSpec>(m, "TensorSpec",
                             "A model input or output: its name, dtype and fixed shape (the largest batch's, for "
                             "a model with a max_batch).")
      .def_readonly("name", &rt::TensorSpec::name)
      .def_property_readonly("dtype", [](const rt::TensorSpec& s) { return from_dtype(s.dtype); })
      .def_property_readonly("shape", &spec_shape)
      .def("__repr__", [](const rt::TensorSpec& s) { return "<tpuhal.TensorSpec " + s.describe() + ">"; });

  py::class_<rt::LayerError>(m, "LayerError",
                             "One line of the precision report: a layer's output in the compiled precision "
                             "against the same layer of the fp32 model, both fed the same inputs.")
      .def_readonly("node", &rt::LayerError::node)
      .def_readonly("op", &rt::LayerError::op)
      .def_readonly("output", &rt::LayerError::output)
      .def_readonly("max_abs", &rt::LayerError::max_abs)
      .def_readonly("rms", &rt::LayerError::rms)
      .def_readonly("rel_rms", &rt::LayerError::rel_rms)
      .def_readonly("snr_db", &rt::LayerError::snr_db)
      .def("__repr__", [](const rt::LayerError& e) {
        return "<tpuhal.LayerError " + e.node + " (" + e.op + "): rel_rms " + std::to_string(e.rel_rms) + ", snr " +
               std::to_string(e.snr_db) + " dB>";
      });

  py::class_<PyCompiled>(m, "CompiledModel",
                         "A compiled model in host memory (tpuhal.compile()): save() writes the .tpm file; "
                         "tpuhal.load_model() puts it on a device.")
      .def(
          "save",
          [](const PyCompiled& c, const py::object& path) {
            const std::filesystem::path p = py::module_::import("os").attr("fspath")(path).cast<std::string>();
            without_gil([&] { rt::write_model_file(p, c.file); });
          },
          py::arg("path"), "Writes the compiled model file (.tpm).")
      .def(
          "to_bytes",
          [](const PyCompiled& c) {
            auto bytes = rt::encode(c.file);
            return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          "The compiled model file's bytes.")
      .def_readonly("report", &PyCompiled::report,
                    "The precision report (compile(report=True)): a list of LayerError, one per layer.")
      .def_readonly("notes", &PyCompiled::notes, "What the compiler did: folded, fused, ...")
      .def("__repr__", [](const PyCompiled& c) { return "<tpuhal.CompiledModel from " + c.name + ">"; });

  m.def("compile", &compile_model, py::arg("onnx"), py::arg("precision") = "fp32", py::arg("shapes") = py::none(),
        py::arg("calibration") = py::none(), py::arg("method") = "percentile", py::arg("percentile") = 99.99,
        py::arg("report") = false, py::arg("device") = "sim:0", py::arg("keep_fp16") = std::vector<std::string>{},
        py::arg("target_snr_db") = 0.0, py::arg("strict_qdq") = false, py::arg("max_batch") = 0,
        py::arg("detect") = py::none(),
        "Compiles an ONNX model (a path, or the file's bytes) for fixed input shapes (or any batch up to "
        "max_batch) and a precision "
        "('fp32', 'fp16', 'bf16', 'int8'), as `tpuhal compile` does. shapes: {input name: shape} for "
        "inputs with symbolic dimensions. calibration (int8 and the report): one array of real samples per "
        "input (a single array for a one-input model), samples along the first axis. method: 'percentile' "
        "(ranges cut at `percentile`), 'minmax' or 'entropy' (ranges cut where quantising loses least "
        "information). keep_fp16 (int8): ONNX node names that run in fp16 (fp32 where their calibrated "
        "values are beyond fp16's range); target_snr_db (int8): move the layers that lose the most signal "
        "to fp16 until every output reaches this SNR against fp32 on the calibration data. A model with "
        "QuantizeLinear/DequantizeLinear pairs compiles to int8 with its own scales, without calibration; "
        "strict_qdq=True refuses it where a layer would run in fp32 instead. report=True measures each "
        "layer's error against fp32. max_batch=N: the model runs any batch from 1 to N (its inputs' "
        "first dimension, symbolic in the model) without compiling again; run() takes the batch from the "
        "arrays. detect='yolov8' or 'yolov5' (or a dict: {'head': 'yolov8', 'score': 0.25, 'iou': 0.45, "
        "'max_boxes': 100, 'agnostic': False}) ends a YOLO detector in box decoding and non-maximum "
        "suppression on the board: its one output becomes 'detections' [batch, max_boxes, 6] (x1, y1, x2, y2, "
        "score, class; class -1 after the last box). A YOLOv5 without its Detect layer (one output per level) "
        "is decoded as that layer does, with YOLOv5's anchors or 'anchors': [w, h, ...] in input pixels, the "
        "finest level first. "
        "Calibration and the report run on `device`. Returns a CompiledModel; raises tpuhal.Unsupported "
        "listing every unsupported op by node, tpuhal.InvalidArgument for bad models, shapes or data.");

  py::class_<rt::Model>(m, "Model",
                        "A compiled model on a device (tpuhal.load_model()): its weights in device memory, "
                        "shared by every Instance made from it.")
      .def_property_readonly("inputs", &rt::Model::inputs, "A list of TensorSpec, in the order run() takes them.")
      .def_property_readonly("outputs", &rt::Model::outputs, "A list of TensorSpec, in the order run() gives them.")
      .def_property_readonly("precision",
                             [](const rt::Model& mo) { return std::string(rt::to_string(mo.precision())); })
      .def_property_readonly("meta", &rt::Model::meta,
                             "The model's metadata: producer, source, precision, calibration.")
      .def_property_readonly("weight_bytes", &rt::Model::weight_bytes, "Device memory the weights take.")
      .def_property_readonly("max_batch", &rt::Model::max_batch,
                             "A model compiled with max_batch runs 1 to this many samples (the first dimension "
                             "of its inputs and outputs); 0 for fixed shapes.")
      .def_property_readonly(
          "host_stage",
          [](const rt::Model& mo) -> py::object {
            const rt::HostStageInfo* h = mo.host_stage();
            if (!h) return py::none();
            py::dict d;
            d["outputs"] = h->outputs;
            d["nodes"] = h->nodes;
            d["ops"] = h->ops;
            return d;
          },
          "None, or for a model with a host stage (ops whose output shape depends on the data, evaluated on "
          "the host after the program: docs/runtime.md) a dict: 'outputs' (the model's ONNX outputs, which "
          "run() returns; `outputs` above are then what the program gives the stage), 'nodes', 'ops' "
          "(op type -> nodes).")
      .def_property_readonly("activation_bytes", &rt::Model::activation_bytes,
                             "Device memory each Instance takes for activations (shared by lifetime).")
      .def(
          "instance",
          [](const rt::Model& mo) {
            auto p = std::make_unique<PyInstance>();
            p->instance = without_gil([&] { return mo.instance(); });
            return p;
          },
          "A new Instance: its own activation buffers and recorded program. Raises tpuhal.OutOfMemory when "
          "the device has no room.")
      .def("__repr__", [](const rt::Model& mo) {
        std::string s = "<tpuhal.Model " + std::string(rt::to_string(mo.precision())) + " on " + mo.device().uri();
        if (mo.max_batch() > 0) s += ", batch 1 to " + std::to_string(mo.max_batch());
        s += ":";
        for (const auto& i : mo.inputs()) s += " " + i.describe();
        s += " ->";
        for (const auto& o : mo.outputs()) s += " " + o.describe();
        return s + ">";
      });

  py::class_<PyInstance, std::unique_ptr<PyInstance>>(
      m, "Instance",
      "One set of activation buffers and a recorded program for a Model (Model.instance()). Threads "
      "sharing one take turns; give each thread its own for parallel runs.")
      .def("run", &run, py::arg("inputs"), py::arg("outputs") = py::none(),
           "Runs one batch and waits for it (without the GIL). inputs: one array per model input, in order "
           "(a list, or the array itself for a one-input model) or a dict by input name; each must have the "
           "shape the model was compiled for (for a model with a max_batch, any first dimension from 1 to it, "
           "the same in every input) and is converted to float32 (to int32 for an i32 input, such as "
           "token ids: integers only, within int32). Returns a list of float32 arrays, "
           "one per output, or fills `outputs` (float32 arrays of the outputs' shapes at the run's batch) and "
           "returns them. A model with a host_stage returns its ONNX outputs as new arrays, float32 or int64 "
           "(labels, indices), of the shapes this run gave them.")
      .def_property_readonly(
          "input_tensors", [](const PyInstance& i) { return tensors_of(i.instance.input_tensors()); },
          "The device tensors the program reads its inputs from (for device-side pipelines).")
      .def_property_readonly(
          "output_tensors", [](const PyInstance& i) { return tensors_of(i.instance.output_tensors()); },
          "The device tensors the program writes its outputs to.")
      .def(
          "submit",
          [](PyInstance& i, const QueueRef& q) {
            Queue queue = q->queue;
            Fence f = without_gil([&] {
              std::lock_guard lock(i.mu);
              return i.instance.submit(queue);
            });
            return PyFence(q, std::move(f));
          },
          py::arg("queue"),
          "Runs the program on `queue` (a compute queue of the model's device) over whatever input_tensors "
          "hold; returns its Fence, after which output_tensors hold the result.")
      .def(
          "record",
          [](py::object self, PyBatch& b) -> PyBatch& {
            auto& i = self.cast<PyInstance&>();
            Batch& batch = b.recording("record");
            {
              std::lock_guard lock(i.mu);
              i.instance.record(batch);
            }
            b.keep.push_back(keep_object(std::move(self)));
            return b;
          },
          py::arg("batch"), py::return_value_policy::reference,
          "Appends the program to `batch` (a Batch of a compute queue of the model's device), after the "
          "commands that fill input_tensors and before those that read output_tensors, so that all go in "
          "one submission; returns the batch, for chaining.")
      .def(
          "profile",
          [](PyInstance& i, unsigned iterations, std::int64_t batch) {
            const rt::Profile p = without_gil([&] {
              std::lock_guard lock(i.mu);
              return i.instance.profile(iterations, batch);
            });
            // The runtime's one JSON form of a profile, as a dict.
            return py::module_::import("json").attr("loads")(rt::to_json(p));
          },
          py::arg("iterations") = 10, py::arg("batch") = 0,
          "Times the program per layer on the board's clock over whatever input_tensors hold (run() once "
          "first to put inputs there; for a model with a max_batch, `batch` picks the program for that many "
          "samples, 0 the largest): a dict with 'layers' (node, ops, output, device_ns: the mean over the "
          "middle half of `iterations` runs by board time, share, flops, achieved_per_s, peak_per_s), "
          "'runs_kept', 'device_ns' (a whole run on the board, over the same runs: the layers add up to it), "
          "'run_ns' (the median host time of a run, submit to fence) and 'host_overhead_ns'. Raises "
          "tpuhal.Unsupported on a device without board timestamps.")
      .def(
          "modelled",
          [](PyInstance& i, std::int64_t batch) -> py::object {
            const auto run = [&] {
              std::lock_guard lock(i.mu);
              return i.instance.modelled(batch);
            }();
            if (!run) return py::none();
            py::list layers;
            for (const auto& l : run->layers) {
              py::dict d;
              d["node"] = l.node;
              d["ops"] = l.ops;
              d["ns"] = l.ns;
              d["compute_ns"] = l.compute_ns;
              d["memory_ns"] = l.memory_ns;
              d["overhead_ns"] = l.overhead_ns;
              d["bound"] = to_string(l.bound);
              layers.append(std::move(d));
            }
            py::dict r;
            r["layers"] = std::move(layers);
            r["ns"] = run->ns;
            r["input_copy_ns"] = run->input_copy_ns;
            r["output_copy_ns"] = run->output_copy_ns;
            return r;
          },
          py::arg("batch") = 0,
          "One run in the board's timing model (docs/timing.md), computed from the ops without running "
          "anything (`batch` as profile()'s): a dict with 'layers' (node, ops, ns, compute_ns, memory_ns, overhead_ns "
          "and bound, as "
          "profile() names and groups them), 'ns' (the layers one after another), 'input_copy_ns' and "
          "'output_copy_ns'. None where the device has no timing model (sim:bm1684x has one).")
      .def_property_readonly("model", [](const PyInstance& i) { return i.instance.model(); });

  m.def(
      "load_model", &load, py::arg("device"), py::arg("model"),
      "Loads a compiled model onto a device: `model` is a .tpm path or a CompiledModel. Checks the file "
      "(tpuhal.InvalidArgument naming what is damaged, tpuhal.VersionMismatch for another format version) and uploads "
      "the weights once. Returns a Model.");
}

}  // namespace tpuhal::python
