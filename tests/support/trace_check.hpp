// Checks a trace written by tpuhal::trace against the rules of the Chrome
// trace event format and tpuhal's own promises (docs/tracing.md). Returns
// the problems found, each saying which event; empty means the trace obeys:
//   - it parses, with traceEvents and otherData;
//   - every B slice ends (an E on its track, in order) and no E is unmatched;
//   - timestamps never decrease along a track (pid, tid) or a counter;
//   - X slices on one track nest or follow one another, never straddle;
//   - each flow start (s) lies inside a slice on its track and has exactly
//     one end (f) that lies inside a device slice; the device slice of the
//     submission it names lies inside its submission's host interval, from
//     the submit slice's start to when the host saw the work complete;
//   - metadata names every process and every thread track used.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace tpuhal::test {

inline nlohmann::json read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, false);
}

inline std::vector<std::string> check_trace(const nlohmann::json& t) {
  std::vector<std::string> bad;
  if (t.is_discarded() || !t.is_object()) return {"the trace is not a JSON object"};
  if (!t.contains("traceEvents") || !t["traceEvents"].is_array()) return {"no traceEvents array"};
  if (!t.contains("otherData") || !t["otherData"].is_object())
    bad.push_back("no otherData (the file was not finished)");
  using Track = std::pair<std::int64_t, std::int64_t>;
  std::map<Track, double> last_ts;
  std::map<std::pair<std::int64_t, std::string>, double> last_counter;
  std::map<Track, std::vector<double>> open;                      // B begin times
  std::map<Track, std::vector<std::pair<double, double>>> spans;  // X [ts, end], in order
  std::set<std::int64_t> named_pids;
  std::set<Track> named_threads, used;
  struct Flow {
    int starts = 0, ends = 0;
    double submit_begin = -1;
  };
  std::map<std::uint64_t, Flow> flows;
  std::map<std::uint64_t, std::pair<double, double>> submission_span;  // correlation -> device [ts, end]
  std::map<std::uint64_t, double> seen_at;                             // correlation -> host saw it done
  std::size_t i = 0;
  auto where = [&](const nlohmann::json& e) { return "event " + std::to_string(i) + " " + e.dump(); };
  for (const auto& e : t["traceEvents"]) {
    ++i;
    if (!e.is_object() || !e.contains("ph") || !e.contains("pid")) {
      bad.push_back(where(e) + ": no ph or pid");
      continue;
    }
    const std::string ph = e["ph"];
    const std::int64_t pid = e["pid"];
    const std::int64_t tid = e.value("tid", std::int64_t{0});
    const Track track{pid, tid};
    if (ph == "M") {
      const std::string name = e.value("name", "");
      if (name == "process_name") named_pids.insert(pid);
      if (name == "thread_name") named_threads.insert(track);
      continue;
    }
    if (!e.contains("ts") || !e["ts"].is_number()) {
      bad.push_back(where(e) + ": no ts");
      continue;
    }
    const double ts = e["ts"];
    if (ph == "C") {
      auto& last = last_counter[{pid, e.value("name", "")}];
      if (ts < last) bad.push_back(where(e) + ": counter time went back");
      last = ts;
      used.insert({pid, -1});
      continue;
    }
    used.insert(track);
    if (auto it = last_ts.find(track); it != last_ts.end() && ts < it->second)
      bad.push_back(where(e) + ": time went back on its track (last " + std::to_string(it->second) + ")");
    last_ts[track] = ts;
    if (ph == "B") {
      open[track].push_back(ts);
    } else if (ph == "E") {
      if (open[track].empty())
        bad.push_back(where(e) + ": E with no open slice");
      else
        open[track].pop_back();
    } else if (ph == "X") {
      const double end = ts + e.value("dur", 0.0);
      auto& s = spans[track];
      while (!s.empty() && s.back().second <= ts + 1e-3) s.pop_back();
      if (!s.empty() && end > s.back().second + 1e-3)
        bad.push_back(where(e) + ": straddles the slice before it on its track");
      s.emplace_back(ts, end);
      if (e.value("name", "") == "submission" && e.contains("args") && e["args"].contains("correlation")) {
        const std::uint64_t c = e["args"]["correlation"];
        submission_span[c] = {ts, end};
        // A modelled board's slices end when the model says, which a host
        // faster than the board sees before (docs/timing.md).
        if (e["args"].contains("seen_ts") && e["args"].value("board_clock", "") != "modelled")
          seen_at[c] = e["args"]["seen_ts"];
      }
    } else if (ph == "s") {
      auto& f = flows[e.value("id", std::uint64_t{0})];
      ++f.starts;
      const auto& s = spans[track];
      if (!s.empty() && ts >= s.back().first - 1e-3 && ts <= s.back().second + 1e-3)
        f.submit_begin = s.back().first;  // at the start of a complete slice
      else if (!open[track].empty())
        f.submit_begin = open[track].back();
      else
        bad.push_back(where(e) + ": flow start outside any slice");
    } else if (ph == "f") {
      auto& f = flows[e.value("id", std::uint64_t{0})];
      ++f.ends;
      const auto& s = spans[track];
      if (s.empty() || ts < s.back().first || ts > s.back().second + 1e-3)
        bad.push_back(where(e) + ": flow end outside any device slice");
    } else if (ph != "i") {
      bad.push_back(where(e) + ": unexpected phase");
    }
  }
  for (const auto& [track, stack] : open)
    if (!stack.empty())
      bad.push_back(std::to_string(stack.size()) + " slice(s) never end on track " + std::to_string(track.first) + "/" +
                    std::to_string(track.second));
  for (const auto& [id, f] : flows) {
    if (f.starts != 1 || f.ends != 1)
      bad.push_back("flow " + std::to_string(id) + ": " + std::to_string(f.starts) + " start(s) and " +
                    std::to_string(f.ends) + " end(s)");
    if (auto it = submission_span.find(id); it != submission_span.end() && f.submit_begin >= 0) {
      if (it->second.first + 1e-3 < f.submit_begin)
        bad.push_back("submission " + std::to_string(id) + " ran on the device before it was submitted");
      if (auto s = seen_at.find(id); s != seen_at.end() && it->second.second > s->second + 1e-3)
        bad.push_back("submission " + std::to_string(id) + " ended on the device after the host saw it complete");
    }
  }
  for (const auto& [pid, tid] : used) {
    if (!named_pids.count(pid)) bad.push_back("process " + std::to_string(pid) + " has no process_name");
    if (tid > 0 && !named_threads.count({pid, tid}))
      bad.push_back("track " + std::to_string(pid) + "/" + std::to_string(tid) + " has no thread_name");
  }
  return bad;
}

// The events of one phase and name.
inline std::vector<nlohmann::json> events_named(const nlohmann::json& t, std::string_view ph, std::string_view name) {
  std::vector<nlohmann::json> out;
  for (const auto& e : t["traceEvents"])
    if (e.value("ph", "") == ph && e.value("name", "") == name) out.push_back(e);
  return out;
}

}  // namespace tpuhal::test
