#include "isa.h"

#include <cstdlib>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>

namespace tpuhal::sim::tensor {
namespace {

struct Level {
  Isa isa;
  std::string_view name;
};

#if defined(__x86_64__)
constexpr Level kLevels[] = {{Isa::kSse2, "sse2"},
                             {Isa::kSse41, "sse41"},
                             {Isa::kAvx2, "avx2"},
                             {Isa::kAvx512, "avx512"},
                             {Isa::kAvx512Vnni, "avx512_vnni"}};
#elif defined(__aarch64__)
constexpr Level kLevels[] = {{Isa::kGeneric, "generic"}, {Isa::kNeon, "neon"}};
#else
constexpr Level kLevels[] = {{Isa::kGeneric, "generic"}};
#endif

constexpr const char* kEnv = "TPUHAL_MAX_ISA";

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kSse2: return "sse2";
    case Isa::kSse41: return "sse41";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Vnni: return "avx512_vnni";
    case Isa::kNeon: return "neon";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (const Level& l : kLevels)
    if (l.name == name) return l.isa;
  return std::nullopt;
}

std::string isa_levels() {
  std::string out;
  for (const Level& l : kLevels) {
    if (!out.empty()) out += ", ";
    out += l.name;
  }
  return out;
}

Isa isa_detected() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("sse4.1")) return Isa::kSse2;
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return Isa::kSse41;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")))
    return Isa::kAvx2;
  if (!__builtin_cpu_supports("avx512vnni")) return Isa::kAvx512;
  return Isa::kAvx512Vnni;
#elif defined(__aarch64__)
  return Isa::kNeon;
#else
  return Isa::kGeneric;
#endif
}

Isa isa_from_env() {
  const Isa have = isa_detected();
  const char* env = std::getenv(kEnv);
  if (!env || !*env) return have;
  const auto cap = parse_isa(env);
  if (!cap)
    throw std::invalid_argument(std::string(kEnv) + "=" + env +
                                ": not an instruction-set level of this machine; one of " + isa_levels());
  return static_cast<std::uint8_t>(*cap) < static_cast<std::uint8_t>(have) ? *cap : have;
}

void cap_onednn(Isa isa) {
  static std::once_flag once;
  std::call_once(once, [isa] {
    if (std::getenv("ONEDNN_MAX_CPU_ISA") || std::getenv("DNNL_MAX_CPU_ISA")) return;
    dnnl::cpu_isa cap = dnnl::cpu_isa::all;
    switch (isa) {
      case Isa::kSse2:
      case Isa::kSse41: cap = dnnl::cpu_isa::sse41; break;
      case Isa::kAvx2: cap = dnnl::cpu_isa::avx2; break;
      case Isa::kAvx512: cap = dnnl::cpu_isa::avx512_core; break;
      case Isa::kAvx512Vnni:
        // The whole machine unless the cap asked for exactly this level.
        if (const char* env = std::getenv(kEnv); env && *env) cap = dnnl::cpu_isa::avx512_core_vnni;
        break;
      default: break;
    }
    if (cap != dnnl::cpu_isa::all) dnnl::set_max_cpu_isa(cap);  // refused once oneDNN has started: nothing to do
  });
}

#if defined(__x86_64__)
namespace {
// Whether oneDNN, under its cap, runs this CPU's `want` instructions.
bool onednn_runs(dnnl::cpu_isa want) {
  const auto w = static_cast<unsigned>(want);
  return (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & w) == w;
}
}  // namespace
#endif

bool onednn_int8_exact(Isa isa) {
#if defined(__x86_64__)
  return isa == Isa::kAvx512Vnni && onednn_runs(dnnl::cpu_isa::avx512_core_vnni);
#else
  (void)isa;
  return false;
#endif
}

bool onednn_int8_exact_on_nibbles(Isa isa) {
#if defined(__x86_64__)
  if (isa != Isa::kAvx2 && isa != Isa::kAvx512) return onednn_int8_exact(isa);
  return onednn_runs(dnnl::cpu_isa::avx2);
#else
  (void)isa;
  return false;
#endif
}

bool onednn_int8_depthwise_exact(Isa isa) { return onednn_int8_exact_on_nibbles(isa); }

bool onednn_has_native_bf16() {
#if defined(__x86_64__)
  return onednn_runs(dnnl::cpu_isa::avx512_core_bf16);
#else
  return false;
#endif
}

bool onednn_has_bf16() {
#if defined(__x86_64__)
  return onednn_runs(dnnl::cpu_isa::avx512_core);
#else
  return false;
#endif
}

}  // namespace tpuhal::sim::tensor
