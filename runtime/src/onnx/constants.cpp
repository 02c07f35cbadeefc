// Constant data: initializers and Constant nodes' tensors, in the model or
// in external data files beside it, each checked to fill its shape exactly
// before any memory is taken for it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string_view>

#include "onnx/importer.hpp"

namespace tpuhal::rt::detail {
namespace {

// The bytes of one element in raw_data (and in external data) for the
// element types the compiler reads; 0 for the others.
std::size_t raw_element_size(int data_type) {
  switch (data_type) {
    case onnx::TensorProto::FLOAT:
    case onnx::TensorProto::INT32: return 4;
    case onnx::TensorProto::DOUBLE:
    case onnx::TensorProto::INT64: return 8;
    case onnx::TensorProto::BOOL:
    case onnx::TensorProto::INT8:
    case onnx::TensorProto::UINT8: return 1;
    default: return 0;
  }
}

// Element `i` of `t`, from `raw` (little-endian bytes) when it holds any,
// else from the typed field. The int64, int32 and bool ones also go to
// `ints`.
template <typename Raw, typename Typed>
Raw element(std::string_view raw, std::uint64_t i, Typed typed) {
  if (raw.empty()) return static_cast<Raw>(typed(static_cast<int>(i)));
  Raw x;
  std::memcpy(&x, raw.data() + i * sizeof(Raw), sizeof(Raw));
  return x;
}

// The `n` values of `t` (its data type one raw_element_size knows).
void decode_values(const onnx::TensorProto& t, std::string_view raw, std::uint64_t n, Value& v) {
  std::vector<float> f(n);
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      for (std::uint64_t i = 0; i < n; ++i) f[i] = element<float>(raw, i, [&](int k) { return t.float_data(k); });
      break;
    case onnx::TensorProto::DOUBLE:
      for (std::uint64_t i = 0; i < n; ++i)
        f[i] = static_cast<float>(element<double>(raw, i, [&](int k) { return t.double_data(k); }));
      break;
    case onnx::TensorProto::INT64:
      v.ints.resize(n);
      for (std::uint64_t i = 0; i < n; ++i) {
        v.ints[i] = element<std::int64_t>(raw, i, [&](int k) { return t.int64_data(k); });
        f[i] = static_cast<float>(v.ints[i]);
      }
      break;
    case onnx::TensorProto::INT32:
      v.ints.resize(n);
      for (std::uint64_t i = 0; i < n; ++i) {
        v.ints[i] = element<std::int32_t>(raw, i, [&](int k) { return t.int32_data(k); });
        f[i] = static_cast<float>(v.ints[i]);
      }
      break;
    case onnx::TensorProto::INT8:  // Q/DQ weights and zero points: as int32_data, or one byte each
    case onnx::TensorProto::UINT8: {
      const bool is_signed = t.data_type() == onnx::TensorProto::INT8;
      v.ints.resize(n);
      v.int8_type = t.data_type();
      for (std::uint64_t i = 0; i < n; ++i) {
        const auto byte = static_cast<unsigned char>(raw.empty() ? t.int32_data(static_cast<int>(i)) : raw[i]);
        v.ints[i] = is_signed ? static_cast<std::int64_t>(static_cast<signed char>(byte)) : byte;
        f[i] = static_cast<float>(v.ints[i]);
      }
      break;
    }
    case onnx::TensorProto::BOOL:  // as int32_data, or one byte each
      v.ints.resize(n);
      for (std::uint64_t i = 0; i < n; ++i) {
        v.ints[i] = (!raw.empty() ? static_cast<int>(raw[i]) : t.int32_data(static_cast<int>(i))) != 0;
        f[i] = static_cast<float>(v.ints[i]);
      }
      break;
    default: break;
  }
  v.data = std::move(f);
}

}  // namespace

Value Importer::tensor_value(const onnx::TensorProto& t, const std::string& what) const {
  Value v;
  std::uint64_t n = 1;
  for (auto d : t.dims()) {
    if (d < 0 || d > (std::int64_t{1} << 32))
      fail(Status::InvalidArgument, what + " has dimension " + std::to_string(d));
    v.shape.push_back(d);
    n *= static_cast<std::uint64_t>(d);
    if (n > (std::uint64_t{1} << 32)) fail(Status::InvalidArgument, what + " is too large");
  }
  const std::size_t esize = raw_element_size(t.data_type());
  if (esize == 0)
    fail(Status::Unsupported, what + " has ONNX element type " + std::to_string(t.data_type()) +
                                  "; the compiler reads float, double, int64, int32, int8, uint8 and bool constants");
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
                                                                 : t.int32_data_size();  // INT32, BOOL, INT8, UINT8
  if (!raw.empty() && raw.size() != n * esize)
    fail(Status::InvalidArgument, what + " holds " + std::to_string(raw.size()) + " bytes of data; its shape " +
                                      dims_text(v.shape) + " of " + std::to_string(esize) + "-byte elements needs " +
                                      std::to_string(n * esize));
  if (raw.empty() && static_cast<std::uint64_t>(typed) != n)
    fail(Status::InvalidArgument, what + " holds " + std::to_string(typed) + " values; its shape " +
                                      dims_text(v.shape) + " needs " + std::to_string(n));
  decode_values(t, raw, n, v);
  v.onnx_type = t.data_type();
  return v;
}

// The `bytes` bytes of a tensor kept in an external data file: its
// external_data entries "location" (relative to external_dir), "offset"
// and "length" (the rest of the file when absent); other keys
// ("checksum", "basepath") are ignored, as ONNX's own loader does.
std::string Importer::external_bytes(const onnx::TensorProto& t, const std::string& what,
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
  const std::string needs = "its shape " + dims_text(shape) + " of " +
                            onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t.data_type())) +
                            " needs " + std::to_string(bytes);
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
ExternalFile Importer::open_external(const std::filesystem::path& rel, const std::string& in_file) const {
  if (external_dir_fd.get() < 0) {
    external_dir_fd = UniqueFd(::open(external_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (external_dir_fd.get() < 0)
      fail(
          errno == ENOENT ? Status::NotFound : Status::InvalidArgument,
          in_file + ": cannot open the directory " + external_dir.string() + " that holds it: " + std::strerror(errno));
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

}  // namespace tpuhal::rt::detail
