#!/usr/bin/env python3
"""The torchvision model zoo on tpuhal: every classification and segmentation
architecture, built with random weights, exported to ONNX, compiled in each
precision, run on the simulated board and compared with PyTorch.

    /usr/bin/python3 examples/model_zoo/zoo.py [--models resnet18,mobilenet_v2] [--size 224]
        [--precisions fp32,fp16,bf16,int8] [--torch-ptq] [--layer-report [N]]
        [--bench] [--json FILE] [--check]

For each model: torch.manual_seed(0), weights=None (and weights_backbone=None,
aux_loss off, for segmentation), eval mode, torch.onnx.export at opset 13
into a temporary directory, with one input of shape BATCHx3xSIZExSIZE and one
output (a segmentation model's 'out'). Each precision is compiled with
tpuhal.compile (int8 calibrated on --calibration fixed random inputs) and
run on --device over one fixed random input; the row reports

  max error / range  max |ours - PyTorch| over (max - min) of PyTorch's output
  SNR dB             10 log10(sum(ref^2) / sum((ref - ours)^2)), ref = PyTorch fp32

--torch-ptq adds a row "torch-int8" under each int8 row: PyTorch's own
post-training static quantisation (FX graph mode, the default qconfig
mapping of --torch-qconfig; fbgemm's, the default, quantises weights per
output channel), calibrated on the same --calibration inputs, run on the
same input and compared with PyTorch fp32 in the same way; a model that FX
cannot trace or quantise is recorded as "torch PTQ failed: ...".
--layer-report prints, under each int8 and int8-mixed row, the layers of
tpuhal's precision report (compile(report=True)) that add the most error.

A model the compiler refuses is recorded as "refused: <the op types it
named>", one PyTorch cannot build or export at this size (inception_v3
below 75x75, say) as "export failed: ...", and the run goes on. --bench adds
images per second on the device beside PyTorch on the same CPU with the same
thread count. --check exits 1 when a model that compiled misses its bound
(the *_MIN_SNR_DB / FP32_MAX_ERROR_OVER_RANGE constants below) or a model
named in --expect-compile does not compile; torch-int8 rows are a
reference, never checked.

--ort DIR (with --bench) adds ONNX Runtime's CPU execution provider beside
PyTorch: the same ONNX file, input and thread count, timed by
ort_bench.mjs under Node.js with the onnxruntime-node package installed in
DIR (npm install --ignore-scripts onnxruntime-node; ort_bench.mjs says how),
and its output checked against PyTorch's as fp32's is (the "ort err"
column). "ort ratio" is tpuhal's images per second over ONNX Runtime's.

Needs the tpuhal package on PYTHONPATH (build/<dir>/python) and Debian's
python3-torch and python3-torchvision (exit status 77 without them).
"""
import argparse
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

# --check's bounds. fp32 should match PyTorch to rounding; the reduced
# precisions are held to a signal-to-noise floor against PyTorch fp32 (on a
# random-weight network, whose activations are less tame than a trained one's).
FP32_MAX_ERROR_OVER_RANGE = 1e-4
FP16_MIN_SNR_DB = 40.0
BF16_MIN_SNR_DB = 25.0
INT8_MIN_SNR_DB = 15.0
# int8-mixed: int8 with the layers that lose the most signal moved to fp16
# until the output reaches --target-snr on the calibration data.
MIXED_MIN_SNR_DB = 30.0
MIN_SNR_DB = {"fp16": FP16_MIN_SNR_DB, "bf16": BF16_MIN_SNR_DB, "int8": INT8_MIN_SNR_DB,
              "int8-mixed": MIXED_MIN_SNR_DB}

# fp16's normal range. Random weights can leave a network's output far from
# 1 (mobilenet_v2's is about 1e-9: its depthwise layers are initialised as if
# they had fan-out C*9); where PyTorch's output lies wholly outside this range
# fp16 cannot represent it, so the fp16 row is reported but not checked.
FP16_SMALLEST_NORMAL = 2.0 ** -14
FP16_LARGEST = 65504.0

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int8-mixed")
# The row --torch-ptq adds under each int8 row: PyTorch's own int8.
TORCH_INT8 = "torch-int8"
# --torch-qconfig's choices: the backends whose default qconfig mapping
# PyTorch 1.13 defines. fbgemm's and x86's quantise conv and linear weights
# per output channel (symmetric int8) and activations to 7 of quint8's 8
# bits (reduce_range, which keeps x86 kernels without VNNI from saturating
# their 16-bit intermediate sums); onednn's use all 8 bits; qnnpack's
# quantise weights per tensor.
TORCH_QCONFIGS = ("fbgemm", "x86", "onednn", "qnnpack")
# PyTorch's observers keep every scale at or above float32's epsilon, so
# values below half of it quantise to 0: random weights leave some
# networks' outputs there (mobilenet_v2's, about 1e-9), and PyTorch's int8
# output is then all zero (0 dB).
TORCH_SMALLEST_SCALE = float(np.finfo(np.float32).eps)

