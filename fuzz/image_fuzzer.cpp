// fw::decode_image: firmware images, the board's side of an upload (and the
// uploader's check before it sends).
//
// Input: the image bytes.
// Properties: a refusal reads as a sentence; an accepted image's sections
// lie inside the input, clear of the header and table and of each other, and
// building an image from them (build_image) decodes back to the same
// sections and header facts.
#include <cstring>

#include "fuzz_util.h"
#include "tpuhal/fw/image.h"

namespace fw = tpuhal::fw;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto r = fw::decode_image(bytes);
  if (!r) {
    const std::string msg = fw::describe_image_problem(r.problem());
    FUZZ_CHECK(tpuhal::fuzz::printable(msg) && msg.rfind("firmware image: ", 0) == 0, "message \"%s\"", msg.c_str());
    return 0;
  }
  const fw::Image& im = *r;
  FUZZ_CHECK(!im.sections.empty() && im.sections.size() <= fw::kMaxImageSections, "%zu sections", im.sections.size());
  const std::size_t table_end = sizeof(fw::ImageHeader) + im.sections.size() * sizeof(fw::SectionEntry);
  fw::ImageSpec spec{im.board_id, im.firmware_version, im.iface_min, im.iface_max, {}};
  for (std::size_t i = 0; i < im.sections.size(); ++i) {
    const auto& s = im.sections[i];
    const auto* begin = reinterpret_cast<const std::uint8_t*>(s.payload.data());
    FUZZ_CHECK(begin >= data + table_end && begin + s.payload.size() <= data + size && !s.payload.empty(),
               "section %zu lies outside the payload area", i);
    for (std::size_t j = 0; j < i; ++j) {
      const auto* other = reinterpret_cast<const std::uint8_t*>(im.sections[j].payload.data());
      FUZZ_CHECK(begin + s.payload.size() <= other || other + im.sections[j].payload.size() <= begin,
                 "sections %zu and %zu overlap", j, i);
    }
    spec.sections.push_back({s.kind, s.load_address, {s.payload.begin(), s.payload.end()}});
  }
  const auto rebuilt = fw::build_image(spec);
  auto again = fw::decode_image(rebuilt);
  FUZZ_CHECK(again.ok(), "a rebuilt image does not decode: %s", fw::describe_image_problem(again.problem()).c_str());
  FUZZ_CHECK(again->board_id == im.board_id && again->sections.size() == im.sections.size(), "rebuilt header differs");
  for (std::size_t i = 0; i < im.sections.size(); ++i) {
    const auto &a = im.sections[i], &b = again->sections[i];
    FUZZ_CHECK(a.kind == b.kind && a.load_address == b.load_address && a.payload.size() == b.payload.size() &&
                   std::memcmp(a.payload.data(), b.payload.data(), a.payload.size()) == 0,
               "section %zu differs after rebuilding", i);
  }
  return 0;
}
