// compile_onnx: import, calibrate (int8), lower, measure the precision
// report, and pack the sections (docs/runtime.md, docs/model-format.md).
#include "tpuhal/rt/compile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <unordered_map>

#include "tpuhal/error.hpp"

#include "model_internal.hpp"

#ifdef TPUHAL_RT_HAVE_ONNX
#include "ir.hpp"
#include "onnx/handler.hpp"
#include <onnx/onnx_pb.h>
#include "tpuhal/fw/half.h"
#endif

namespace tpuhal::rt {

namespace {

// Protobuf parses at most 2 GiB - 1 bytes (its sizes are int).
constexpr std::uint64_t kMaxProtobufBytes = 0x7fffffff;

}  // namespace

#ifndef TPUHAL_RT_HAVE_ONNX

namespace {

CompileResult compile_bytes(std::span<const std::byte>, const CompileOptions&, std::string_view name,
                            const std::filesystem::path&) {
  throw Error(Status::Unsupported,
              std::string(name) +
                  ": this tpuhal was built without ONNX (libonnx-dev, libprotobuf-dev); it loads and "
                  "runs compiled models but cannot compile");
}

}  // namespace

std::vector<std::string> supported_onnx_ops() { return {}; }
std::vector<std::string> foldable_onnx_ops() { return {}; }

namespace detail {
struct HostStage {};
std::shared_ptr<const HostStage> decode_host_stage(std::span<const std::byte>, const std::vector<TensorSpec>&,
                                                   const std::string& name) {
  throw Error(Status::Unsupported, name +
                                       ": the model has a host stage, which this tpuhal, built without ONNX "
                                       "(libonnx-dev, libprotobuf-dev), cannot run");
}
const HostStageInfo& host_stage_info(const HostStage&) {
  static const HostStageInfo none;
  return none;
}
std::vector<Result> run_host_stage(const HostStage&, const std::vector<TensorSpec>&, std::vector<std::vector<float>>,
                                   const std::string&) {
  return {};
}
}  // namespace detail

#else

namespace {

using namespace detail;
using nlohmann::json;

// The calibration set cut into batches of the model's input shapes.
struct Batches {
  std::vector<std::vector<float>> per_input;  // each input's samples, flat
  std::vector<std::uint64_t> sample_elems;
  std::vector<std::vector<std::int64_t>> shapes;
  std::uint64_t samples = 0;
  std::uint64_t count() const {
    const auto n = static_cast<std::uint64_t>(shapes.at(0).at(0));
    return (samples + n - 1) / n;
  }
  // Batch `b`: rows past the last sample wrap to the first ones.
  std::vector<std::vector<float>> batch(std::uint64_t b) const {
    std::vector<std::vector<float>> out;
    for (std::size_t i = 0; i < per_input.size(); ++i) {
      const auto n = static_cast<std::uint64_t>(shapes[i][0]);
      std::vector<float> x(n * sample_elems[i]);
      for (std::uint64_t r = 0; r < n; ++r) {
        const std::uint64_t s = (b * n + r) % samples;
        std::copy_n(per_input[i].begin() + static_cast<std::ptrdiff_t>(s * sample_elems[i]), sample_elems[i],
                    x.begin() + static_cast<std::ptrdiff_t>(r * sample_elems[i]));
      }
      out.push_back(std::move(x));
    }
    return out;
  }
};

// "minmax", "percentile:99.99", "entropy"
std::string method_text(const CompileOptions& o) {
  if (o.method == CalibrationMethod::MinMax) return "minmax";
  if (o.method == CalibrationMethod::Entropy) return "entropy";
  char buf[64];
  std::snprintf(buf, sizeof buf, "percentile:%g", o.percentile);
  return buf;
}

std::string dims(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Batches calibration_batches(const Graph& g, const CompileOptions& o, std::string_view name, const char* why) {
  if (o.calibration.empty())
    throw Error(Status::InvalidArgument,
                std::string(name) + ": " + why + " needs calibration data (one array per input)");
  if (o.calibration.size() != g.inputs.size())
    throw Error(Status::InvalidArgument, std::string(name) + ": " + std::to_string(o.calibration.size()) +
                                             " calibration arrays for " + std::to_string(g.inputs.size()) + " inputs");
  Batches b;
  for (std::size_t i = 0; i < g.inputs.size(); ++i) {
    const auto& shape = g.value(g.inputs[i]).shape;
    const NdArray& a = o.calibration[i];
    std::uint64_t per = 1;
    for (std::size_t d = 1; d < shape.size(); ++d) per *= static_cast<std::uint64_t>(shape[d]);
    std::vector<std::int64_t> tail(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
    std::uint64_t given = 1;
    for (auto d : a.shape) given *= static_cast<std::uint64_t>(d);
    const bool shape_ok = a.shape.size() >= tail.size() + 1 &&
                          std::equal(tail.rbegin(), tail.rend(), a.shape.rbegin()) && given == a.values.size();
    if (!shape_ok || shape.empty() || a.values.empty() || a.values.size() % per != 0)
      throw Error(Status::InvalidArgument, std::string(name) + ": calibration array " + std::to_string(i) +
                                               " has shape " + dims(a.shape) + "; input '" + g.inputs[i] + "' " +
                                               dims(shape) + " needs [samples, " + dims(tail).substr(1));
    const std::uint64_t samples = a.values.size() / per;
    if (i > 0 && samples != b.samples)
      throw Error(Status::InvalidArgument, std::string(name) + ": calibration arrays hold " +
                                               std::to_string(b.samples) + " and " + std::to_string(samples) +
                                               " samples; every input needs the same number");
    b.samples = samples;
    b.per_input.push_back(a.values);
    b.sample_elems.push_back(per);
    b.shapes.push_back(shape);
  }
  return b;
}

ModelFile pack(const Graph& g, const Lowered& l, Precision p, const CompileOptions& o, std::string_view name,
               const json* report) {
  std::vector<TensorSpec> inputs, outputs;
  for (std::size_t i = 0; i < g.inputs.size(); ++i)
    inputs.push_back(
        {g.inputs[i], g.integer_inputs.count(g.inputs[i]) ? DType::I32 : DType::F32, g.value(g.inputs[i]).shape});
  for (std::size_t i = 0; i < g.outputs.size(); ++i)
    outputs.push_back(
        {g.outputs[i].first, DType::F32, l.graph.tensors[static_cast<std::size_t>(l.graph.outputs[i])].shape});
  std::map<std::string, std::string> meta = {
      {"producer", std::string("tpuhal ") + tpuhal::version()},
      {"source", std::string(name)},
      {"precision", to_string(p)},
      {"opset", std::to_string(g.opset)},
      {"ops", std::to_string(l.graph.ops.size())},
  };
  if (p == Precision::Int8) {
    meta["calibration"] = g.qdq ? "qdq (the model's QuantizeLinear / DequantizeLinear)" : method_text(o);
    std::uint64_t n = 1;
    if (!g.qdq && !o.calibration.empty() && !g.inputs.empty()) {
      const auto& s = g.value(g.inputs[0]).shape;
      for (std::size_t d = 1; d < s.size(); ++d) n *= static_cast<std::uint64_t>(s[d]);
      meta["calibration_samples"] = std::to_string(o.calibration[0].values.size() / std::max<std::uint64_t>(n, 1));
    }
  }
  ModelFile f;
  f.add(SectionKind::Meta, encode_meta(meta));
  f.add(SectionKind::Io, encode_io(inputs, outputs));
  f.add(SectionKind::Graph, encode_graph(l.graph));
  f.add(SectionKind::Weights, l.weights);
  // A convolution accumulating into its output: version 4, which older
  // readers refuse rather than run it as a plain one.
  if (std::any_of(l.graph.ops.begin(), l.graph.ops.end(),
                  [](const DOp& op) { return op.attrs.value("accumulate", false); }))
    f.require_version(4);
  if (p == Precision::Int8) {
    json q = l.quant;
    q["method"] = meta["calibration"];
    const std::string s = q.dump(1);
    std::vector<std::byte> b(s.size());
    std::memcpy(b.data(), s.data(), s.size());
    f.add(SectionKind::Quant, std::move(b));
  }
  if (g.host_stage) {
    onnx::ModelProto stage = *g.host_stage;
    for (auto& in : *stage.mutable_graph()->mutable_input())  // integers the program holds as i32
      if (auto it = l.values.find(in.name()); it != l.values.end() && it->second.dtype == DType::I32)
        in.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    std::vector<std::byte> b(stage.ByteSizeLong());
    stage.SerializeToArray(b.data(), static_cast<int>(b.size()));
    f.add(SectionKind::HostStage, std::move(b));
  }
  if (report) {
    const std::string s = report->dump(1);
    std::vector<std::byte> b(s.size());
    std::memcpy(b.data(), s.data(), s.size());
    f.add(SectionKind::Report, std::move(b), true);
  }
  return f;
}

float element(const std::vector<std::byte>& arena, const DTensor& t, std::uint64_t i, const QParams& q) {
  const std::byte* p = arena.data() + t.offset + i * size_of(t.dtype);
  switch (t.dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::F16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return fw::f16_to_f32(h);
    }
    case DType::BF16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return fw::bf16_to_f32(h);
    }
    case DType::U8:
      return (static_cast<float>(static_cast<std::uint8_t>(*p)) - static_cast<float>(q.zero_point)) * q.scale;
    case DType::I8: return static_cast<float>(static_cast<std::int8_t>(*p));
    case DType::I32: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return static_cast<float>(v);
    }
  }
  return 0;
}

// The NHWC index of element `i` of an NCHW tensor of `shape`.
std::uint64_t nchw_to_nhwc(const std::vector<std::int64_t>& shape, std::uint64_t i) {
  const auto c = static_cast<std::uint64_t>(shape[1]), h = static_cast<std::uint64_t>(shape[2]),
             w = static_cast<std::uint64_t>(shape[3]);
  const std::uint64_t x = i % w, y = i / w % h, ch = i / (w * h) % c, n = i / (w * h * c);
  return ((n * h + y) * w + x) * c + ch;
}

// Runs `l` over every calibration batch; `visit(arena)` after each.
template <typename Visit>
void run_batches(Device& dev, const Graph& g, const Lowered& l, const Batches& b, Visit visit) {
  Model m = Model::load(dev, pack(g, l, Precision::F32, CompileOptions{}, "calibration model", nullptr));
  Instance inst = m.instance();
  std::vector<std::vector<float>> outs;
  for (const auto& spec : m.outputs()) outs.emplace_back(spec.elements());
  for (std::uint64_t i = 0; i < b.count(); ++i) {
    auto in = b.batch(i);
    std::vector<HostArray> ins, os;
    std::vector<std::vector<std::int32_t>> ints;  // the integer inputs' samples, as i32
    ints.reserve(in.size());
    for (std::size_t k = 0; k < in.size(); ++k) {
      if (m.inputs()[k].dtype != DType::I32) {
        ins.push_back(host(in[k]));
        continue;
      }
      auto& v = ints.emplace_back();
      for (float f : in[k]) {
        if (!(f >= -2147483648.0f && f < 2147483648.0f) || f != std::trunc(f))
          throw Error(Status::InvalidArgument, "calibration array " + std::to_string(k) + " holds " +
                                                   std::to_string(f) + " for integer input '" + m.inputs()[k].name +
                                                   "'; give integers within int32");
        v.push_back(static_cast<std::int32_t>(f));
      }
      ins.push_back(host(v));
    }
    for (auto& y : outs) os.push_back(host(y));
    inst.run(ins, os);
    visit(read_arena(inst));
  }
}

// The magnitude, of a histogram of |x| in `hist` (bins of equal width from
// 0), below which quantising to `levels` steps keeps the distribution
// closest to the original: the cut whose clipped distribution P and its
// quantised form Q have the least Kullback-Leibler divergence KL(P || Q).
// Returns the cut in bins.
std::size_t entropy_cut(const std::vector<std::uint64_t>& hist, std::size_t levels) {
  const std::size_t bins = hist.size();
  std::size_t best = bins;
  double best_kl = INFINITY;
  std::vector<double> p, q;
  for (std::size_t cut = levels; cut <= bins; cut += std::max<std::size_t>(1, levels / 8)) {
    p.assign(hist.begin(), hist.begin() + static_cast<std::ptrdiff_t>(cut));
    double outliers = 0;
    for (std::size_t i = cut; i < bins; ++i) outliers += static_cast<double>(hist[i]);
    p[cut - 1] += outliers;
    // Q: the unclipped bins merged into `levels` steps, each step's count
    // spread over the bins of it that held values.
    q.assign(cut, 0.0);
    for (std::size_t j = 0; j < levels; ++j) {
      const std::size_t from = j * cut / levels, to = (j + 1) * cut / levels;
      double total = 0;
      std::size_t used = 0;
      for (std::size_t i = from; i < to; ++i) {
        total += static_cast<double>(hist[i]);
        used += hist[i] != 0;
      }
      for (std::size_t i = from; i < to; ++i)
        if (hist[i] != 0) q[i] = total / static_cast<double>(used);
    }
    double ps = 0, qs = 0;
    for (std::size_t i = 0; i < cut; ++i) ps += p[i], qs += q[i];
    if (ps <= 0 || qs <= 0) continue;
    double kl = 0;
    for (std::size_t i = 0; i < cut; ++i) {
      if (p[i] <= 0) continue;
      const double pi = p[i] / ps, qi = std::max(q[i] / qs, 1e-12);
      kl += pi * std::log(pi / qi);
    }
    if (kl < best_kl) best_kl = kl, best = cut;
  }
  return best;
}

// Entropy calibration: each observed range cut at the magnitude
// entropy_cut chooses, over a histogram of |x|; values that are never
// negative get all 255 steps, others half each side.
void entropy_ranges(Device& dev, const Graph& g, const Lowered& f32, const Batches& b,
                    std::map<std::string, Range>& ranges) {
  constexpr std::size_t kBins = 2048;
  std::map<std::string, std::vector<std::uint64_t>> hist;
  run_batches(dev, g, f32, b, [&](const std::vector<std::byte>& arena) {
    for (const auto& [v, info] : f32.values) {
      const DTensor& t = f32.graph.tensors[static_cast<std::size_t>(info.tensor)];
      const Range& r = ranges[v];
      const float peak = std::max(std::fabs(r.lo), std::fabs(r.hi));
      auto& h = hist[v];
      h.resize(kBins);
      if (!(peak > 0)) continue;
      for (std::uint64_t i = 0; i < t.elements(); ++i) {
        const float x = element(arena, t, i, info.q);
        if (!std::isfinite(x)) continue;
        ++h[static_cast<std::size_t>(std::min(std::fabs(x) / peak * kBins, static_cast<float>(kBins - 1)))];
      }
    }
  });
  for (auto& [v, r] : ranges) {
    const float peak = std::max(std::fabs(r.lo), std::fabs(r.hi));
    if (!(peak > 0)) continue;
    const std::size_t cut = entropy_cut(hist[v], r.lo >= 0 ? 255 : 128);
    const float t = peak * static_cast<float>(cut) / kBins;
    r = Range{std::max(r.lo, -t), std::min(r.hi, t)};
  }
}

std::map<std::string, Range> calibrate(Device& dev, const Graph& g, const Lowered& f32, const Batches& b,
                                       const CompileOptions& o) {
  std::map<std::string, Range> ranges;
  run_batches(dev, g, f32, b, [&](const std::vector<std::byte>& arena) {
    for (const auto& [v, info] : f32.values) {
      const DTensor& t = f32.graph.tensors[static_cast<std::size_t>(info.tensor)];
      auto [it, fresh] = ranges.try_emplace(v, Range{INFINITY, -INFINITY});
      Range& r = it->second;
      for (std::uint64_t i = 0; i < t.elements(); ++i) {
        const float x = element(arena, t, i, info.q);
        if (!std::isfinite(x)) continue;
        r.lo = std::min(r.lo, x);
        r.hi = std::max(r.hi, x);
      }
    }
  });
  for (auto& [v, r] : ranges)
    if (r.lo > r.hi) r = Range{0, 0};
  if (o.method == CalibrationMethod::MinMax) return ranges;
  if (o.method == CalibrationMethod::Entropy) {
    entropy_ranges(dev, g, f32, b, ranges);
    return ranges;
  }

  // Percentile: a histogram over each observed range, cut at the
  // `percentile` and (100 - percentile) quantiles.
  if (!(o.percentile > 50.0 && o.percentile <= 100.0))
    throw Error(Status::InvalidArgument,
                "calibration percentile " + std::to_string(o.percentile) + " is not in (50, 100]");
  constexpr std::size_t kBins = 4096;
  std::map<std::string, std::vector<std::uint64_t>> hist;
  run_batches(dev, g, f32, b, [&](const std::vector<std::byte>& arena) {
    for (const auto& [v, info] : f32.values) {
      const DTensor& t = f32.graph.tensors[static_cast<std::size_t>(info.tensor)];
      const Range& r = ranges[v];
      auto& h = hist[v];
      h.resize(kBins);
      const float width = r.hi - r.lo;
      if (!(width > 0)) continue;
      for (std::uint64_t i = 0; i < t.elements(); ++i) {
        const float x = element(arena, t, i, info.q);
        if (!std::isfinite(x)) continue;
        const auto bin =
            static_cast<std::size_t>(std::clamp((x - r.lo) / width * kBins, 0.0f, static_cast<float>(kBins - 1)));
        ++h[bin];
      }
    }
  });
  for (auto& [v, r] : ranges) {
    const auto& h = hist[v];
    std::uint64_t total = 0;
    for (auto c : h) total += c;
    if (total == 0 || !(r.hi > r.lo)) continue;
    const double tail = (100.0 - o.percentile) / 100.0 * static_cast<double>(total);
    const float width = (r.hi - r.lo) / kBins;
    std::uint64_t acc = 0;
    std::size_t lo_bin = 0, hi_bin = kBins - 1;
    for (std::size_t i = 0; i < kBins; ++i) {
      acc += h[i];
      if (static_cast<double>(acc) > tail) {
        lo_bin = i;
        break;
      }
    }
    acc = 0;
    for (std::size_t i = kBins; i-- > 0;) {
      acc += h[i];
      if (static_cast<double>(acc) > tail) {
        hi_bin = i;
        break;
      }
    }
    const Range cut{r.lo + width * static_cast<float>(lo_bin), r.lo + width * static_cast<float>(hi_bin + 1)};
    r = Range{std::max(r.lo, cut.lo), std::min(r.hi, cut.hi)};
  }
  return ranges;
}

std::vector<LayerError> measure(Device& dev, const Graph& g, const Lowered& f32, const Lowered& reduced,
                                const Batches& b) {
  // Each model's arena after each batch, then compare layer by layer.
  std::vector<std::vector<std::byte>> ref, red;
  run_batches(dev, g, f32, b, [&](const std::vector<std::byte>& a) { ref.push_back(a); });
  run_batches(dev, g, reduced, b, [&](const std::vector<std::byte>& a) { red.push_back(a); });
  std::vector<LayerError> out;
  for (const auto& n : g.nodes) {
    auto fi = f32.values.find(n.output);
    auto ri = reduced.values.find(n.output);
    if (fi == f32.values.end() || ri == reduced.values.end()) continue;
    const DTensor& ft = f32.graph.tensors[static_cast<std::size_t>(fi->second.tensor)];
    const DTensor& rt = reduced.graph.tensors[static_cast<std::size_t>(ri->second.tensor)];
    // Element i of the value in ONNX's (NCHW) order, in either model's layout.
    const auto& shape = g.value(n.output).shape;
    const auto at = [&](const ValueInfo& held, std::uint64_t i) { return held.nhwc ? nchw_to_nhwc(shape, i) : i; };
    double max_abs = 0, err = 0, sig = 0;
    std::uint64_t count = 0;
    // A value a convolution accumulated into later holds that one's output
    // by the end of a run: it is not measured.
    if (f32.overwritten.count(n.output) || reduced.overwritten.count(n.output)) continue;
    for (std::size_t k = 0; k < ref.size(); ++k)
      for (std::uint64_t i = 0; i < ft.elements(); ++i) {
        const double x = element(ref[k], ft, at(fi->second, i), fi->second.q);
        const double y = element(red[k], rt, at(ri->second, i), ri->second.q);
        max_abs = std::max(max_abs, std::fabs(y - x));
        err += (y - x) * (y - x);
        sig += x * x;
        ++count;
      }
    LayerError e;
    e.node = n.name;
    e.op = n.op;
    e.output = n.output;
    e.max_abs = max_abs;
    e.rms = count ? std::sqrt(err / static_cast<double>(count)) : 0;
    const double sig_rms = count ? std::sqrt(sig / static_cast<double>(count)) : 0;
    e.rel_rms = sig_rms > 0 ? e.rms / sig_rms : 0;
    e.snr_db = err > 0 ? 10.0 * std::log10(sig / err) : INFINITY;
    if (!std::isfinite(err)) {  // an infinity or NaN in the reduced values: nothing of the signal is left
      e.max_abs = e.rms = e.rel_rms = INFINITY;
      e.snr_db = -INFINITY;
    }
    out.push_back(e);
  }
  return out;
}

// The lowest signal-to-noise ratio of the graph's outputs in a report. A
// detector's output is its Detect layer's input, the head: NMS rows shift
// whole when one box comes or goes, and say nothing of the network's signal.
double output_snr(const Graph& g, const std::vector<LayerError>& errors) {
  double worst = INFINITY;
  for (const auto& [_, out] : g.outputs) {
    std::string v = out;
    for (const Node& n : g.nodes)
      if (n.op == "Detect" && n.output == out) v = n.inputs.at(0);
    for (const auto& e : errors)
      if (e.output == v) worst = std::min(worst, e.snr_db);
  }
  return worst;
}

// Automatic mixed precision: while an output's SNR against fp32 is below
// `target` dB, the layers running in int8 that lose the most signal (their output's
// SNR below their input's) move to fp16, an eighth of those left at a
// time; a move that costs the outputs more than 1 dB (values fp16 cannot
// hold) is undone and those layers stay int8. Returns the report of the
// final `reduced`.
std::vector<LayerError> keep_until(Device& dev, const Graph& g, const Lowered& f32,
                                   const std::map<std::string, Range>& ranges, const Batches& b, double target,
                                   std::set<std::string>& keep, Lowered& reduced, std::vector<std::string>& notes) {
  std::vector<LayerError> errors = measure(dev, g, f32, reduced, b);
  const double start = output_snr(g, errors);
  std::set<std::string> tried;  // moves undone
  while (output_snr(g, errors) < target) {
    std::map<std::string, double> snr;  // by value
    for (const auto& e : errors) snr[e.output] = e.snr_db;
    // Only layers that run in int8: a layer of an int8 kind left in f32
    // (a 1-D convolution, a bias that would not fit) would lose precision.
    std::set<std::string> in_int8;
    for (const auto& op : reduced.graph.ops)
      if (op.kind == "qlinear_conv") in_int8.insert(op.node);
    std::vector<std::pair<double, std::string>> lost;  // dB lost, node
    for (const auto& n : g.nodes) {
      if (!n.handler->int8_layer || !in_int8.count(n.name) || keep.count(n.name) || tried.count(n.name) ||
          !snr.count(n.output))
        continue;
      const auto in = snr.find(n.inputs.at(0));
      const double before = in == snr.end() ? 200.0 : std::min(in->second, 200.0);
      lost.emplace_back(before - std::min(snr[n.output], 200.0), n.name);
    }
    if (lost.empty()) break;
    std::sort(lost.begin(), lost.end(), std::greater<>());
    std::set<std::string> more = keep;
    const std::size_t take = std::max<std::size_t>(1, lost.size() / 8);
    for (std::size_t i = 0; i < take; ++i) more.insert(lost[i].second);
    Lowered next = lower(g, Precision::Int8, &ranges, more);
    auto next_errors = measure(dev, g, f32, next, b);
    if (output_snr(g, next_errors) < output_snr(g, errors) - 1.0) {
      for (std::size_t i = 0; i < take; ++i) tried.insert(lost[i].second);
      continue;
    }
    keep = std::move(more);
    reduced = std::move(next);
    errors = std::move(next_errors);
  }
  char buf[200];
  const double reached = output_snr(g, errors);
  std::snprintf(buf, sizeof buf,
                "mixed precision: outputs at %.1f dB against fp32 (int8 alone: %.1f dB; target %.1f%s)", reached, start,
                target, reached < target ? "; no int8 layer left that helps" : "");
  notes.push_back(buf);
  return errors;
}

json report_json(const std::vector<LayerError>& r, Precision p, std::uint64_t samples) {
  json layers = json::array();
  for (const auto& e : r)
    layers.push_back({{"node", e.node},
                      {"op", e.op},
                      {"output", e.output},
                      {"max_abs", e.max_abs},
                      {"rms", e.rms},
                      {"rel_rms", e.rel_rms},
                      {"snr_db", std::isfinite(e.snr_db) ? json(e.snr_db)
                                 : e.snr_db > 0          ? json(nullptr)
                                                         : json("-inf")}});
  return {{"precision", to_string(p)}, {"reference", "fp32"}, {"samples", samples}, {"layers", std::move(layers)}};
}

// The layers --keep-fp16 names, checked against the graph's.
std::set<std::string> layers_kept(const Graph& g, const CompileOptions& options, std::string_view name, bool int8) {
  std::set<std::string> keep;
  if (int8)
    for (const auto& n : g.nodes)
      if (g.fp16_in_int8.count(n.name)) keep.insert(n.name);
  if (options.keep_fp16.empty() && !(options.target_snr_db > 0)) return keep;
  if (!int8)
    throw Error(Status::InvalidArgument, std::string(name) + ": layers kept in fp16 (" +
                                             (options.keep_fp16.empty() ? "a target SNR" : "--keep-fp16") +
                                             ") need precision int8, not " + to_string(options.precision));
  std::set<std::string> names;
  for (const auto& n : g.nodes) names.insert(n.name);
  for (const auto& k : options.keep_fp16) {
    if (!names.count(k))
      throw Error(Status::InvalidArgument,
                  std::string(name) + ": --keep-fp16 '" + k +
                      "' names no layer of the model (the precision report lists them; folded and fused nodes "
                      "go by the name of the layer they joined)");
    keep.insert(k);
  }
  return keep;
}

// The notes on where an int8 model's layers run: fp16 or fp32 instead
// (kept, or their bias too large), and how many in int8.
void precision_notes(const Graph& g, const Lowered& reduced, const std::set<std::string>& keep,
                     const std::map<std::string, Range>& ranges, bool int8, std::vector<std::string>& notes) {
  if (!keep.empty()) {
    std::string f16, f32_list;
    std::size_t n16 = 0, n32 = 0;
    for (const auto& n : g.nodes) {
      if (!keep.count(n.name)) continue;
      const bool holds = fp16_holds(n, ranges);
      std::string& list = holds ? f16 : f32_list;
      list += (list.empty() ? "" : ", ") + n.name;
      ++(holds ? n16 : n32);
    }
    if (n16) notes.push_back(std::to_string(n16) + " layer(s) in fp16: " + f16);
    if (n32)
      notes.push_back(std::to_string(n32) + " layer(s) kept in fp32, their calibrated values outside " +
                      "what fp16 holds (largest magnitude below 2^-6 or above 2^14): " + f32_list);
  }
  if (!reduced.fp32_for_bias.empty()) {
    std::string list;
    for (const auto& k : reduced.fp32_for_bias) list += (list.empty() ? "" : ", ") + k;
    notes.push_back(std::to_string(reduced.fp32_for_bias.size()) +
                    " layer(s) in fp32, their bias too large for int32 in units of the input's and weights' "
                    "scales (activations far below the bias): " +
                    list);
  }
  if (int8) {
    std::size_t q = 0, adds = 0, muls = 0, pools = 0;
    for (const auto& op : reduced.graph.ops) {
      q += op.kind == "qlinear_conv";
      adds += op.kind == "qlinear_add";
      muls += op.kind == "qlinear_mul";
      pools += op.kind == "qlinear_global_avg_pool";
    }
    notes.push_back(std::to_string(q) + " layers run in int8 (qlinear_conv), and " + std::to_string(adds) +
                    " additions (qlinear_add), " + std::to_string(muls) + " products (qlinear_mul), " +
                    std::to_string(pools) +
                    " global averages (qlinear_global_avg_pool); the rest in f32 between dequantize and quantize");
  }
}

// Where a Q/DQ model's layers run in int8: from the model's own scales,
// or fp32 and why; with strict_qdq, a layer in fp32 is an error.
void qdq_notes(const Lowered& reduced, const CompileOptions& options, std::string_view name,
               std::vector<std::string>& notes) {
  std::string list;
  for (const auto& [layer, why] : reduced.qdq_float) list += (list.empty() ? "" : "; ") + ("'" + layer + "': " + why);
  if (options.strict_qdq && !reduced.qdq_float.empty())
    throw Error(Status::InvalidArgument, std::string(name) + ": " + std::to_string(reduced.qdq_float.size()) +
                                             " layer(s) would run in fp32, not in int8 from the model's Q/DQ "
                                             "(strict Q/DQ): " +
                                             list);
  notes.push_back(std::to_string(reduced.qdq_int8.size()) +
                  " layer(s) in int8 from the model's Q/DQ (its own scales and zero points; no calibration)");
  if (!reduced.qdq_float.empty())
    notes.push_back(std::to_string(reduced.qdq_float.size()) +
                    " layer(s) in fp32, not covered by the model's Q/DQ: " + list);
}

// The loader's own checks on what was made, so that no model comes out
// that Model::load (and `tpuhal model-info`) would refuse.
void check_loads(const ModelFile& model, const CompileOptions& options, std::string_view name, Device& dev) {
  if (!dev) dev = tpuhal::open(options.device);
  try {
    check_model(dev, model, name);
  } catch (const Error& e) {
    std::string why = e.what();
    if (why.rfind(std::string(name) + ": ", 0) == 0) why.erase(0, name.size() + 2);
    throw Error(e.status(), std::string(name) + ": the compiled model would not load (checked on " + options.device +
                                "), so none is made; the loader says: " + why);
  }
}

// Shares the arena, packs the model and runs the loader's checks on it.
void finish(CompileResult& result, const Graph& g, const Lowered& reduced, const CompileOptions& options,
            std::string_view name, const json* report, Device& dev) {
  // Calibration and the report read every layer from an arena without
  // sharing; the model runs with tensors sharing memory where their
  // lifetimes allow.
  Lowered shared = reduced;
  const std::uint64_t unshared = shared.graph.share_arena();
  result.notes.push_back("activation memory per instance: " + std::to_string(shared.graph.arena_bytes) +
                         " bytes, shared by lifetime (" + std::to_string(unshared) + " without sharing)");
  result.model = pack(g, shared, options.precision, options, name, report);
  check_loads(result.model, options, name, dev);
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  return TensorSpec{"", DType::F32, s}.describe().substr(1);
}

// The weights section of a model compiled for several batches: the
// largest batch's weights, and each smaller batch's where they are not the
// same bytes as one already there.
class SharedWeights {
 public:
  SharedWeights(std::span<const std::byte> given, const DeviceGraph& largest) : bytes_(given.begin(), given.end()) {
    for (const DTensor& t : largest.tensors)
      if (t.storage == Storage::Weights)
        known_.emplace(hash(bytes_.data() + t.offset, t.span()), Span{t.offset, t.span()});
  }

