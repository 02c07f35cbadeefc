// The instruction-set levels the tensor engine's own kernels are built for,
// chosen at run time from what this CPU has and capped from outside by
// TPUHAL_MAX_ISA (docs/ops.md). Internal to the simulator.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tpuhal::sim::tensor {

// Each level includes the ones before it on its architecture.
enum class Isa : std::uint8_t {
  kGeneric,     // portable C++ (arm64's lowest level, and any other architecture)
  kSse2,        // x86-64 baseline
  kSse41,       // + SSE4.1 (widening loads)
  kAvx2,        // + AVX2, FMA, F16C
  kAvx512,      // + AVX-512 F, BW, DQ, VL
  kAvx512Vnni,  // + AVX-512 VNNI
  kNeon,        // arm64 Advanced SIMD
};

std::string_view isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view name);

// The best level this CPU (and its operating system) supports.
Isa isa_detected();
// The levels of this architecture, lowest first, separated by ", ".
std::string isa_levels();

// The level the engine runs at: isa_detected(), capped by TPUHAL_MAX_ISA
// when set. A level above the CPU's is capped to the CPU's; a name that is
// not a level of this architecture throws std::invalid_argument naming the
// variable, the value and the levels.
Isa isa_from_env();

// Applies the cap to oneDNN as well (its lowest level is SSE4.1), unless
// ONEDNN_MAX_CPU_ISA is set, which oneDNN reads itself. oneDNN takes one
// cap per process, before its first primitive: the first call wins.
void cap_onednn(Isa isa);

// Whether oneDNN's int8 kernels may run ops for an engine at `isa`: only
// with AVX-512 VNNI, where every product and sum is kept exact in int32
// (vpdpbusd). Without VNNI oneDNN multiplies with vpmaddubsw, whose 16-bit
// pair sums saturate.
bool onednn_int8_exact(Isa isa);
// Whether oneDNN's int8 kernels are exact here for u8 inputs of at most 15
// (an input's nibbles): with VNNI, and on AVX2 and AVX-512 without it,
// where vpmaddubsw's pair sums of such products stay within 2 * 15 * 128.
bool onednn_int8_exact_on_nibbles(Isa isa);
// Whether oneDNN's depthwise int8 kernels (weights blocked by group only)
// are exact here on whole u8 bytes: with VNNI, and on AVX2 and AVX-512
// without it, where they widen each byte to 32 bits before multiplying
// instead of pairing products in 16 bits (dnnl_conv() checks that oneDNN
// chose such a kernel). Not on s8 inputs, which oneDNN 2.6 gets wrong at
// the borders (NHWC) and with a zero point: the engine flips them to u8.
bool onednn_int8_depthwise_exact(Isa isa);
// Whether oneDNN has bf16 kernels on this CPU, emulated on AVX-512 or
// native (else bf16 is widened to f32, which is exact).
bool onednn_has_bf16();
// Whether oneDNN multiplies bf16 in hardware here (AVX512_BF16, AMX), twice
// to several times the rate of f32.
bool onednn_has_native_bf16();

}  // namespace tpuhal::sim::tensor
