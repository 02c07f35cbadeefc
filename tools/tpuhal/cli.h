// Shared pieces of the tpuhal command-line tool.
#pragma once

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tpuhal/tpuhal.hpp"

namespace tpuhal::rt {
struct LayerError;
}

namespace tpuhal::cli {

namespace po = boost::program_options;

// A subcommand: parses its own arguments, returns the process exit code.
using Command = int (*)(const std::vector<std::string>& args);

int cmd_list(const std::vector<std::string>& args);
int cmd_info(const std::vector<std::string>& args);
int cmd_smi(const std::vector<std::string>& args);
int cmd_exporter(const std::vector<std::string>& args);
int cmd_cdi(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_demo(const std::vector<std::string>& args);
int cmd_decode(const std::vector<std::string>& args);
int cmd_reset(const std::vector<std::string>& args);
int cmd_firmware(const std::vector<std::string>& args);
int cmd_stress(const std::vector<std::string>& args);
int cmd_compile(const std::vector<std::string>& args);
int cmd_model_info(const std::vector<std::string>& args);
int cmd_profile(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);
int cmd_sim(const std::vector<std::string>& args);
int cmd_trace(const std::vector<std::string>& args);

// Parses `args` against `opts` (and `pos`); on --help prints `usage` and the
// options and returns false with *exit_code = 0; on a bad argument prints the
// problem and returns false with *exit_code = 2.
bool parse(const std::vector<std::string>& args, const po::options_description& opts,
           const po::positional_options_description& pos, po::variables_map& vm, const std::string& usage,
           int* exit_code);
// The same, also accepting `hidden` options, which --help does not list
// (flags a command passes to copies of itself).
bool parse(const std::vector<std::string>& args, const po::options_description& opts,
           const po::options_description& hidden, const po::positional_options_description& pos, po::variables_map& vm,
           const std::string& usage, int* exit_code);

// The device to use: --device if given, else the first one there is.
// Throws tpuhal::Error(NotFound) when there is none, saying why.
std::string pick_device(const po::variables_map& vm);

std::string bytes(std::uint64_t n);  // "12 GiB"

nlohmann::json properties_json(const Properties& p);

// Prints a compiled model's precision report, one line per layer (tpuhal
// compile --report, and tpuhal model-info for a model that has one).
void print_precision_report(const std::vector<rt::LayerError>& report);

}  // namespace tpuhal::cli
