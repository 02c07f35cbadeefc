// fw::usb_message_bytes / decode_usb_message: the USB wire format, both
// sides (the board reading the host's bulk OUT stream, the host reading the
// board's bulk IN stream), and the identity and interrupt records.
//
// Input: byte 0 bit 0 picks the direction (0: to the board), bits 1-2 a
// max_data limit (64 KiB, 1 KiB, 1 MiB, 40 bytes); the rest is a stream of
// messages, read the way a transport reads it: a header's length, then the
// message.
// Properties: refusals read as sentences; an accepted message lies inside
// the stream, travels in the direction read, respects the limit, and
// append_usb_message re-encodes it to exactly the bytes it came from.
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/usb.h"

namespace fw = tpuhal::fw;

namespace {

void check_message(const fw::Problem& p) {
  const std::string msg = fw::describe_usb_problem(p);
  FUZZ_CHECK(tpuhal::fuzz::printable(msg) && msg.rfind("usb: ", 0) == 0, "message \"%s\"", msg.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto direction = (data[0] & 1) ? fw::UsbDirection::kToHost : fw::UsbDirection::kToBoard;
  constexpr std::uint32_t kLimits[] = {64 * 1024, 1024, fw::kUsbMaxData, 40};
  const std::uint32_t max_data = kLimits[(data[0] >> 1) & 3];
  std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data + 1), size - 1);

  // The records that are not messages.
  if (auto id = fw::decode_usb_identity(rest.first(std::min(rest.size(), sizeof(fw::UsbIdentity)))); id)
    FUZZ_CHECK(id->max_data > 0 && id->max_data <= fw::kUsbMaxData, "identity max_data %u", id->max_data);
  if (auto irq = fw::decode_usb_interrupt(rest.first(std::min(rest.size(), sizeof(fw::UsbInterrupt)))); irq)
    FUZZ_CHECK(irq->vectors != 0, "an interrupt with no vector");

  while (!rest.empty()) {
    auto n = fw::usb_message_bytes(rest, direction, max_data);
    if (!n) {
      check_message(n.problem());
      return 0;
    }
    FUZZ_CHECK(*n >= sizeof(fw::UsbHeader) && *n - sizeof(fw::UsbHeader) <= max_data, "length %llu",
               static_cast<unsigned long long>(*n));
    if (*n > rest.size()) return 0;  // the rest would come in the next transfer
    const auto whole = rest.first(*n);
    auto m = fw::decode_usb_message(whole, direction, fw::kBar0Size, max_data);
    if (!m) {
      check_message(m.problem());
    } else {
      std::vector<std::byte> again;
      fw::append_usb_message(again, m->type, m->tag, m->arg[0], m->arg[1], m->data, m->sequence, m->flags);
      FUZZ_CHECK(again.size() == whole.size() && std::memcmp(again.data(), whole.data(), whole.size()) == 0,
                 "%s does not re-encode to its bytes", fw::to_string(m->type));
      FUZZ_CHECK((direction == fw::UsbDirection::kToHost) == (m->sequence != 0), "sequence %u", m->sequence);
    }
    rest = rest.subspan(*n);
  }
  return 0;
}
