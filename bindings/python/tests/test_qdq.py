"""Q/DQ (explicit quantization) models: QuantizeLinear / DequantizeLinear
pairs as quantization-aware training exports them, compiled to int8 with the
model's own scales (no calibration) and run in float as the graph says
(docs/runtime.md, "Q/DQ models")."""

import numpy as np
import pytest

import tpuhal
from conftest import run_plain

onnx = pytest.importorskip("onnx", reason="python3-onnx is not installed (scripts/setup.sh installs it)")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(5)


def fake_quant(v, scale, zero, lo, hi):
    return (np.clip(np.rint(v / scale) + zero, lo, hi) - zero) * scale


def qdq_model(nodes, name, x_shape, consts):
    """An opset-13 model's bytes: float input x, float output y, `consts` [(name, array)] as initializers."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for n, a in consts])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


def qdq_conv(out_quantized=True, out_reader="DequantizeLinear", act="Relu"):
    """pytorch-quantization's style: int8 symmetric activations, per-channel int8 weights, a Relu (or a
    Clip to [0, 6]), the output quantized again. Returns the model's bytes, the input and a float64
    reference."""
    c, k, h = 16, 32, 12
    x = RNG.standard_normal((1, c, h, h)).astype(np.float32)
    w = (RNG.standard_normal((k, c, 3, 3)) * 0.2).astype(np.float32)
    b = (RNG.standard_normal(k) * 0.1).astype(np.float32)
    sx, sy = np.float32(0.03), np.float32(0.05)
    sw = (np.abs(w).reshape(k, -1).max(1) / 127).astype(np.float32)
    wq = np.clip(np.rint(w / sw[:, None, None, None]), -128, 127).astype(np.int8)
    consts = [("sx", np.array(sx)), ("zx", np.array(0, np.int8)), ("wq", wq), ("sw", sw),
              ("zw", np.zeros(k, np.int8)), ("b", b), ("sy", np.array(sy)), ("zy", np.array(0, np.int8)),
              ("lo", np.array(0, np.float32)), ("hi", np.array(6, np.float32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(act, ["c"] if act == "Relu" else ["c", "lo", "hi"], ["r"] if out_quantized else ["y"])]
    if out_quantized:
        nodes += [helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["yq"]),
                  helper.make_node(out_reader, ["yq", "sy", "zy"] if out_reader == "DequantizeLinear" else ["yq"],
                                   ["y"])]
    model = qdq_model(nodes, "qdq_conv", x.shape, consts)
    torch = pytest.importorskip("torch")
    xd = fake_quant(x, sx, 0, -128, 127).astype(np.float64)
    wd = wq.astype(np.float64) * sw[:, None, None, None]
    conv = torch.nn.functional.conv2d(torch.from_numpy(xd), torch.from_numpy(wd), torch.from_numpy(b.astype(np.float64)),
                                      padding=1).numpy()
    ref = np.maximum(conv, 0) if act == "Relu" else np.clip(conv, 0, 6)
    if out_quantized:
        ref = fake_quant(ref, np.float64(sy), 0, -128, 127)
    return model, x, ref, float(sy)


def run(dev, model, precision, x, **kw):
    compiled = tpuhal.compile(model, precision, device=dev.uri, **kw)
    return dev.load_model(compiled).instance().run([x])[0], compiled.notes


@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_a_qdq_convolution_runs_the_models_arithmetic_in_every_precision(dev, act):
    model, x, ref, step = qdq_conv(act=act)
    got, _ = run(dev, model, "fp32", x)
    assert np.abs(got - ref).max() <= 1e-4 * step
    got, notes = run(dev, model, "int8", x)  # no calibration data: the model's scales
    assert "1 layer(s) in int8 from the model's Q/DQ" in " ".join(notes)
    steps = np.abs(got - ref) / step
    # Exact integer sums; the requantisation's f32 multiplier may round a
    # value at a tie the other way.
    assert steps.max() <= 1.0 + 1e-5
    assert (steps > 0.5).mean() <= 0.01
    # The Relu or Clip after a signed (zero point 128 as u8) output is
    # applied: the int8 range holds -6.4 to 6.35.
    assert got.min() >= 0
    if act == "Clip":
        assert got.max() <= 6 and ref.max() == pytest.approx(6, abs=step)
    got, _ = run(dev, model, "fp16", x)
    assert np.abs(got - ref).max() <= step * 1.01


def test_a_layer_the_pairs_do_not_cover_runs_in_fp32_or_is_refused_when_strict(dev):
    model, x, ref, _ = qdq_conv(out_quantized=False)
    got, notes = run(dev, model, "int8", x)
    text = " ".join(notes)
    assert "1 layer(s) in fp32, not covered by the model's Q/DQ" in text
    assert "its output is not quantized by the model" in text
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    with pytest.raises(tpuhal.InvalidArgument, match="would run in fp32.*Conv"):
        tpuhal.compile(model, "int8", device=dev.uri, strict_qdq=True)


def test_quantized_integers_read_by_other_ops_are_refused_clearly(dev):
    model, _, _, _ = qdq_conv(out_reader="Relu")
    with pytest.raises(tpuhal.Unsupported, match="QuantizeLinear only before DequantizeLinear"):
        tpuhal.compile(model, "fp32", device=dev.uri)


# torchvision's ResNet-18 through PyTorch's FX quantization-aware training
# (FakeQuantize observers: per-tensor uint8 activations, per-channel
# symmetric int8 weights), exported at opset 13 into argv[1]/qat.onnx, with
# an input and the model's output on it in argv[1]/qat.npz.
FX_QAT_RESNET18 = """
import sys, warnings
import numpy as np, torch, torchvision
from torch.ao import quantization as tq
from torch.ao.quantization.quantize_fx import prepare_qat_fx
warnings.simplefilter("ignore")
torch.manual_seed(0)
qconfig = tq.QConfig(
    activation=tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                         dtype=torch.quint8),
    weight=tq.FakeQuantize.with_args(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                                     quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric))
