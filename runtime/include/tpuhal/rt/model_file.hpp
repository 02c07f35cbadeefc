// The compiled-model file (`.tpm`): what `tpuhal compile` writes and the
// runtime loads. A versioned, checksummed container of typed sections; what
// each section holds is defined by the compiler and runtime that use it
// (docs/model-format.md). This header is the container only: reading
// bytes that may be damaged or hostile is done here once, and fuzzed.
//
//   rt::ModelFile m;
//   m.add(rt::SectionKind::Weights, bytes);
//   rt::write_model_file("net.tpm", m);
//   rt::ModelFile back = rt::read_model_file("net.tpm");
//   std::span<const std::byte> w = back.get(rt::SectionKind::Weights);
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpuhal::rt {

// The format versions this library reads: kOldestModelFormatVersion to
// kModelFormatVersion. A file of another version is refused with
// Status::VersionMismatch naming both. Version 2 added strided tensors (a
// graph tensor's "strides"); version 3 the host stage section, which older
// readers must not skip: a file is written as version 3 only where it has
// one, so that a model without one still loads in a version-2 reader;
// version 4 convolutions that accumulate into their output (a conv2d's
// "accumulate" attribute, which an older reader would ignore), written
// only where the graph has one (ModelFile::require_version).
inline constexpr std::uint32_t kModelFormatVersion = 4;
inline constexpr std::uint32_t kOldestModelFormatVersion = 2;

// Section kinds. A reader refuses a file with a kind it does not know,
// unless the section is marked optional.
enum class SectionKind : std::uint32_t {
  Meta = 1,       // producer, source model, precision: key=value lines (UTF-8)
  Io = 2,         // the model's inputs and outputs: names, dtypes, fixed shapes (the largest batch's)
  Graph = 3,      // the compiled program: ops, their operands and attributes
  Weights = 4,    // constant tensors, laid out for the device
  Quant = 5,      // quantisation parameters and calibration ranges
  Report = 6,     // the precision report, per layer (optional to readers)
  Stages = 7,     // programs for the batch sizes below the graph's (optional to readers)
  HostStage = 8,  // ONNX nodes the runtime evaluates on the host after the program (an ONNX model)
};
const char* to_string(SectionKind kind) noexcept;  // "weights"; "unknown" for others

struct Section {
  SectionKind kind;
  bool optional = false;  // readers that do not know the kind skip it
  std::vector<std::byte> bytes;
};

class ModelFile {
 public:
  // Adds a section; InvalidArgument if one of that kind is already there.
  void add(SectionKind kind, std::vector<std::byte> bytes, bool optional = false);
  bool has(SectionKind kind) const noexcept;
  // The section's bytes; NotFound naming the kind if there is none.
  std::span<const std::byte> get(SectionKind kind) const;
  const std::vector<Section>& sections() const noexcept { return sections_; }
  // The oldest format version that holds what the sections hold, where
  // their contents (not their kinds) need a newer one than 2: encode()
  // writes the larger of this and what the kinds need.
  void require_version(std::uint32_t version) noexcept { required_ = std::max(required_, version); }
  std::uint32_t required_version() const noexcept { return required_; }

 private:
  std::vector<Section> sections_;
  std::uint32_t required_ = kOldestModelFormatVersion;
};

// The file's bytes: header, section table, then each section at a 64-byte
// boundary (weights can be used in place), every part under a CRC-32.
std::vector<std::byte> encode(const ModelFile& model);

// Reads a file's bytes. `name` (the path) goes into error messages. Throws
// tpuhal::Error: VersionMismatch for another format version, InvalidArgument
// for anything damaged (not a model file, truncated, checksum mismatch,
// sections out of bounds or overlapping, an unknown required section),
// each saying what and where.
ModelFile decode(std::span<const std::byte> bytes, std::string_view name = "compiled model");

// Whole files. Writing goes through a temporary file renamed into place, so
// a reader never sees a half-written model. Errors name the path.
ModelFile read_model_file(const std::filesystem::path& path);
void write_model_file(const std::filesystem::path& path, const ModelFile& model);

// Text read from a file (a model's metadata and names, an ONNX node name, an
// .npy header) made safe to print on a terminal: control bytes (below
// 0x20, 0x7f), C1 control characters (U+0080 to U+009F) and bytes that are
// not UTF-8 become \xNN; printable ASCII and UTF-8 stay as they are.
//   escape_text("a\x1b[2Jb") == "a\\x1b[2Jb"
std::string escape_text(std::string_view text);

}  // namespace tpuhal::rt
