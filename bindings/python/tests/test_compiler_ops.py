"""The compiler's ops beyond the basics: each is compiled from a small ONNX
graph, run on the simulated board in every float precision and compared
with NumPy (or PyTorch, where it defines the op the way exporters write it).

Concat, Pad, Slice on device data, the reductions, HardSigmoid and
HardSwish (also fused into the convolution before them), the unary maps,
Pow, variadic Min and Max, Resize, and LayerNorm as PyTorch exports it at
opset 13."""
import math

import numpy as np
import pytest

import tpuhal

onnx = pytest.importorskip("onnx", reason="python3-onnx is not installed (scripts/setup.sh installs it)")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(11)
# Largest error allowed, relative to the reference's largest magnitude.
TOLERANCE = {"fp32": 2e-6, "fp16": 4e-3, "bf16": 3e-2}


def model(nodes, inputs, output, out_shape=None, initializers=(), opset=13):
    """An ONNX model: `inputs` {name: shape}, one float output."""
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def run(dev, onnx_bytes, precision, feeds):
    compiled = tpuhal.compile(onnx_bytes, precision, shapes={k: v.shape for k, v in feeds.items()}, device=dev.uri)
    return dev.load_model(compiled).instance().run(feeds)[0]


def check(dev, onnx_bytes, feeds, reference, precisions=("fp32", "fp16", "bf16")):
    want = reference(*feeds.values())
    scale = max(float(np.abs(want).max()), 1e-30)
    for precision in precisions:
        got = run(dev, onnx_bytes, precision, feeds)
        assert got.shape == want.shape, precision
        err = float(np.abs(got.astype(np.float64) - want).max()) / scale
        assert err <= TOLERANCE[precision], f"{precision}: error {err:.3g} of the largest value"


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def i64(values):
    return np.asarray(values, np.int64)


@pytest.mark.parametrize("shape,axis", [((1, 3, 4, 4), 1), ((2, 3, 4, 4), 1), ((2, 3, 4, 5), 3), ((1, 6, 2), -1)])
def test_concat_of_device_values_on_any_axis(dev, shape, axis):
    # a's Relu writes straight into the output where the parts are contiguous;
    # b is an input (copied); c is a Sigmoid used twice (copied).
    b_shape = list(shape)
    b_shape[axis] = 2
    nodes = [helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Sigmoid", ["a"], ["sa"]),
             helper.make_node("Concat", ["ra", "b", "sa"], ["c"], axis=axis),
             helper.make_node("Mul", ["c", "c"], ["y0"]),
             helper.make_node("Concat", ["y0", "sa"], ["y"], axis=axis)]
    a, b = randn(*shape), randn(*b_shape)

    def reference(a, b):
        sa = 1 / (1 + np.exp(-a))
        c = np.concatenate([np.maximum(a, 0), b, sa], axis=axis)
        return np.concatenate([c * c, sa], axis=axis)

    check(dev, model(nodes, {"a": a.shape, "b": b.shape}, "y"), {"a": a, "b": b}, reference)


def test_nested_concats_and_a_concat_feeding_a_convolution(dev):
    w = randn(4, 6, 1, 1) * 0.5
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Concat", ["r", "n"], ["inner"], axis=1),
             helper.make_node("Abs", ["x"], ["ab"]),
             helper.make_node("Concat", ["inner", "ab"], ["outer"], axis=1),
             helper.make_node("Conv", ["outer", "w"], ["y"])]
    x = randn(1, 2, 5, 5)

    def reference(x):
        outer = np.concatenate([np.maximum(x, 0), -x, np.abs(x)], axis=1)
        return np.einsum("nchw,oc->nohw", outer, w[:, :, 0, 0])

    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("w", w)])
    check(dev, onnx_bytes, {"x": x}, reference)
    # Batch 1: Relu, Neg and Abs write into the outer Concat's output; no copies.
    assert dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).meta["ops"] == "4"
    # Batch 2: the parts are strided; each is copied.
    x2 = randn(2, 2, 5, 5)
    check(dev, model(nodes, {"x": x2.shape}, "y", initializers=[("w", w)]), {"x": x2}, reference)


