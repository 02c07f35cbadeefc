// Programs of the CUDA shim: the commands captured from a stream into a CUDA
// graph, replayed with cuGraphLaunch.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <variant>

#include "device_impl.h"

namespace tpuhal::cuda {

CudaProgram::~CudaProgram() {
  dev_->dispose([dev = dev_.get(), exec = exec_, keep = std::move(keep_)] {
    try {
      ScopedContext scope(dev->api(), dev->context());
      dev->api().cuGraphExecDestroy(exec);
    } catch (const Error& e) {
      log()->error("{}: destroying a program: {}", dev->uri(), e.what());
    }
  });
}

std::shared_ptr<driver::ProgramBackend> CudaDevice::create_program(std::span<const driver::Command> commands) {
  ScopedContext scope(api_, ctx_);
  CUstream s = nullptr;
  check(api_, api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), uri() + ": recording a program: cuStreamCreate");
  struct StreamGuard {
    const Api& api;
    CUstream s;
    ~StreamGuard() { api.cuStreamDestroy(s); }
  } guard{api_, s};
  check(api_, api_.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        uri() + ": recording a program: cuStreamBeginCapture");
  // The commands are translated as a queue's are, into the capture; the
  // program holds what they keep (it holds no fence waits).
  Keep keep;
  std::string what;
  CUresult failed = CUDA_SUCCESS;
  std::size_t at = 0;
  // Ops report bad input into the program's own fault record; the queue
  // that calls it moves a fault on to its record (kernels/kernel.h).
  std::shared_ptr<TimelineWord> faults;
  if (kernels_ && std::any_of(commands.begin(), commands.end(),
                              [](const driver::Command& c) { return std::holds_alternative<driver::cmd::Run>(c); }))
    faults = std::make_shared<TimelineWord>(api_, ctx_, uri() + ": a program's fault record");
  k::Fault fault{faults ? faults->fault_address() : 0, 0, 0, 0, static_cast<std::uint32_t>(commands.size())};
  for (; at < commands.size(); ++at) {
    if (std::holds_alternative<driver::cmd::WaitFence>(commands[at])) {
      failed = CUDA_ERROR_INVALID_VALUE;
      what = "a wait for a fence (programs cannot hold one)";
      break;
    }
    fault.command = static_cast<std::uint32_t>(at);
    failed = enqueue(*this, s, commands[at], keep, what, fault);
    if (failed != CUDA_SUCCESS) break;
  }
  CUgraph graph = nullptr;
  const CUresult ended = api_.cuStreamEndCapture(s, &graph);
  if (failed != CUDA_SUCCESS) {
    if (graph) api_.cuGraphDestroy(graph);
    check(api_, failed, uri() + ": recording command " + std::to_string(at) + ": " + what);
  }
  check(api_, ended, uri() + ": recording a program: cuStreamEndCapture");
  CUgraphExec exec = nullptr;
  const CUresult made = api_.cuGraphInstantiateWithFlags(&exec, graph, 0);
  api_.cuGraphDestroy(graph);
  check(api_, made, uri() + ": recording a program: cuGraphInstantiateWithFlags");
  return std::make_shared<CudaProgram>(shared_from_this(), exec, commands.size(), std::move(keep), std::move(faults));
}

}  // namespace tpuhal::cuda
