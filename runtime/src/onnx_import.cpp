// ONNX in: parse, list unsupported ops, infer every shape for the fixed
// input shapes, fold constants, drop Identity and Dropout, fold
// BatchNormalization into the Conv before it and fuse Relu / Clip into the
// Conv, Gemm or MatMul before them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>

#include "beneath.hpp"
#include "ir.hpp"
#include "onnx_attrs.hpp"
#include "tpuhal/error.hpp"

namespace tpuhal::rt::detail {
namespace {

using onnx_attrs::Attrs;

const std::set<std::string> kSupported = {
    "Conv", "Gemm", "MatMul", "Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "MaxPool",
    "AveragePool", "GlobalAveragePool", "Softmax", "Add", "Mul", "Sub", "Div", "Pow", "Min", "Max", "Sqrt", "Exp",
    "Log", "Abs", "Neg", "Reciprocal", "Erf", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2", "Pad",
    "Resize", "Upsample", "Reshape", "Flatten", "Transpose", "BatchNormalization", "Identity", "Dropout", "Constant",
    "Concat", "Slice", "Split", "LayerNormalization", "InstanceNormalization", "Expand", "Einsum", "ConvTranspose",
    "ArgMax", "ArgMin", "TopK",
    // Shape computations, folded to constants for the fixed input shapes
    // (what exporters write for x.view(x.size(0), -1), and for masks built
    // from shapes).
    "Shape", "Gather", "Unsqueeze", "Squeeze", "Cast", "ConstantOfShape", "Range", "Mod", "Where", "ScatterND",
    // Comparisons and logic: folded on constants, on the device otherwise
    // (booleans as u8 1 or 0, for Where's condition).
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor"};

// Ops that exist here only to compute shapes: every input must be known at
// compile time.
const std::set<std::string> kFoldOnly = {"ConstantOfShape", "Range", "Mod", "ScatterND"};
// Ops folded when every input is a constant, run on the device otherwise
// (Unsqueeze, Squeeze, and Cast to float, as views of another shape).
const std::set<std::string> kFoldable = {
    "Concat",         "Slice", "Sqrt",  "Exp",    "Log",    "Abs",         "Neg",
    "Reciprocal",     "Erf",   "Pow",   "Gather", "Expand", "Transpose",   "Unsqueeze",
    "Squeeze",        "Cast",  "Where", "Equal",  "Less",   "LessOrEqual", "Greater",
    "GreaterOrEqual", "Not",   "And",   "Or",     "Xor"};
// Comparisons and logic of two inputs, broadcast.
const std::set<std::string> kCompareOrLogic = {"Equal",          "Less", "LessOrEqual", "Greater",
                                               "GreaterOrEqual", "And",  "Or",          "Xor"};
const std::set<std::string> kUnary = {"Sqrt",       "Exp",  "Log",         "Abs",       "Neg",
                                      "Reciprocal", "Erf",  "HardSigmoid", "HardSwish", "Relu",
                                      "Sigmoid",    "Tanh", "LeakyRelu",   "Clip",      "Softmax"};
const std::set<std::string> kReduce = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2"};

std::string dims_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The bytes of one element in raw_data (and in external data) for the
// element types the compiler reads; 0 for the others.
std::size_t raw_element_size(int data_type) {
  switch (data_type) {
    case onnx::TensorProto::FLOAT:
    case onnx::TensorProto::INT32: return 4;
    case onnx::TensorProto::DOUBLE:
    case onnx::TensorProto::INT64: return 8;
    case onnx::TensorProto::BOOL: return 1;
    default: return 0;
  }
}

// An external data file, opened once however many tensors it holds.
struct ExternalFile {
  UniqueFd fd;
  std::uint64_t size = 0;
};

struct Importer {
  std::string model_name;
  const CompileOptions& options;
  std::filesystem::path external_dir;  // empty: external data is refused
  Graph g;
  std::map<std::string, std::string> alias;                    // Identity / Dropout outputs -> their input
  mutable UniqueFd external_dir_fd;                            // external_dir, opened at the first use
  mutable std::map<std::string, ExternalFile> external_files;  // by location
  std::uint64_t constant_limit = 0;                            // bytes: the largest constant folding may make

  [[noreturn]] void fail(Status s, const std::string& what) const { throw Error(s, model_name + ": " + what); }
  [[noreturn]] void fail_node(const Node& n, const std::string& what) const {
    fail(Status::InvalidArgument, "node '" + n.name + "' (" + n.op + "): " + what);
  }

  // A constant that folding node `n` would make, of `shape`, must fit
  // constant_limit as float32: checked before any memory is taken for it.
  void check_folded(const Node& n, const std::vector<std::int64_t>& shape) const {
    std::uint64_t elements = 1;
    bool over = false;
    for (auto d : shape) {
      if (d < 0) fail_node(n, "a constant of shape " + dims_text(shape));
      over = over || __builtin_mul_overflow(elements, static_cast<std::uint64_t>(d), &elements);
    }
    if (over || elements > constant_limit / 4)
      fail(Status::ResourceExhausted,
           "node '" + n.name + "' (" + n.op + "): folded on constants it makes a constant of shape " +
               dims_text(shape) + (over ? std::string() : " (" + std::to_string(elements * 4) + " bytes as float32)") +
               ", above the limit of " + std::to_string(constant_limit) +
               " bytes (tpuhal compile --max-constant-bytes, CompileOptions::max_constant_bytes)");
  }

  std::string resolve(const std::string& v) const {
    auto it = alias.find(v);
    return it == alias.end() ? v : it->second;
  }

  Value tensor_value(const onnx::TensorProto& t, const std::string& what) const {
    Value v;
    std::uint64_t n = 1;
    for (auto d : t.dims()) {
      if (d < 0 || d > (std::int64_t{1} << 32))
        fail(Status::InvalidArgument, what + " has dimension " + std::to_string(d));
      v.shape.push_back(d);
      n *= static_cast<std::uint64_t>(d);
      if (n > (std::uint64_t{1} << 32)) fail(Status::InvalidArgument, what + " is too large");
    }
    auto unsupported_type = [&] {
      fail(Status::Unsupported, what + " has ONNX element type " + std::to_string(t.data_type()) +
                                    "; the compiler reads float, double, int64, int32 and bool constants");
    };
    const std::size_t esize = raw_element_size(t.data_type());
    if (esize == 0) unsupported_type();
    // The data must fill the shape exactly, checked before any memory is
    // taken for the values: a few bytes of model that declare 2^31 elements
    // are refused, not zero-filled.
    std::string external;
    std::string_view raw = t.raw_data();
    if (t.data_location() == onnx::TensorProto::EXTERNAL) {
      external = external_bytes(t, what, v.shape, n * esize);  // checks the length against the file
      raw = external;
    }
    const int typed = t.data_type() == onnx::TensorProto::FLOAT    ? t.float_data_size()
                      : t.data_type() == onnx::TensorProto::DOUBLE ? t.double_data_size()
                      : t.data_type() == onnx::TensorProto::INT64  ? t.int64_data_size()
                                                                   : t.int32_data_size();  // INT32, BOOL
    if (!raw.empty() && raw.size() != n * esize)
      fail(Status::InvalidArgument, what + " holds " + std::to_string(raw.size()) + " bytes of data; its shape " +
                                        dims_text(v.shape) + " of " + std::to_string(esize) + "-byte elements needs " +
                                        std::to_string(n * esize));
    if (raw.empty() && static_cast<std::uint64_t>(typed) != n)
      fail(Status::InvalidArgument, what + " holds " + std::to_string(typed) + " values; its shape " +
                                        dims_text(v.shape) + " needs " + std::to_string(n));
    std::vector<float> f(n);
    switch (t.data_type()) {
      case onnx::TensorProto::FLOAT:
        for (std::uint64_t i = 0; i < n; ++i) {
          if (!raw.empty())
            std::memcpy(&f[i], raw.data() + i * 4, 4);
          else
            f[i] = t.float_data(static_cast<int>(i));
        }
        break;
      case onnx::TensorProto::DOUBLE:
        for (std::uint64_t i = 0; i < n; ++i) {
          double d;
          if (!raw.empty())
            std::memcpy(&d, raw.data() + i * 8, 8);
          else
            d = t.double_data(static_cast<int>(i));
          f[i] = static_cast<float>(d);
        }
        break;
      case onnx::TensorProto::INT64:
        v.ints.resize(n);
        for (std::uint64_t i = 0; i < n; ++i) {
          if (!raw.empty())
            std::memcpy(&v.ints[i], raw.data() + i * 8, 8);
          else
            v.ints[i] = t.int64_data(static_cast<int>(i));
          f[i] = static_cast<float>(v.ints[i]);
        }
        break;
      case onnx::TensorProto::INT32:
        v.ints.resize(n);
        for (std::uint64_t i = 0; i < n; ++i) {
          std::int32_t x;
          if (!raw.empty())
            std::memcpy(&x, raw.data() + i * 4, 4);
          else
            x = t.int32_data(static_cast<int>(i));
          v.ints[i] = x;
          f[i] = static_cast<float>(x);
        }
        break;
      case onnx::TensorProto::BOOL:  // as int32_data, or one byte each
        v.ints.resize(n);
        for (std::uint64_t i = 0; i < n; ++i) {
          v.ints[i] = (!raw.empty() ? static_cast<int>(raw[i]) : t.int32_data(static_cast<int>(i))) != 0;
          f[i] = static_cast<float>(v.ints[i]);
        }
        break;
      default: unsupported_type();
    }
    v.data = std::move(f);
    return v;
  }

  // The `bytes` bytes of a tensor kept in an external data file: its
  // external_data entries "location" (relative to external_dir), "offset"
  // and "length" (the rest of the file when absent); other keys
  // ("checksum", "basepath") are ignored, as ONNX's own loader does.
  std::string external_bytes(const onnx::TensorProto& t, const std::string& what,
                             const std::vector<std::int64_t>& shape, std::uint64_t bytes) const {
    std::string location;
    std::uint64_t offset = 0;
    std::optional<std::uint64_t> length;
    for (const auto& e : t.external_data()) {
      auto number = [&] {
        std::uint64_t x = 0;
        const char* end = e.value().data() + e.value().size();
        const auto [p, ec] = std::from_chars(e.value().data(), end, x);
        if (ec != std::errc() || p != end || e.value().empty())
          fail(Status::InvalidArgument,
               what + ": its external data '" + e.key() + "' is '" + e.value() + "', not a byte count");
        return x;
      };
      if (e.key() == "location")
        location = e.value();
      else if (e.key() == "offset")
        offset = number();
      else if (e.key() == "length")
        length = number();
    }
    if (location.empty())
      fail(Status::InvalidArgument, what + " keeps its data in an external file but names none (no 'location')");
    const std::string in_file = what + ": its external data '" + location + "'";
    const std::string needs =
        "its shape " + dims_text(shape) + " of " +
        onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t.data_type())) + " needs " +
        std::to_string(bytes);
    if (external_dir.empty())
      fail(Status::InvalidArgument,
           what + " keeps its data in the external file '" + location +
               "'; compile the model from its file path (the data is read from the model's directory) or give the "
               "directory holding the data (CompileOptions::external_data_dir)");
    const std::filesystem::path rel(location);
    if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
      fail(Status::InvalidArgument,
           in_file + " is an absolute path; ONNX external data locations are relative to the model's directory");
    for (const auto& part : rel)
      if (part == "..")
        fail(Status::InvalidArgument, in_file + " leaves the model's directory ('..'); the data must lie in it");
    if (length && *length != bytes)
      fail(Status::InvalidArgument, in_file + " is " + std::to_string(*length) + " bytes ('length'); " + needs);

    auto it = external_files.find(location);
    if (it == external_files.end()) it = external_files.emplace(location, open_external(rel, in_file)).first;
    ExternalFile& f = it->second;
    if (offset > f.size)
      fail(Status::InvalidArgument, in_file + ": offset " + std::to_string(offset) + " is past the end of the file (" +
                                        std::to_string(f.size) + " bytes)");
    const std::uint64_t len = length ? *length : f.size - offset;
    if (len > f.size - offset)
      fail(Status::InvalidArgument, in_file + ": bytes " + std::to_string(offset) + " to " +
                                        std::to_string(offset + len) + " run past the end of the file (" +
                                        std::to_string(f.size) + " bytes)");
    if (len != bytes)
      fail(Status::InvalidArgument, in_file + " is " + std::to_string(len) + " bytes (from offset " +
                                        std::to_string(offset) + " to the end of the file); " + needs);
    std::string data(len, '\0');
    for (std::uint64_t done = 0; done < len;) {
      const ssize_t got = ::pread(f.fd.get(), data.data() + done, len - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        fail(Status::InvalidArgument, in_file + ": reading " + std::to_string(len) + " bytes at offset " +
                                          std::to_string(offset) + " failed" +
                                          (got < 0 ? std::string(": ") + std::strerror(errno) : " (the file shrank)"));
      done += static_cast<std::uint64_t>(got);
    }
    return data;
  }

  // Opens external data file `rel` inside external_dir (beneath.hpp: no
  // symbolic link, nothing outside it); it must be a regular file.
  ExternalFile open_external(const std::filesystem::path& rel, const std::string& in_file) const {
    if (external_dir_fd.get() < 0) {
      external_dir_fd = UniqueFd(::open(external_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (external_dir_fd.get() < 0)
        fail(errno == ENOENT ? Status::NotFound : Status::InvalidArgument,
             in_file + ": cannot open the directory " + external_dir.string() +
                 " that holds it: " + std::strerror(errno));
    }
    const std::string path = (external_dir / rel).string();
    const int fd = open_beneath(external_dir_fd.get(), rel);
    if (fd < 0) {
      switch (-fd) {
        case ENOENT: fail(Status::NotFound, in_file + ": no file " + path);
        case ELOOP:
          fail(Status::InvalidArgument,
               in_file + ": " + path + " is, or lies under, a symbolic link; external data must be a regular file " +
                   "in the model's directory (or a directory in it), named without symbolic links");
        case EXDEV: fail(Status::InvalidArgument, in_file + ": " + path + " lies outside the model's directory");
        default: fail(Status::InvalidArgument, in_file + ": cannot open " + path + ": " + std::strerror(-fd));
      }
    }
    ExternalFile f;
    f.fd = UniqueFd(fd);
    struct stat st;
    if (::fstat(fd, &st) != 0)
      fail(Status::InvalidArgument, in_file + ": cannot read the size of " + path + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(Status::InvalidArgument, in_file + ": " + path + " is not a regular file");
    f.size = static_cast<std::uint64_t>(st.st_size);
    return f;
  }

  const Value& in(const Node& n, std::size_t i) const {
    if (i >= n.inputs.size() || n.inputs[i].empty()) fail_node(n, "input " + std::to_string(i) + " is missing");
    auto it = g.values.find(n.inputs[i]);
    if (it == g.values.end())
      fail_node(n, "input '" + n.inputs[i] + "' is not produced before it (the graph must be sorted)");
    return it->second;
  }
  const Value& constant(const Node& n, std::size_t i, const char* what) const {
    const Value& v = in(n, i);
    if (!v.data)
      fail(Status::Unsupported, "node '" + n.name + "' (" + n.op + "): its " + what + " ('" + n.inputs[i] +
                                    "') is computed, not a constant; the compiler needs constant " + what);
    return v;
  }
  bool has(const Node& n, std::size_t i) const { return i < n.inputs.size() && !n.inputs[i].empty(); }

  std::vector<std::int64_t> broadcast(const Node& n, std::vector<std::int64_t> a, std::vector<std::int64_t> b) const {
    if (a.size() < b.size()) std::swap(a, b);
    b.insert(b.begin(), a.size() - b.size(), 1);
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i] || b[i] == 1) continue;
      if (a[i] == 1) {
        a[i] = b[i];
        continue;
      }
      fail_node(n, "shapes " + dims_text(a) + " and " + dims_text(b) + " do not broadcast");
    }
    return a;
  }

  // The flat position in a tensor of shape `s` of the element broadcast to
  // flat position `flat` of `shape`.
  static std::size_t broadcast_index(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& s,
                                     std::uint64_t flat) {
    const auto st = row_major_strides(shape), ss = row_major_strides(s);
    std::int64_t at = 0;
    const std::size_t off = shape.size() - s.size();
    for (std::size_t d = off; d < shape.size(); ++d) {
      const std::int64_t coord = static_cast<std::int64_t>(flat) / st[d] % shape[d];
      if (s[d - off] != 1) at += coord * ss[d - off];
    }
    return static_cast<std::size_t>(at);
  }

  // Unsqueeze's and Squeeze's output shape.
  std::vector<std::int64_t> squeezed(const Node& n) const {
    const Attrs a{n.proto};
    const auto& x = in(n, 0).shape;
    const auto rank = static_cast<std::int64_t>(x.size());
    auto axes = g.opset >= 13 ? int_list(n, 1, "axes", a) : a.ints("axes");
    std::vector<std::int64_t> shape = x;
    if (n.op == "Unsqueeze") {
      const auto out_rank = rank + static_cast<std::int64_t>(axes.size());
      for (auto& ax : axes) ax = axis_of(n, ax, out_rank);
      std::sort(axes.begin(), axes.end());
      if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) fail_node(n, "an axis is repeated");
      for (auto ax : axes) shape.insert(shape.begin() + ax, 1);
      if (shape.size() > kMaxRank) fail(Status::Unsupported, "node '" + n.name + "' (Unsqueeze): rank above 6");
      return shape;
    }
    for (auto& ax : axes) ax = axis_of(n, ax, rank);
    std::vector<std::int64_t> kept;
    for (std::int64_t d = 0; d < rank; ++d) {
      const bool listed = std::find(axes.begin(), axes.end(), d) != axes.end();
      const auto dim = x[static_cast<std::size_t>(d)];
      if (listed && dim != 1)
        fail_node(n, "axis " + std::to_string(d) + " has size " + std::to_string(dim) + ", not 1");
      if (!(listed || (axes.empty() && dim == 1))) kept.push_back(dim);
    }
    return kept;
  }

