#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "cli.h"
#include "tpuhal/bench/bench.h"

namespace tpuhal::cli {

int cmd_bench(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("which", po::value<std::string>()->default_value("all"), "dma, submit, gemm, conv, video or all")(
      "device,d", po::value<std::string>(), "device URI (default: the first device)")(
      "json", "one JSON object per line: bench, value, unit, baseline, ratio, ...")(
      "quick", "fewer repetitions (a smoke run, not a measurement)")(
      "max-isa", po::value<std::string>(),
      "run a simulated board's tensor engine, and oneDNN beside it, at most at this\n"
      "instruction-set level (TPUHAL_MAX_ISA): sse2, sse41, avx2, avx512, avx512_vnni\n"
      "on x86-64; generic, neon on arm64");
  po::positional_options_description pos;
  pos.add("which", 1);
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, pos, vm,
             "Usage: tpuhal bench [dma|submit|gemm|conv|video|all] [--device URI] [--json] [--quick]\n"
             "                    [--max-isa LEVEL]\n\n"
             "dma     host->device and device->host bandwidth from 4 KiB to 64 MiB, beside\n"
             "        single-thread memcpy of the same size (ratio = dma / memcpy)\n"
             "submit  round trip of one empty command (submit, wait its fence), beside a\n"
             "        two-thread atomic ping-pong and an eventfd ping-pong (ratio = times the\n"
             "        atomic ping-pong); and sustained empty-command rate on one queue, beside\n"
             "        a two-thread ring of 64-byte messages (ratio = rate / ring rate)\n"
             "gemm    matrix products 1024^3 and 2048^3 in f32, bf16, f16 and int8 on the tensor\n"
             "        engine, beside oneDNN on the same thread count (ratio = device / oneDNN);\n"
             "        where oneDNN has no kernel for a precision on this CPU, beside its f32;\n"
             "        on cuda:N: 4096^3 and 8192^3 (1024^3 with --quick) in f32, f16, bf16 and int8,\n"
             "        beside cuBLAS called directly (ratio = cuBLAS time / device time)\n"
             "conv    a 3x3 convolution, 1x56x56x64 -> 64 channels, NHWC, in f32, bf16, f16 and\n"
             "        int8 (QLinearConv), beside oneDNN likewise (ratio = device / oneDNN)\n"
             "        gemm and conv name the engine's ISA (isa=) and oneDNN's in each line\n"
             "video   aggregate decode frames per second of 1, 8 and 32 channels of 1080p H.264\n"
             "        and H.265 and 192 channels of 360p (clips made with ffmpeg), beside\n"
             "        libavcodec on the same clips and thread count (ratio = device / libavcodec),\n"
             "        and the real-time 1080p30 H.264 channels that rate sustains\n"
             "On cuda:N, dma and submit compare with the CUDA driver API called directly:\n"
             "cuMemcpyAsync of the same sizes, and an empty kernel through cuLaunchKernel\n"
             "(ratio = shim / raw driver; overhead_us = round trip above the raw launch);\n"
             "the machine's floors stay beside them.\n"
             "Figures are medians over rounds that alternate the device and its baseline.",
             &rc))
    return rc;
  const std::string which = vm["which"].as<std::string>();
  if (which != "dma" && which != "submit" && which != "gemm" && which != "conv" && which != "video" && which != "all") {
    std::fprintf(stderr, "tpuhal bench: unknown benchmark '%s' (dma, submit, gemm, conv, video, all)\n", which.c_str());
    return 2;
  }
  if (vm.count("max-isa")) {
    // Before anything starts oneDNN or a board: both read their caps once.
    const std::string isa = vm["max-isa"].as<std::string>();
    ::setenv("TPUHAL_MAX_ISA", isa.c_str(), 1);
    const char* onednn = isa == "sse2" || isa == "sse41" ? "SSE41"
                         : isa == "avx2"                 ? "AVX2"
                         : isa == "avx512"               ? "AVX512_CORE"
                         : isa == "avx512_vnni"          ? "AVX512_CORE_VNNI"
                                                         : nullptr;
    if (onednn) ::setenv("ONEDNN_MAX_CPU_ISA", onednn, 1);
  }
  Device dev = open(pick_device(vm));
  const bool json = vm.count("json") != 0;
  bench::Options o;
  o.quick = vm.count("quick") != 0;
  bool header_done = false;
  o.on_result = [&](const bench::Result& r) {
    if (json) {
      std::printf("%s\n", bench::to_json(r).c_str());
      std::fflush(stdout);
      return;
    }
    if (!header_done) {
      std::printf("%s: %s\n", dev.uri().c_str(), dev.properties().board.c_str());
      header_done = true;
    }
    std::string what = r.bench;
    for (auto& [k, v] : r.params) what += " " + k + "=" + v;
    std::printf("  %-38s %10.3f %-7s | %-16s %10.3f %-7s | ratio %6.3f", what.c_str(), r.value, r.unit.c_str(),
                r.baseline_name.c_str(), r.baseline, r.unit.c_str(), r.ratio);
    for (auto& [k, v] : r.extra) std::printf("  %s %.3f", k.c_str(), v);
    std::printf("\n");
    std::fflush(stdout);
  };
  if (which == "dma" || which == "all") bench::run_dma(dev, o);
  if (which == "submit" || which == "all") bench::run_submit(dev, o);
  if ((which == "gemm" || which == "conv") && !dev.properties().caps.tensor) {
    std::fprintf(stderr, "tpuhal bench: %s has no tensor engine\n", dev.uri().c_str());
    return 1;
  }
  if (which == "gemm" || which == "all") bench::run_gemm(dev, o);
  if (which == "conv" || which == "all") bench::run_conv(dev, o);
  if (which == "video" && !dev.properties().caps.video_decode) {
    std::fprintf(stderr, "tpuhal bench: %s has no video decoder\n", dev.uri().c_str());
    return 1;
  }
  if (which == "video" || which == "all") bench::run_video(dev, o);
  return 0;
}

}  // namespace tpuhal::cli
