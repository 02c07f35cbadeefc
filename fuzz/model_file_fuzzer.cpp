// rt::decode: compiled-model files (`.tpm`), which users copy between
// machines and may find damaged, truncated or from another version.
//
// Properties, for every input:
//   - decode either returns a model or throws tpuhal::Error with status
//     InvalidArgument (damage) or VersionMismatch, whose message is a
//     printable sentence naming the file;
//   - a model it returns re-encodes to bytes that decode to the same
//     sections, and re-encoding that is a fixed point.
#include <algorithm>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
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
  return 0;
}
