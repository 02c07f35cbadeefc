#include "tpuhal/base/ffmpeg.h"

#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <type_traits>

// The build names the libraries it compiled against; their majors must be
// the headers' (an FFmpeg major changes structures the code reads).
static_assert(LIBAVUTIL_VERSION_MAJOR == TPUHAL_LIBAVUTIL_MAJOR);
static_assert(LIBAVCODEC_VERSION_MAJOR == TPUHAL_LIBAVCODEC_MAJOR);
static_assert(LIBAVFORMAT_VERSION_MAJOR == TPUHAL_LIBAVFORMAT_MAJOR);

namespace tpuhal::base::ffmpeg {
namespace {

struct Library {
  const char* soname;
  const char* version;  // the symbol version its exports carry: LIBAVCODEC_59
  void* handle = nullptr;
};

// In load order: each needs the ones before it.
enum Index { avutil, avcodec, avformat, kLibraries };  // as ffmpeg_entries.inc names them

#define TPUHAL_STR2(x) #x
#define TPUHAL_STR(x) TPUHAL_STR2(x)
std::array<Library, kLibraries> libraries{{
    {TPUHAL_LIBAVUTIL_SONAME, "LIBAVUTIL_" TPUHAL_STR(TPUHAL_LIBAVUTIL_MAJOR)},
    {TPUHAL_LIBAVCODEC_SONAME, "LIBAVCODEC_" TPUHAL_STR(TPUHAL_LIBAVCODEC_MAJOR)},
    {TPUHAL_LIBAVFORMAT_SONAME, "LIBAVFORMAT_" TPUHAL_STR(TPUHAL_LIBAVFORMAT_MAJOR)},
}};
#undef TPUHAL_STR
#undef TPUHAL_STR2

// Debian names a library's package after its soname: libavcodec.so.59 is in
// libavcodec59.
std::string package_of(const std::string& soname) {
  const auto so = soname.find(".so.");
  return so == std::string::npos ? soname : soname.substr(0, so) + soname.substr(so + 4);
}

struct Loaded {
  Api api;
  std::once_flag once[2];
  const Api* ok[2] = {nullptr, nullptr};
  std::string why[2];
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

// Opens `lib` (never closed: codec threads and callbacks may outlive
// any moment we could prove safe to unload it).
bool open(Library& lib, std::string& why) {
  if (lib.handle) return true;
  const char* dir = std::getenv("TPUHAL_FFMPEG_DIR");
  const std::string path = dir && *dir ? std::string(dir) + "/" + lib.soname : lib.soname;
  lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle) return true;
  const char* err = dlerror();
  why = std::string(lib.soname) + " could not be loaded (" + (err ? err : "unknown error") + ")";
  return false;
}

void* symbol(const Library& lib, const char* name) {
  // The version the headers describe first; a build without symbol
  // versions exports the plain name only.
  if (void* f = dlvsym(lib.handle, name, lib.version)) return f;
  return dlsym(lib.handle, name);
}

const Api* load_part(Loaded& l, Part part, std::string& why) {
  const int last = part == Part::kDemux ? avformat : avcodec;
  for (int i = 0; i <= last; ++i)
    if (!open(libraries[i], why)) {
      why += "; install FFmpeg's";
      for (int j = 0; j <= last; ++j) why += std::string(" ") + package_of(libraries[j].soname);
      return nullptr;
    }
  std::string missing;
  auto resolve = [&](int library, const char* name, auto& slot) {
    if (library > last || slot) return;
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol(libraries[library], name));
    if (!slot) missing += (missing.empty() ? "" : ", ") + std::string(name) + " (" + libraries[library].soname + ")";
  };
#define TPUHAL_FFMPEG_ENTRY(library, name) resolve(library, #name, l.api.name);
#include "tpuhal/base/ffmpeg_entries.inc"
#undef TPUHAL_FFMPEG_ENTRY
  if (!missing.empty()) {
    why = "FFmpeg lacks entry points tpuhal uses: " + missing;
    return nullptr;
  }
  return &l.api;
}

}  // namespace

const Api* load(Part part, std::string* why) {
  Loaded& l = loaded();
  const int p = part == Part::kDemux ? 1 : 0;
  // Decoding's entry points are demuxing's too: one part at a time.
  static std::mutex mu;
  std::call_once(l.once[p], [&] {
    std::lock_guard lock(mu);
    l.ok[p] = load_part(l, part, l.why[p]);
  });
  if (!l.ok[p] && why) *why = l.why[p];
  return l.ok[p];
}

}  // namespace tpuhal::base::ffmpeg