  // The offset of t's bytes (in `from`, a lowered graph's weights) here.
  std::uint64_t place(const std::vector<std::byte>& from, const DTensor& t) {
    const std::byte* p = from.data() + t.offset;
    const std::uint64_t n = t.span();
    const std::size_t h = hash(p, n);
    for (auto [it, end] = known_.equal_range(h); it != end; ++it)
      if (it->second.bytes == n && std::memcmp(bytes_.data() + it->second.offset, p, n) == 0) return it->second.offset;
    const std::uint64_t at = align64(bytes_.size());
    bytes_.resize(at + n);
    std::memcpy(bytes_.data() + at, p, n);
    known_.emplace(h, Span{at, n});
    return at;
  }

  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  struct Span {
    std::uint64_t offset, bytes;
  };
  static std::size_t hash(const std::byte* p, std::uint64_t n) {
    return std::hash<std::string_view>{}(std::string_view(reinterpret_cast<const char*>(p), n));
  }
  std::vector<std::byte> bytes_;
  std::unordered_multimap<std::size_t, Span> known_;
};

// Every output follows the batch, so that a run of b samples reads the
// first b rows of each: its shape at batch b (graph `at`, imported as g) is
// its shape at the largest with b first.
void check_batch_outputs(const Graph& g, const DeviceGraph& at, std::int64_t b, const DeviceGraph& largest,
                         std::int64_t max_batch, std::string_view name) {
  for (std::size_t i = 0; i < at.outputs.size(); ++i) {
    const auto& most = largest.tensors[static_cast<std::size_t>(largest.outputs[i])].shape;
    const auto& got = at.tensors[static_cast<std::size_t>(at.outputs[i])].shape;
    auto want = most;
    if (!want.empty()) want[0] = b;
    if (!most.empty() && most[0] == max_batch && got == want) continue;
    const std::string output = i < g.outputs.size() ? g.outputs[i].first : std::to_string(i);
    throw Error(Status::InvalidArgument,
                std::string(name) + ": output '" + output + "' is " + shape_text(most) + " at batch " +
                    std::to_string(max_batch) +
                    (b == max_batch ? std::string() : " and " + shape_text(got) + " at batch " + std::to_string(b)) +
                    "; compiling for several batch sizes needs every output's first dimension to be the batch");
  }
}

// The program for batch b of a model compiled for several, lowered with the
// largest batch's calibration and layer choices; errors name the batch.
Lowered lower_batch(std::span<const std::byte> onnx_bytes, const std::filesystem::path& dir,
                    const CompileOptions& options, std::string_view name, std::int64_t b, const DeviceGraph& largest,
                    const std::map<std::string, Range>& ranges, const std::set<std::string>& keep) {
  try {
    const Graph g = import_onnx(onnx_bytes, options, name, dir, b);
    Lowered l = options.precision == Precision::F32
                    ? lower(g, Precision::F32, nullptr)
                    : lower(g, options.precision, options.precision == Precision::Int8 ? &ranges : nullptr, keep);
    check_batch_outputs(g, l.graph, b, largest, options.max_batch, name);
    return l;
  } catch (const Error& e) {
    std::string why = e.what();
    if (why.rfind(std::string(name) + ": ", 0) == 0) why.erase(0, name.size() + 2);
    throw Error(e.status(), std::string(name) + ": compiling for batches 1 to " + std::to_string(options.max_batch) +
                                ", at batch " + std::to_string(b) + ": " + why);
  }
}

// `model` with the weights section `weights`, its graph's weight_bytes
// set to match (edited as JSON: decoding would make its names printable),
// and the Stages section; returns the largest arena of them all in `arena`.
ModelFile with_stages(const ModelFile& model, const std::vector<std::byte>& weights, const std::vector<Stage>& stages,
                      std::uint64_t& arena) {
  const auto packed = model.get(SectionKind::Graph);
  json graph = json::parse(reinterpret_cast<const char*>(packed.data()),
                           reinterpret_cast<const char*>(packed.data()) + packed.size());
  graph["weight_bytes"] = weights.size();
  const std::string text = graph.dump(1);
  ModelFile file;
  file.require_version(model.required_version());  // an accumulating convolution's 4
  for (const Section& s : model.sections()) {
    if (s.kind == SectionKind::Graph)
      file.add(s.kind,
               std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                      reinterpret_cast<const std::byte*>(text.data()) + text.size()),
               s.optional);
    else if (s.kind == SectionKind::Weights)
      file.add(s.kind, weights, s.optional);
    else
      file.add(s.kind, s.bytes, s.optional);
  }
  // Optional: a reader from before stages runs the largest batch only.
  file.add(SectionKind::Stages, encode_stages(stages), true);
  arena = graph["arena_bytes"].get<std::uint64_t>();
  for (const Stage& s : stages) arena = std::max(arena, s.graph.arena_bytes);
  return file;
}