model = torchvision.models.resnet18().train()
shape = (1, 3, 64, 64)
qat = prepare_qat_fx(model, tq.QConfigMapping().set_global(qconfig), example_inputs=(torch.randn(shape),))
with torch.no_grad():
    for _ in range(3):
        qat(torch.randn(2, *shape[1:]))
qat.eval()
qat.apply(tq.disable_observer)
x = torch.randn(shape)
with torch.no_grad():
    y = qat(x).numpy()
torch.onnx.export(qat, x, sys.argv[1] + "/qat.onnx", opset_version=13)
np.savez(sys.argv[1] + "/qat.npz", x=x.numpy(), y=y)
"""


def fx_qat_resnet18(tmp_path):
    """FX_QAT_RESNET18's model, input and output, made by an interpreter without the sanitizer runtime."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    run_plain(FX_QAT_RESNET18, tmp_path)
    saved = np.load(tmp_path / "qat.npz")
    return (tmp_path / "qat.onnx").read_bytes(), saved["x"], saved["y"]


@pytest.mark.filterwarnings("ignore")
def test_an_fx_qat_resnet18_runs_every_layer_in_int8_from_its_own_scales(dev, tmp_path):
    model, x, want = fx_qat_resnet18(tmp_path)
    m = onnx.load_from_string(model)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    last = [n for n in m.graph.node if n.op_type == "DequantizeLinear"][-1]
    step = float(inits[last.input[1]].reshape(-1)[0])  # the output's quantization step
    got, notes = run(dev, model, "int8", x)
    text = " ".join(notes)
    assert "21 layer(s) in int8 from the model's Q/DQ" in text
    assert "not covered" not in text
    # Quantized activations that fall the other way at a tie move later
    # layers by a step or so: measured 3 steps at most, 0.7 on average.
    steps = np.abs(got - want) / step
    assert steps.max() <= 4.01 and steps.mean() <= 1.0
    assert (got.argmax(1) == want.argmax(1)).all()
    got32, _ = run(dev, model, "fp32", x)
    steps = np.abs(got32 - want) / step
    assert steps.max() <= 3.01 and steps.mean() <= 1.0


