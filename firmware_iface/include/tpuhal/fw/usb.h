// The firmware interface over USB (docs/usb.md).
//
// A USB board has no BARs: its register accesses, device-memory accesses,
// its DMA into and out of host memory and its interrupts all travel as
// messages on one interface:
//
//   EP0 (control)        vendor request kUsbGetIdentity: the UsbIdentity below
//   bulk OUT kUsbEpOut   host -> board messages
//   bulk IN  kUsbEpIn    board -> host messages
//   interrupt IN kUsbEpIrq  UsbInterrupt notifications
//
// Every bulk message is a UsbHeader followed by its fixed arguments and, for
// the data-carrying types, `data_bytes` of payload; several may share one
// transfer and one may span transfers (a reader reassembles by length:
// usb_message_bytes(), UsbSplitter). The board executes host messages in
// order. Its own messages carry a sequence number, and an interrupt
// notification names the last sequence sent before it, so the host applies
// every write the board made before it delivers the interrupt that
// announces them: the bulk and interrupt pipes are independent and USB
// does not order them.
//
// DMA is reversed: the board cannot reach host memory, so it asks. The host
// tells it what it mapped (kMapDma, kUnmapDma) so that the board can fault a
// command before asking; the host's own table stays the authority. A
// kHostRead names an IOVA range the driver mapped (Transport::map_dma) and a
// tag; the host answers with kHostData carrying the bytes and the same tag.
// kHostWrite carries bytes the board writes to host memory (fences, status
// pages, device-to-host copies). The host checks every range against its
// mappings: a board that names memory the driver did not map gets a
// kHostData with kUsbFlagFault and no bytes, which it reports as a DMA fault.
//
// Firmware upload: a board without firmware enumerates with its loader
// product ID and takes kFwBegin, kFwData..., kFwCommit; it checks the image
// (image.h) and answers kFwStatus; on success it detaches and re-enumerates
// with its application product ID.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tpuhal/fw/result.h"