// A model compiled for batches 1 to options.max_batch: the graph is the
// largest; each smaller batch gets a program of its own in the Stages
// section, lowered with the same calibration and layer choices as the
// graph, its weights shared with the graph's where they are the same
// bytes (they are, unless a constant was folded over the batch).
void add_stages(CompileResult& result, std::span<const std::byte> onnx_bytes, const std::filesystem::path& dir,
                const CompileOptions& options, std::string_view name, const Graph& graph_at_most,
                const Lowered& largest, const std::map<std::string, Range>& ranges, const std::set<std::string>& keep,
                Device& dev) {
  const auto given = result.model.get(SectionKind::Weights);
  SharedWeights weights(given, largest.graph);
  check_batch_outputs(graph_at_most, largest.graph, options.max_batch, largest.graph, options.max_batch, name);
  std::vector<Stage> stages;
  for (std::int64_t b = 1; b < options.max_batch; ++b) {
    Lowered l = lower_batch(onnx_bytes, dir, options, name, b, largest.graph, ranges, keep);
    l.graph.share_arena();
    for (DTensor& t : l.graph.tensors)
      if (t.storage == Storage::Weights) t.offset = weights.place(l.weights, t);
    stages.push_back({b, std::move(l.graph)});
  }
  for (Stage& s : stages) s.graph.weight_bytes = weights.bytes().size();
  std::uint64_t arena = 0;
  result.model = with_stages(result.model, weights.bytes(), stages, arena);
  result.notes.push_back("compiled for batches 1 to " + std::to_string(options.max_batch) + " (a program each; " +
                         std::to_string(weights.bytes().size() - given.size()) +
                         " bytes of weights the batches do not share; " + "activation memory per instance " +
                         std::to_string(arena) + " bytes)");
  check_loads(result.model, options, name, dev);
}

