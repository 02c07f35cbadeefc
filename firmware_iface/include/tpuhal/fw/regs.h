// BAR0: the board's register window (64 KiB, 32-bit little-endian registers).
//
//   0x0000  identity, version, capabilities, reset/status, time
//   0x0060  interrupt status / mask / acknowledge
//   0x0080  firmware mailbox
//   0x0100  memory regions the board advertises (kMaxMemRegions x 0x40)
//   0x0300  board model name
//   0x1000  per-queue registers (kMaxQueues x 0x40)
//
// 64-bit values are split into _LO/_HI registers; reading _LO latches _HI so
// a LO-then-HI read pair is consistent.
#pragma once

#include <cstdint>

namespace tpuhal::fw {

inline constexpr std::uint32_t kBar0Size = 64 * 1024;
inline constexpr std::uint32_t kIdMagic = 0x48555054;  // "TPUH" little-endian

namespace reg {
// Identity and global control.
inline constexpr std::uint32_t kIdMagic = 0x0000;          // RO  fw::kIdMagic
inline constexpr std::uint32_t kIfaceVersion = 0x0004;     // RO  Version::packed()
inline constexpr std::uint32_t kDriverVersion = 0x0008;    // RW  driver's chosen version
inline constexpr std::uint32_t kVendorDevice = 0x000C;     // RO  PCI vendor << 16 | device
inline constexpr std::uint32_t kBoardId = 0x0010;          // RO  board model number
inline constexpr std::uint32_t kBoardRevision = 0x0014;    // RO
inline constexpr std::uint32_t kSerialLo = 0x0018;         // RO
inline constexpr std::uint32_t kSerialHi = 0x001C;         // RO
inline constexpr std::uint32_t kCaps = 0x0020;             // RO  kCap* bits
inline constexpr std::uint32_t kFirmwareVersion = 0x0024;  // RO  major << 16 | minor << 8 | patch
inline constexpr std::uint32_t kDramSizeLo = 0x0028;       // RO  bytes of device DRAM
inline constexpr std::uint32_t kDramSizeHi = 0x002C;
inline constexpr std::uint32_t kApertureLo = 0x0030;  // RO  bytes of DRAM visible through BAR2
inline constexpr std::uint32_t kApertureHi = 0x0034;
inline constexpr std::uint32_t kNumQueues = 0x0038;   // RO  hardware queues (<= kMaxQueues)
inline constexpr std::uint32_t kNumVectors = 0x003C;  // RO  interrupt vectors (queues + 1)
inline constexpr std::uint32_t kControl = 0x0040;     // RW  kControl* bits
inline constexpr std::uint32_t kStatus = 0x0044;      // RO  kStatus* bits
inline constexpr std::uint32_t kFatalCode = 0x0048;   // RO  CmdStatus of a fatal error
inline constexpr std::uint32_t kScratch = 0x004C;     // RW  free for the driver
inline constexpr std::uint32_t kTimeLo = 0x0050;      // RO  board time, ns since reset
inline constexpr std::uint32_t kTimeHi = 0x0054;
inline constexpr std::uint32_t kMaxRingEntries = 0x0058;  // RO  largest ring a queue takes
inline constexpr std::uint32_t kNumMemRegions = 0x005C;   // RO  (<= kMaxMemRegions)

// Interrupts. Vector q (q < NUM_QUEUES) belongs to queue q, vector NUM_QUEUES
// to device events (fatal errors, mailbox). Status bit q mirrors vector q;
// bit 31 is the device vector. A vector fires only while its mask bit is set.
inline constexpr std::uint32_t kIntStatus = 0x0060;  // RO  pending bits
inline constexpr std::uint32_t kIntMask = 0x0064;    // RW  1 = enabled
inline constexpr std::uint32_t kIntAck = 0x0068;     // WO  write 1s to clear pending bits

// Compute and video resources, for the device's properties.
inline constexpr std::uint32_t kFp32Gflops = 0x006C;      // RO  peak fp32 GFLOPS
inline constexpr std::uint32_t kTensorCores = 0x0070;     // RO  tensor cores
inline constexpr std::uint32_t kInt8Gops = 0x0074;        // RO  peak int8 GOPS
inline constexpr std::uint32_t kFp16Gflops = 0x0078;      // RO  peak fp16/bf16 GFLOPS
inline constexpr std::uint32_t kDecodeChannels = 0x007C;  // RO  video decoder channels

// Firmware mailbox: write ARGs, then CMD; poll STATUS until DONE or ERROR.
inline constexpr std::uint32_t kMboxCmd = 0x0080;     // WO  MboxCmd; starts the command
inline constexpr std::uint32_t kMboxStatus = 0x0084;  // RO  MboxStatus
inline constexpr std::uint32_t kMboxArg0Lo = 0x0088;
inline constexpr std::uint32_t kMboxArg0Hi = 0x008C;
inline constexpr std::uint32_t kMboxArg1Lo = 0x0090;
inline constexpr std::uint32_t kMboxArg1Hi = 0x0094;
inline constexpr std::uint32_t kMboxRes0Lo = 0x0098;
inline constexpr std::uint32_t kMboxRes0Hi = 0x009C;
inline constexpr std::uint32_t kMboxRes1Lo = 0x00A0;
inline constexpr std::uint32_t kMboxRes1Hi = 0x00A4;
inline constexpr std::uint32_t kMboxSeq = 0x00A8;  // RO  commands completed

// Video (interface 1.2): the driver writes a channel number after freeing
// frame slots so that a channel waiting for one resumes (video.h).
inline constexpr std::uint32_t kVideoDoorbell = 0x00AC;  // WO  channel
inline constexpr std::uint32_t kVideoCodecs = 0x00B0;    // RO  bit c set: VideoCodec c decodes

// Memory regions: region i at kMemRegionBase + i * kMemRegionStride.
inline constexpr std::uint32_t kMemRegionBase = 0x0100;
inline constexpr std::uint32_t kMemRegionStride = 0x40;
namespace region {
inline constexpr std::uint32_t kName = 0x00;    // 16 bytes, NUL-padded ASCII
inline constexpr std::uint32_t kBaseLo = 0x10;  // device address
inline constexpr std::uint32_t kBaseHi = 0x14;
inline constexpr std::uint32_t kSizeLo = 0x18;
inline constexpr std::uint32_t kSizeHi = 0x1C;
inline constexpr std::uint32_t kFlags = 0x20;  // kRegion* bits
}  // namespace region

// The board's model name: 64 bytes of NUL-padded ASCII.
inline constexpr std::uint32_t kBoardName = 0x0300;
inline constexpr std::uint32_t kBoardNameBytes = 64;

// Queue q's registers at kQueueBase + q * kQueueStride.
inline constexpr std::uint32_t kQueueBase = 0x1000;
inline constexpr std::uint32_t kQueueStride = 0x40;
namespace queue {
inline constexpr std::uint32_t kEngine = 0x00;      // RO  EngineType
inline constexpr std::uint32_t kControl = 0x04;     // RW  kQueueControl* bits
inline constexpr std::uint32_t kStatus = 0x08;      // RO  kQueueStatus* bits
inline constexpr std::uint32_t kRingSize = 0x0C;    // RW  entries, power of two
inline constexpr std::uint32_t kRingBaseLo = 0x10;  // RW  device address (DRAM), 64-aligned
inline constexpr std::uint32_t kRingBaseHi = 0x14;
inline constexpr std::uint32_t kFenceLo = 0x18;  // RW  address of the QueueStatusPage
inline constexpr std::uint32_t kFenceHi = 0x1C;
inline constexpr std::uint32_t kHead = 0x20;      // RO  next descriptor the board reads
inline constexpr std::uint32_t kTail = 0x24;      // RW  doorbell: one past the last published
inline constexpr std::uint32_t kError = 0x28;     // RO  CmdStatus of a configuration error
inline constexpr std::uint32_t kProgress = 0x2C;  // RO  moves while the queue makes progress
inline constexpr std::uint32_t kBusyNsLo = 0x30;  // RO  time spent executing
inline constexpr std::uint32_t kBusyNsHi = 0x34;
inline constexpr std::uint32_t kRetiredLo = 0x38;  // RO  descriptors retired
inline constexpr std::uint32_t kRetiredHi = 0x3C;
}  // namespace queue

constexpr std::uint32_t queue_reg(std::uint32_t q, std::uint32_t r) { return kQueueBase + q * kQueueStride + r; }
constexpr std::uint32_t region_reg(std::uint32_t i, std::uint32_t r) {
  return kMemRegionBase + i * kMemRegionStride + r;
}
}  // namespace reg

inline constexpr std::uint32_t kMaxQueues = 31;
inline constexpr std::uint32_t kMaxMemRegions = 8;
inline constexpr std::uint32_t kDeviceVectorBit = 1u << 31;
static_assert(reg::kQueueBase + kMaxQueues * reg::kQueueStride <= kBar0Size);
static_assert(reg::kMemRegionBase + kMaxMemRegions * reg::kMemRegionStride <= reg::kBoardName);
static_assert(reg::kBoardName + reg::kBoardNameBytes <= reg::kQueueBase);

// Capability bits (reg::kCaps).
inline constexpr std::uint32_t kCapCopySg = 1u << 0;         // opcode kCopySg
inline constexpr std::uint32_t kCapFill = 1u << 1;           // opcode kFill
inline constexpr std::uint32_t kCapWaitValue = 1u << 2;      // opcodes kWaitValue, kWriteValue
inline constexpr std::uint32_t kCapTimestamp = 1u << 3;      // opcode kTimestamp
inline constexpr std::uint32_t kCapHostAperture = 1u << 4;   // BAR2 maps DRAM for the host
inline constexpr std::uint32_t kCapUnifiedMemory = 1u << 5;  // SoC: all DRAM host-mappable
inline constexpr std::uint32_t kCapTensor = 1u << 6;         // tensor engine opcodes
inline constexpr std::uint32_t kCapVideoDecode = 1u << 7;    // video engine opcodes
inline constexpr std::uint32_t kCapTelemetry = 1u << 8;      // MboxCmd::kTelemetry (telemetry.h)
inline constexpr std::uint32_t kCapModelledTime = 1u << 9;   // 1.9: the clock is a timing model's (timing.h)
inline constexpr std::uint32_t kCapTimingModel = 1u << 10;   // 1.9: MboxCmd::kTimingModel (timing.h)

// Global control and status (reg::kControl, reg::kStatus).
inline constexpr std::uint32_t kControlEnable = 1u << 0;
inline constexpr std::uint32_t kControlReset = 1u << 1;  // self-clearing
inline constexpr std::uint32_t kStatusReady = 1u << 0;
inline constexpr std::uint32_t kStatusVersionOk = 1u << 1;
inline constexpr std::uint32_t kStatusVersionRejected = 1u << 2;
inline constexpr std::uint32_t kStatusFatal = 1u << 3;

// Memory region flags.
inline constexpr std::uint32_t kRegionHostVisible = 1u << 0;  // inside the BAR2 aperture
inline constexpr std::uint32_t kRegionDefault = 1u << 1;      // default heap for device memory
inline constexpr std::uint32_t kRegionReserved = 1u << 2;     // firmware's; not for allocation

// Per-queue control and status.
inline constexpr std::uint32_t kQueueControlEnable = 1u << 0;
inline constexpr std::uint32_t kQueueControlReset = 1u << 1;  // self-clearing; drops the ring
inline constexpr std::uint32_t kQueueStatusEnabled = 1u << 0;
inline constexpr std::uint32_t kQueueStatusBusy = 1u << 1;
inline constexpr std::uint32_t kQueueStatusWaiting = 1u << 2;  // blocked in kWaitValue or kWaitTime
inline constexpr std::uint32_t kQueueStatusFaulted = 1u << 3;

enum class EngineType : std::uint32_t {
  kNone = 0,
  kCompute = 1,  // every opcode
  kCopy = 2,     // DMA and synchronisation opcodes only
  kVideo = 3,    // video opcodes plus DMA and synchronisation
};
const char* to_string(EngineType engine) noexcept;

enum class MboxCmd : std::uint32_t {
  kNone = 0,
  kPing = 1,         // res0 = ~arg0
  kGetUptime = 2,    // res0 = ns since the last reset
  kGetBuildId = 3,   // res0 = firmware build identifier
  kQueueStats = 4,   // arg0 = queue; res0 = busy ns, res1 = descriptors retired
  kTelemetry = 5,    // 1.6: arg0 = host address, arg1 = bytes; writes the block (telemetry.h)
  kTimingModel = 6,  // 1.9: arg0 = host address, arg1 = bytes; writes the TimingModel (timing.h), res0 = its bytes
};
enum class MboxStatus : std::uint32_t { kIdle = 0, kBusy = 1, kDone = 2, kError = 3 };

}  // namespace tpuhal::fw
