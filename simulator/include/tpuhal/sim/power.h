// The simulated board's power and thermal model (docs/simulator.md), behind
// its telemetry: power grows linearly from the profile's idle to its peak
// with the engines' utilisation since the last step (compute 80 % of the
// dynamic power, copy and video 10 % each); energy integrates the power
// exactly; the die relaxes towards ambient + R * power with one time
// constant. Not thread-safe: its owner serialises the steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tpuhal/sim/profile.h"

namespace tpuhal::sim {

class PowerModel {
 public:
  PowerModel(const BoardProfile& profile, std::uint64_t now_ns) noexcept
      : idle_w_(profile.idle_power_w),
        peak_w_(profile.peak_power_w),
        ambient_c_(profile.ambient_c),
        c_per_w_(profile.thermal_c_per_w),
        time_s_(profile.thermal_time_s),
        at_ns_(now_ns),
        power_w_(idle_w_),
        temp_c_(ambient_c_ + c_per_w_ * idle_w_) {}

  // Moves the model to `now_ns`, given the engines' busy time so far (by
  // fw::EngineType; [0] unused). A step back in time changes nothing.
  void advance(std::uint64_t now_ns, const std::uint64_t (&busy_ns)[4]) noexcept {
    if (now_ns <= at_ns_) return;
    const double dt = static_cast<double>(now_ns - at_ns_) * 1e-9;
    auto util = [&](int e) {
      const std::uint64_t d = busy_ns[e] - std::min(busy_ns[e], busy_[e]);
      return std::clamp(static_cast<double>(d) * 1e-9 / dt, 0.0, 1.0);
    };
    const double load = 0.8 * util(1) + 0.1 * util(2) + 0.1 * util(3);
    power_w_ = idle_w_ + (peak_w_ - idle_w_) * load;
    energy_j_ += power_w_ * dt;
    const double steady = ambient_c_ + c_per_w_ * power_w_;
    temp_c_ = steady + (temp_c_ - steady) * std::exp(-dt / time_s_);
    at_ns_ = now_ns;
    std::copy(std::begin(busy_ns), std::end(busy_ns), std::begin(busy_));
  }

  double power_w() const noexcept { return power_w_; }
  double temperature_c() const noexcept { return temp_c_; }
  double energy_j() const noexcept { return energy_j_; }

 private:
  double idle_w_, peak_w_, ambient_c_, c_per_w_, time_s_;
  std::uint64_t at_ns_;
  std::uint64_t busy_[4] = {};
  double power_w_;
  double temp_c_;
  double energy_j_ = 0;
};

}  // namespace tpuhal::sim
