// FFmpeg as the simulated codec unit and the demuxer reach it: libavutil,
// libavcodec and libavformat opened at run time, so that libtpuhal and the
// simulator daemon run without them (a service image without FFmpeg, a host
// that decodes on a real board) and say what is missing when video is asked
// for. The libraries are the majors of the headers the build compiled
// against; their names come from the build (TPUHAL_LIBAV*_SONAME), which
// also hands them to the packages as recommendations.
#pragma once

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavcodec/bsf.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libavutil/log.h>
#include <libavutil/md5.h>
#include <libavutil/mem.h>
}

#include <string>

namespace tpuhal::base::ffmpeg {

// What a caller needs: decoding (libavutil and libavcodec) or demuxing
// (libavformat as well).
enum class Part { kDecode, kDemux };

struct Api {
#define TPUHAL_FFMPEG_ENTRY(library, name) decltype(&::name) name = nullptr;
#include "tpuhal/base/ffmpeg_entries.inc"
#undef TPUHAL_FFMPEG_ENTRY
};

// The entry points, with every library `part` needs loaded, or null with
// `why` naming the library that could not be loaded, why, and the Debian
// package that has it ("libavformat.so.59 could not be loaded (...); install
// libavformat59"). Loads once per process and part; never unloads.
// TPUHAL_FFMPEG_DIR names a folder to load the same majors from instead of
// the system's search path.
const Api* load(Part part, std::string* why);

}  // namespace tpuhal::base::ffmpeg
