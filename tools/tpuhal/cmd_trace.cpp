// tpuhal trace -o FILE -- COMMAND ARGS...: runs a program with tracing on in
// it and in every process it starts (TPUHAL_TRACE), then merges their traces
// into one file (docs/tracing.md).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>

#include "cli.h"
#include "tpuhal/base/output_file.h"

namespace tpuhal::cli {

namespace {

constexpr const char* kUsage =
    "Usage: tpuhal trace -o FILE [--] COMMAND [ARGS...]\n\n"
    "Runs COMMAND with tracing on (TPUHAL_TRACE) in it and in every process it\n"
    "starts, then merges their traces into FILE: a Chrome trace that\n"
    "ui.perfetto.dev and chrome://tracing open (docs/tracing.md). FILE is\n"
    "written under a new name beside it and renamed over it once whole (a\n"
    "link at FILE is replaced, never followed). Exits with COMMAND's status.\n\n"
    "Options:\n"
    "  -o, --output FILE  the merged trace (required)\n"
    "  -h, --help         this text\n";

// A trace a process left unfinished (it crashed or was killed) still holds
// its events: close the array so that it parses.
nlohmann::json read_trace(const std::filesystem::path& p, std::string* problem) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_discarded()) return j;
  while (!text.empty() && (text.back() == '\n' || text.back() == ',')) text.pop_back();
  j = nlohmann::json::parse(text + "\n]}", nullptr, false);
  if (!j.is_discarded()) {
    *problem = p.filename().string() + " was not finished (the process did not exit normally)";
    return j;
  }
  *problem = p.filename().string() + " could not be read as a trace; left out";
  return nullptr;
}

}  // namespace

int cmd_trace(const std::vector<std::string>& args) {
  std::string output;
  std::vector<std::string> command;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!command.empty()) {
      command.push_back(a);
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "-o" || a == "--output") {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "tpuhal trace: %s needs a file name\n\n%s", a.c_str(), kUsage);
        return 2;
      }
      output = args[++i];
    } else if (a.rfind("--output=", 0) == 0) {
      output = a.substr(9);
    } else if (a == "--") {
      if (i + 1 < args.size()) command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "tpuhal trace: unknown option '%s'\n\n%s", a.c_str(), kUsage);
      return 2;
    } else {
      command.push_back(a);
    }
  }
  if (output.empty() || command.empty()) {
    std::fprintf(stderr, "tpuhal trace: %s\n\n%s", output.empty() ? "-o FILE is required" : "no command to run",
                 kUsage);
    return 2;
  }
  // The output's directory must take the file before the command runs. The
  // merged trace goes to a new file beside OUTPUT, renamed over it at the
  // end: a link planted at OUTPUT in a shared directory is replaced, never
  // followed, and OUTPUT is untouched until the trace is whole.
  std::optional<base::OutputFile> out;
  try {
    out.emplace(output);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "tpuhal trace: %s\n", e.what());
    return 1;
  }
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "tpuhal-trace-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::fprintf(stderr, "tpuhal trace: cannot make a temporary directory: %s\n", std::strerror(errno));
    return 1;
  }
  const fs::path dir = tmpl;
  const std::string pattern = (dir / "trace-%p.json").string();

  const pid_t child = ::fork();
  if (child < 0) {
    std::fprintf(stderr, "tpuhal trace: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (child == 0) {
    ::setenv("TPUHAL_TRACE", pattern.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "tpuhal trace: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

  // Merge: every process's events in one array; each process's summary kept.
  nlohmann::json merged = {{"displayTimeUnit", "ns"}, {"traceEvents", nlohmann::json::array()}};
  nlohmann::json processes = nlohmann::json::array();
  std::uint64_t events = 0, dropped = 0;
  std::vector<std::string> problems;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    std::string problem;
    auto t = read_trace(p, &problem);
    if (!problem.empty()) problems.push_back(problem);
    if (t.is_object() && t.contains("traceEvents")) {
      for (auto& ev : t["traceEvents"]) merged["traceEvents"].push_back(std::move(ev));
      if (t.contains("otherData")) {
        events += t["otherData"].value("events", std::uint64_t{0});
        dropped += t["otherData"].value("dropped_events", std::uint64_t{0});
        processes.push_back(t["otherData"]);
      }
    }
    fs::remove(p);
  }
  fs::remove(dir);
  merged["otherData"] = {{"command", command},
                         {"exit_status", code},
                         {"processes", processes},
                         {"events", events},
                         {"dropped_events", dropped}};
  try {
    out->write(merged.dump() + "\n");
    out->commit();
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "tpuhal trace: %s\n", e.what());
    return code ? code : 1;
  }
  for (auto& p : problems) std::fprintf(stderr, "tpuhal trace: %s\n", p.c_str());
  if (files.empty())
    std::fprintf(stderr, "tpuhal trace: %s wrote no trace (it does not use libtpuhal, or it could not start)\n",
                 command[0].c_str());
  else
    std::fprintf(stderr, "tpuhal trace: %zu process(es), %llu events (%llu dropped) in %s\n", files.size(),
                 static_cast<unsigned long long>(merged["traceEvents"].size()),
                 static_cast<unsigned long long>(dropped), output.c_str());
  return code;
}

}  // namespace tpuhal::cli