@pytest.mark.parametrize("pads,value", [([0, 0, 1, 2, 0, 0, 3, 1], 0.0), ([0, 1, 0, 0, 1, 0, 2, 2], -1.5)])
def test_constant_pad(dev, pads, value):
    x = randn(2, 3, 4, 5)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Pad", ["r", "pads", "value"], ["y"], mode="constant")]
    rank = 4
    width = [(pads[d], pads[d + rank]) for d in range(rank)]
    onnx_bytes = model(nodes, {"x": x.shape}, "y",
                       initializers=[("pads", i64(pads)), ("value", np.float32(value))])
    check(dev, onnx_bytes, {"x": x}, lambda x: np.pad(np.maximum(x, 0), width, constant_values=value))


def test_zero_pads_are_a_view_and_other_modes_are_refused_clearly(dev):
    x = randn(1, 2, 3, 3)
    zero = model([helper.make_node("Pad", ["x", "pads"], ["y"])], {"x": x.shape}, "y",
                 initializers=[("pads", i64([0] * 8))])
    check(dev, zero, {"x": x}, lambda x: x)
    reflect = model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")], {"x": x.shape}, "y",
                    initializers=[("pads", i64([0, 0, 1, 1, 0, 0, 1, 1]))])
    with pytest.raises(tpuhal.Unsupported, match="mode 'reflect'"):
        tpuhal.compile(reflect, "fp32", shapes={"x": x.shape})


@pytest.mark.parametrize("starts,ends,axes,steps", [([1], [3], [1], [1]), ([0, 1], [4, 6], [2, 3], [2, 2]),
                                                    ([-3], [100], [-1], [1])])
def test_slice_of_device_data(dev, starts, ends, axes, steps):
    x = randn(2, 4, 5, 7)
    nodes = [helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Slice", ["e", "starts", "ends", "axes", "steps"], ["y"])]
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("starts", i64(starts)), ("ends", i64(ends)),
                                                                 ("axes", i64(axes)), ("steps", i64(steps))])

    def reference(x):
        index = [slice(None)] * 4
        for s, e, a, st in zip(starts, ends, axes, steps):
            index[a] = slice(s, e, st)
        return np.exp(x)[tuple(index)]

    check(dev, onnx_bytes, {"x": x}, reference)


REDUCTIONS = {
    "ReduceMean": lambda x, axes, keep: x.mean(axis=axes, keepdims=keep),
    "ReduceSum": lambda x, axes, keep: x.sum(axis=axes, keepdims=keep),
    "ReduceMax": lambda x, axes, keep: x.max(axis=axes, keepdims=keep),
    "ReduceMin": lambda x, axes, keep: x.min(axis=axes, keepdims=keep),
    "ReduceL2": lambda x, axes, keep: np.sqrt((x.astype(np.float64) ** 2).sum(axis=axes, keepdims=keep)),
}


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("shape,axes,keep", [((2, 3, 4, 5), [2, 3], 0), ((2, 3, 4, 5), [-1], 1),
                                             ((2, 3, 4, 5), [1], 1), ((2, 3, 4, 5), [0, 2], 0),
                                             ((2, 3, 4, 5), None, 1), ((2, 3, 1, 1), [2, 3], 0)])
def test_reductions_over_any_axes(dev, op, shape, axes, keep):
    x = randn(*shape)
    attrs = {"keepdims": keep}
    inputs = ["x"]
    initializers = []
    if axes is not None:
        if op == "ReduceSum":  # an input from opset 13
            inputs.append("axes")
            initializers.append(("axes", i64(axes)))
        else:
            attrs["axes"] = axes
    onnx_bytes = model([helper.make_node(op, inputs, ["y"], **attrs)], {"x": x.shape}, "y",
                       initializers=initializers)
    numpy_axes = tuple(range(4)) if axes is None else tuple(a % 4 for a in axes)
    check(dev, onnx_bytes, {"x": x}, lambda x: REDUCTIONS[op](x.astype(np.float64), numpy_axes, bool(keep)))


