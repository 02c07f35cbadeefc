// NumPy .npy files (format versions 1 to 3) of little-endian f4 or f8 in C
// order: calibration sets and test batches.
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "tpuhal/error.hpp"
#include "tpuhal/rt/compile.hpp"

namespace tpuhal::rt {
namespace {

// `what` may quote the header: escaped (escape_text) for the terminal.
[[noreturn]] void bad(const std::filesystem::path& path, const std::string& what) {
  throw Error(Status::InvalidArgument, escape_text(path.string() + ": " + what));
}

// The value of `key` in the header dict, as written ("'<f4'", "False", "(3, 4)").
std::string dict_value(const std::string& header, const std::string& key) {
  const auto k = header.find("'" + key + "'");
  if (k == std::string::npos) return {};
  auto p = header.find(':', k);
  if (p == std::string::npos) return {};
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  if (p < header.size() && header[p] == '(') {
    const auto e = header.find(')', p);
    return e == std::string::npos ? std::string() : header.substr(p, e - p + 1);
  }
  const auto e = header.find_first_of(",}", p);
  return header.substr(p, e == std::string::npos ? std::string::npos : e - p);
}

// Where the header's dict lies in the file: {offset, length}.
std::pair<std::size_t, std::size_t> header_at(const std::filesystem::path& path, const std::vector<char>& data) {
  if (data.size() < 10 || std::memcmp(data.data(), "\x93NUMPY", 6) != 0) bad(path, "not a NumPy .npy file");
  const int major = static_cast<unsigned char>(data[6]);
  std::size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len =
        static_cast<unsigned char>(data[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(data[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) bad(path, "the .npy header is cut short");
    for (int i = 0; i < 4; ++i)
      header_len |= static_cast<std::size_t>(static_cast<unsigned char>(data[8 + i])) << (8 * i);
    start = 12;
  } else {
    bad(path, ".npy format version " + std::to_string(major) + " is not supported");
  }
  if (header_len > data.size() - start) bad(path, "the .npy header is cut short");
  return {start, header_len};
}

}  // namespace

NdArray read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot open the file");
  const std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto [start, header_len] = header_at(path, data);
  const std::string header(data.data() + start, header_len);
  const std::string descr = dict_value(header, "descr");
  const std::string order = dict_value(header, "fortran_order");
  const std::string shape_text = dict_value(header, "shape");
  std::size_t esize = 0;
  bool integer = false;  // int32 or int64 (token ids): exact as floats up to 2^24
  if (descr == "'<f4'" || descr == "'f4'")
    esize = 4;
  else if (descr == "'<f8'" || descr == "'f8'")
    esize = 8;
  else if (descr == "'<i4'" || descr == "'i4'")
    esize = 4, integer = true;
  else if (descr == "'<i8'" || descr == "'i8'")
    esize = 8, integer = true;
  else
    bad(path, "element type " + (descr.empty() ? std::string("(none)") : descr) +
                  " is not supported; use float32 (<f4), float64 (<f8), int32 (<i4) or int64 (<i8)");
  if (order != "False") bad(path, "the array is in Fortran order; save it in C order (np.ascontiguousarray)");
  if (shape_text.empty() || shape_text.front() != '(') bad(path, "the header has no shape");
  NdArray a;
  std::uint64_t n = 1;
  std::string num;
  for (char c : shape_text.substr(1)) {
    if (c >= '0' && c <= '9') {
      num += c;
    } else if (!num.empty()) {
      if (num.size() > 12) bad(path, "a dimension is too large");
      a.shape.push_back(std::stoll(num));
      n *= static_cast<std::uint64_t>(a.shape.back());
      if (n > (std::uint64_t{1} << 36)) bad(path, "the array is too large");
      num.clear();
    }
  }
  const std::size_t body = start + header_len;
  if ((data.size() - body) / esize < n)
    bad(path,
        "holds " + std::to_string((data.size() - body) / esize) + " values; its shape needs " + std::to_string(n));
  a.values.resize(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    if (integer) {
      std::int64_t v = 0;
      if (esize == 4) {
        std::int32_t w;
        std::memcpy(&w, data.data() + body + i * 4, 4);
        v = w;
      } else {
        std::memcpy(&v, data.data() + body + i * 8, 8);
      }
      if (v > (std::int64_t{1} << 24) || v < -(std::int64_t{1} << 24))
        bad(path, "holds the integer " + std::to_string(v) + "; integer arrays hold values within +-2^24");
      a.values[i] = static_cast<float>(v);
    } else if (esize == 4) {
      std::memcpy(&a.values[i], data.data() + body + i * 4, 4);
    } else {
      double d;
      std::memcpy(&d, data.data() + body + i * 8, 8);
      a.values[i] = static_cast<float>(d);
    }
  }
  return a;
}

void write_npy(const std::filesystem::path& path, const NdArray& array) {
  std::uint64_t n = 1;
  for (auto d : array.shape) n *= static_cast<std::uint64_t>(d);
  if (n != array.values.size())
    throw Error(Status::InvalidArgument, path.string() + ": the shape holds " + std::to_string(n) +
                                             " values; the array has " + std::to_string(array.values.size()));
  std::string shape = "(";
  for (std::size_t i = 0; i < array.shape.size(); ++i)
    shape += std::to_string(array.shape[i]) + (array.shape.size() == 1 ? "," : i + 1 < array.shape.size() ? ", " : "");
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(Status::InvalidArgument, path.string() + ": cannot create the file");
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(array.values.data()), static_cast<std::streamsize>(n * 4));
  if (!out) throw Error(Status::InvalidArgument, path.string() + ": writing failed");
}

}  // namespace tpuhal::rt
