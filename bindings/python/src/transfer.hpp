// Moving bytes between host memory (NumPy arrays) and buffers: what
// Device.upload(), Buffer.upload() and Buffer.download() do, with the GIL
// released.
//
//   - HostPinned memory (and any memory on boards with caps.map_device_memory)
//     is written and read through its mapping.
//   - Other memory moves by DMA on a queue (the caller's, or the transfer
//     context's own). Large transfers import the page-aligned interior of the
//     caller's memory (caps.import_host_memory) so the board reaches it with
//     no copy on the host, and move the unaligned head and tail through a
//     pinned staging buffer; otherwise the bytes go through pinned staging
//     buffers in 4 MiB chunks, copying one chunk on the host while the board
//     moves the previous one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "tpuhal/tpuhal.hpp"

namespace tpuhal::python {

class Transfers {
 public:
  // Transfers go through staging buffers of this size.
  static constexpr std::uint64_t kChunk = 4ull << 20;
  // Below this many page-aligned bytes, importing the caller's memory costs
  // more than staging it.
  static constexpr std::uint64_t kImportMin = 1ull << 20;

  // The context every Device object of `device`, and every buffer and
  // frame of it, shares while any of them holds it (made on first use, so
  // threads moving bytes at once share one queue rather than each claiming
  // one of the board's few).
  static std::shared_ptr<Transfers> shared(const Device& device);

  explicit Transfers(Device device);
  ~Transfers();
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  // Copies n host bytes to `dst` at `offset` / n bytes of `src` at `offset` to
  // the host, and returns once they are there. `queue`: the caller's queue,
  // or nullptr for this context's own (claimed at first use: a copy queue, or
  // a compute queue if the board has none or all are claimed). Ranges are
  // checked by the caller. Call without the GIL.
  void write(const Buffer& dst, std::uint64_t offset, const std::byte* src, std::uint64_t n, const Queue* queue);
  void read(const Buffer& src, std::uint64_t offset, std::byte* dst, std::uint64_t n, const Queue* queue);

  // True if `b` is read and written through its mapping rather than by DMA.
  bool direct(const Buffer& b) const;
  const Device& device() const { return device_; }

 private:
  class Staging;
  Queue queue_for(const Queue* user);
  Queue claim_queue();  // with mu_ held
  void forget_queue();
  Buffer take_staging();
  void give_back(Buffer b);

  Device device_;
  std::mutex mu_;
  std::optional<Queue> queue_;   // this context's own, claimed at first use
  std::vector<Buffer> staging_;  // pinned buffers of kChunk bytes, free for use
};

}  // namespace tpuhal::python
