// rt::decode: compiled-model files (`.tpm`), which users copy between
// machines and may find damaged, truncated or from another version.
//
// Properties, for every input:
//   - decode either returns a model or throws tpuhal::Error with status
//     InvalidArgument (damage) or VersionMismatch, whose message is a
//     printable sentence naming the file;
//   - a model it returns re-encodes to bytes that decode to the same
//     sections, and re-encoding that is a fixed point;
//   - its io, graph and stages sections (docs/model-format.md) either
//     decode or are refused with InvalidArgument and a message naming the
//     file, as Model::load does before it builds any op.
#include <algorithm>

#include "device_graph.hpp"
#include "fuzz_util.h"
#include "tpuhal/error.hpp"
#include "tpuhal/rt/model_file.hpp"

namespace rt = tpuhal::rt;

namespace {

bool same(const rt::ModelFile& a, const rt::ModelFile& b) {
  const auto& x = a.sections();
  const auto& y = b.sections();
  return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(), [](const auto& s, const auto& t) {
           return s.kind == t.kind && s.optional == t.optional && s.bytes == t.bytes;
         });
}

// Every tensor of a decoded graph lies inside its storage.
void check_placed(const rt::detail::DeviceGraph& g, std::uint64_t weights) {
  for (const auto& t : g.tensors) {
    const std::uint64_t limit = t.storage == rt::detail::Storage::Weights ? weights : g.arena_bytes;
    FUZZ_CHECK(t.offset <= limit && t.bytes() <= limit - t.offset, "a decoded tensor lies outside its storage");
  }
}

// The io, graph and stages decoders on those sections (any may be empty).
void decode_sections(std::span<const std::byte> io, std::span<const std::byte> graph, std::span<const std::byte> stages,
                     std::uint64_t weights) {
  auto refused_properly = [](const tpuhal::Error& e) {
    const std::string msg = e.what();
    FUZZ_CHECK(e.status() == tpuhal::Status::InvalidArgument, "section decoder status %d: %s",
               static_cast<int>(e.status()), e.what());
    FUZZ_CHECK(msg.rfind("fuzz.tpm: ", 0) == 0 && tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());
  };
  if (!io.empty()) {
    std::vector<rt::TensorSpec> inputs, outputs;
    try {
      rt::detail::decode_io(io, "fuzz.tpm", inputs, outputs);
    } catch (const tpuhal::Error& e) {
      refused_properly(e);
    }
  }
  if (!graph.empty()) {
    try {
      check_placed(rt::detail::decode_graph(graph, weights, "fuzz.tpm"), weights);
    } catch (const tpuhal::Error& e) {
      refused_properly(e);
    }
  }
  if (!stages.empty()) {
    try {
      for (const auto& st : rt::detail::decode_stages(stages, weights, "fuzz.tpm")) check_placed(st.graph, weights);
    } catch (const tpuhal::Error& e) {
      refused_properly(e);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  // Text that starts like JSON also goes to the section decoders directly:
  // the container's checksums would keep mutations from reaching them.
  if (size > 0 && data[0] == '{') decode_sections(bytes, bytes, bytes, 80);
  rt::ModelFile model;
  try {
    model = rt::decode(bytes, "fuzz.tpm");
  } catch (const tpuhal::Error& e) {
    FUZZ_CHECK(e.status() == tpuhal::Status::InvalidArgument || e.status() == tpuhal::Status::VersionMismatch,
               "status %d: %s", static_cast<int>(e.status()), e.what());
    const std::string msg = e.what();
    FUZZ_CHECK(msg.rfind("fuzz.tpm: ", 0) == 0 && tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());
    return 0;
  }
  const auto again = rt::encode(model);
  const rt::ModelFile back = rt::decode(again, "re-encoded");
  FUZZ_CHECK(same(model, back), "re-encoding changed the sections (%zu -> %zu)", model.sections().size(),
             back.sections().size());
  FUZZ_CHECK(rt::encode(back) == again, "encode is not a fixed point");

  auto section = [&](rt::SectionKind k) { return model.has(k) ? model.get(k) : std::span<const std::byte>(); };
  decode_sections(section(rt::SectionKind::Io), section(rt::SectionKind::Graph), section(rt::SectionKind::Stages),
                  section(rt::SectionKind::Weights).size());
  return 0;
}