CompileResult compile_bytes(std::span<const std::byte> onnx_bytes, const CompileOptions& options, std::string_view name,
                            const std::filesystem::path& external_dir) {
  if (options.max_batch > static_cast<std::int64_t>(kMaxStages))
    throw Error(Status::InvalidArgument, std::string(name) + ": a maximum batch of " +
                                             std::to_string(options.max_batch) + " is above the " +
                                             std::to_string(kMaxStages) + " a model can be compiled for");
  if (options.max_batch < 0)
    throw Error(Status::InvalidArgument,
                std::string(name) + ": a maximum batch of " + std::to_string(options.max_batch) + " is not a batch");
  if (options.precision == Precision::Int8 && options.method == CalibrationMethod::Percentile &&
      !(options.percentile > 50.0 && options.percentile <= 100.0))
    throw Error(Status::InvalidArgument,
                "calibration percentile " + std::to_string(options.percentile) + " is not in (50, 100]");
  const Graph g = import_onnx(onnx_bytes, options, name, external_dir, options.max_batch);
  CompileResult result;
  result.notes = g.notes;
  // The fp32 model, or the fp32 reference another precision is calibrated
  // and measured against: NCHW there, so that int8's calibrated ranges
  // (and its bits) are what they were before fp32 models ran NHWC.
  const Lowered f32 = lower(g, Precision::F32, nullptr, {}, options.precision != Precision::F32);
  const bool int8 = options.precision == Precision::Int8;
  std::map<std::string, Range> ranges;
  Batches batches;
  Device dev;
  // A Q/DQ model's int8 comes from its own scales: no calibration.
  const bool calibrated = int8 && !g.qdq;
  if (int8 && g.qdq && options.target_snr_db > 0)
    throw Error(Status::InvalidArgument,
                std::string(name) +
                    ": the model quantizes with QuantizeLinear / DequantizeLinear, so its int8 "
                    "layers are the model's; a target SNR (which moves calibrated layers to fp16) "
                    "does not apply");
  if (calibrated || options.report) {
    batches = calibration_batches(g, options, name, int8 ? "int8" : "the precision report");
    dev = tpuhal::open(options.device);
  }
  if (calibrated) {
    ranges = calibrate(dev, g, f32, batches, options);
    result.notes.push_back("calibrated " + std::to_string(ranges.size()) + " activations on " +
                           std::to_string(batches.samples) + " samples (" + method_text(options) + ") on " +
                           options.device);
  }
  std::set<std::string> keep = layers_kept(g, options, name, int8);
  Lowered reduced =
      options.precision == Precision::F32 ? f32 : lower(g, options.precision, int8 ? &ranges : nullptr, keep);
  std::vector<LayerError> errors;  // the last measured report, while it matches `reduced`
  if (int8 && options.target_snr_db > 0) {
    errors = keep_until(dev, g, f32, ranges, batches, options.target_snr_db, keep, reduced, result.notes);
  }
  precision_notes(g, reduced, keep, ranges, int8, result.notes);
  if (int8 && g.qdq) qdq_notes(reduced, options, name, result.notes);
  json report;
  if (options.report) {
    result.report = errors.empty() ? measure(dev, g, f32, reduced, batches) : errors;
    report = report_json(result.report, options.precision, batches.samples);
  }
  finish(result, g, reduced, options, name, options.report ? &report : nullptr, dev);
  if (options.max_batch > 0) add_stages(result, onnx_bytes, external_dir, options, name, g, reduced, ranges, keep, dev);
  return result;
}

}  // namespace