  // Transpose's permutation, checked.
  std::vector<std::int64_t> permutation(const Node& n) const {
    const auto& x = in(n, 0).shape;
    auto perm = Attrs{n.proto}.ints("perm");
    if (perm.empty())
      for (std::size_t i = x.size(); i-- > 0;) perm.push_back(static_cast<std::int64_t>(i));
    if (perm.size() != x.size())
      fail_node(n, "perm has " + std::to_string(perm.size()) + " entries for rank " + std::to_string(x.size()));
    std::vector<bool> seen(x.size());
    for (auto p : perm) {
      if (p < 0 || p >= static_cast<std::int64_t>(x.size()) || seen[static_cast<std::size_t>(p)])
        fail_node(n, "perm is not a permutation");
      seen[static_cast<std::size_t>(p)] = true;
    }
    return perm;
  }

  // Expand's output shape: the input broadcast with the shape input.
  std::vector<std::int64_t> expanded(const Node& n) const {
    const Value& s = constant(n, 1, "shape");
    if (!is_integer(s) && s.elements() != 0) fail_node(n, "its shape is not integers");
    for (auto d : s.ints)
      if (d < 0) fail_node(n, "its shape " + dims_text(s.ints) + " has a negative entry");
    auto shape = broadcast(n, in(n, 0).shape, s.ints);
    if (shape.size() > kMaxRank) fail(Status::Unsupported, "node '" + n.name + "' (Expand): rank above 6");
    return shape;
  }

