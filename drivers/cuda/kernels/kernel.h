// What every tensor-op kernel of the CUDA shim shares. The kernels are
// written once, as plain C++ functions of one output element, and compiled
// twice: by nvcc into the fatbin the shim loads on a GPU (kernels.cu), and
// by the host compiler into the stand-in driver's table (host_kernels.cpp),
// which runs the same functions over every element when a test launches
// them. So the tests on machines without a GPU check the very code the GPU
// runs, element by element; only the parallel schedule differs.
//
// A kernel is one line of a family's list (elementwise.inc, ...):
//
//   TPUHAL_KERNEL(name, Params, body)
//
// `Params` is a trivially copyable struct passed by value (the launch's only
// parameter) whose first member is `std::uint64_t n`, the number of work
// items; `body(const Params&, std::uint64_t i)` does item i. The GPU entry
// point is "tpuhal_k_<name>", a grid-stride loop over [0, n).
//
// Nothing here may use the C++ library beyond <cstdint>, <cmath>-style
// builtins the device has, and what is defined below: the same source
// must compile for the device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TK_FN __host__ __device__ inline
#else
#define TK_FN inline
#endif

namespace tpuhal::cuda::k {

// tpuhal::DType's values (the shim checks they agree).
enum : std::uint32_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI8 = 3, kU8 = 4, kI32 = 5 };

inline constexpr std::uint32_t kRank = 6;  // tpuhal::kMaxRank

// A tensor as a kernel sees it: device address of element 0, dtype, and
// shape and strides (in elements) of up to kRank dimensions. A broadcast
// dimension has stride 0 (op_desc.hpp). Absent optional tensors have
// addr == 0.
struct Tensor {
  std::uint64_t addr = 0;
  std::uint32_t dtype = kF32;
  std::uint32_t rank = 0;
  std::uint64_t shape[kRank] = {};
  std::int64_t strides[kRank] = {};
};

TK_FN std::uint64_t numel(const Tensor& t) {
  std::uint64_t n = 1;
  for (std::uint32_t d = 0; d < t.rank; ++d) n *= t.shape[d];
  return n;
}

// The element offset (in elements) of row-major linear index `lin` of
// `shape` (the first `rank` dimensions), in a tensor of `t`'s strides.
TK_FN std::int64_t offset_of(const Tensor& t, std::uint64_t lin) {
  std::int64_t off = 0;
  for (std::uint32_t d = t.rank; d-- > 0;) {
    const std::uint64_t s = t.shape[d];
    off += static_cast<std::int64_t>(lin % s) * t.strides[d];
    lin /= s;
  }
  return off;
}

// The element offset of a full index `idx[0..rank)`.
TK_FN std::int64_t offset_at(const Tensor& t, const std::uint64_t* idx) {
  std::int64_t off = 0;
  for (std::uint32_t d = 0; d < t.rank; ++d) off += static_cast<std::int64_t>(idx[d]) * t.strides[d];
  return off;
}

TK_FN std::uint32_t size_of(std::uint32_t dtype) {
  return dtype == kF32 || dtype == kI32 ? 4 : dtype == kF16 || dtype == kBF16 ? 2 : 1;
}

// ---- Half floats, bit-exact on host and device ---------------------------------

TK_FN float bits_float(std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  return __builtin_bit_cast(float, b);
#endif
}
TK_FN std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(std::uint32_t, f);
#endif
}

TK_FN float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // Subnormal: man * 2^-24, exact in f32.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

