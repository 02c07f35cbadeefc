// Tensor work (tpuhal/ops.hpp): tpuhal.Tensor, tpuhal.Activation, tpuhal.Op,
// the tpuhal.ops builders, Device.record() and tpuhal.Program, and
// Batch.run() / Queue.run().
//
// Ops are checked as they are built (the C++ builders throw tpuhal::Error
// naming the operand and the value), so building one holds the GIL; running
// one is a batch command like any other.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <tuple>
#include <time.h>

#include "common.hpp"

namespace tpuhal::python {
namespace {

// A checked op and the owners of imported memory its operands use.
struct PyOp {
  Op op;
  std::vector<Keep> keep;
};

// A recorded program and the owners of imported memory it uses.
struct PyProgram {
  Program program;
  std::vector<Keep> keep;
};

std::vector<std::int64_t> int_list(const py::handle& h, const char* what) {
  if (py::isinstance<py::int_>(h)) return {h.cast<std::int64_t>()};
  try {
    return h.cast<std::vector<std::int64_t>>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(what) + " must be an int or a sequence of ints, not " + type_name(h));
  }
}

py::tuple to_tuple(const std::vector<std::int64_t>& v) {
  py::tuple t(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) t[i] = v[i];
  return t;
}

// Names for the small enums of ops.hpp, as Python takes them: lower case,
// '-' or '_' between words ("half_pixel", "NHWC" and "nhwc" alike).
template <class E, std::size_t N>
E parse(const py::handle& h, const char* what, const std::array<std::pair<const char*, E>, N>& names) {
  if (!py::isinstance<py::str>(h))
    throw py::type_error(std::string(what) + " must be a string such as '" + names[0].first + "', not " + type_name(h));
  std::string given = h.cast<std::string>();
  std::string key;
  for (char c : given) key += c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string known;
  for (auto& [name, value] : names) {
    if (key == name) return value;
    known += std::string(known.empty() ? "" : ", ") + "'" + name + "'";
  }
  fail(Status::InvalidArgument, "unknown " + std::string(what) + " '" + given + "' (one of: " + known + ")");
}

// None, an Activation, or a name with its default parameters ('relu6' too).
ActivationParams to_activation(const py::handle& h) {
  if (h.is_none()) return {};
  if (py::isinstance<ActivationParams>(h)) return h.cast<ActivationParams>();
  if (py::isinstance<py::str>(h)) {
    const std::string name = h.cast<std::string>();
    if (name == "relu6") return ActivationParams::relu6();
    if (name == "leaky_relu" || name == "leaky-relu") return ActivationParams::leaky_relu();
    if (name == "hard_sigmoid" || name == "hard-sigmoid") return ActivationParams::hard_sigmoid();
    if (name == "hard_swish" || name == "hard-swish") return ActivationParams::hard_swish();
    if (name == "clip")
      fail(Status::InvalidArgument, "activation 'clip' needs its bounds: tpuhal.Activation.clip(lo, hi)");
    return {parse(h, "activation", kActivationNames), 0, 0};
  }
  throw py::type_error("activation must be None, a tpuhal.Activation or a name such as 'relu', not " + type_name(h));
}

// The operands' owners of imported memory, for the batches that run the op.
PyOp finish(Op op, std::initializer_list<const PyTensor*> operands) {
  PyOp out{std::move(op), {}};
  for (const PyTensor* t : operands)
    if (t && t->buffer && t->buffer->owner) out.keep.push_back(t->buffer->owner);
  return out;
}

std::optional<Tensor> opt(const PyTensor* t) {
  if (!t) return std::nullopt;
  return t->tensor;
}

PyTensor make_tensor(const BufferRef& buffer, const py::object& dtype, const py::object& shape,
                     const py::object& strides, std::uint64_t offset) {
  const Buffer& b = buffer->get("Tensor");
  const auto& l = buffer->layout;
  DType dt;
  if (!dtype.is_none()) {
    dt = to_dtype(dtype);
  } else if (l) {
    dt = to_dtype(py::str(l->dtype));
  } else {
    fail(Status::InvalidArgument, "Tensor: give a dtype ('f32', 'f16', 'bf16', 'i8', 'u8', 'i32'); the " +
                                      buffer->describe() + " was made by alloc() and has none");
  }
  std::vector<std::int64_t> dims;
  if (!shape.is_none()) {
    dims = int_list(shape, "shape");
  } else if (l && offset == 0 && l->itemsize == size_of(dt)) {
    dims = l->shape;
  } else {
    const std::uint64_t item = size_of(dt);
    const std::uint64_t rest = offset < b.size() ? b.size() - offset : 0;
    if (rest % item)
      fail(Status::InvalidArgument, "Tensor: the " + std::to_string(rest) + " bytes from offset " +
                                        std::to_string(offset) + " are not a whole number of " + to_string(dt) +
                                        " elements; give a shape");
    dims = {static_cast<std::int64_t>(rest / item)};
  }
  if (strides.is_none()) return {Tensor(b, dt, std::move(dims), offset), buffer};
  return {Tensor(b, dt, std::move(dims), int_list(strides, "strides"), offset), buffer};
}

template <std::size_t N>
std::array<std::uint32_t, N> uints(const py::handle& h, const char* what) {
  std::array<std::uint32_t, N> out{};
  std::vector<std::int64_t> v = int_list(h, what);
  if (v.size() == 1 && N > 1) v.assign(N, v[0]);  // one value for every dimension
  if (v.size() != N)
    fail(Status::InvalidArgument,
         std::string(what) + " needs " + std::to_string(N) + " values (got " + std::to_string(v.size()) + ")");
  for (std::size_t i = 0; i < N; ++i) {
    if (v[i] < 0 || v[i] > 0xFFFFFFFFll)
      fail(Status::InvalidArgument, std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                                        " is not a non-negative 32-bit value");
    out[i] = static_cast<std::uint32_t>(v[i]);
  }
  return out;
}

constexpr auto chain = py::return_value_policy::reference;  // the same Batch object, for chaining

// A timing model's answer as a dict (None without a model).
py::object modelled_dict(const std::optional<ModelledTime>& t) {
  if (!t) return py::none();
  py::dict d;
  d["ns"] = t->ns;
  d["compute_ns"] = t->compute_ns;
  d["memory_ns"] = t->memory_ns;
  d["overhead_ns"] = t->overhead_ns;
  d["bound"] = to_string(t->bound);
  return d;
}

PyBatch& run_op(PyBatch& b, const PyOp& op) {
  b.recording("run").run(op.op);
  b.keep.insert(b.keep.end(), op.keep.begin(), op.keep.end());
  return b;
}

PyBatch& run_program(PyBatch& b, const PyProgram& p) {
  b.recording("run").run(p.program);
  b.keep.insert(b.keep.end(), p.keep.begin(), p.keep.end());
  return b;
}

void bind_builders(py::module_& ops) {
  using T = const PyTensor&;
  using Opt = const PyTensor*;

  // The builders of the kinds with shape rules of their own (op_builders.inc,
  // generated): matmul, conv2d, ...
#include "op_builders.inc"

  // The schema's elementwise maps (op_maps.inc, generated): add, sub, ...
  const auto binary = [&](const char* name, Op (*f)(const Tensor&, const Tensor&, const Tensor&), const char* doc) {
    ops.def(
        name,
        [f](T a, T b, T y) {
          return finish(f(a.tensor, b.tensor, y.tensor), {&a, &b, &y});
        },
        py::arg("a"), py::arg("b"), py::arg("y"), doc);
  };
  const auto unary = [&](const char* name, Op (*f)(const Tensor&, const Tensor&), const char* doc) {
    ops.def(
        name,
        [f](T x, T y) {
          return finish(f(x.tensor, y.tensor), {&x, &y});
        },
        py::arg("x"), py::arg("y"), doc);
  };
#define TPUHAL_PY_MAP(name, arity, doc) TPUHAL_PY_MAP_##arity(name, doc);
#define TPUHAL_PY_MAP_2(name, doc) binary(#name, &ops::name, doc)
#define TPUHAL_PY_MAP_1(name, doc) unary(#name, &ops::name, doc)
#include "op_maps.inc"
#undef TPUHAL_PY_MAP_1
#undef TPUHAL_PY_MAP_2
#undef TPUHAL_PY_MAP
  // The kinds with rules (op_kinds.inc, generated): cumsum, ...
#include "op_kinds.inc"
  ops.def("same_pads", &ops::same_pads, py::arg("input"), py::arg("kernel"), py::arg("stride"), py::arg("dilation") = 1,
          py::arg("lower") = false,
          "The (before, after) pads along one dimension that give an output of ceil(input / stride) "
          "('SAME_UPPER'; lower=True: 'SAME_LOWER').");
}

}  // namespace

