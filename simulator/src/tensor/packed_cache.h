// Operands packed for a GEMM kept from one op to the next: a convolution's
// weights are the same bytes every run of a model, and packing them costs
// as much as the product for layers with few output positions (ResNet-50's
// last stage: 49 positions, 2.4 M weights). Internal to the simulator.
//
// An entry is found by a key (where the operand is and how it is packed)
// and used only while the operand still holds the bytes it was packed from,
// so that weights rewritten in place, or new weights at a freed address,
// are packed again: a hit compares them (memcmp) unless the board's DRAM
// write log says nothing wrote them since they were last compared
// (../dram_writes.h). The engine runs one op at a time, so the cache needs
// no lock; what the GEMM's threads read of an entry is written before they
// start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "../dram_writes.h"

namespace tpuhal::sim::tensor {

class PackedCache {
 public:
  // `writes`: the board's DRAM write log, or null (every hit compares).
  explicit PackedCache(const DramWrites* writes = nullptr) : writes_(writes) {}

  // Everything the packed floats depend on besides the source bytes
  // (kernels, geometry, zero points, ...), compared whole.
  using Key = std::vector<std::int64_t>;

  // The floats packed for `key` from the `bytes` bytes now at `src`, or
  // null where there are none or the bytes differ.
  const float* find(const Key& key, const std::byte* src, std::size_t bytes) {
    for (const auto& e : entries_)
      if (e->key == key) return e->kept.holds(writes_, src, bytes) ? e->packed.data() : nullptr;
    return nullptr;
  }

  // Room for `floats` packed floats under `key`, from the `bytes` bytes at
  // `src` (copied now), for the caller to fill before the next find(); an
  // entry for the same key is replaced. Null where the cache would pass
  // kMaxBytes: entries stay until the engine goes, and the first ones kept
  // are the ones a model runs first.
  float* insert(Key key, const std::byte* src, std::size_t bytes, std::size_t floats) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if ((*it)->key == key) {
        bytes_ -= (*it)->kept.source.size() + (*it)->packed.size() * sizeof(float);
        entries_.erase(it);
        break;
      }
    const std::size_t cost = bytes + floats * sizeof(float);
    if (bytes_ + cost > kMaxBytes) return nullptr;
    auto e = std::make_unique<Entry>();
    e->key = std::move(key);
    e->kept.keep(writes_, src, bytes);
    e->packed.resize(floats);
    bytes_ += cost;
    entries_.push_back(std::move(e));
    return entries_.back()->packed.data();
  }

  std::size_t bytes() const { return bytes_; }

  // ResNet-50's weights packed take about 130 MB.
  static constexpr std::size_t kMaxBytes = std::size_t{256} << 20;

 private:
  struct Entry {
    Key key;
    KeptSource kept;
    std::vector<float> packed;
  };
  const DramWrites* writes_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::size_t bytes_ = 0;
};

}  // namespace tpuhal::sim::tensor