def test_a_1d_convolution_between_pairs_runs_in_float_and_says_so(dev):
    x = RNG.standard_normal((1, 4, 20)).astype(np.float32)
    w = (RNG.standard_normal((6, 4, 3)) * 0.2).astype(np.float32)
    sx, sy = np.float32(0.03), np.float32(0.05)
    sw = (np.abs(w).reshape(6, -1).max(1) / 127).astype(np.float32)
    wq = np.clip(np.rint(w / sw[:, None, None]), -128, 127).astype(np.int8)
    consts = [("sx", np.array(sx)), ("z", np.array(0, np.int8)), ("wq", wq), ("sw", sw), ("zw", np.zeros(6, np.int8)),
              ("sy", np.array(sy))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1]),
             helper.make_node("QuantizeLinear", ["c", "sy", "z"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "sy", "z"], ["y"])]
    model = qdq_model(nodes, "qdq_conv1d", x.shape, consts)
    got, notes = run(dev, model, "int8", x)
    text = " ".join(notes)
    assert "1 layer(s) in fp32, not covered by the model's Q/DQ" in text, text
    assert "1-D convolutions run in float" in text, text
    xd = np.pad(fake_quant(x, sx, 0, -128, 127).astype(np.float64), ((0, 0), (0, 0), (1, 1)))
    wd = wq.astype(np.float64) * sw[:, None, None]
    conv = np.stack([np.einsum("ck,ock->o", xd[0, :, i:i + 3], wd) for i in range(20)], axis=1)[None]
    ref = fake_quant(conv, np.float64(sy), 0, -128, 127)
    assert np.abs(got - ref).max() <= sy * 1.001  # at most one step, where rounding meets a tie
    with pytest.raises(tpuhal.InvalidArgument, match="would run in fp32"):
        tpuhal.compile(model, "int8", device=dev.uri, strict_qdq=True)


@pytest.mark.parametrize("factor_shape,folded", [((4, 1, 1, 1), True), ((4, 1, 1), False)])
def test_a_3d_convolution_between_pairs_runs_in_float_and_a_factor_folds_only_per_channel(dev, factor_shape,
                                                                                          folded):
    # x is [1, C, D, H, W] with C = D = 4: a factor [C, 1, 1, 1] scales channels and folds into the weights; one
    # of [4, 1, 1] lines up with D (broadcasting from the right) and must stay a Mul.
    x = RNG.standard_normal((1, 4, 4, 5, 5)).astype(np.float32)
    w = (RNG.standard_normal((4, 4, 3, 3, 3)) * 0.2).astype(np.float32)
    f = RNG.uniform(0.5, 2.0, factor_shape).astype(np.float32)
    sx = np.float32(0.03)
    sw = (np.abs(w).reshape(4, -1).max(1) / 127).astype(np.float32)
    wq = np.clip(np.rint(w / sw[:, None, None, None, None]), -128, 127).astype(np.int8)
    consts = [("sx", np.array(sx)), ("z", np.array(0, np.int8)), ("wq", wq), ("sw", sw), ("zw", np.zeros(4, np.int8)),
              ("f", f)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1] * 6, name="conv"),
             helper.make_node("Mul", ["c", "f"], ["y"], name="scale")]
    model = qdq_model(nodes, "qdq_conv3d", x.shape, consts)
    torch = pytest.importorskip("torch")
    xd = fake_quant(x, sx, 0, -128, 127).astype(np.float64)
    wd = wq.astype(np.float64) * sw[:, None, None, None, None]
    ref = torch.nn.functional.conv3d(torch.from_numpy(xd), torch.from_numpy(wd), padding=1).numpy() * f
    for precision in ("fp32", "int8"):
        got, notes = run(dev, model, precision, x)
        text = " ".join(notes)
        assert ("folded Mul 'scale'" in text) == folded, text
        assert np.abs(got - ref).max() <= 1e-4 * float(np.abs(ref).max()), precision
    assert "3-D convolutions run in float" in text, text