// Round to nearest even; NaN stays NaN (quiet), overflow goes to infinity.
TK_FN std::uint16_t float_to_f16(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (ax < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24.
    if (ax < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half of 2^-24
    const std::uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // m * 2^(e-150) / 2^-24 = m >> (126 - e)
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t r = ax - 0x38000000u;  // rebias 127 -> 15, in place
  const std::uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

TK_FN float bf16_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

TK_FN std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// ---- Loads and stores ----------------------------------------------------------

template <class T>
TK_FN T* at(const Tensor& t, std::int64_t off) {
  return reinterpret_cast<T*>(t.addr) + off;
}

// Element `off` of a float tensor (f32, f16, bf16) as f32; of an integer
// tensor, its value converted to f32.
TK_FN float load_f(const Tensor& t, std::int64_t off) {
  switch (t.dtype) {
    case kF32: return *at<const float>(t, off);
    case kF16: return f16_to_float(*at<const std::uint16_t>(t, off));
    case kBF16: return bf16_to_float(*at<const std::uint16_t>(t, off));
    case kI8: return static_cast<float>(*at<const std::int8_t>(t, off));
    case kU8: return static_cast<float>(*at<const std::uint8_t>(t, off));
    default: return static_cast<float>(*at<const std::int32_t>(t, off));
  }
}

// Element `off` of an integer tensor (i8, u8, i32).
TK_FN std::int32_t load_i(const Tensor& t, std::int64_t off) {
  switch (t.dtype) {
    case kI8: return *at<const std::int8_t>(t, off);
    case kU8: return *at<const std::uint8_t>(t, off);
    default: return *at<const std::int32_t>(t, off);
  }
}

// Stores an f32 into a float tensor, rounding to nearest even.
TK_FN void store_f(const Tensor& t, std::int64_t off, float v) {
  switch (t.dtype) {
    case kF32: *at<float>(t, off) = v; break;
    case kF16: *at<std::uint16_t>(t, off) = float_to_f16(v); break;
    default: *at<std::uint16_t>(t, off) = float_to_bf16(v); break;
  }
}

// Stores an integer into an integer tensor, wrapping to its width.
TK_FN void store_i(const Tensor& t, std::int64_t off, std::int32_t v) {
  switch (t.dtype) {
    case kI8: *at<std::int8_t>(t, off) = static_cast<std::int8_t>(v); break;
    case kU8: *at<std::uint8_t>(t, off) = static_cast<std::uint8_t>(v); break;
    default: *at<std::int32_t>(t, off) = v; break;
  }
}

TK_FN bool is_float(std::uint32_t dtype) { return dtype <= kBF16; }

// ---- Faults: bad input found while the op runs ---------------------------------
//
// An op whose input can be wrong in a way no check before the run sees (an
// index outside its axis) validates it in a first kernel that raises a
// fault, and its other kernels then write nothing (raised()). The shim
// turns the record into the queue's failure, naming the op and the values
// (docs/cuda.md, Faults).

enum FaultCode : std::uint32_t {
  kFaultNone = 0,
  // a: the index, b: the length of the indexed axis; tensor: the position
  // of the indices tensor among the op's tensors.
  kFaultIndexOutOfRange = 1,
};

// Written in pinned host memory. `claim` goes 0 -> 1 once; the first fault
// fills the fields, then `value` (nonzero) publishes them.
struct FaultRecord {
  std::uint64_t claim;
  std::uint64_t value;     // the submission's timeline value
  std::uint32_t command;   // the command's index in its submission (or program)
  std::uint32_t commands;  // how many the submission (or program) has
  std::uint32_t kind;      // the op's driver::OpKind
  std::uint32_t code;      // FaultCode
  std::uint32_t tensor;
  std::uint32_t call;  // inside a program: 1 + the index of the command that called it; else 0
  std::uint64_t ring;  // the submission's ring position
  std::int64_t a, b;
};

// What a launcher passes a kernel that may fault: where the record is and
// what to say about the command.
struct Fault {
  std::uint64_t record = 0;  // FaultRecord's device address
  std::uint64_t value = 0;   // the submission's timeline value (a program's: 0, set when it is called)
  std::uint64_t ring = 0;
  std::uint32_t command = 0, commands = 0, kind = 0, reserved = 0;
};

TK_FN void raise(const Fault& f, std::uint32_t code, std::uint32_t tensor, std::int64_t a, std::int64_t b) {
  auto* r = reinterpret_cast<FaultRecord*>(f.record);
#if defined(__CUDA_ARCH__)
  if (atomicCAS(reinterpret_cast<unsigned long long*>(&r->claim), 0ull, 1ull) != 0ull) return;
  volatile FaultRecord* v = r;
#else
  if (r->claim != 0) return;
  r->claim = 1;
  FaultRecord* v = r;
#endif
  v->command = f.command;
  v->commands = f.commands;
  v->kind = f.kind;
  v->code = code;
  v->tensor = tensor;
  v->call = 0;
  v->ring = f.ring;
  v->a = a;
  v->b = b;
  // Published last: a reader that sees `value` sees the rest. A program's
  // record is published by its caller (forward_fault) instead.
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  v->value = f.value ? f.value : ~0ull;
  __threadfence_system();
#else
  __atomic_store_n(&r->value, f.value ? f.value : ~0ull, __ATOMIC_RELEASE);
#endif
}

// Whether a fault was raised in this record (by this op's check or an
// earlier op's): the op must then write nothing.
TK_FN bool raised(const Fault& f) {
  const auto* r = reinterpret_cast<const FaultRecord*>(f.record);
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile std::uint64_t*>(&r->claim) != 0;
#else
  return __atomic_load_n(&r->claim, __ATOMIC_ACQUIRE) != 0;
#endif
}

// After a program runs: a fault its kernels raised in the program's record
// moves to the calling queue's record, with the submission's value, and
// the program's record is cleared for its next run.
struct ForwardFaultParams {
  std::uint64_t n;     // 1
  std::uint64_t from;  // the program's FaultRecord
  Fault to;            // the queue's, with the Call command's index
};
TK_FN void forward_fault_body(const ForwardFaultParams& p, std::uint64_t) {
  auto* from = reinterpret_cast<FaultRecord*>(p.from);
  if (from->value == 0) return;
  Fault to = p.to;
  to.command = from->command;
  to.commands = from->commands;
  to.kind = from->kind;
  const std::uint32_t call = p.to.command + 1;
  auto* r = reinterpret_cast<FaultRecord*>(to.record);
  if (r->claim == 0) {
    raise(to, from->code, from->tensor, from->a, from->b);
    r->call = call;  // before the host may look: the stream has not yet written the timeline word
  }
  from->value = 0;
  from->claim = 0;
}

}  // namespace tpuhal::cuda::k