#endif

namespace {

// Errors quote the model's node, value and file names: escaped
// (escape_text), so that a model cannot send control sequences to the
// terminal of whoever compiles it.
template <typename Compile>
CompileResult escaping_errors(Compile compile) {
  try {
    return compile();
  } catch (const Error& e) {
    throw Error(e.status(), escape_text(e.what()));
  }
}

}  // namespace

CompileResult compile_onnx(std::span<const std::byte> onnx_bytes, const CompileOptions& options,
                           std::string_view name) {
  return escaping_errors([&] { return compile_bytes(onnx_bytes, options, name, options.external_data_dir); });
}

CompileResult compile_onnx(const std::filesystem::path& onnx, const CompileOptions& options) {
  std::ifstream in(onnx, std::ios::binary);
  if (!in) throw Error(Status::NotFound, onnx.string() + ": cannot open the ONNX model");
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(onnx, ec);
  if (!ec && size > kMaxProtobufBytes)
    throw Error(Status::InvalidArgument,
                onnx.string() + ": the ONNX model is " + std::to_string(size) +
                    " bytes; protobuf cannot parse a model file over 2 GiB. Save it with its weights as external "
                    "data (onnx.save_model(model, path, save_as_external_data=True); PyTorch's exporter does so "
                    "for models over 2 GB) and compile the .onnx file");
  const std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // External data is found next to the model unless the caller says where.
  std::filesystem::path dir = options.external_data_dir;
  if (dir.empty()) dir = onnx.has_parent_path() ? onnx.parent_path() : std::filesystem::path(".");
  return escaping_errors([&] {
    return compile_bytes(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data.data()), data.size()),
                         options, onnx.filename().string(), dir);
  });
}

}  // namespace tpuhal::rt