  // The window attributes of Conv, ConvTranspose and the pools, checked
  // before they become the engine's unsigned options: one entry per
  // spatial dimension (pads two), kernel_shape, strides, dilations and
  // group from 1 to 2^31 - 1, pads and output_padding from 0 to 65536 (the
  // most the ops take), auto_pad one of ONNX's four.
  void check_window(const Node& n, const Attrs& a, std::size_t spatial) const {
    constexpr std::int64_t kMaxStep = 0x7fffffff, kMaxPad = 65536;
    auto each = [&](const char* attr, std::size_t count, std::int64_t lo, std::int64_t hi) {
      if (!a.find(attr)) return;
      const auto v = a.ints(attr);
      if (count && v.size() != count)
        fail_node(n, std::string(attr) + " " + dims_text(v) + " has " + std::to_string(v.size()) + " entries; " +
                         std::to_string(spatial) + "-D windows take " + std::to_string(count));
      for (auto x : v)
        if (x < lo || x > hi)
          fail_node(n, std::string(attr) + " " + dims_text(v) + " has an entry outside [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
    };
    each("kernel_shape", spatial, 1, kMaxStep);
    each("strides", spatial, 1, kMaxStep);
    each("dilations", spatial, 1, kMaxStep);
    each("pads", 2 * spatial, 0, kMaxPad);
    each("output_padding", spatial, 0, kMaxPad);
    each("output_shape", 0, 1, kMaxStep);
    if (a.find("group") && (a.i("group", 1) < 1 || a.i("group", 1) > kMaxStep))
      fail_node(n, "group " + std::to_string(a.i("group", 1)) + " is outside [1, " + std::to_string(kMaxStep) + "]");
    const std::string autopad = a.s("auto_pad", "NOTSET");
    if (autopad != "NOTSET" && autopad != "SAME_UPPER" && autopad != "SAME_LOWER" && autopad != "VALID")
      fail_node(n, "auto_pad '" + autopad + "' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID");
  }
  // A window's output extents, each at least 1.
  void check_window_fits(const Node& n, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& out,
                         const std::string& window) const {
    if (out[2] < 1 || out[3] < 1)
      fail_node(n, "its " + window + " does not fit the padded " + std::to_string(x[2]) + "x" + std::to_string(x[3]) +
                       " input");
  }

  static std::int64_t pool_out(std::int64_t in, std::uint32_t k, std::uint32_t s, std::uint32_t d, std::uint32_t pb,
                               std::uint32_t pe, bool ceil) {
    const std::int64_t eff = static_cast<std::int64_t>(d) * (k - 1) + 1;
    const std::int64_t num = in + pb + pe - eff;
    if (num < 0 || s == 0) return 0;
    std::int64_t out = (ceil ? (num + s - 1) / s : num / s) + 1;
    if (ceil && (out - 1) * static_cast<std::int64_t>(s) >= in + pb) --out;
    return out;
  }

  // A constant from values (held as floats, and as integers when `integer`).
  static Value make_constant(std::vector<std::int64_t> shape, const std::vector<double>& values, bool integer) {
    Value v;
    v.shape = std::move(shape);
    v.data = std::vector<float>(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) (*v.data)[i] = static_cast<float>(values[i]);
    if (integer) {
      v.ints.resize(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) v.ints[i] = static_cast<std::int64_t>(values[i]);
    }
    return v;
  }
  static bool is_integer(const Value& v) { return !v.ints.empty() || (v.data && v.data->empty() && v.elements() == 0); }
  static std::vector<double> values_of(const Value& v) {
    std::vector<double> out;
    if (!v.ints.empty()) {
      for (auto x : v.ints) out.push_back(static_cast<double>(x));
    } else {
      for (auto x : *v.data) out.push_back(x);
    }
    return out;
  }
  // An axis attribute or entry, made non-negative for `rank`.
  std::int64_t axis_of(const Node& n, std::int64_t axis, std::int64_t rank) const {
    if (axis < -rank || axis >= rank)
      fail_node(n, "axis " + std::to_string(axis) + " for rank " + std::to_string(rank));
    return axis < 0 ? axis + rank : axis;
  }
  std::vector<std::int64_t> int_list(const Node& n, std::size_t input, const char* attr, const Attrs& a) const {
    if (has(n, input)) {
      const Value& v = constant(n, input, attr);
      if (!is_integer(v)) fail_node(n, std::string("its ") + attr + " are not integers");
      return v.ints;
    }
    return a.ints(attr);
  }

  // Slice's start and step per dimension and its output shape.
  struct SliceParams {
    std::vector<std::int64_t> lo, step, shape;
  };
  SliceParams slice_of(const Node& n) const {
    const Attrs a{n.proto};
    const auto& x = in(n, 0).shape;
    const auto rank = static_cast<std::int64_t>(x.size());
    if (g.opset < 10)
      fail(Status::Unsupported,
           "node '" + n.name + "' (Slice): opset " + std::to_string(g.opset) + " (attribute form)");
    auto starts = int_list(n, 1, "starts", a), ends = int_list(n, 2, "ends", a);
    std::vector<std::int64_t> axes = has(n, 3) ? int_list(n, 3, "axes", a) : std::vector<std::int64_t>{};
    std::vector<std::int64_t> steps = has(n, 4) ? int_list(n, 4, "steps", a) : std::vector<std::int64_t>{};
    if (axes.empty())
      for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
      fail_node(n, "starts, ends, axes and steps differ in length");
    SliceParams p{std::vector<std::int64_t>(x.size(), 0), std::vector<std::int64_t>(x.size(), 1), x};
    for (std::size_t i = 0; i < starts.size(); ++i) {
      const auto ax = static_cast<std::size_t>(axis_of(n, axes[i], rank));
      const auto dim = x[ax];
      if (steps[i] == 0) fail_node(n, "a step of 0");
      if (steps[i] < 0 && !in(n, 0).data)
        fail(Status::Unsupported, "node '" + n.name + "' (Slice): step " + std::to_string(steps[i]) +
                                      " on data computed on the device; the compiler slices it with positive steps");
      auto clampi = [&](std::int64_t v, std::int64_t lo, std::int64_t hi) {
        return std::clamp(v < 0 ? v + dim : v, lo, hi);
      };
      p.step[ax] = steps[i];
      if (steps[i] > 0) {
        const auto b = clampi(starts[i], 0, dim), e = clampi(ends[i], 0, dim);
        p.lo[ax] = b;
        p.shape[ax] = e > b ? (e - b + steps[i] - 1) / steps[i] : 0;
      } else if (dim > 0) {  // backwards: from start down to end (exclusive), clamped as ONNX does
        const auto b = clampi(starts[i], 0, dim - 1), e = clampi(ends[i], -1, dim - 1);
        p.lo[ax] = b;
        p.shape[ax] = b > e ? (b - e - steps[i] - 1) / -steps[i] : 0;
      } else {
        p.shape[ax] = 0;
      }
    }
    return p;
  }

  // Shape computations, evaluated here (kFoldOnly, Shape, and arithmetic
  // on constants).
  Value fold(Node& n) {
    const std::string& op = n.op;
    const Attrs a{n.proto};
    if (op == "Shape") {
      const auto& x = in(n, 0).shape;
      const auto rank = static_cast<std::int64_t>(x.size());
      std::int64_t start = a.i("start", 0), end = a.i("end", rank);
      start = std::clamp(start < 0 ? start + rank : start, std::int64_t{0}, rank);
      end = std::clamp(end < 0 ? end + rank : end, std::int64_t{0}, rank);
      std::vector<double> dims;
      for (std::int64_t i = start; i < end; ++i) dims.push_back(static_cast<double>(x[static_cast<std::size_t>(i)]));
      return make_constant({static_cast<std::int64_t>(dims.size())}, dims, true);
    }
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      if (has(n, i) && !in(n, i).data)
        fail(Status::Unsupported, "node '" + n.name + "' (" + op + "): input '" + n.inputs[i] +
                                      "' is computed on the device; the compiler evaluates " + op +
                                      " only on constants and shapes (shape computations)");
    if (op == "ConstantOfShape") {
      const Value& shape = in(n, 0);
      if (!is_integer(shape)) fail_node(n, "its shape is not integers");
      for (auto d : shape.ints)
        if (d < 0 || d > (std::int64_t{1} << 31)) fail_node(n, "dimension " + std::to_string(d));
      Value fill = make_constant({}, {0.0}, false);
      if (const auto* v = a.find("value")) fill = tensor_value(v->t(), "node '" + n.name + "' value");
      if (fill.elements() != 1) fail_node(n, "its value is not one element");
      check_folded(n, shape.ints);
      return make_constant(shape.ints, std::vector<double>(elements_of(shape.ints), values_of(fill)[0]),
                           is_integer(fill));
    }
    if (op == "Range") {
      const auto start = values_of(in(n, 0)), limit = values_of(in(n, 1)), delta = values_of(in(n, 2));
      if (start.size() != 1 || limit.size() != 1 || delta.size() != 1) fail_node(n, "its inputs are not scalars");
      if (delta[0] == 0) fail_node(n, "a delta of 0");
      const double count = std::max(std::ceil((limit[0] - start[0]) / delta[0]), 0.0);
      if (!(count * 4 <= static_cast<double>(constant_limit)))
        check_folded(n, {count < 0x1p62 ? static_cast<std::int64_t>(count) : std::int64_t{1} << 62});
      std::vector<double> r(static_cast<std::size_t>(count));
      for (std::size_t i = 0; i < r.size(); ++i) r[i] = start[0] + static_cast<double>(i) * delta[0];
      return make_constant({static_cast<std::int64_t>(r.size())}, r,
                           is_integer(in(n, 0)) && is_integer(in(n, 1)) && is_integer(in(n, 2)));
    }
    if (op == "Where") {
      const Value &c = in(n, 0), &p = in(n, 1), &q = in(n, 2);
      const auto shape = broadcast(n, broadcast(n, c.shape, p.shape), q.shape);
      check_folded(n, shape);
      const auto cv = values_of(c), pv = values_of(p), qv = values_of(q);
      std::vector<double> r(elements_of(shape));
      for (std::uint64_t i = 0; i < r.size(); ++i)
        r[i] = cv[broadcast_index(shape, c.shape, i)] != 0 ? pv[broadcast_index(shape, p.shape, i)]
                                                           : qv[broadcast_index(shape, q.shape, i)];
      return make_constant(shape, r, is_integer(p) && is_integer(q));
    }
    if (op == "ScatterND") {
      const Value &data = in(n, 0), &idx = in(n, 1), &upd = in(n, 2);
      if (!is_integer(idx) || idx.shape.empty()) fail_node(n, "its indices are not an integer tensor");
      if (a.s("reduction", "none") != "none")
        fail(Status::Unsupported, "node '" + n.name + "' (ScatterND): reduction '" + a.s("reduction", "none") + "'");
      const auto k = static_cast<std::size_t>(idx.shape.back());
      if (k == 0 || k > data.shape.size()) fail_node(n, "index tuples of " + std::to_string(k));
      std::uint64_t slab = 1;
      for (std::size_t d = k; d < data.shape.size(); ++d) slab *= static_cast<std::uint64_t>(data.shape[d]);
      const std::uint64_t tuples = idx.elements() / k;
      if (upd.elements() != tuples * slab) fail_node(n, "updates of " + std::to_string(upd.elements()) + " elements");
      auto r = values_of(data);
      const auto uv = values_of(upd);
      const auto st = row_major_strides(data.shape);
      for (std::uint64_t t = 0; t < tuples; ++t) {
        std::int64_t at = 0;
        for (std::size_t d = 0; d < k; ++d) {
          std::int64_t i = idx.ints[t * k + d];
          const auto dim = data.shape[d];
          if (i < -dim || i >= dim)
            fail_node(n, "index " + std::to_string(i) + " for a dimension of " + std::to_string(dim));
          at += (i < 0 ? i + dim : i) * st[d];
        }
        std::copy_n(uv.begin() + static_cast<std::ptrdiff_t>(t * slab), slab,
                    r.begin() + static_cast<std::ptrdiff_t>(at));
      }
      return make_constant(data.shape, r, is_integer(data) && is_integer(upd));
    }
    const Value& x = in(n, 0);
    const auto vals = values_of(x);
    const auto rank = static_cast<std::int64_t>(x.shape.size());
    if (op == "Not") {
      std::vector<double> r = vals;
      for (auto& v : r) v = v == 0 ? 1 : 0;
      return make_constant(x.shape, r, true);
    }
    if (op == "Expand") {
      const auto shape = expanded(n);
      check_folded(n, shape);
      std::vector<double> r(elements_of(shape));
      for (std::uint64_t i = 0; i < r.size(); ++i) r[i] = vals[broadcast_index(shape, x.shape, i)];
      return make_constant(shape, r, is_integer(x));
    }
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Mod" || kCompareOrLogic.count(op)) {
      const Value& y = in(n, 1);
      const auto shape = broadcast(n, x.shape, y.shape);
      check_folded(n, shape);
      const auto yv = values_of(y);
      const bool integer = is_integer(x) && is_integer(y);
      Value out;
      out.shape = shape;
      std::vector<double> r(out.elements());
      if (op == "Mod" && !integer && a.i("fmod", 0) == 0) fail_node(n, "fmod 0 on floats");
      for (std::uint64_t i = 0; i < r.size(); ++i) {
        const double p = vals[broadcast_index(shape, x.shape, i)], q = yv[broadcast_index(shape, y.shape, i)];
        if (kCompareOrLogic.count(op)) {
          r[i] = op == "Equal"            ? p == q
                 : op == "Less"           ? p < q
                 : op == "LessOrEqual"    ? p <= q
                 : op == "Greater"        ? p > q
                 : op == "GreaterOrEqual" ? p >= q
                 : op == "And"            ? (p != 0 && q != 0)
                 : op == "Or"             ? (p != 0 || q != 0)
                                          : ((p != 0) != (q != 0));
          continue;
        }
        if (op == "Mod") {
          if (integer && q == 0) fail_node(n, "integer modulo by zero");
          r[i] = std::fmod(p, q);
          if (a.i("fmod", 0) == 0 && r[i] != 0 && ((r[i] < 0) != (q < 0))) r[i] += q;  // the divisor's sign
          continue;
        }
        if (op == "Add")
          r[i] = p + q;
        else if (op == "Sub")
          r[i] = p - q;
        else if (op == "Mul")
          r[i] = p * q;
        else if (integer) {
          if (q == 0) fail_node(n, "integer division by zero");
          r[i] = static_cast<double>(static_cast<std::int64_t>(p) / static_cast<std::int64_t>(q));
        } else {
          r[i] = p / q;
        }
      }
      return make_constant(shape, r, integer || kCompareOrLogic.count(op));
    }
    if (op == "Sqrt" || op == "Exp" || op == "Log" || op == "Abs" || op == "Neg" || op == "Reciprocal" || op == "Erf") {
      std::vector<double> r = vals;
      for (auto& v : r)
        v = op == "Sqrt"  ? std::sqrt(v)
            : op == "Exp" ? std::exp(v)
            : op == "Log" ? std::log(v)
            : op == "Abs" ? std::fabs(v)
            : op == "Neg" ? -v
            : op == "Erf" ? std::erf(v)
                          : 1.0 / v;
      return make_constant(x.shape, r, false);
    }
    if (op == "Pow") {
      const Value& y = in(n, 1);
      if (x.elements() != 1 && y.elements() != 1)
        fail_node(n, "a power of two constant tensors is folded only with a scalar");
      const auto yv = values_of(y);
      const auto shape = broadcast(n, x.shape, y.shape);
      check_folded(n, shape);
      Value out;
      out.shape = shape;
      std::vector<double> r(out.elements());
      for (std::size_t i = 0; i < r.size(); ++i)
        r[i] = std::pow(vals[x.elements() == 1 ? 0 : i], yv[y.elements() == 1 ? 0 : i]);
      return make_constant(shape, r, false);
    }
    if (op == "Cast") {
      const auto to = a.i("to", 0);
      const bool boolean = to == onnx::TensorProto::BOOL;
      const bool integer = to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32 || boolean;
      if (!integer && to != onnx::TensorProto::FLOAT && to != onnx::TensorProto::DOUBLE)
        fail(Status::Unsupported, "node '" + n.name + "' (Cast): to ONNX type " + std::to_string(to) +
                                      "; the compiler casts constants to float, double, int64, int32 and bool");
      std::vector<double> r = vals;
      for (auto& v : r) v = boolean ? (v != 0) : integer ? std::trunc(v) : v;
      return make_constant(x.shape, r, integer);
    }
    if (op == "Unsqueeze" || op == "Squeeze") return make_constant(squeezed(n), vals, is_integer(x));
    if (op == "Transpose") {
      const auto perm = permutation(n);
      std::vector<std::int64_t> shape;
      for (auto p : perm) shape.push_back(x.shape[static_cast<std::size_t>(p)]);
      const auto in_st = row_major_strides(x.shape), out_st = row_major_strides(shape);
      std::vector<double> r(vals.size());
      for (std::uint64_t i = 0; i < r.size(); ++i) {
        std::int64_t at = 0;
        for (std::size_t d = 0; d < shape.size(); ++d)
          at += static_cast<std::int64_t>(i) / out_st[d] % shape[d] * in_st[static_cast<std::size_t>(perm[d])];
        r[i] = vals[static_cast<std::size_t>(at)];
      }
      return make_constant(shape, r, is_integer(x));
    }
    if (op == "Gather") {
      const Value& idx = in(n, 1);
      if (!is_integer(idx)) fail_node(n, "its indices are not integers");
      if (rank == 0) fail_node(n, "gathers from a scalar");
      const auto axis = axis_of(n, a.i("axis", 0), rank);
      const auto dim = x.shape[static_cast<std::size_t>(axis)];
      std::vector<std::int64_t> shape(x.shape.begin(), x.shape.begin() + axis);
      shape.insert(shape.end(), idx.shape.begin(), idx.shape.end());
      shape.insert(shape.end(), x.shape.begin() + axis + 1, x.shape.end());
      check_folded(n, shape);
      std::int64_t outer = 1, inner = 1;
      for (std::int64_t d = 0; d < axis; ++d) outer *= x.shape[static_cast<std::size_t>(d)];
      for (std::int64_t d = axis + 1; d < rank; ++d) inner *= x.shape[static_cast<std::size_t>(d)];
      std::vector<double> r;
      for (std::int64_t o = 0; o < outer; ++o)
        for (auto i : idx.ints) {
          if (i < -dim || i >= dim)
            fail_node(n, "index " + std::to_string(i) + " outside [" + std::to_string(-dim) + ", " +
                             std::to_string(dim) + ")");
          if (i < 0) i += dim;
          for (std::int64_t k = 0; k < inner; ++k)
            r.push_back(vals[static_cast<std::size_t>((o * dim + i) * inner + k)]);
        }
      return make_constant(shape, r, is_integer(x));
    }
    if (op == "Concat") {
      if (!a.find("axis")) fail_node(n, "no axis");
      const auto axis = axis_of(n, a.i("axis", 0), rank);
      std::vector<std::int64_t> shape = x.shape;
      shape[static_cast<std::size_t>(axis)] = 0;
      bool integer = true;
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        const Value& v = in(n, i);
        if (v.shape.size() != x.shape.size())
          fail_node(n, "inputs of ranks " + std::to_string(rank) + " and " + std::to_string(v.shape.size()));
        for (std::int64_t d = 0; d < rank; ++d)
          if (d != axis && v.shape[static_cast<std::size_t>(d)] != x.shape[static_cast<std::size_t>(d)])
            fail_node(n, "inputs " + dims_text(x.shape) + " and " + dims_text(v.shape) + " differ off the axis");
        shape[static_cast<std::size_t>(axis)] += v.shape[static_cast<std::size_t>(axis)];
        integer = integer && is_integer(v);
      }
      check_folded(n, shape);
      std::int64_t outer = 1;
      for (std::int64_t d = 0; d < axis; ++d) outer *= x.shape[static_cast<std::size_t>(d)];
      std::vector<double> r;
      for (std::int64_t o = 0; o < outer; ++o)
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
          const Value& v = in(n, i);
          const auto vv = values_of(v);
          const std::uint64_t chunk = outer ? v.elements() / static_cast<std::uint64_t>(outer) : 0;
          r.insert(r.end(), vv.begin() + static_cast<std::ptrdiff_t>(o * chunk),
                   vv.begin() + static_cast<std::ptrdiff_t>((o + 1) * chunk));
        }
      return make_constant(shape, r, integer);
    }
    if (op == "Slice") return sliced(x, slice_of(n));
    fail_node(n, "no folding rule");
  }

  // A constant sliced.
  static Value sliced(const Value& x, const SliceParams& sl) {
    const auto vals = values_of(x);
    Value out;
    out.shape = sl.shape;
    const auto in_st = row_major_strides(x.shape), out_st = row_major_strides(sl.shape);
    std::vector<double> r(out.elements());
    for (std::uint64_t i = 0; i < r.size(); ++i) {
      std::int64_t at = 0;
      for (std::size_t d = 0; d < sl.shape.size(); ++d) {
        const std::int64_t coord = static_cast<std::int64_t>(i) / out_st[d] % sl.shape[d];
        at += (sl.lo[d] + coord * sl.step[d]) * in_st[d];
      }
      r[i] = vals[static_cast<std::size_t>(at)];
    }
    return make_constant(sl.shape, r, is_integer(x));
  }

  // The output shape of `n`, or a folded constant.
  Value infer(Node& n) {
    const std::string& op = n.op;
    const Attrs a{n.proto};
    if (op == "Shape" || kFoldOnly.count(op)) return fold(n);
    if ((op == "Add" || op == "Sub" || op == "Mul" || op == "Div") && in(n, 0).data && in(n, 1).data) return fold(n);
    if (kFoldable.count(op)) {
      bool constants = true;
      for (std::size_t i = 0; i < n.inputs.size(); ++i) constants = constants && (!has(n, i) || in(n, i).data);
      if (constants) return fold(n);
    }
    Value out;
    if (kUnary.count(op) || op == "BatchNormalization") {
      out.shape = in(n, 0).shape;
      if (op == "Clip" && g.opset >= 11) {
        if (has(n, 1)) constant(n, 1, "bounds");
        if (has(n, 2)) constant(n, 2, "bounds");
      }
      if (op == "BatchNormalization") {
        for (std::size_t i = 1; i < 5; ++i) constant(n, i, "scale, bias, mean and variance");
        if (out.shape.size() < 2) fail_node(n, "input of rank " + std::to_string(out.shape.size()));
      }
      return out;
    }
    if (op == "Add" || op == "Mul" || op == "Sub" || op == "Div" || kCompareOrLogic.count(op)) {
      out.shape = broadcast(n, in(n, 0).shape, in(n, 1).shape);
      return out;
    }
    if (op == "Not") {
      out.shape = in(n, 0).shape;
      return out;
    }
    if (op == "Min" || op == "Max") {
      if (n.inputs.empty()) fail_node(n, "no inputs");
      out.shape = in(n, 0).shape;
      for (std::size_t i = 1; i < n.inputs.size(); ++i) out.shape = broadcast(n, out.shape, in(n, i).shape);
      return out;
    }
    if (op == "Pow") {
      const Value& y = constant(n, 1, "exponent");
      if (y.elements() != 1)
        fail(Status::Unsupported, "node '" + n.name + "' (Pow): an exponent of shape " + dims_text(y.shape) +
                                      "; the compiler takes one constant exponent");
      out.shape = broadcast(n, in(n, 0).shape, y.shape);
      n.params["exponent"] = values_of(y);
      return out;
    }
    if (kReduce.count(op)) {
      const auto& x = in(n, 0).shape;
      const auto rank = static_cast<std::int64_t>(x.size());
      // Axes: an attribute, or (ReduceSum from opset 13, the others from 18) an input.
      const bool axes_input = op == "ReduceSum" ? g.opset >= 13 : g.opset >= 18;
      std::vector<std::int64_t> axes =
          axes_input ? (has(n, 1) ? int_list(n, 1, "axes", a) : std::vector<std::int64_t>{}) : a.ints("axes");
      if (axes.empty() && a.i("noop_with_empty_axes", 0) != 0)
        fail(Status::Unsupported, "node '" + n.name + "' (" + op + "): noop_with_empty_axes");
      if (axes.empty())
        for (std::int64_t d = 0; d < rank; ++d) axes.push_back(d);
      std::vector<bool> reduced(x.size());
      for (auto ax : axes) {
        const auto d = static_cast<std::size_t>(axis_of(n, ax, rank));
        if (reduced[d]) fail_node(n, "axis " + std::to_string(ax) + " is repeated");
        reduced[d] = true;
      }
      const bool keep = a.i("keepdims", 1) != 0;
      auto& kept_axes = n.params["axes"];
      for (std::size_t d = 0; d < x.size(); ++d)
        if (reduced[d]) kept_axes.push_back(static_cast<double>(d));
      for (std::size_t d = 0; d < x.size(); ++d)
        if (!reduced[d])
          out.shape.push_back(x[d]);
        else if (keep)
          out.shape.push_back(1);
      return out;
    }
    if (op == "Pad") {
      const auto& x = in(n, 0).shape;
      const auto rank = static_cast<std::int64_t>(x.size());
      const auto pads = g.opset >= 11 ? int_list(n, 1, "pads", a) : a.ints("pads");
      if (g.opset >= 18 && has(n, 3)) fail(Status::Unsupported, "node '" + n.name + "' (Pad): the axes input");
      if (static_cast<std::int64_t>(pads.size()) != 2 * rank)
        fail_node(n, std::to_string(pads.size()) + " pads for rank " + std::to_string(rank));
      const std::string mode = a.s("mode", "constant");
      if (mode != "constant" && mode != "reflect" && mode != "edge")
        fail(Status::Unsupported, "node '" + n.name + "' (Pad): mode '" + mode + "'");
      double value = a.f("value", 0.0f);
      if (g.opset >= 11 && has(n, 2)) {
        const Value& c = constant(n, 2, "constant_value");
        if (c.elements() != 1) fail_node(n, "constant_value is not a scalar");
        value = values_of(c)[0];
      }
      n.params["value"] = {value};
      for (auto p : pads) n.params["pads"].push_back(static_cast<double>(p));
      for (std::int64_t d = 0; d < rank; ++d) {
        const auto lo = pads[static_cast<std::size_t>(d)], hi = pads[static_cast<std::size_t>(d + rank)];
        if (lo < 0 || hi < 0) fail(Status::Unsupported, "node '" + n.name + "' (Pad): negative pads (cropping)");
        const auto dim = x[static_cast<std::size_t>(d)];
        if (mode == "reflect" && (lo >= dim || hi >= dim))
          fail_node(n, "reflect pads " + std::to_string(lo) + ", " + std::to_string(hi) + " on a dimension of " +
                           std::to_string(dim));
        if (mode == "edge" && dim == 0 && lo + hi > 0) fail_node(n, "edge pads on an empty dimension");
        out.shape.push_back(dim + lo + hi);
      }
      return out;
    }
    if (op == "Resize" || op == "Upsample") {
      const auto& x = in(n, 0).shape;
      if (x.size() != 4)
        fail(Status::Unsupported, "node '" + n.name + "' (" + op + "): input of rank " + std::to_string(x.size()) +
                                      "; the compiler resizes 4-D (NCHW) tensors");
      if (const std::string why = onnx_attrs::resize_unsupported(a, g.opset); !why.empty())
        fail(Status::Unsupported, "node '" + n.name + "' (" + op + "): " + why);
      // Scales: Upsample's and opset 10's second input, else the third; or sizes, the fourth.
      const std::size_t scales_at = (op == "Upsample" || g.opset < 11) ? 1 : 2;
      std::vector<double> scales;
      if (has(n, scales_at) && constant(n, scales_at, "scales").elements() > 0)
        scales = values_of(constant(n, scales_at, "scales"));
      if (!scales.empty()) {
        if (scales.size() != 4) fail_node(n, std::to_string(scales.size()) + " scales for rank 4");
        if (scales[0] != 1 || scales[1] != 1)
          fail(Status::Unsupported, "node '" + n.name + "' (" + op + "): scales on N or C");
        for (std::size_t d = 0; d < 4; ++d) {
          if (!(scales[d] > 0)) fail_node(n, "scale " + std::to_string(scales[d]));
          out.shape.push_back(static_cast<std::int64_t>(std::floor(static_cast<double>(x[d]) * scales[d])));
        }
      } else if (scales_at == 2 && has(n, 3)) {
        const Value& sz = constant(n, 3, "sizes");
        if (!is_integer(sz) || sz.ints.size() != 4) fail_node(n, "sizes are not 4 integers");
        if (sz.ints[0] != x[0] || sz.ints[1] != x[1])
          fail(Status::Unsupported, "node '" + n.name + "' (" + op + "): sizes that change N or C");
        out.shape = sz.ints;
      } else {
        fail_node(n, "neither scales nor sizes");
      }
      for (auto d : out.shape)
        if (d <= 0) fail_node(n, "an output of shape " + dims_text(out.shape));
      if (!scales.empty())
        n.params["scales"] = {scales[2], scales[3]};
      else
        n.params["scales"] = {static_cast<double>(out.shape[2]) / static_cast<double>(x[2]),
                              static_cast<double>(out.shape[3]) / static_cast<double>(x[3])};
      return out;
    }
    if (op == "Concat") {
      const auto& x = in(n, 0).shape;
      const auto rank = static_cast<std::int64_t>(x.size());
      if (!a.find("axis")) fail_node(n, "no axis");
      const auto axis = static_cast<std::size_t>(axis_of(n, a.i("axis", 0), rank));
      out.shape = x;
      out.shape[axis] = 0;
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        const auto& v = in(n, i).shape;
        if (v.size() != x.size())
          fail_node(n, "inputs of ranks " + std::to_string(rank) + " and " + std::to_string(v.size()));
        for (std::size_t d = 0; d < x.size(); ++d)
          if (d != axis && v[d] != x[d])
            fail_node(n, "inputs " + dims_text(x) + " and " + dims_text(v) + " differ off the axis");
        out.shape[axis] += v[axis];
      }
      return out;
    }
    if (op == "Slice") {
      const auto r = slice_of(n);
      out.shape = r.shape;
      for (std::size_t d = 0; d < r.lo.size(); ++d) {
        n.params["lo"].push_back(static_cast<double>(r.lo[d]));
        n.params["step"].push_back(static_cast<double>(r.step[d]));
      }
      return out;
    }
    if (op == "Expand") {  // device data
      out.shape = expanded(n);
      return out;
    }
    if (op == "Gather") {  // device data, constant indices
      const auto& x = in(n, 0).shape;
      const Value& idx = constant(n, 1, "indices");
      if (!is_integer(idx)) fail_node(n, "its indices are not integers");
      const auto rank = static_cast<std::int64_t>(x.size());
      if (rank == 0) fail_node(n, "gathers from a scalar");
      const auto axis = axis_of(n, a.i("axis", 0), rank);
      const auto dim = x[static_cast<std::size_t>(axis)];
      out.shape.assign(x.begin(), x.begin() + axis);
      out.shape.insert(out.shape.end(), idx.shape.begin(), idx.shape.end());
      out.shape.insert(out.shape.end(), x.begin() + axis + 1, x.end());
      if (out.shape.size() > kMaxRank) fail(Status::Unsupported, "node '" + n.name + "' (Gather): rank above 6");
      n.params["axis"] = {static_cast<double>(axis)};
      auto& kept = n.params["indices"];
      for (auto i : idx.ints) {
        if (i < -dim || i >= dim)
          fail_node(
              n, "index " + std::to_string(i) + " outside [" + std::to_string(-dim) + ", " + std::to_string(dim) + ")");
        kept.push_back(static_cast<double>(i < 0 ? i + dim : i));
      }
      return out;
    }
    if (op == "Conv") {
      const auto& x = in(n, 0).shape;
      const auto& w = constant(n, 1, "weights").shape;
      if (x.size() != 4 || w.size() != 4)
        fail(Status::Unsupported, "node '" + n.name + "' (Conv): " + std::to_string(x.size() - 2) +
                                      "-D convolution; the compiler takes 2-D (NCHW) convolutions");
      if (!a.unknown({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}).empty())
        fail(Status::Unsupported, "node '" + n.name + "' (Conv): attribute " +
                                      a.unknown({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}));
      if (has(n, 2)) constant(n, 2, "bias");
      check_window(n, a, 2);
      if (w[2] < 1 || w[3] < 1 || w[2] > 0x7fffffff || w[3] > 0x7fffffff)
        fail_node(n, "weights of shape " + dims_text(w) + " make no kernel");
      if (a.find("kernel_shape") && a.ints("kernel_shape") != std::vector<std::int64_t>{w[2], w[3]})
        fail_node(n,
                  "kernel_shape " + dims_text(a.ints("kernel_shape")) + " is not that of its weights " + dims_text(w));
      const auto o = onnx_attrs::conv_options(a, x, w);
      if (o.groups == 0 || x[1] != w[1] * o.groups || w[0] % o.groups != 0)
        fail_node(n, "input " + dims_text(x) + " and weights " + dims_text(w) + " do not match with group " +
                         std::to_string(o.groups));
      out.shape = {
          x[0], w[0],
          pool_out(x[2], static_cast<std::uint32_t>(w[2]), o.strides[0], o.dilations[0], o.pads[0], o.pads[2], false),
          pool_out(x[3], static_cast<std::uint32_t>(w[3]), o.strides[1], o.dilations[1], o.pads[1], o.pads[3], false)};
      check_window_fits(n, x, out.shape, std::to_string(w[2]) + "x" + std::to_string(w[3]) + " kernel");
      return out;
    }
    if (op == "ConvTranspose") {
      const auto& x = in(n, 0).shape;
      const auto& w = constant(n, 1, "weights").shape;
      const bool one_d = x.size() == 3 && w.size() == 3;  // [N, C, L]: lowered as H = 1
      if (!one_d && (x.size() != 4 || w.size() != 4))
        fail(Status::Unsupported, "node '" + n.name + "' (ConvTranspose): " + std::to_string(x.size() - 2) +
                                      "-D transposed convolution; the compiler takes 1-D and 2-D (NCHW) ones");
      const auto unknown = a.unknown(
          {"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"});
      if (!unknown.empty()) fail(Status::Unsupported, "node '" + n.name + "' (ConvTranspose): attribute " + unknown);
      if (has(n, 2)) constant(n, 2, "bias");
      check_window(n, a, one_d ? 1 : 2);
      const auto geo = onnx_attrs::conv_transpose_options(a, x, w);
      const auto groups = static_cast<std::int64_t>(geo.options.groups);
      if (groups == 0 || x[1] != w[0] || x[1] % groups != 0)
        fail_node(n, "input " + dims_text(x) + " and weights " + dims_text(w) + " do not match with group " +
                         std::to_string(groups));
      for (auto p : geo.options.pads)
        if (p > 65536) fail_node(n, "pad " + std::to_string(p) + " is above 65536");
      if (geo.out[0] < 1 || geo.out[1] < 1) fail_node(n, "its pads leave an empty output");
      out.shape = one_d ? std::vector<std::int64_t>{x[0], w[1] * groups, geo.out[1]}
                        : std::vector<std::int64_t>{x[0], w[1] * groups, geo.out[0], geo.out[1]};
      return out;
    }
    if (op == "ArgMax" || op == "ArgMin" || op == "TopK") {
      const auto& x = in(n, 0).shape;
      const auto rank = static_cast<std::int64_t>(x.size());
      if (rank == 0) fail_node(n, "a scalar input");
      const std::int64_t axis = axis_of(n, a.i("axis", op == "TopK" ? -1 : 0), rank);
      out.shape = x;
      std::int64_t k = 1;
      if (op == "TopK") {
        if (g.opset < 10) fail(Status::Unsupported, "node '" + n.name + "' (TopK): opset below 10 (k as an attribute)");
        const Value& kv = constant(n, 1, "k");
        if (kv.ints.size() != 1) fail_node(n, "k is not one integer");
        k = kv.ints[0];
        if (k < 1 || k > x[static_cast<std::size_t>(axis)])
          fail_node(n,
                    "k " + std::to_string(k) + " for a length of " + std::to_string(x[static_cast<std::size_t>(axis)]));
        if (a.i("sorted", 1) == 0)
          g.notes.push_back("TopK '" + n.name + "' runs sorted (sorted=0 leaves the order open)");
      }
      if (op == "TopK" || a.i("keepdims", 1) != 0)
        out.shape[static_cast<std::size_t>(axis)] = k;
      else
        out.shape.erase(out.shape.begin() + axis);
      if (x[static_cast<std::size_t>(axis)] > 0x7FFF'FFFF) fail_node(n, "an axis too long for i32 indices");
      n.params["axis"] = {static_cast<double>(axis)};
      n.params["largest"] = {op == "ArgMin" ? 0.0 : static_cast<double>(a.i("largest", 1) != 0)};
      n.params["last_index"] = {static_cast<double>(a.i("select_last_index", 0) != 0)};
      n.inputs.resize(1);
      return out;
    }
    if (op == "Where") {  // device data: a condition, constant or computed, selecting between values
      const Value& c = in(n, 0);
      out.shape = broadcast(n, broadcast(n, c.shape, in(n, 1).shape), in(n, 2).shape);
      return out;
    }
    if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool") {
      const auto& x = in(n, 0).shape;
      if (x.size() != 4)
        fail(Status::Unsupported, "node '" + n.name + "' (" + op + "): input of rank " + std::to_string(x.size()) +
                                      "; the compiler pools 4-D (NCHW) tensors");
      if (a.i("storage_order", 0) != 0) fail(Status::Unsupported, "node '" + n.name + "' (MaxPool): storage_order 1");
      if (op != "GlobalAveragePool") {
        if (!a.find("kernel_shape")) fail_node(n, "no kernel_shape");
        check_window(n, a, 2);
      }
      const auto o = onnx_attrs::pool_options(a, x);
      for (int k = 0; k < 2; ++k) {  // what the pooling ops take
        const std::uint64_t window = std::uint64_t{o.dilations[k]} * (o.kernel[k] - 1) + 1;
        if (o.pads[k] >= window || o.pads[k + 2] >= window)
          fail_node(n, "pads (" + std::to_string(o.pads[k]) + ", " + std::to_string(o.pads[k + 2]) +
                           ") must be smaller than the window (" + std::to_string(window) + ")");
      }
      out.shape = {x[0], x[1],
                   pool_out(x[2], o.kernel[0], o.strides[0], o.dilations[0], o.pads[0], o.pads[2], o.ceil_mode),
                   pool_out(x[3], o.kernel[1], o.strides[1], o.dilations[1], o.pads[1], o.pads[3], o.ceil_mode)};
      check_window_fits(n, x, out.shape, std::to_string(o.kernel[0]) + "x" + std::to_string(o.kernel[1]) + " window");
      return out;
    }
    if (op == "Gemm") {
      const auto& x = in(n, 0).shape;
      const auto& b = constant(n, 1, "weights (B)").shape;
      if (x.size() != 2 || b.size() != 2) fail_node(n, "A " + dims_text(x) + " and B " + dims_text(b) + " must be 2-D");
      const bool ta = a.i("transA", 0) != 0, tb = a.i("transB", 0) != 0;
      const std::int64_t m = ta ? x[1] : x[0], k = ta ? x[0] : x[1];
      const std::int64_t kb = tb ? b[1] : b[0], nn = tb ? b[0] : b[1];
      if (k != kb) fail_node(n, "A " + dims_text(x) + " and B " + dims_text(b) + " do not multiply");
      if (has(n, 2)) broadcast(n, {m, nn}, constant(n, 2, "bias (C)").shape);
      out.shape = {m, nn};
      return out;
    }
    if (op == "MatMul") {
      const auto& x = in(n, 0).shape;
      const auto& b = in(n, 1).shape;
      if (x.size() < 2 || b.size() < 2) fail(Status::Unsupported, "node '" + n.name + "' (MatMul): 1-D operands");
      if (x.back() != b[b.size() - 2])
        fail_node(n, "A " + dims_text(x) + " and B " + dims_text(b) + " do not multiply");
      auto batch = broadcast(n, std::vector<std::int64_t>(x.begin(), x.end() - 2),
                             std::vector<std::int64_t>(b.begin(), b.end() - 2));
      batch.push_back(x[x.size() - 2]);
      batch.push_back(b.back());
      out.shape = batch;
      return out;
    }
    if (op == "Reshape" || op == "Flatten") {
      const Value& x = in(n, 0);
      const std::uint64_t total = x.elements();
      if (op == "Flatten") {
        std::int64_t axis = a.i("axis", 1);
        const auto r = static_cast<std::int64_t>(x.shape.size());
        if (axis < 0) axis += r;
        if (axis < 0 || axis > r)
          fail_node(n, "axis " + std::to_string(a.i("axis", 1)) + " for rank " + std::to_string(r));
        std::int64_t outer = 1;
        for (std::int64_t i = 0; i < axis; ++i) outer *= x.shape[static_cast<std::size_t>(i)];
        out.shape = {outer, outer ? static_cast<std::int64_t>(total) / outer : 0};
      } else {
        const Value& s = constant(n, 1, "shape");
        if (s.ints.empty() && s.elements() != 0) fail_node(n, "the shape input is not an integer tensor");
        const bool allowzero = a.i("allowzero", 0) != 0;
        std::int64_t known = 1, infer_at = -1;
        for (std::size_t i = 0; i < s.ints.size(); ++i) {
          std::int64_t d = s.ints[i];
          if (d == 0 && !allowzero) {
            if (i >= x.shape.size())
              fail_node(n, "shape entry " + std::to_string(i) + " copies a dimension the input lacks");
            d = x.shape[i];
          }
          if (d == -1) {
            if (infer_at >= 0) fail_node(n, "two -1 entries in the shape");
            infer_at = static_cast<std::int64_t>(i);
            out.shape.push_back(1);
            continue;
          }
          if (d < 0) fail_node(n, "shape entry " + std::to_string(d));
          out.shape.push_back(d);
          known *= d;
        }
        if (infer_at >= 0) {
          if (known == 0 || total % static_cast<std::uint64_t>(known) != 0)
            fail_node(n, "cannot reshape " + dims_text(x.shape) + " to " + dims_text(s.ints));
          out.shape[static_cast<std::size_t>(infer_at)] = static_cast<std::int64_t>(total) / known;
        }
      }
      if (out.elements() != total) fail_node(n, "cannot reshape " + dims_text(x.shape) + " to " + dims_text(out.shape));
      if (out.shape.size() > kMaxRank) fail(Status::Unsupported, "node '" + n.name + "': rank above 6");
      if (x.data) {  // a reshaped constant stays one
        out.data = x.data;
        out.ints = x.ints;
      }
      return out;
    }
    if (op == "Transpose") {
      const auto& x = in(n, 0).shape;
      for (auto p : permutation(n)) out.shape.push_back(x[static_cast<std::size_t>(p)]);
      return out;
    }
    if (op == "Unsqueeze" || op == "Squeeze" || op == "Cast") {  // device data: a view of another shape
      if (op == "Cast") {
        const auto to = a.i("to", 0);
        if (to != onnx::TensorProto::FLOAT && to != onnx::TensorProto::DOUBLE)
          fail(Status::Unsupported, "node '" + n.name + "' (Cast): to ONNX type " + std::to_string(to) +
                                        " on data computed on the device; the compiler keeps device data float");
      }
      out.shape = op == "Cast" ? in(n, 0).shape : squeezed(n);
      n.inputs.resize(1);
      n.op = "Reshape";
      return out;
    }
    fail_node(n, "no shape rule");  // not reached: kSupported lists what is handled
  }

  // Infers a node's output and keeps it, or its folded constant. Its shape
  // must be one a compiled model holds (device_graph.cpp, as the loader
  // checks it): dimensions below 2^32, fewer than 2^40 elements.
  void emit(Node n) {
    if (g.values.count(n.output)) fail_node(n, "output '" + n.output + "' is defined twice");
    Value v = infer(n);
    std::uint64_t elements = 1;
    bool over = false;
    for (auto d : v.shape)
      over = over || d < 0 || d >= (std::int64_t{1} << 32) ||
             __builtin_mul_overflow(elements, static_cast<std::uint64_t>(d), &elements);
    if (over || elements >= (std::uint64_t{1} << 40))
      fail_node(n, "its output of shape " + dims_text(v.shape) +
                       " is beyond what a compiled model holds (dimensions below 2^32, fewer than 2^40 elements)");
    g.values[n.output] = std::move(v);
    if (!n.output2.empty()) {  // TopK's indices: the values' shape
      if (g.values.count(n.output2)) fail_node(n, "output '" + n.output2 + "' is defined twice");
      g.values[n.output2] = Value{g.values[n.output].shape, std::nullopt, {}};
    }
    if (g.values[n.output].data) {
      g.notes.push_back("folded " + n.op + " '" + n.name + "' of a constant");
      return;
    }
    g.nodes.push_back(std::move(n));
  }

  // A node of the importer's own, standing for part of `from`.
  Node derived(const Node& from, const std::string& suffix, const std::string& op, std::vector<std::string> inputs,
               std::string output) const {
    Node n;
    n.name = from.name + "/" + suffix;
    n.op = op;
    n.proto.set_op_type(op);
    n.proto.set_name(n.name);
    n.inputs = std::move(inputs);
    n.output = std::move(output);
    return n;
  }
  std::string add_constant(const std::string& name, std::vector<std::int64_t> shape, const std::vector<double>& v,
                           bool integer) {
    g.values[name] = make_constant(std::move(shape), v, integer);
    return name;
  }

  // Split: a Slice per used output.
  void split(const Node& n, const onnx::NodeProto& p) {
    const Attrs a{p};
    const Value& x = in(n, 0);
    const auto rank = static_cast<std::int64_t>(x.shape.size());
    const auto axis = static_cast<std::size_t>(axis_of(n, a.i("axis", 0), rank));
    const auto dim = x.shape[axis];
    std::vector<std::int64_t> sizes =
        g.opset >= 13 ? (has(n, 1) ? int_list(n, 1, "split", a) : std::vector<std::int64_t>{}) : a.ints("split");
    const auto parts = static_cast<std::int64_t>(p.output_size());
    if (sizes.empty()) {
      // Equal parts (opset 18: num_outputs of them, the last smaller).
      const std::int64_t count = a.find("num_outputs") ? a.i("num_outputs", parts) : parts;
      if (count != parts) fail_node(n, std::to_string(parts) + " outputs for num_outputs " + std::to_string(count));
      const std::int64_t each = (dim + count - 1) / std::max<std::int64_t>(count, 1);
      if (!a.find("num_outputs") && dim % count != 0)
        fail_node(n, "a dimension of " + std::to_string(dim) + " does not split into " + std::to_string(count) +
                         " equal parts");
      for (std::int64_t k = 0, left = dim; k < count; ++k, left -= each) sizes.push_back(std::min(each, left));
    }
    if (static_cast<std::int64_t>(sizes.size()) != parts)
      fail_node(n, std::to_string(sizes.size()) + " sizes for " + std::to_string(parts) + " outputs");
    std::int64_t at = 0;
    for (auto sz : sizes) {
      if (sz < 0) fail_node(n, "a part of size " + std::to_string(sz));
      at += sz;
    }
    if (at != dim) fail_node(n, "parts of " + std::to_string(at) + " for a dimension of " + std::to_string(dim));
    at = 0;
    for (int k = 0; k < p.output_size(); ++k) {
      SliceParams sl{std::vector<std::int64_t>(x.shape.size(), 0), std::vector<std::int64_t>(x.shape.size(), 1),
                     x.shape};
      sl.lo[axis] = at;
      sl.shape[axis] = sizes[static_cast<std::size_t>(k)];
      at += sizes[static_cast<std::size_t>(k)];
      const std::string& out = p.output(k);
      if (out.empty()) continue;
      if (g.values.count(out)) fail_node(n, "output '" + out + "' is defined twice");
      if (x.data) {
        g.values[out] = sliced(x, sl);
        g.notes.push_back("folded Split '" + n.name + "' of a constant");
        continue;
      }
      Node s = derived(n, std::to_string(k), "Slice", {n.inputs[0]}, out);
      for (std::size_t d = 0; d < sl.lo.size(); ++d) {
        s.params["lo"].push_back(static_cast<double>(sl.lo[d]));
        s.params["step"].push_back(1.0);
      }
      g.values[out].shape = sl.shape;
      g.nodes.push_back(std::move(s));
    }
  }

  // LayerNormalization (opset 17) and InstanceNormalization, as the ops
  // PyTorch writes for LayerNorm at opset 13: the mean and the variance
  // over the normalised axes (ReduceMean), then (x - mean) / sqrt(var + eps)
  // * scale + bias.
  void normalization(const Node& n) {
    const Attrs a{n.proto};
    const Value& x = in(n, 0);
    const auto rank = static_cast<std::int64_t>(x.shape.size());
    const bool layer = n.op == "LayerNormalization";
    std::int64_t first = 2;
    if (layer) {
      first = axis_of(n, a.i("axis", -1), rank);
    } else if (rank < 3) {
      fail_node(n, "input of rank " + std::to_string(rank));
    }
    std::vector<double> axes;
    for (std::int64_t d = first; d < rank; ++d) axes.push_back(static_cast<double>(d));
    const float eps = a.f("epsilon", 1e-5f);
    // Scale and bias: over the normalised dims (LayerNormalization), or one
    // per channel, shaped [C, 1, ...] to broadcast (InstanceNormalization).
    auto param = [&](std::size_t i, const char* what) -> std::string {
      const Value& v = constant(n, i, what);
      if (layer) {
        broadcast(n, x.shape, v.shape);
        return n.inputs[i];
      }
      if (v.elements() != static_cast<std::uint64_t>(x.shape[1]))
        fail_node(n, std::string("its ") + what + " has " + std::to_string(v.elements()) + " values for " +
                         std::to_string(x.shape[1]) + " channels");
      std::vector<std::int64_t> shape(static_cast<std::size_t>(rank - 1), 1);
      shape[0] = x.shape[1];
      return add_constant(n.name + "/" + what, shape, values_of(v), false);
    };
    const std::string scale = param(1, "scale");
    const std::string bias = has(n, 2) ? param(2, "bias") : std::string();
    auto reduce_mean = [&](const std::string& suffix, const std::string& from, const std::string& to) {
      Node r = derived(n, suffix, "ReduceMean", {from}, to);
      if (g.opset >= 18) {
        std::vector<double> ax = axes;
        r.inputs.push_back(add_constant(n.name + "/axes", {static_cast<std::int64_t>(ax.size())}, ax, true));
      } else {
        auto* at = r.proto.add_attribute();
        at->set_name("axes");
        at->set_type(onnx::AttributeProto::INTS);
        for (double d : axes) at->add_ints(static_cast<std::int64_t>(d));
      }
      emit(std::move(r));
    };
    const std::string p = n.name + "/";
    reduce_mean("mean", n.inputs[0], p + "mean");
    emit(derived(n, "centre", "Sub", {n.inputs[0], p + "mean"}, p + "centred"));
    emit(derived(n, "square", "Mul", {p + "centred", p + "centred"}, p + "squares"));
    reduce_mean("variance", p + "squares", p + "variance");
    const std::string e = add_constant(p + "epsilon", {}, {static_cast<double>(eps)}, false);
    emit(derived(n, "add_epsilon", "Add", {p + "variance", e}, p + "variance+eps"));
    emit(derived(n, "deviation", "Sqrt", {p + "variance+eps"}, p + "deviation"));
    emit(derived(n, "normalise", "Div", {p + "centred", p + "deviation"}, p + "normalised"));
    emit(derived(n, "scale", "Mul", {p + "normalised", scale}, bias.empty() ? n.output : p + "scaled"));
    if (!bias.empty()) emit(derived(n, "bias", "Add", {p + "scaled", bias}, n.output));
    g.notes.push_back(n.op + " '" + n.name + "' runs as ReduceMean, Sub, Mul, Sqrt, Div, Mul" +
                      (bias.empty() ? "" : ", Add"));
  }

  // Einsum of two operands that is a batched matrix product (every label
  // in both operands and the output is a batch dimension; those in both
  // operands only are summed; the others are kept), or of one operand that
  // only permutes it: as Transpose, Reshape, MatMul, Reshape, Transpose.
  void einsum(const Node& n) {
    std::string eq;
    for (char c : Attrs{n.proto}.s("equation", ""))
      if (c != ' ') eq += c;
    const auto arrow = eq.find("->");
    auto unsupported = [&](const std::string& why) {
      fail(Status::Unsupported, "node '" + n.name + "' (Einsum): equation '" + eq + "': " + why);
    };
    if (arrow == std::string::npos) unsupported("no output subscripts (->)");
    if (eq.find("...") != std::string::npos) unsupported("an ellipsis");
    const std::string out = eq.substr(arrow + 2);
    std::vector<std::string> ops;
    for (std::size_t at = 0; at <= arrow;) {
      const auto comma = std::min(eq.find(',', at), arrow);
      ops.push_back(eq.substr(at, comma - at));
      at = comma + 1;
    }
    if (ops.size() != n.inputs.size()) fail_node(n, "the equation has " + std::to_string(ops.size()) + " operands");
    std::map<char, std::int64_t> dims;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const auto& sh = in(n, i).shape;
      if (ops[i].size() != sh.size())
        fail_node(n,
                  "operand " + std::to_string(i) + " of rank " + std::to_string(sh.size()) + " for '" + ops[i] + "'");
      for (std::size_t d = 0; d < sh.size(); ++d) {
        const char c = ops[i][d];
        if (std::count(ops[i].begin(), ops[i].end(), c) != 1) unsupported("a repeated subscript (a diagonal)");
        if (dims.count(c) && dims[c] != sh[d] && dims[c] != 1 && sh[d] != 1)
          fail_node(n, std::string("subscript ") + c + " has sizes " + std::to_string(dims[c]) + " and " +
                           std::to_string(sh[d]));
        dims[c] = std::max(dims[c], sh[d]);
      }
    }
    for (char c : out)
      if (!dims.count(c)) fail_node(n, std::string("output subscript ") + c + " is in no operand");
    const auto has_label = [](const std::string& s, char c) { return s.find(c) != std::string::npos; };
    const std::string p = n.name + "/";
    auto transpose = [&](const std::string& from, const std::string& labels, const std::string& order,
                         const std::string& to, const std::string& suffix) {
      if (labels == order) return from;
      Node t = derived(n, suffix, "Transpose", {from}, to);
      auto* perm = t.proto.add_attribute();
      perm->set_name("perm");
      perm->set_type(onnx::AttributeProto::INTS);
      for (char c : order) perm->add_ints(static_cast<std::int64_t>(labels.find(c)));
      emit(std::move(t));
      return to;
    };
    if (ops.size() == 1) {
      if (ops[0].size() != out.size() || !std::is_permutation(out.begin(), out.end(), ops[0].begin()))
        unsupported("one operand that is summed, not only permuted");
      const std::string r = transpose(n.inputs[0], ops[0], out, n.output, "transpose");
      if (r != n.output) alias[n.output] = r;  // the identity
      return;
    }
    if (ops.size() != 2) unsupported(std::to_string(ops.size()) + " operands");
    const std::string &la = ops[0], &lb = ops[1];
    std::string batch, m, k, nn;
    for (char c : out)
      if (has_label(la, c) && has_label(lb, c)) batch += c;
    for (char c : la) {
      if (has_label(out, c) && !has_label(lb, c)) m += c;
      if (!has_label(out, c) && has_label(lb, c)) k += c;
      if (!has_label(out, c) && !has_label(lb, c))
        unsupported(std::string("subscript ") + c + " summed in one operand");
    }
    for (char c : lb) {
      if (has_label(out, c) && !has_label(la, c)) nn += c;
      if (!has_label(out, c) && !has_label(la, c))
        unsupported(std::string("subscript ") + c + " summed in one operand");
    }
    auto extent = [&](const std::string& labels, const std::vector<std::int64_t>& sh, const std::string& within) {
      std::int64_t s = 1;
      for (char c : labels) s *= sh[within.find(c)];
      return s;
    };
    auto reshape = [&](const std::string& from, std::vector<std::int64_t> shape, const std::string& to,
                       const std::string& suffix) {
      const std::string sn = add_constant(p + suffix + "_shape", {static_cast<std::int64_t>(shape.size())},
                                          std::vector<double>(shape.begin(), shape.end()), true);
      emit(derived(n, suffix, "Reshape", {from, sn}, to));
      return to;
    };
    const auto& sa = in(n, 0).shape;
    const auto& sb = in(n, 1).shape;
    std::vector<std::int64_t> a_shape, b_shape, y_shape;
    for (char c : batch) {
      a_shape.push_back(sa[la.find(c)]);
      b_shape.push_back(sb[lb.find(c)]);
      y_shape.push_back(dims[c]);
    }
    const std::int64_t msz = extent(m, sa, la), ksz = extent(k, sa, la), nsz = extent(nn, sb, lb);
    a_shape.insert(a_shape.end(), {msz, ksz});
    b_shape.insert(b_shape.end(), {ksz, nsz});
    std::string a = transpose(n.inputs[0], la, batch + m + k, p + "a", "transpose_a");
    a = reshape(a, a_shape, p + "a_matrix", "reshape_a");
    std::string b = transpose(n.inputs[1], lb, batch + k + nn, p + "b", "transpose_b");
    b = reshape(b, b_shape, p + "b_matrix", "reshape_b");
    emit(derived(n, "matmul", "MatMul", {a, b}, p + "product"));
    for (char c : m + nn) y_shape.push_back(dims[c]);
    const std::string order = batch + m + nn;
    const std::string y = reshape(p + "product", y_shape, order == out ? n.output : p + "y", "reshape_y");
    if (order != out) transpose(y, order, out, n.output, "transpose_y");
    g.notes.push_back("Einsum '" + n.name + "' (" + eq + ") runs as a MatMul of [" + batch + "|" + m + "|" + k +
                      "] by [" + batch + "|" + k + "|" + nn + "]");
  }

  void import(const onnx::ModelProto& model) {
    for (const auto& o : model.opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") g.opset = static_cast<int>(o.version());
    const auto& graph = model.graph();

    // Every unsupported node, in one error.
    std::vector<std::string> unsupported;
    for (int i = 0; i < graph.node_size(); ++i) {
      const auto& n = graph.node(i);
      const std::string name = n.name().empty() ? n.op_type() + " #" + std::to_string(i) : n.name();
      if (!(n.domain().empty() || n.domain() == "ai.onnx") || !kSupported.count(n.op_type()))
        unsupported.push_back("'" + name + "' (" + (n.domain().empty() ? "" : n.domain() + ".") + n.op_type() + ")");
    }
    if (!unsupported.empty()) {
      std::string list;
      for (std::size_t i = 0; i < unsupported.size(); ++i) list += (i ? ", " : "") + unsupported[i];
      fail(Status::Unsupported, std::to_string(unsupported.size()) + " node" + (unsupported.size() == 1 ? "" : "s") +
                                    " with ops the compiler does not support: " + list +
                                    " (supported: docs/runtime.md)");
    }

    std::set<std::string> initializers;
    std::uint64_t own = 0;  // the initializers' bytes as float32
    for (const auto& t : graph.initializer()) {
      g.values[t.name()] = tensor_value(t, "initializer '" + t.name() + "'");
      initializers.insert(t.name());
      own += g.values[t.name()].elements() * 4;
    }
    constant_limit = options.max_constant_bytes ? options.max_constant_bytes : std::max(kDefaultMaxConstantBytes, own);
    for (const auto& input : graph.input()) {
      if (initializers.count(input.name())) continue;
      Value v;
      auto given = options.shapes.find(input.name());
      const auto& tt = input.type().tensor_type();
      if (tt.elem_type() != onnx::TensorProto::FLOAT)
        fail(Status::Unsupported, "input '" + input.name() + "' has ONNX element type " +
                                      std::to_string(tt.elem_type()) + "; model inputs must be float32");
      if (given != options.shapes.end()) {
        v.shape = given->second;
        if (tt.has_shape() && tt.shape().dim_size() != static_cast<int>(v.shape.size()))
          fail(Status::InvalidArgument, "input '" + input.name() + "' has rank " +
                                            std::to_string(tt.shape().dim_size()) + "; the shape given for it, " +
                                            dims_text(v.shape) + ", has rank " + std::to_string(v.shape.size()));
        for (int i = 0; tt.has_shape() && i < tt.shape().dim_size(); ++i) {
          const auto& d = tt.shape().dim(i);
          if (d.has_dim_value() && d.dim_value() > 0 && d.dim_value() != v.shape[static_cast<std::size_t>(i)])
            fail(Status::InvalidArgument, "input '" + input.name() + "' has dimension " + std::to_string(i) +
                                              " fixed at " + std::to_string(d.dim_value()) + "; the shape given is " +
                                              dims_text(v.shape));
        }
      } else {
        if (!tt.has_shape())
          fail(Status::InvalidArgument, "input '" + input.name() + "' has no shape in the model; give one (--shape " +
                                            input.name() + "=1x3x224x224)");
        for (int i = 0; i < tt.shape().dim_size(); ++i) {
          const auto& d = tt.shape().dim(i);
          if (!d.has_dim_value() || d.dim_value() <= 0)
            fail(Status::InvalidArgument, "input '" + input.name() + "' has a symbolic dimension " + std::to_string(i) +
                                              (d.dim_param().empty() ? std::string() : " ('" + d.dim_param() + "')") +
                                              "; give its fixed shape (--shape " + input.name() + "=...)");
          v.shape.push_back(d.dim_value());
        }
      }
      for (auto d : v.shape)
        if (d <= 0 || d > (std::int64_t{1} << 31))
          fail(Status::InvalidArgument, "input '" + input.name() + "' has shape " + dims_text(v.shape));
      if (v.shape.size() > kMaxRank) fail(Status::Unsupported, "input '" + input.name() + "' has rank above 6");
      g.values[input.name()] = v;
      g.inputs.push_back(input.name());
    }
    for (const auto& [name, _] : options.shapes)
      if (std::find(g.inputs.begin(), g.inputs.end(), name) == g.inputs.end())
        fail(Status::InvalidArgument, "a shape is given for '" + name + "', which is not an input of the model");
    if (g.inputs.empty()) fail(Status::InvalidArgument, "the model has no inputs");

    for (int i = 0; i < graph.node_size(); ++i) {
      const auto& p = graph.node(i);
      Node n;
      n.name = p.name().empty() ? p.op_type() + " #" + std::to_string(i) : p.name();
      n.op = p.op_type();
      n.proto = p;
      for (const auto& x : p.input()) n.inputs.push_back(x.empty() ? x : resolve(x));
      if (p.output_size() < 1) fail_node(n, "no output");
      n.output = p.output(0);
      if (n.op == "TopK" && p.output_size() > 1) n.output2 = p.output(1);
      if (g.values.count(n.output)) fail_node(n, "output '" + n.output + "' is defined twice");
      if (n.op == "Constant") {
        const Attrs a{p};
        const auto* t = a.find("value");
        if (!t || !t->has_t())
          fail(Status::Unsupported, "node '" + n.name + "' (Constant): only the 'value' tensor form");
        g.values[n.output] = tensor_value(t->t(), "constant '" + n.name + "'");
        continue;
      }
      if (n.op == "Identity" || n.op == "Dropout") {
        in(n, 0);
        alias[n.output] = n.inputs[0];
        g.notes.push_back("removed " + n.op + " '" + n.name + "'");
        continue;
      }
      if (n.op == "Split") {
        split(n, p);
        continue;
      }
      if (n.op == "Einsum") {
        einsum(n);
        continue;
      }
      if (n.op == "LayerNormalization" || n.op == "InstanceNormalization") {
        normalization(n);
        continue;
      }
      emit(std::move(n));
    }
    // Other outputs of a node (MaxPool's indices, Dropout's mask) must be
    // unused; Split's are its parts.
    std::set<std::string> produced;
    for (int i = 0; i < graph.node_size(); ++i)
      for (int o = graph.node(i).op_type() == "TopK" ? 2 : 1;
           o < graph.node(i).output_size() && graph.node(i).op_type() != "Split"; ++o)
        if (!graph.node(i).output(o).empty()) produced.insert(graph.node(i).output(o));
    auto check_used = [&](const std::string& v, const std::string& by) {
      if (produced.count(v))
        fail(Status::Unsupported, "'" + v + "', a second output of its node, is used by " + by +
                                      "; the compiler supports only first outputs");
    };
    for (const auto& n : g.nodes)
      for (const auto& x : n.inputs) check_used(x, "node '" + n.name + "'");
    for (const auto& o : graph.output()) {
      check_used(o.name(), "the graph's outputs");
      const std::string v = resolve(o.name());
      if (!g.values.count(v)) fail(Status::InvalidArgument, "output '" + o.name() + "' is not produced by any node");
      g.outputs.emplace_back(o.name(), v);
    }
  }

  std::size_t consumers(const std::string& v) const {
    std::size_t c = 0;
    for (const auto& n : g.nodes)
      for (const auto& x : n.inputs) c += x == v;
    for (const auto& o : g.outputs) c += o.second == v;
    return c;
  }
  // The node (index) whose only consumer is node `i`'s first input, if it is of `ops`.
  std::optional<std::size_t> sole_producer(std::size_t i, std::initializer_list<const char*> ops) const {
    const std::string& x = g.nodes[i].inputs.empty() ? std::string() : g.nodes[i].inputs[0];
    for (std::size_t j = 0; j < i; ++j) {
      if (g.nodes[j].output != x) continue;
      bool ok = false;
      for (auto op : ops) ok = ok || g.nodes[j].op == op;
      if (!ok || consumers(x) != 1) return std::nullopt;
      return j;
    }
    return std::nullopt;
  }

  // A BatchNormalization of a 4-D value that follows no Conv becomes a
  // depthwise 1x1 Conv (weight gamma / sqrt(var + eps) per channel, bias
  // beta - mean * weight): one pass instead of a multiply and an add, and
  // a Relu after it fuses.
  // A BatchNormalization's parameters, checked to be one per channel.
  struct BatchNorm {
    const std::vector<float>&gamma, &beta, &mean, &var;
    float eps;
  };
  BatchNorm batch_norm(const Node& bn, std::size_t channels) const {
    BatchNorm p{*g.value(bn.inputs[1]).data, *g.value(bn.inputs[2]).data, *g.value(bn.inputs[3]).data,
                *g.value(bn.inputs[4]).data, Attrs{bn.proto}.f("epsilon", 1e-5f)};
    for (const auto* v : {&p.gamma, &p.beta, &p.mean, &p.var})
      if (v->size() != channels)
        fail_node(bn, "its parameters do not have one value per channel (" + std::to_string(channels) + ")");
    return p;
  }

  void batch_norm_as_conv(Node& bn) {
    const auto& x = g.value(bn.inputs[0]);
    if (x.shape.size() != 4) return;
    const auto c = static_cast<std::size_t>(x.shape[1]);
    const auto [gamma, beta, mean, var, eps] = batch_norm(bn, c);
    Value w, b;
    w.shape = {static_cast<std::int64_t>(c), 1, 1, 1};
    b.shape = {static_cast<std::int64_t>(c)};
    w.data = std::vector<float>(c);
    b.data = std::vector<float>(c);
    for (std::size_t k = 0; k < c; ++k) {
      const double scale = gamma[k] / std::sqrt(static_cast<double>(var[k]) + eps);
      (*w.data)[k] = static_cast<float>(scale);
      (*b.data)[k] = static_cast<float>(beta[k] - mean[k] * scale);
    }
    const std::string wn = bn.name + "/depthwise", bname = bn.name + "/depthwise_bias";
    g.values[wn] = std::move(w);
    g.values[bname] = std::move(b);
    bn.inputs = {bn.inputs[0], wn, bname};
    bn.op = "Conv";
    bn.proto.set_op_type("Conv");
    bn.proto.clear_attribute();
    auto* group = bn.proto.add_attribute();
    group->set_name("group");
    group->set_type(onnx::AttributeProto::INT);
    group->set_i(static_cast<std::int64_t>(c));
    bn.fused = "BatchNormalization as a depthwise 1x1 convolution";
    g.notes.push_back("BatchNormalization '" + bn.name + "' runs as a depthwise 1x1 Conv");
  }

  void fold_batch_norm() {
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      Node& bn = g.nodes[i];
      if (bn.op != "BatchNormalization") continue;
      auto p = sole_producer(i, {"Conv"});
      if (!p || g.nodes[*p].act.kind != Activation::None) {
        batch_norm_as_conv(bn);
        continue;
      }
      Node& conv = g.nodes[*p];
      const auto& w = g.value(conv.inputs[1]);
      const auto cout = static_cast<std::size_t>(w.shape[0]);
      const auto [gamma, beta, mean, var, eps] = batch_norm(bn, cout);
      Value nw = w, nb;
      nb.shape = {static_cast<std::int64_t>(cout)};
      nb.data = std::vector<float>(cout, 0.0f);
      const std::vector<float>* bias =
          conv.inputs.size() > 2 && !conv.inputs[2].empty() ? &*g.value(conv.inputs[2]).data : nullptr;
      const std::size_t per = w.elements() / cout;
      for (std::size_t c = 0; c < cout; ++c) {
        const double s = gamma[c] / std::sqrt(static_cast<double>(var[c]) + eps);
        for (std::size_t k = 0; k < per; ++k) (*nw.data)[c * per + k] = static_cast<float>((*w.data)[c * per + k] * s);
        (*nb.data)[c] = static_cast<float>(((bias ? (*bias)[c] : 0.0f) - mean[c]) * s + beta[c]);
      }
      const std::string wn = conv.name + "/weights+" + bn.name, bname = conv.name + "/bias+" + bn.name;
      g.values[wn] = std::move(nw);
      g.values[bname] = std::move(nb);
      conv.inputs.resize(3);
      conv.inputs[1] = wn;
      conv.inputs[2] = bname;
      conv.output = bn.output;
      conv.fused = "BatchNormalization '" + bn.name + "'";
      g.notes.push_back("folded BatchNormalization '" + bn.name + "' into Conv '" + conv.name + "'");
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
      --i;
    }
  }

  void fuse_activations() {
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      Node& r = g.nodes[i];
      // int8 convolutions apply Relu and Clip by their output's range alone;
      // HardSigmoid, Sigmoid and Tanh stay layers of their own there.
      const bool float_only = (r.op == "HardSigmoid" || r.op == "HardSwish" || r.op == "Sigmoid" || r.op == "Tanh") &&
                              options.precision != Precision::Int8;
      if (r.op != "Relu" && r.op != "Clip" && !float_only) continue;
      auto p = sole_producer(i, {"Conv", "Gemm", "MatMul"});
      if (!p || g.nodes[*p].act.kind != Activation::None) continue;
      Node& c = g.nodes[*p];
      if (r.op == "Relu") {
        c.act = ActivationParams::relu();
      } else if (r.op == "HardSwish") {
        c.act = ActivationParams::hard_swish();
      } else if (r.op == "Sigmoid") {
        c.act = ActivationParams::sigmoid();
      } else if (r.op == "Tanh") {
        c.act = ActivationParams::tanh();
      } else if (r.op == "HardSigmoid") {
        c.act = ActivationParams::hard_sigmoid(Attrs{r.proto}.f("alpha", 0.2f), Attrs{r.proto}.f("beta", 0.5f));
      } else {
        float lo = -FLT_MAX, hi = FLT_MAX;
        if (g.opset >= 11) {
          if (r.inputs.size() > 1 && !r.inputs[1].empty()) lo = (*g.value(r.inputs[1]).data).at(0);
          if (r.inputs.size() > 2 && !r.inputs[2].empty()) hi = (*g.value(r.inputs[2]).data).at(0);
        } else {
          lo = Attrs{r.proto}.f("min", -FLT_MAX);
          hi = Attrs{r.proto}.f("max", FLT_MAX);
        }
        c.act = ActivationParams::clip(lo, hi);
      }
      c.output = r.output;
      c.fused += (c.fused.empty() ? "" : ", ") + r.op + " '" + r.name + "'";
      g.notes.push_back("fused " + r.op + " '" + r.name + "' into " + c.op + " '" + c.name + "'");
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
      --i;
    }
  }

  // SiLU and HardSwish as PyTorch writes them at opset 13, Mul(x,
  // Sigmoid(x)) and Mul(x, HardSigmoid(x)), after a Conv, Gemm or MatMul
  // whose output nothing else reads: the Silu or HardSwish activation of
  // that node (not in int8, where activations other than Relu and Clip are
  // layers of their own).
  void fuse_gated() {
    if (options.precision == Precision::Int8) return;
    auto producer = [&](const std::string& v) -> std::optional<std::size_t> {
      for (std::size_t j = 0; j < g.nodes.size(); ++j)
        if (g.nodes[j].output == v) return j;
      return std::nullopt;
    };
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& m = g.nodes[i];
      if (m.op != "Mul" || m.inputs.size() != 2) continue;
      for (int side = 0; side < 2; ++side) {
        const std::string& x = m.inputs[side];
        const auto s = producer(m.inputs[1 - side]);
        if (!s || (g.nodes[*s].op != "Sigmoid" && g.nodes[*s].op != "HardSigmoid") || g.nodes[*s].inputs[0] != x ||
            consumers(m.inputs[1 - side]) != 1 || consumers(x) != 2)
          continue;
        const auto c = producer(x);
        if (!c) continue;
        Node& conv = g.nodes[*c];
        if ((conv.op != "Conv" && conv.op != "Gemm" && conv.op != "MatMul") || conv.act.kind != Activation::None)
          continue;
        const Node& gate = g.nodes[*s];
        const bool hard = gate.op == "HardSigmoid";
        conv.act =
            hard ? ActivationParams::hard_swish(Attrs{gate.proto}.f("alpha", 0.2f), Attrs{gate.proto}.f("beta", 0.5f))
                 : ActivationParams::silu();
        conv.output = m.output;
        const std::string what =
            std::string(hard ? "HardSwish" : "SiLU") + " (" + gate.op + " '" + gate.name + "', Mul '" + m.name + "')";
        conv.fused += (conv.fused.empty() ? "" : ", ") + what;
        g.notes.push_back("fused " + what + " into " + conv.op + " '" + conv.name + "'");
        const std::size_t hi = std::max(i, *s), lo = std::min(i, *s);
        g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(hi));
        g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(lo));
        i = lo == 0 ? static_cast<std::size_t>(-1) : lo - 1;
        break;
      }
    }
  }
};

}  // namespace

const Value& Graph::value(const std::string& name) const {
  auto it = values.find(name);
  if (it == values.end()) throw Error(Status::Internal, "compiler: no value '" + name + "'");
  return it->second;
}

Graph import_onnx(std::span<const std::byte> bytes, const CompileOptions& options, std::string_view name,
                  const std::filesystem::path& external_dir) {
  onnx::ModelProto model;
  if (bytes.size() > static_cast<std::size_t>(INT32_MAX))
    throw Error(Status::InvalidArgument,
                std::string(name) + ": the ONNX model is " + std::to_string(bytes.size()) +
                    " bytes; protobuf cannot parse a model over 2 GiB. Save it with its weights as external data "
                    "(onnx.save_model(model, path, save_as_external_data=True); PyTorch's exporter does so for "
                    "models over 2 GB) and compile the .onnx file by its path");
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw Error(Status::InvalidArgument, std::string(name) + ": not an ONNX model (it does not parse as a ModelProto)");
  Importer im{std::string(name), options, external_dir, {}, {}, {}, {}, 0};
  im.import(model);
  im.fold_batch_norm();
  im.fuse_activations();
  im.fuse_gated();
  return std::move(im.g);
}

}  // namespace tpuhal::rt::detail