void bind_ops(py::module_& m) {
  py::class_<ActivationParams>(
      m, "Activation",
      "An activation and its parameters, for the ops that take one (ops.matmul, ops.conv2d, "
      "ops.activation). Where an activation is taken, a name ('relu', 'relu6', 'sigmoid', 'silu', 'tanh', "
      "'leaky_relu', 'hard_sigmoid', 'hard_swish') gives it with default parameters.")
      .def(py::init([](const py::object& kind, float alpha, float beta) {
             ActivationParams p = to_activation(kind);
             if (alpha != 0 || beta != 0) {
               p.alpha = alpha;
               p.beta = beta;
             }
             return p;
           }),
           py::arg("kind") = "none", py::arg("alpha") = 0.0f, py::arg("beta") = 0.0f)
      .def_property_readonly(
          "kind", [](const ActivationParams& a) { return std::string(to_string(a.kind)); },
          "'none', 'relu', 'clip', 'sigmoid', 'silu', 'leaky_relu', 'tanh', 'hard_sigmoid' or 'hard_swish'.")
      .def_readonly("alpha", &ActivationParams::alpha)
      .def_readonly("beta", &ActivationParams::beta)
      .def_static("relu", &ActivationParams::relu)
      .def_static("relu6", &ActivationParams::relu6, "clip(0, 6).")
      .def_static("clip", &ActivationParams::clip, py::arg("lo"), py::arg("hi"), "Clamps to [lo, hi].")
      .def_static("sigmoid", &ActivationParams::sigmoid)
      .def_static("silu", &ActivationParams::silu, "x * sigmoid(x).")
      .def_static("leaky_relu", &ActivationParams::leaky_relu, py::arg("alpha") = 0.01f)
      .def_static("tanh", &ActivationParams::tanh)
      .def_static("hard_sigmoid", &ActivationParams::hard_sigmoid, py::arg("alpha") = 0.2f, py::arg("beta") = 0.5f,
                  "clamp(alpha * x + beta, 0, 1).")
      .def_static("hard_swish", &ActivationParams::hard_swish, py::arg("alpha") = 1.0f / 6, py::arg("beta") = 0.5f,
                  "x * clamp(alpha * x + beta, 0, 1) (ONNX HardSwish: alpha 1/6, beta 1/2).")
      .def("__eq__",
           [](const ActivationParams& a, const ActivationParams& b) {
             return a.kind == b.kind && a.alpha == b.alpha && a.beta == b.beta;
           })
      .def("__repr__", [](const ActivationParams& a) {
        return "Activation('" + std::string(to_string(a.kind)) + "', alpha=" + std::to_string(a.alpha) +
               ", beta=" + std::to_string(a.beta) + ")";
      });

  py::class_<PyTensor>(
      m, "Tensor",
      "A view of a Buffer as an n-dimensional array (rank 0 to 6): dtype, shape, strides in elements "
      "(row-major when not given) and a byte offset. The operands of tpuhal.ops. Keeps its buffer alive.")
      .def(py::init(&make_tensor), py::arg("buffer"), py::arg("dtype") = py::none(), py::arg("shape") = py::none(),
           py::arg("strides") = py::none(), py::arg("offset") = 0,
           "A view of `buffer`. dtype: a tpuhal.DType, its name, or a NumPy dtype (default: the dtype the buffer "
           "was uploaded with). shape: default the upload's shape, else every whole element from `offset`. "
           "Raises tpuhal.OutOfRange if the view does not fit in the buffer.")
      .def_property_readonly(
          "buffer", [](const PyTensor& t) { return t.buffer; }, "The Buffer it views.")
      .def_property_readonly(
          "dtype", [](const PyTensor& t) { return from_dtype(t.tensor.dtype()); }, "Its tpuhal.DType.")
      .def_property_readonly(
          "shape", [](const PyTensor& t) { return to_tuple(t.tensor.shape()); }, "A tuple of ints.")
      .def_property_readonly(
          "strides", [](const PyTensor& t) { return to_tuple(t.tensor.strides()); },
          "In elements (NumPy's are in bytes).")
      .def_property_readonly(
          "offset", [](const PyTensor& t) { return t.tensor.offset(); }, "Byte offset in the buffer.")
      .def_property_readonly(
          "ndim", [](const PyTensor& t) { return t.tensor.rank(); }, "Rank.")
      .def_property_readonly(
          "size", [](const PyTensor& t) { return t.tensor.elements(); }, "Number of elements.")
      .def_property_readonly(
          "itemsize", [](const PyTensor& t) { return size_of(t.tensor.dtype()); }, "Bytes per element.")
      .def_property_readonly(
          "contiguous", [](const PyTensor& t) { return t.tensor.contiguous(); }, "Row-major without gaps.")
      .def(
          "reshape",
          [](const PyTensor& t, const py::args& args) {
            const py::object shape = args.size() == 1 ? py::object(args[0]) : py::object(args);
            return PyTensor{t.tensor.reshape(int_list(shape, "shape")), t.buffer};
          },
          "The same elements in another shape (contiguous tensors only): t.reshape(2, 3) or t.reshape((2, 3)).")
      .def(
          "permute",
          [](const PyTensor& t, const py::args& args) {
            const py::object perm = args.size() == 1 ? py::object(args[0]) : py::object(args);
            std::vector<std::size_t> p;
            for (auto v : int_list(perm, "perm")) p.push_back(static_cast<std::size_t>(v));
            return PyTensor{t.tensor.permute(p), t.buffer};
          },
          "A view with dimensions reordered: result dim i is this tensor's dim perm[i].")
      .def("__repr__", [](const PyTensor& t) { return "<tpuhal.Tensor " + t.tensor.describe() + ">"; });

  py::class_<PyOp>(m, "Op",
                   "An op with its operands (built by the tpuhal.ops functions), checked and ready to run on a "
                   "compute queue of the operands' device: queue.run(op).submit(), or batch.run(op). "
                   "Keeps its operands' buffers alive; run it as often as needed.")
      .def_property_readonly(
          "name", [](const PyOp& o) { return o.op.name(); }, "'matmul', 'conv2d', ...")
      .def_property_readonly(
          "device", [](const PyOp& o) { return std::make_shared<PyDevice>(o.op.device()); },
          "A new Device handle for the device it runs on.")
      .def("__repr__", [](const PyOp& o) { return "<tpuhal.Op " + o.op.name() + ">"; });

  py::class_<PyProgram>(m, "Program",
                        "Commands recorded once (Device.record()), uploaded to the device and replayed by "
                        "queue.run(program).submit() as often as needed: a compiled model. It refers to the "
                        "buffers it was recorded with and keeps them alive; copy new inputs into them before "
                        "a replay.")
      .def(
          "__len__", [](const PyProgram& p) { return p.program.size(); }, "Commands recorded.")
      .def_property_readonly(
          "device", [](const PyProgram& p) { return std::make_shared<PyDevice>(p.program.device()); },
          "A new Device handle for its device.")
      .def("__repr__", [](const PyProgram& p) {
        return "<tpuhal.Program of " + std::to_string(p.program.size()) + " commands on " + p.program.device().uri() +
               ">";
      });

  auto ops = m.def_submodule(
      "ops",
      "Tensor op builders (<tpuhal/ops.hpp>; docs/ops.md gives each op's exact numerics). Each takes "
      "tpuhal.Tensor operands, checks them at once (raising tpuhal.Error naming the operand and the value) "
      "and returns a tpuhal.Op to run: queue.run(tpuhal.ops.matmul(a, b, y)).submit().wait().");
  bind_builders(ops);

  auto batch = py::reinterpret_borrow<py::class_<PyBatch>>(m.attr("Batch"));
  batch.def("run", &run_op, py::arg("op"), chain, "Runs a tensor op (tpuhal.ops) on this queue's device.")
      .def("run", &run_program, py::arg("program"), chain, "Replays a recorded Program (Device.record()).");

  auto queue_cls = py::reinterpret_borrow<py::class_<PyQueue, QueueRef>>(m.attr("Queue"));
  queue_cls
      .def(
          "run",
          [](const QueueRef& q, const PyOp& op) {
            auto b = std::make_unique<PyBatch>(q);
            run_op(*b, op);
            return b;
          },
          py::arg("op"), "A new Batch starting with a tensor op.")
      .def(
          "run",
          [](const QueueRef& q, const PyProgram& p) {
            auto b = std::make_unique<PyBatch>(q);
            run_program(*b, p);
            return b;
          },
          py::arg("program"), "A new Batch starting with a program replay.");

  auto dev = py::reinterpret_borrow<py::class_<PyDevice, std::shared_ptr<PyDevice>>>(m.attr("Device"));
  dev.def(
         "record",
         [](const PyDevice& d, const py::function& body) {
           Device device = d.get();
           py::object holder;  // the Batch object the body sees
           PyBatch* recording = nullptr;
           std::vector<Keep> keep;
           // The upload (and the driver's work) runs without the GIL; the body
           // takes it back to run.
           Program p = without_gil([&] {
             return device.record([&](Batch& b) {
               py::gil_scoped_acquire gil;
               auto owned = std::make_unique<PyBatch>(b);
               recording = owned.get();
               holder = py::cast(std::move(owned));
               struct Close {  // the batch is record()'s: unusable once the body returns
                 PyBatch* r;
                 ~Close() { r->batch = nullptr; }
               } close{recording};
               body(holder);
               keep = std::move(recording->keep);
             });
           });
           return PyProgram{std::move(p), std::move(keep)};
         },
         py::arg("body"),
         "Records a program: calls body(batch) once, where batch records copies, fills, value writes, "
         "timestamps and ops (batch.run(op); no waits on fences), then uploads the commands to the device and "
         "returns a Program to replay with queue.run(program). Raises tpuhal.Unsupported where the device "
         "cannot record programs, tpuhal.InvalidArgument if the body recorded nothing; an exception the body "
         "raises propagates.")
      .def(
          "modelled", [](const PyDevice& d, const PyOp& op) { return modelled_dict(d.get().modelled(op.op)); },
          py::arg("op"),
          "What `op` costs in the board's timing model (docs/timing.md), without running it: a dict with "
          "'ns' (max(compute, memory) + overhead), 'compute_ns', 'memory_ns', 'overhead_ns' and 'bound' "
          "('compute', 'memory' or 'overhead'); the same on every host. None where the device has no timing "
          "model (a simulated board whose profile gives one has: sim:bm1684x).")
      .def(
          "modelled_copy",
          [](const PyDevice& d, std::uint64_t bytes, py::handle from, py::handle to) {
            return modelled_dict(d.get().modelled_copy(bytes, to_memory(from), to_memory(to)));
          },
          py::arg("bytes"), py::arg("src") = "host_pinned", py::arg("dst") = "device",
          "What a copy of `bytes` from `src` memory to `dst` costs in the board's timing model (a fill: "
          "'device' to 'device'), as modelled() gives it; None without a timing model.")
      .def(
          "board_time_ns", [](const PyDevice& d) { return d.get().board_time_ns(); },
          "The board's clock now (ns since its reset; a simulated board with TPUHAL_SIM_CLOCK=virtual: the "
          "furthest its modelled clocks reached): the base for Batch.wait_until() and "
          "VideoDecoder.send(arrival_ns=). None without caps.wait_time.")
      .def(
          "modelled_decode_ns",
          [](const PyDevice& d, py::handle codec, const std::string& frame_type, std::uint32_t width,
             std::uint32_t height) -> std::optional<std::uint64_t> {
            FrameType t;
            if (frame_type == "I")
              t = FrameType::Intra;
            else if (frame_type == "P")
              t = FrameType::Predicted;
            else if (frame_type == "B")
              t = FrameType::Bidirectional;
            else
              throw Error(Status::InvalidArgument, "frame_type must be 'I', 'P' or 'B', not '" + frame_type + "'");
            return d.get().modelled_decode_ns(to_codec(codec), t, width, height);
          },
          py::arg("codec"), py::arg("frame_type"), py::arg("width"), py::arg("height"),
          "Board nanoseconds the video unit spends decoding one frame of `frame_type` ('I', 'P' or 'B') at "
          "width x height in the board's timing model; None without a timing model.");

  m.def(
      "_bench_run_wait",
      [](const QueueRef& q, const PyOp& op, int iterations) {
        Queue queue = q->queue;
        Op o = op.op;
        std::vector<double> us;
        us.reserve(static_cast<std::size_t>(std::max(iterations, 0)));
        PythonFramesKept frames;  // reports made meanwhile name the Python line
        py::gil_scoped_release release;
        for (int i = 0; i < iterations; ++i) {
          const auto t0 = now_ns();
          queue.run(o).submit().wait();
          us.push_back(static_cast<double>(now_ns() - t0) / 1000.0);
        }
        return us;
      },
      py::arg("queue"), py::arg("op"), py::arg("iterations"),
      "Internal: microseconds of each of `iterations` C++ queue.run(op).submit().wait() round trips.");
}

}  // namespace tpuhal::python
