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

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
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
  // null where there are none or the bytes differ. `serial`, if given, is
  // set to the entry's serial: a number no other entry of any cache has had
  // or will have, so that what is kept of the floats elsewhere (oneDNN's
  // reordered copy of them) can tell them from later floats at the same
  // address.
  const float* find(const Key& key, const std::byte* src, std::size_t bytes, std::uint64_t* serial = nullptr) {
    for (const auto& e : entries_)
      if (e->key == key) {
        if (!e->kept.holds(writes_, src, bytes)) return nullptr;
        if (serial) *serial = e->serial;
        return e->packed.data();
      }
    return nullptr;
  }

  // Room for `floats` packed floats under `key`, from the `bytes` bytes at
  // `src` (copied now), for the caller to fill before the next find(); an
  // entry for the same key is replaced. Null where the cache would pass
  // kMaxBytes: entries stay until the engine goes, and the first ones kept
  // are the ones a model runs first.
  // `serial`, if given, is set to the new entry's (find()'s).
  float* insert(Key key, const std::byte* src, std::size_t bytes, std::size_t floats, std::uint64_t* serial = nullptr) {
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
    e->serial = next_serial_.fetch_add(1, std::memory_order_relaxed);
    if (serial) *serial = e->serial;
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
    std::uint64_t serial = 0;
  };
  inline static std::atomic<std::uint64_t> next_serial_{1};  // 0: none
  const DramWrites* writes_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::size_t bytes_ = 0;
};

// Values computed from an operand's bytes (the largest per-channel sum of
// an int8 convolution's weights), kept without a copy of those bytes: one
// serves only while the board's DRAM write log shows no write to the bytes
// since it was computed, so only values of bytes past the aperture are
// kept (recomputing one reads the bytes once, as comparing them would).
class DerivedValues {
 public:
  // What the value is of: a tag, where the bytes are, and its parameters.
  using Key = std::array<std::int64_t, 4>;

  explicit DerivedValues(const DramWrites* writes = nullptr) : writes_(writes) {}

  // The value kept for `key` from the `bytes` bytes at `src`, if they are
  // unchanged since it was computed.
  std::optional<std::uint64_t> find(const Key& key, const void* src, std::size_t bytes) const {
    const auto it = values_.find(key);
    if (it == values_.end() || !writes_ || !writes_->unchanged_since(src, bytes, it->second.at)) return std::nullopt;
    return it->second.value;
  }
  // The write log's clock: read it before computing a value to keep.
  std::uint64_t now() const { return writes_ ? writes_->now() : 0; }
  // Keeps `value`, computed from the bytes at `src` from clock `at` on,
  // where the write log can vouch for those bytes.
  void keep(const Key& key, const void* src, std::size_t bytes, std::uint64_t value, std::uint64_t at) {
    if (!writes_ || !writes_->unchanged_since(src, bytes, at)) return;
    if (values_.size() >= kMaxValues) values_.clear();
    values_[key] = {value, at};
  }

  static constexpr std::size_t kMaxValues = 4096;

 private:
  struct Hash {
    std::size_t operator()(const Key& k) const noexcept {
      std::size_t h = 0;
      for (const std::int64_t v : k) h = h * 0x9E3779B97F4A7C15ull + static_cast<std::size_t>(v);
      return h;
    }
  };
  struct Entry {
    std::uint64_t value;
    std::uint64_t at;
  };
  const DramWrites* writes_;
  std::unordered_map<Key, Entry, Hash> values_;
};

}  // namespace tpuhal::sim::tensor