def hard_sigmoid(x, alpha=0.2, beta=0.5):
    return np.clip(alpha * x + beta, 0, 1)


def test_hard_sigmoid_alone_and_fused_into_a_convolution_and_hard_swish(dev):
    w = randn(2, 2, 3, 3) * 0.4
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSigmoid", ["c"], ["h"], alpha=1 / 6, beta=0.5),  # fused into the Conv
             helper.make_node("HardSigmoid", ["x"], ["hx"]),
             helper.make_node("Mul", ["x", "hx"], ["m"]),
             helper.make_node("Add", ["h", "m"], ["y"])]
    x = randn(1, 2, 6, 6) * 3

    def reference(x):
        pad = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
        c = np.zeros((1, 2, 6, 6))
        for i in range(3):
            for j in range(3):
                c += np.einsum("nchw,oc->nohw", pad[:, :, i:i + 6, j:j + 6], w[:, :, i, j])
        return hard_sigmoid(c, 1 / 6) + x * hard_sigmoid(x)

    check(dev, model(nodes, {"x": x.shape}, "y", initializers=[("w", w)]), {"x": x}, reference)
    swish = model([helper.make_node("HardSwish", ["x"], ["y"])], {"x": x.shape}, "y", opset=14)
    check(dev, swish, {"x": x}, lambda x: x * hard_sigmoid(x, 1 / 6))


def conv3x3(x, w):
    n, _, h, wd = x.shape
    pad = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    c = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            c += np.einsum("nchw,oc->nohw", pad[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return c


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "int8"])
def test_silu_sigmoid_and_tanh_fuse_into_the_convolution_before_them(dev, precision):
    w1, w2, w3 = randn(3, 2, 3, 3) * 0.4, randn(3, 3, 3, 3) * 0.3, randn(2, 3, 3, 3) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]),
             helper.make_node("Mul", ["s1", "c1"], ["silu"]),  # SiLU, the Sigmoid's output first
             helper.make_node("Conv", ["silu", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Tanh", ["c2"], ["t"]),
             helper.make_node("Conv", ["t", "w3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c3"], ["s3"]),
             helper.make_node("Mul", ["c3", "s3"], ["m3"]),
             helper.make_node("Add", ["m3", "c3"], ["y"])]  # c3 read again: not a SiLU to fuse
    x = randn(1, 2, 6, 6) * 2

    def reference(x):
        c1 = conv3x3(x, w1)
        c3 = conv3x3(np.tanh(conv3x3(c1 * sigmoid(c1), w2)), w3)
        return c3 * sigmoid(c3) + c3

    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("w1", w1), ("w2", w2), ("w3", w3)])
    if precision == "int8":
        compiled = tpuhal.compile(onnx_bytes, "int8", calibration=x[None], device=dev.uri)
        assert not [n for n in compiled.notes if "SiLU" in n or "Sigmoid" in n or "Tanh" in n]
        got = dev.load_model(compiled).instance().run(x)[0]
        want = reference(x)
        snr = 10 * math.log10(float((want ** 2).sum()) / float(((want - got) ** 2).sum()))
        assert snr > 20, snr
        return
    compiled = tpuhal.compile(onnx_bytes, precision, device=dev.uri)
    fused = [n for n in compiled.notes if n.startswith("fused")]
    assert any("SiLU (Sigmoid 'Sigmoid #1', Mul 'Mul #2')" in n for n in fused), compiled.notes
    assert any(n.startswith("fused Tanh") for n in fused), compiled.notes
    assert not any("Mul #7" in n for n in fused), compiled.notes
    check(dev, onnx_bytes, {"x": x}, reference, precisions=(precision,))