# Builder-name prefixes of the architectures, in the order they are listed.
CLASSIFICATION_FAMILIES = ("resnet", "resnext", "wide_resnet", "vgg", "alexnet", "squeezenet", "densenet",
                           "googlenet", "inception_v3", "mobilenet_v2", "mobilenet_v3_", "mnasnet",
                           "shufflenet_v2_", "efficientnet_b", "efficientnet_v2_", "regnet_", "convnext_", "vit_",
                           "swin_", "maxvit")
SEGMENTATION_FAMILIES = ("fcn_", "deeplabv3_", "lraspp_")

# Exit status for "cannot run here" (ctest's SKIP_RETURN_CODE).
SKIP = 77


def natural_key(name):
    """resnet18 before resnet101: digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def zoo():
    """{model name: (builder, is segmentation)} for every architecture this torchvision has."""
    import torchvision.models as classification
    import torchvision.models.segmentation as segmentation

    models = {}
    for module, families, is_segmentation in ((classification, CLASSIFICATION_FAMILIES, False),
                                              (segmentation, SEGMENTATION_FAMILIES, True)):
        names = [n for n in dir(module) if inspect.isfunction(getattr(module, n)) and n.startswith(families)]
        names.sort(key=lambda n: (next(i for i, f in enumerate(families) if n.startswith(f)), natural_key(n)))
        for n in names:
            models[n] = (getattr(module, n), is_segmentation)
    return models


def held_out():
    """{name: (builder, the input's shape after the batch)}: networks of the
    kinds teams deploy beside torchvision's, for timing (random weights;
    build them with build_held_out): a BERT-style encoder (4 layers, d 256,
    4 heads, feed-forward 1024, GELU, 128 tokens), a GPT-2-style decoder
    (the same with pre-norm, a causal mask and a 1000-way head) and a 1-D
    audio network (7 Conv1d + BatchNorm + ReLU over 16,000 samples, a
    35-way head)."""
    import torch

    d, tokens = 256, 128

    def gelu(x):  # a function of its own: PyTorch's fused encoder kernel, which has no ONNX export, takes F.gelu
        return torch.nn.functional.gelu(x)

    def layers(norm_first):
        layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=1024, dropout=0.0,
                                                 activation=gelu, batch_first=True, norm_first=norm_first)
        return torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = layers(True)
            self.head = torch.nn.Linear(d, 1000)
            self.register_buffer("mask", torch.triu(torch.full((tokens, tokens), float("-inf")), 1))

        def forward(self, x):
            return self.head(self.body(x, mask=self.mask))

    def audio():
        stack, c = [], 1
        for co, k, stride in ((32, 80, 4), (32, 3, 1), (64, 3, 2), (64, 3, 1), (128, 3, 2), (128, 3, 1), (256, 3, 2)):
            stack += [torch.nn.Conv1d(c, co, k, stride, padding=k // 2), torch.nn.BatchNorm1d(co), torch.nn.ReLU()]
            c = co
        return torch.nn.Sequential(*stack, torch.nn.AdaptiveAvgPool1d(1), torch.nn.Flatten(), torch.nn.Linear(c, 35))

    return {"bert_encoder": (lambda: layers(False), (tokens, d)), "gpt_decoder": (Decoder, (tokens, d)),
            "audio_1d": (audio, (1, 16000))}


def build_held_out(builder):
    """A held_out() network in eval mode, built from seed 0."""
    import torch

    torch.manual_seed(0)
    return builder().eval()


def first_line(error, limit=None):
    text = str(error).strip().splitlines()
    text = text[0] if text else type(error).__name__
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def refused_ops(message):
    """The op types a compiler refusal names: "'node' (Op), ..." or "node 'n' (Op): ..."."""
    ops = []
    for op in re.findall(r"'[^']*' \(([A-Za-z0-9_.]+)\)", message):
        if op not in ops:
            ops.append(op)
    return ops


def build(builder, is_segmentation):
    """The network in eval mode, built from seed 0; a segmentation net gives only its 'out'."""
    import torch

    class SegmentationOut(torch.nn.Module):
        """A segmentation model whose dict result is reduced to its 'out' tensor."""

        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)["out"]

    torch.manual_seed(0)
    kwargs = {"weights": None}
    if is_segmentation:
        kwargs["weights_backbone"] = None
        if "aux_loss" in inspect.signature(builder).parameters:
            kwargs["aux_loss"] = False
    net = builder(**kwargs)
    # Some builders initialise a layer to zero (vit's classifier head), which
    # leaves the output constant and any comparison empty: such weights are
    # drawn like the rest (normal, std 0.02), still from seed 0.
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) and not m.weight.any():
                m.weight.normal_(0, 0.02)
    if is_segmentation:
        net = SegmentationOut(net)
    return net.eval()


def unfuse_attention(net):
    """PyTorch 1.13 runs nn.MultiheadAttention in eval mode as one fused kernel
    (aten::_native_multi_head_attention) that it cannot export to ONNX. In
    training mode the module takes its composed path, which exports as
    MatMul, Softmax and the rest; with a dropout of 0 (torchvision's vit)
    the result is the same. Returns how many modules were switched."""
    import torch

    switched = 0
    for m in net.modules():
        if isinstance(m, torch.nn.MultiheadAttention) and m.dropout == 0:
            m.train()
            switched += 1
    return switched


def export(net, x, path):
    """PyTorch's fp32 output on x and the largest magnitude any module
    output reaches on the way, and the ONNX file at path (opset 13).
    Attention modules are exported in their composed form (unfuse_attention)."""
    import torch

    unfused = unfuse_attention(net)
    peak = [0.0]

    def largest(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point() and output.numel():
            peak[0] = max(peak[0], float(output.detach().abs().max()))

    hooks = [m.register_forward_hook(largest) for m in net.modules()]
    with torch.no_grad():
        try:
            ref = net(x).numpy()
        finally:
            for h in hooks:
                h.remove()
        torch.onnx.export(net, x, path, opset_version=13, input_names=["input"], output_names=["out"],
                          do_constant_folding=True,
                          training=torch.onnx.TrainingMode.PRESERVE if unfused else torch.onnx.TrainingMode.EVAL)
    return ref, peak[0]


def qat_export(net, x, path, calibration, steps=3):
    """The Q/DQ (explicitly quantised) form of net at path, as quantization-
    aware training exports it: a copy through PyTorch's FX QAT
    (prepare_qat_fx; FakeQuantize with per-tensor uint8 activations and
    per-channel symmetric int8 weights, the pairs TensorRT and ONNX Runtime
    run in int8), its observers fed `steps` slices of `calibration`, then
    frozen and exported at opset 13. No training: the scales are the
    observers' ranges, and the copy is prepared and observed in eval mode,
    so that stochastic depth (EfficientNet's) is traced as the identity it
    is at inference and batch norms keep their running statistics. Ops whose int8 form has fixed scales
    (Hardsigmoid, Sigmoid, Softmax, Tanh) get those fixed scales, as in
    PyTorch's default QAT mapping. Returns the frozen model's output on x."""
    import copy

    import onnx
    import torch
    from torch.ao import quantization as tq
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    qconfig = tq.QConfig(
        activation=tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                             dtype=torch.quint8),
        weight=tq.FakeQuantize.with_args(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                                         quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric))
    tx = torch.from_numpy(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mapping = tq.QConfigMapping().set_global(qconfig)
        for ops, observer in (((torch.nn.Hardsigmoid, torch.nn.functional.hardsigmoid, "hardsigmoid", "hardsigmoid_",
                                torch.nn.Sigmoid, torch.sigmoid, "sigmoid", "sigmoid_", torch.nn.Softmax),
                               tq.observer.default_fixed_qparams_range_0to1_observer),
                              ((torch.nn.Tanh, torch.tanh, "tanh", "tanh_"),
                               tq.observer.default_fixed_qparams_range_neg1to1_observer)):
            fixed = tq.QConfig(activation=tq.FixedQParamsFakeQuantize.with_args(observer=observer),
                               weight=qconfig.weight)
            for op in ops:
                mapping.set_object_type(op, fixed)
        qat = prepare_qat_fx(copy.deepcopy(net).eval(), mapping, example_inputs=(tx,))
        qat.eval()  # the prepared module starts in training mode; the observers run in either
        with torch.no_grad():
            for part in np.array_split(calibration, max(1, min(steps, len(calibration)))):
                qat(torch.from_numpy(np.ascontiguousarray(part)))
        qat.apply(tq.disable_observer)
        with torch.no_grad():
            ref = qat(tx).numpy()
            torch.onnx.export(qat, tx, path, opset_version=13, input_names=["input"], output_names=["out"])
    # PyTorch writes a per-tensor scale and zero point as [1], which opset 13
    # reads as per-axis along axis 1; ONNX Runtime's QLinearAdd refuses it.
    model = onnx.load(path)
    per_tensor = {i for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                  and not any(a.name == "axis" for a in n.attribute) for i in n.input[1:]}
    for t in model.graph.initializer:
        if t.name in per_tensor and list(t.dims) == [1]:
            del t.dims[:]
    onnx.save(model, path)
    return ref


def errors(ref, ours):
    """(max |error| / range of ref, SNR in dB of ours against ref)."""
    ours = ours.reshape(ref.shape).astype(np.float64)
    ref = ref.astype(np.float64)
    span = float(ref.max() - ref.min()) or 1.0
    max_error = float(np.abs(ours - ref).max()) / span
    noise = float(np.square(ref - ours).sum())
    signal = float(np.square(ref).sum())
    snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal > 0 else -math.inf)
    if not np.isfinite(ours).all():
        max_error, snr = math.nan, math.nan
    return max_error, snr


def rate(run, batch, seconds):
    """Images per second of run(): one warm-up call, then calls for `seconds`."""
    run()
    n = 0
    start = time.perf_counter()
    while True:
        run()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n * batch / elapsed


def torch_images_per_s(torch, net, x, batch, seconds):
    """PyTorch's images per second, the better of IEEE arithmetic and flushing
    denormals to zero: random weights leave some networks' activations in
    the denormal range, where PyTorch's CPU kernels slow down many times,
    and the baseline should be PyTorch at its fastest."""
    tx = torch.from_numpy(x)
    rates = []
    with torch.no_grad():
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            try:
                rates.append(rate(lambda: net(tx), batch, seconds))
            finally:
                torch.set_flush_denormal(False)
    return max(rates)


ORT_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ort_bench.mjs")


def ort_images_per_s(args, path, x, ref, folder):
    """ONNX Runtime's images per second on the ONNX file at path (the better
    of IEEE arithmetic and flushed denormals, as for PyTorch) and its
    output's max error / range against PyTorch's ref."""
    xin, yout = os.path.join(folder, "ort-input.bin"), os.path.join(folder, "ort-output.bin")
    x.tofile(xin)
    done = subprocess.run(["node", ORT_BENCH, "--modules", args.ort, "--model", path, "--input", xin,
                           "--output", yout, "--shape", "x".join(map(str, x.shape)),
                           "--threads", str(args.threads), "--seconds", str(args.seconds)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("ONNX Runtime: " + (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    out = np.fromfile(yout, dtype=np.float32)
    return result["images_per_s"], errors(ref, out)[0], result["version"]


def fp16_out_of_range(ref, inside=0.0):
    """Why fp16 cannot hold PyTorch's output ref, or an activation on the way
    there (`inside`, the largest magnitude a module's output reached), or
    None where it can."""
    if inside > FP16_LARGEST:
        return f"an activation above fp16 range (max |x| {inside:.1e})"
    peak = float(np.abs(ref).max())
    if peak < FP16_SMALLEST_NORMAL:
        return f"output below fp16 range (max |x| {peak:.1e})"
    if peak > FP16_LARGEST:
        return f"output above fp16 range (max |x| {peak:.1e})"
    return None


def torch_engine(torch, qconfig):
    """The quantized engine that runs PyTorch's int8 for --torch-qconfig: the
    backend of that name where this PyTorch has it, else onednn for fbgemm's
    and x86's qconfig (Debian builds PyTorch without FBGEMM; oneDNN's x86
    kernels take the same per-channel weights and 7-bit activations), else
    None."""
    engines = torch.backends.quantized.supported_engines
    if qconfig in engines:
        return qconfig
    if qconfig in ("fbgemm", "x86") and "onednn" in engines:
        return "onednn"
    return None


def torch_ptq(torch, net, calibration, x, qconfig):
    """PyTorch's own int8 output on x: a copy of net quantised by FX graph
    mode post-training static quantisation with the default qconfig mapping
    of `qconfig`, its observers fed the whole calibration set in one batch.
    Runs on the engine torch.backends.quantized.engine names."""
    import copy

    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    example = (torch.from_numpy(x),)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_fx(copy.deepcopy(net), get_default_qconfig_mapping(qconfig), example)
        prepared(torch.from_numpy(calibration))
        quantized = convert_fx(prepared)
        return quantized(*example).numpy()


def layer_errors(path, report):
    """tpuhal's precision report as dicts, each layer with two more fields:
    input_snr_db, the lowest SNR of the values its ONNX node reads (traced
    back through nodes the report has no line for, such as Identity; None
    where it reads only the model's input, which both models take exactly,
    and constants), and own_snr_db, the SNR of the error the layer adds,
    -10 log10(10^(-snr/10) - 10^(-input/10)): the errors before a layer and
    its own taken to add as independent noise, the layer that adds the
    most has the lowest (inf: it adds none)."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    inputs = {node.name: list(node.input) for node in graph.node}
    snr = {e.output: e.snr_db for e in report}

    def input_snr(tensors, seen):
        """The lowest SNR of `tensors` in the report, or None."""
        found = []
        for t in tensors:
            if t in snr:
                found.append(snr[t])
            elif t in producer and t not in seen:
                seen.add(t)
                found.append(input_snr(producer[t].input, seen))
        found = [f for f in found if f is not None]
        return min(found) if found else None

    layers = []
    for e in report:
        before = input_snr(inputs.get(e.node, []), set())
        noise = 10 ** (-e.snr_db / 10) - (0.0 if before is None else 10 ** (-before / 10))
        layers.append({"node": e.node, "op": e.op, "output": e.output, "max_abs": e.max_abs, "rms": e.rms,
                       "rel_rms": e.rel_rms, "snr_db": e.snr_db, "input_snr_db": before,
                       "own_snr_db": -10 * math.log10(noise) if noise > 0 else math.inf})
    return layers


def within_bounds(row):
    """Whether an ok row meets --check's bound for its precision (rows with a note are not checked)."""
    if row.get("note"):
        return True
    if row["precision"] == "fp32":
        return row["max_error_over_range"] <= FP32_MAX_ERROR_OVER_RANGE
    return row["snr_db"] >= MIN_SNR_DB[row["precision"]]


def run_model(tpuhal, dev, name, builder, is_segmentation, args, tmp):
    """The rows of one model, one per precision; never raises for the model's sake."""
    import torch

    rng = np.random.default_rng(args.seed)
    shape = (args.batch, 3, args.size, args.size)
    x = rng.standard_normal(shape, dtype=np.float32)
    calibration = rng.standard_normal((args.calibration,) + shape[1:], dtype=np.float32)
    precisions = [q for p in args.precisions for q in ((p, TORCH_INT8) if p == "int8" and args.torch_ptq else (p,))]
    rows = [{"model": name, "precision": p, "status": None, "max_error_over_range": None, "snr_db": None}
            for p in precisions]

    def all_rows(status, message):
        for row in rows:
            row["status"], row["message"] = status, message
        return rows

    # A directory per model: PyTorch writes a model over 2 GiB (vit_h_14,
    # regnet_y_128gf) as external data, one file per tensor beside the
    # .onnx, where the compiler reads them; all go when the model is done.
    folder = os.path.join(tmp, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name + ".onnx")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = build(builder, is_segmentation)
            ref, inside = export(net, torch.from_numpy(x), path)
    except Exception as e:  # noqa: BLE001 - any PyTorch failure is this model's result
        shutil.rmtree(folder, ignore_errors=True)
        return all_rows("export failed: " + first_line(e), str(e))

    torch_rate = None
    ort = None  # (images per second, max error / range): once per model
    for row in rows:
        precision = row["precision"]
        if precision == TORCH_INT8:
            row["qconfig"], row["engine"] = args.torch_qconfig, args.torch_engine
            try:
                out = torch_ptq(torch, net, calibration, x, args.torch_qconfig)
                row["max_error_over_range"], row["snr_db"] = errors(ref, out)
                row["status"] = "ok"
                peak = float(np.abs(ref).max())
                if not out.any() and 0 < peak < TORCH_SMALLEST_SCALE:
                    row["note"] = (f"all zero: PyTorch's output (max |x| {peak:.1e}) is below its smallest "
                                   f"int8 scale ({TORCH_SMALLEST_SCALE:.1e})")
            except Exception as e:  # noqa: BLE001 - FX cannot trace or quantise every model
                row["status"] = "torch PTQ failed: " + first_line(e)
                row["message"] = str(e)
            continue
        try:
            if precision.startswith("int8"):
                cm = tpuhal.compile(path, "int8", shapes={"input": shape}, calibration=calibration,
                                    method=args.method, percentile=args.percentile, device=args.device,
                                    target_snr_db=args.target_snr if precision == "int8-mixed" else 0.0,
                                    report=args.layer_report is not None)
                row["fp16_layers"] = sum(int(n.split()[0]) for n in cm.notes if " layer(s) in fp16" in n)
                if args.layer_report is not None:
                    row["layer_report"] = layer_errors(path, cm.report)
            else:
                cm = tpuhal.compile(path, precision, shapes={"input": shape}, device=args.device)
        except tpuhal.Unsupported as e:
            ops = refused_ops(str(e))
            row["status"] = "refused: " + (", ".join(ops) if ops else first_line(e))
            row["message"] = str(e)
            continue
        except Exception as e:  # noqa: BLE001
            row["status"] = "compile failed: " + first_line(e)
            row["message"] = str(e)
            continue
        try:
            instance = dev.load_model(cm).instance()
            out = np.empty(ref.shape, np.float32)
            instance.run(x, outputs=[out])
            row["max_error_over_range"], row["snr_db"] = errors(ref, out)
            if args.bench:
                if torch_rate is None:  # once per model, and only for one that runs here
                    torch_rate = torch_images_per_s(torch, net, x, args.batch, args.seconds)
                row["images_per_s"] = rate(lambda: instance.run(x, outputs=[out]), args.batch, args.seconds)
                row["pytorch_images_per_s"] = torch_rate
                row["ratio"] = row["images_per_s"] / torch_rate
                if args.ort:
                    if ort is None:
                        try:
                            ort = ort_images_per_s(args, path, x, ref, folder)[:2]
                        except Exception as e:  # noqa: BLE001 - ONNX Runtime's failure is its row's note
                            ort = (None, None)
                            row["ort_message"] = str(e)
                    row["ort_images_per_s"], row["ort_max_error_over_range"] = ort
                    if ort[0]:
                        row["ort_ratio"] = row["images_per_s"] / ort[0]
            row["status"] = "ok"
            if precision == "fp16" and fp16_out_of_range(ref, inside):
                row["note"] = fp16_out_of_range(ref, inside)
        except Exception as e:  # noqa: BLE001
            row["status"] = "run failed: " + first_line(e)
            row["message"] = str(e)
    shutil.rmtree(folder)
    return rows


def number(value, fmt):
    if value is None:
        return "-"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return format(value, fmt)


def print_row(row, bench, status_width, ort=False):
    status = row["status"]
    if row.get("note"):
        status += " (all zero)" if row["precision"] == TORCH_INT8 else " (unchecked)"
    line = (f"{row['model']:<30} {row['precision']:<10} {first_line(status, status_width):<{status_width}} "
            f"{number(row['max_error_over_range'], '.2e'):>10} {number(row['snr_db'], '.1f'):>7}")
    if bench:
        line += (f" {number(row.get('images_per_s'), '.1f'):>9} {number(row.get('pytorch_images_per_s'), '.1f'):>9}"
                 f" {number(row.get('ratio'), '.2f'):>6}")
    if ort:
        line += (f" {number(row.get('ort_images_per_s'), '.1f'):>9} {number(row.get('ort_max_error_over_range'), '.1e'):>8}"
                 f" {number(row.get('ort_ratio'), '.2f'):>9}")
    print(line, flush=True)


def print_layer_report(row, count):
    """The `count` layers of an int8 row's precision report that add the most error, indented under the row."""
    layers = row.get("layer_report")
    if not layers:
        return
    print(f"    precision report on the calibration data: the {min(count, len(layers))} of {len(layers)} layers "
          "that add the most error")
    print(f"    {'own dB':>8} {'SNR dB':>7} {'input dB':>8}  op, node")
    for e in sorted(layers, key=lambda e: e["own_snr_db"])[:count]:
        before = "input" if e["input_snr_db"] is None else number(e["input_snr_db"], ".1f")
        print(f"    {number(e['own_snr_db'], '.1f'):>8} {number(e['snr_db'], '.1f'):>7} {before:>8}  "
              f"{e['op']}, {e['node']}")
    sys.stdout.flush()


def comma_list(text):
    return [item for item in re.split(r"[,\s]+", text) if item]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--models", type=comma_list, help="comma-separated model names (default: all; see --list)")
    ap.add_argument("--list", action="store_true", help="list the models this torchvision has and exit")
    ap.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    ap.add_argument("--batch", type=int, default=1, help="batch size the models are exported and compiled for")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS),
                    help="precisions to compile, comma- or space-separated (default: fp32 fp16 bf16 int8 int8-mixed)")
    ap.add_argument("--calibration", type=int, default=4, help="random inputs int8 is calibrated on (default 4)")
    ap.add_argument("--percentile", type=float, default=99.99, help="int8 calibration percentile (default 99.99)")
    ap.add_argument("--method", default="percentile", choices=("percentile", "minmax", "entropy"),
                    help="int8 calibration method (default percentile)")
    ap.add_argument("--target-snr", type=float, default=MIXED_MIN_SNR_DB + 5,
                    help="int8-mixed: the output SNR on the calibration data that layers move to fp16 for "
                         f"(default {MIXED_MIN_SNR_DB + 5:g} dB)")
    ap.add_argument("--torch-ptq", action="store_true",
                    help="add a torch-int8 row under each int8 row: PyTorch's FX graph mode post-training static "
                         "quantisation on the same calibration inputs")
    ap.add_argument("--torch-qconfig", default="fbgemm", choices=TORCH_QCONFIGS,
                    help="with --torch-ptq: the backend whose default qconfig mapping PyTorch quantises with "
                         "(default fbgemm: int8 weights per output channel, 7-bit activations)")
    ap.add_argument("--layer-report", type=int, nargs="?", const=5, metavar="N",
                    help="print the N layers (default 5) of tpuhal's precision report that add the most error "
                         "under each int8 and int8-mixed row, and put the whole report in --json")
    ap.add_argument("--seed", type=int, default=0, help="seed of the input and the calibration set (default 0)")
    ap.add_argument("--device", default="sim:0", help="the device to compile for and run on (default sim:0)")
    ap.add_argument("--bench", action="store_true",
                    help="also measure images/s on the device and in PyTorch on this CPU")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for the simulated tensor engine and for PyTorch alike (default: every CPU)")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per --bench entry (default 2)")
    ap.add_argument("--ort", metavar="DIR",
                    help="with --bench: also time ONNX Runtime (npm's onnxruntime-node installed in DIR) "
                         "on the same file, input and threads")
    ap.add_argument("--json", metavar="FILE", help="also write the rows to FILE as JSON")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a model that compiled misses its precision's bound, or a model in "
                         "--expect-compile does not compile")
    ap.add_argument("--expect-compile", type=comma_list, default=[],
                    help="comma-separated models that must compile (with --check; added to --models)")
    args = ap.parse_args()
    args.precisions = [p for item in args.precisions for p in comma_list(item)]
    if args.ort:
        if not args.bench:
            ap.error("--ort times ONNX Runtime beside tpuhal: give --bench with it")
        if not os.path.isdir(os.path.join(args.ort, "node_modules", "onnxruntime-node")):
            ap.error(f"--ort: {args.ort} has no node_modules/onnxruntime-node (see {ORT_BENCH})")
        if shutil.which("node") is None:
            ap.error("--ort: no node on PATH (Debian: nodejs)")
    for p in args.precisions:
        if p not in PRECISIONS:
            ap.error(f"unknown precision '{p}' (expected some of {', '.join(PRECISIONS)})")

    # The simulated board's tensor engine takes its thread count from here,
    # so set it before tpuhal opens the device.
    os.environ["TPUHAL_SIM_THREADS"] = str(args.threads)
    try:
        import torch
        import torchvision
    except ImportError as e:
        print(f"model zoo: skipped, {e} (Debian: python3-torch python3-torchvision)", file=sys.stderr)
        return SKIP
    import tpuhal

    torch.set_num_threads(args.threads)
    args.torch_ptq = args.torch_ptq and "int8" in args.precisions
    args.torch_engine = torch_engine(torch, args.torch_qconfig) if args.torch_ptq else None
    if args.torch_ptq:
        if args.torch_engine is None:
            ap.error(f"--torch-ptq: this PyTorch has no quantized engine for the {args.torch_qconfig} qconfig "
                     f"(it has {', '.join(torch.backends.quantized.supported_engines)})")
        torch.backends.quantized.engine = args.torch_engine
    if args.layer_report is not None:
        try:
            import onnx  # noqa: F401 - layer_errors reads the exported graph
        except ImportError as e:
            ap.error(f"--layer-report: {e} (Debian: python3-onnx)")

    models = zoo()
    if args.list:
        for name, (_, is_segmentation) in models.items():
            print(f"{name:<30} {'segmentation' if is_segmentation else 'classification'}")
        return 0
    chosen = list(args.models or models)
    chosen += [m for m in args.expect_compile if m not in chosen]
    unknown = [m for m in chosen if m not in models]
    if unknown:
        ap.error(f"unknown model(s): {', '.join(unknown)} (see --list)")

    status_width = 40
    header = f"{'model':<30} {'prec':<10} {'status':<{status_width}} {'err/range':>10} {'SNR dB':>7}"
    if args.bench:
        header += f" {'ours/s':>9} {'torch/s':>9} {'ratio':>6}"
    if args.ort:
        header += f" {'ort/s':>9} {'ort err':>8} {'ort ratio':>9}"
    print(f"{len(chosen)} model(s), input {args.batch}x3x{args.size}x{args.size}, on {args.device}; "
          f"PyTorch {torch.__version__}, torchvision {torchvision.__version__}"
          + (f", {args.threads} thread(s), {args.seconds:g} s per entry" if args.bench else "")
          + (f"; torch-int8: {args.torch_qconfig} qconfig on the {args.torch_engine} engine"
             if args.torch_ptq else ""))
    print(header)
    print("-" * len(header), flush=True)

    rows = []
    with tpuhal.open(args.device) as dev, tempfile.TemporaryDirectory(prefix="tpuhal-zoo-") as tmp:
        for name in chosen:
            builder, is_segmentation = models[name]
            for row in run_model(tpuhal, dev, name, builder, is_segmentation, args, tmp):
                rows.append(row)
                print_row(row, args.bench, status_width, bool(args.ort))
                if args.layer_report:
                    print_layer_report(row, args.layer_report)

    if args.json:
        def plain(v):
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, list):
                return [plain(x) for x in v]
            return str(v) if isinstance(v, float) and not math.isfinite(v) else v
        with open(args.json, "w") as f:
            json.dump(plain(rows), f, indent=1)
            f.write("\n")

    ours = [r for r in rows if r["precision"] != TORCH_INT8]
    theirs = [r for r in rows if r["precision"] == TORCH_INT8]
    print(f"\n{sum(r['status'] == 'ok' for r in ours)} of {len(ours)} ok")
    if theirs:
        print(f"{TORCH_INT8}: {sum(r['status'] == 'ok' for r in theirs)} of {len(theirs)} quantised by PyTorch")
    for row in rows:
        if row.get("note"):
            print(f"{'note' if row['precision'] == TORCH_INT8 else 'unchecked'}: "
                  f"{row['model']} {row['precision']}: {row['note']}")
    not_ok = {}  # each model's first status other than ok, in full
    for row in ours:
        if row["status"] != "ok":
            not_ok.setdefault(row["model"], row["status"])
    for model, status in not_ok.items():
        print(f"{model}: {first_line(status, 200)}")
    for row in theirs:
        if row["status"] != "ok" and not row["status"].startswith("export failed"):
            print(f"{row['model']} {TORCH_INT8}: {first_line(row['status'], 200)}")
    if not args.check:
        return 0

    failures = []
    for row in ours:
        where = f"{row['model']} {row['precision']}"
        if row["status"] == "ok" and not within_bounds(row):
            if row["precision"] == "fp32":
                failures.append(f"{where}: max error / range {number(row['max_error_over_range'], '.2e')} "
                                f"> {FP32_MAX_ERROR_OVER_RANGE:g}")
            else:
                failures.append(f"{where}: SNR {number(row['snr_db'], '.1f')} dB "
                                f"< {MIN_SNR_DB[row['precision']]:g} dB")
        elif row["status"].startswith("run failed"):
            failures.append(f"{where}: compiled, then {row['status']}")
        elif row["model"] in args.expect_compile and row["status"] != "ok":
            failures.append(f"{where}: expected to compile, {row['status']}")
    for f in failures:
        print("check failed: " + f, file=sys.stderr)
    print("check: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