namespace tpuhal::fw {

inline constexpr std::uint8_t kUsbEpOut = 0x01;
inline constexpr std::uint8_t kUsbEpIn = 0x81;
inline constexpr std::uint8_t kUsbEpIrq = 0x82;
// Control requests (bmRequestType: vendor, interface).
inline constexpr std::uint8_t kUsbGetIdentity = 0x01;  // device-to-host, 64 bytes
inline constexpr std::uint8_t kUsbResetLink = 0x02;    // host-to-device: drop partial messages

inline constexpr std::uint32_t kUsbMagic = 0x42535554;  // "TUSB"

// The simulator's USB gadget enumerates with pid.codes' test IDs (a real
// board has its vendor's own): the application firmware, and the loader.
inline constexpr std::uint16_t kUsbSimVendor = 0x1209;
inline constexpr std::uint16_t kUsbSimProduct = 0x0001;
inline constexpr std::uint16_t kUsbSimLoaderProduct = 0x0002;
inline constexpr std::uint32_t kUsbMaxData = 1u << 20;  // payload per message
// The largest bulk transfer either side sends: a whole message of the
// largest payload fits, and it is a multiple of every max packet size. A
// receiver whose buffers are this large gets every message sent in one
// transfer whole.
inline constexpr std::size_t kUsbTransferBytes = kUsbMaxData + (64u << 10);

enum class UsbMode : std::uint32_t { kLoader = 1, kApplication = 2 };

// What kUsbGetIdentity returns.
struct UsbIdentity {
  std::uint32_t magic;  // kUsbMagic
  std::uint32_t mode;   // UsbMode
  std::uint32_t board_id;
  std::uint32_t iface_version;  // Version::packed; 0 in loader mode
  std::uint32_t firmware_version;
  std::uint32_t max_data;      // largest payload per message it takes (<= kUsbMaxData)
  std::uint32_t reserved[10];  // 0
};
static_assert(sizeof(UsbIdentity) == 64);

enum class UsbType : std::uint16_t {
  // host -> board
  kRegWrite = 0x01,  // args: offset, value (posted)
  kRegRead = 0x02,   // args: offset -> kRegValue with the same tag
  kMemWrite = 0x03,  // args: device address; data: bytes to write
  kMemRead = 0x04,   // args: device address, bytes -> kMemData with the same tag
  kHostData = 0x05,  // args: iova; data: the bytes a kHostRead asked for (tag = its tag)
  kMapDma = 0x06,    // args: iova, bytes (page-aligned); flag kUsbFlagDeviceWrites: the board may write
  kUnmapDma = 0x07,  // args: iova, bytes: exactly a range kMapDma mapped
  kFwBegin = 0x10,   // args: image bytes (loader mode)
  kFwData = 0x11,    // args: offset into the image; data: image bytes
  kFwCommit = 0x12,  // args: the image's crc32c -> kFwStatus
  // board -> host
  kRegValue = 0x81,   // args: offset, value
  kMemData = 0x83,    // args: device address; data
  kHostRead = 0x84,   // args: iova, bytes (tag: answer with it)
  kHostWrite = 0x85,  // args: iova; data
  kError = 0x86,      // args: CmdStatus, the offending message's type, value: a host message refused
  kFwStatus = 0x90,   // args: CmdStatus (kOk: accepted; the board re-enumerates) | image Problem field << 32,
                      //       the Problem's value
};
const char* to_string(UsbType type) noexcept;  // "reg-write"; "unknown" off the list

inline constexpr std::uint16_t kUsbFlagFault = 1;         // kHostData: the range is not mapped (no data)
inline constexpr std::uint16_t kUsbFlagDeviceWrites = 2;  // kMapDma: writable as well as readable
inline constexpr std::uint64_t kUsbPage = 4096;           // kMapDma / kUnmapDma granularity

struct UsbHeader {
  std::uint32_t magic;       // kUsbMagic
  std::uint16_t type;        // UsbType
  std::uint16_t flags;       // kUsbFlagFault on kHostData, kUsbFlagDeviceWrites on kMapDma; else 0
  std::uint32_t sequence;    // board messages: usb_wire_sequence(1, 2, 3, ... per link); host messages: 0
  std::uint32_t data_bytes;  // payload after the arguments
  std::uint64_t tag;         // pairs requests and replies
  std::uint64_t arg[2];
};
static_assert(sizeof(UsbHeader) == 40);

struct UsbInterrupt {
  std::uint32_t magic;           // kUsbMagic
  std::uint32_t vectors;         // bit v: vector v fired
  std::uint64_t after_sequence;  // deliver once board messages up to this count are applied (not wrapped)
};

// Board message number `count` (1, 2, 3, ... per link) as its header carries
// it: 32 bits that never read 0, so after 4294967295 comes 1 again. Both
// sides count in 64 bits; a link outlives 2^32 messages (days of small
// ones) this way.
constexpr std::uint32_t usb_wire_sequence(std::uint64_t count) noexcept {
  return count == 0 ? 0 : static_cast<std::uint32_t>((count - 1) % 0xFFFFFFFFull + 1);
}
static_assert(sizeof(UsbInterrupt) == 16);

// A decoded message: the header's fields and a view of its payload.
struct UsbMessage {
  UsbType type{};
  std::uint16_t flags = 0;
  std::uint32_t sequence = 0;
  std::uint64_t tag = 0;
  std::uint64_t arg[2]{};
  std::span<const std::byte> data;
};

// Problem::field values (Problem::value: the offending value, detail: a limit
// or the message type).
inline constexpr std::uint16_t kFieldUsbMagic = 0x300;
inline constexpr std::uint16_t kFieldUsbType = 0x301;
inline constexpr std::uint16_t kFieldUsbFlags = 0x302;
inline constexpr std::uint16_t kFieldUsbLength = 0x303;     // data_bytes
inline constexpr std::uint16_t kFieldUsbArg = 0x304;        // an argument; detail = type
inline constexpr std::uint16_t kFieldUsbDirection = 0x305;  // a board message sent by the host or back
inline constexpr std::uint16_t kFieldUsbSequence = 0x306;

enum class UsbDirection : std::uint8_t { kToBoard, kToHost };

// The whole length of the message whose header starts `bytes` (which must
// hold at least sizeof(UsbHeader)), after checking the header: magic, type
// (and that it travels in `direction`), flags, data_bytes against `max_data`.
Result<std::uint64_t> usb_message_bytes(std::span<const std::byte> bytes, UsbDirection direction,
                                        std::uint32_t max_data = kUsbMaxData);

// Decodes exactly one message (`bytes` is its whole length, as
// usb_message_bytes gave), checking its arguments: register offsets
// 4-aligned and below `bar0_size`, sizes against `max_data`, reserved
// arguments zero, data present exactly where the type carries it.
Result<UsbMessage> decode_usb_message(std::span<const std::byte> bytes, UsbDirection direction, std::uint32_t bar0_size,
                                      std::uint32_t max_data = kUsbMaxData);

Result<UsbIdentity> decode_usb_identity(std::span<const std::byte> bytes);
Result<UsbInterrupt> decode_usb_interrupt(std::span<const std::byte> bytes);

// The header of a message whose `data_bytes` of payload the sender puts
// beside it itself (a gathered write, a transfer filled in place).
inline UsbHeader usb_header(UsbType type, std::uint64_t tag, std::uint64_t arg0, std::uint64_t arg1,
                            std::uint32_t data_bytes, std::uint32_t sequence = 0, std::uint16_t flags = 0) {
  return {kUsbMagic, static_cast<std::uint16_t>(type), flags, sequence, data_bytes, tag, {arg0, arg1}};
}

// Appends a message to `out` (tools, tests and both sides' senders).
void append_usb_message(std::vector<std::byte>& out, UsbType type, std::uint64_t tag, std::uint64_t arg0,
                        std::uint64_t arg1 = 0, std::span<const std::byte> data = {}, std::uint32_t sequence = 0,
                        std::uint16_t flags = 0);

// The messages of a firmware upload, tagged `tag`: fw-begin, the image in
// fw-data chunks of at most `max_data` bytes (the loader's identity), and
// fw-commit with the image's CRC-32C; packed into bulk transfers of at most
// kUsbTransferBytes each, whatever `max_data` (1..kUsbMaxData) is.
std::vector<std::vector<std::byte>> usb_upload_transfers(std::span<const std::byte> image, std::uint32_t max_data,
                                                         std::uint32_t crc32c, std::uint64_t tag);

// "usb: message type 0x7 is unknown", ...
std::string describe_usb_problem(const Problem& p);

// Cuts a bulk stream into whole messages, for either side's receiver. The
// messages inside a received buffer are handed over where they lie; only a
// message cut between buffers is copied, into the splitter, to be made
// whole.
class UsbSplitter {
 public:
  explicit UsbSplitter(UsbDirection direction, std::uint32_t max_data = kUsbMaxData)
      : direction_(direction), max_data_(max_data) {}

  enum class Fed : std::uint8_t { kAll, kStopped };
  // Hands every whole message of the stream so far (an unfinished one from
  // earlier calls, then `bytes`) to `on_message`, in order, and keeps an
  // unfinished last one. kStopped: on_message returned false, and the rest
  // of `bytes` was dropped. A header that does not check out
  // (usb_message_bytes) is a Problem: nothing after it can be trusted, and
  // the splitter holds nothing more until it is fed again.
  Result<Fed> feed(std::span<const std::byte> bytes, const std::function<bool(std::span<const std::byte>)>& on_message);
  // Drops an unfinished message (the link was reset).
  void reset() noexcept { partial_.clear(); }
  // The bytes of an unfinished message held.
  std::size_t held() const noexcept { return partial_.size(); }

 private:
  UsbDirection direction_;
  std::uint32_t max_data_;
  std::vector<std::byte> partial_;
};

}  // namespace tpuhal::fw