UNARY = {
    "Sqrt": (np.sqrt, lambda x: np.abs(x) + 0.1),
    "Exp": (np.exp, lambda x: x),
    "Log": (np.log, lambda x: np.abs(x) + 0.1),
    "Abs": (np.abs, lambda x: x),
    "Neg": (np.negative, lambda x: x),
    "Reciprocal": (np.reciprocal, lambda x: np.abs(x) + 0.5),
    "Erf": (np.vectorize(math.erf), lambda x: x),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_maps(dev, op):
    fn, domain = UNARY[op]
    x = domain(randn(2, 3, 7)).astype(np.float32)
    check(dev, model([helper.make_node(op, ["x"], ["y"])], {"x": x.shape}, "y"), {"x": x},
          lambda x: fn(x.astype(np.float64)))


@pytest.mark.parametrize("exponent", [2.0, 3.0, 5.0, -1.0, -2.0, 0.5, 1.0, 0.0, 1.7])
def test_pow_by_a_constant(dev, exponent):
    x = (np.abs(randn(3, 8)) + 0.25).astype(np.float32)
    onnx_bytes = model([helper.make_node("Pow", ["x", "e"], ["y"])], {"x": x.shape}, "y",
                       initializers=[("e", np.float32(exponent))])
    check(dev, onnx_bytes, {"x": x}, lambda x: np.power(x.astype(np.float64), exponent))


def test_pow_by_a_computed_exponent_is_refused_clearly(dev):
    x = randn(2, 2)
    onnx_bytes = model([helper.make_node("Pow", ["x", "x"], ["y"])], {"x": x.shape}, "y")
    with pytest.raises(tpuhal.Unsupported, match="exponent"):
        tpuhal.compile(onnx_bytes, "fp32", shapes={"x": x.shape})


def test_variadic_min_and_max_broadcast(dev):
    a, b, c = randn(2, 3, 4), randn(3, 1), randn(4)
    nodes = [helper.make_node("Max", ["a", "b", "c"], ["m"]), helper.make_node("Min", ["m", "a"], ["n"]),
             helper.make_node("Min", ["n"], ["y"])]
    onnx_bytes = model(nodes, {"a": a.shape, "b": b.shape, "c": c.shape}, "y")
    check(dev, onnx_bytes, {"a": a, "b": b, "c": c}, lambda a, b, c: np.minimum(np.maximum(np.maximum(a, b), c), a))


@pytest.mark.parametrize("mode,coordinate,by", [("nearest", "asymmetric", "scales"), ("linear", "half_pixel", "sizes"),
                                                ("linear", "align_corners", "scales"),
                                                ("linear", "pytorch_half_pixel", "sizes")])
def test_resize_as_pytorch_interpolates(dev, mode, coordinate, by):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    x = randn(1, 3, 5, 6)
    out = (10, 9)
    inputs = ["x", "", "scales"] if by == "scales" else ["x", "", "", "sizes"]
    scales = np.asarray([1, 1, 2, 2], np.float32) if by == "scales" else np.zeros(0, np.float32)
    if by == "scales":
        out = (10, 12)
    initializers = [("scales", scales)] if by == "scales" else [("sizes", i64([1, 3, *out]))]
    node = helper.make_node("Resize", inputs, ["y"], mode=mode, coordinate_transformation_mode=coordinate,
                            nearest_mode="floor")
    onnx_bytes = model([node], {"x": x.shape}, "y", initializers=initializers)

    def reference(x):
        t = torch.from_numpy(x).double()
        if mode == "nearest":
            return torch.nn.functional.interpolate(t, size=out, mode="nearest").numpy()
        return torch.nn.functional.interpolate(t, size=out, mode="bilinear",
                                               align_corners=coordinate == "align_corners").numpy()

    check(dev, onnx_bytes, {"x": x}, reference)


def test_layer_norm_and_gelu_as_pytorch_exports_them_at_opset_13(dev, tmp_path):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 8), torch.nn.GELU()).eval()
    with torch.no_grad():
        net[0].weight.uniform_(0.5, 1.5)
        net[0].bias.uniform_(-0.5, 0.5)
    x = randn(2, 5, 16)
    path = tmp_path / "ln.onnx"
    torch.onnx.export(net, torch.from_numpy(x), str(path), opset_version=13, input_names=["x"], output_names=["y"])
    with torch.no_grad():
        want = net(torch.from_numpy(x).double().float()).numpy()
    check(dev, path.read_bytes(), {"x": x}, lambda x: want.astype(np.float64))
