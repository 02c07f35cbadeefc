"""The compiler's ops beyond the basics: each is compiled from a small ONNX
graph, run on the simulated board in every float precision and compared
with NumPy (or PyTorch, where it defines the op the way exporters write it).

Concat, Pad, Slice on device data, the reductions, HardSigmoid and
HardSwish (also fused into the convolution before them), the unary maps,
Pow, variadic Min and Max, Resize, Ceil, Floor, Round, Tile, ReduceProd, ReduceL1, ReduceSumSquare, ReduceLogSum,
ReduceLogSumExp, CumSum, PRelu, Elu, Selu, Celu, ThresholdedRelu, Softplus, Softsign, Shrink, Sum, Mean,
DepthToSpace, SpaceToDepth, Trilu, IsNaN, IsInf, Sign, Gather by indices computed on the
device, GatherND, GatherElements, ScatterElements, ScatterND, Cast to integers, LayerNorm as PyTorch exports it at opset 13, 1-D and 3-D convolutions,
3-D transposed convolutions and pools, and the networks that use them (M5 audio, R3D-18 video)."""
import itertools
import json
import math
import os
import subprocess

import numpy as np
import pytest

import tpuhal
from conftest import run_plain

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


def check(dev, onnx_bytes, feeds, reference, precisions=("fp32", "fp16", "bf16"), scale=0.0):
    """Errors are relative to the reference's largest magnitude, or `scale` if larger (a reduction whose
    result is much smaller than what it sums)."""
    want = reference(*feeds.values())
    scale = max(float(np.abs(want).max()), scale, 1e-30)
    for precision in precisions:
        got = run(dev, onnx_bytes, precision, feeds)
        assert got.shape == want.shape, precision
        err = float(np.abs(got.astype(np.float64) - want).max()) / scale
        assert err <= TOLERANCE[precision], f"{precision}: error {err:.3g} of the largest value"


def exported(torch, net, x, path, input_name):
    """`net` exported to ONNX at `path` (opset 13) with one input, and its float64 output for `x` in PyTorch."""
    torch.onnx.export(net, torch.from_numpy(x), str(path), opset_version=13, input_names=[input_name],
                      output_names=["y"])
    with torch.no_grad():
        return path.read_bytes(), net(torch.from_numpy(x)).numpy().astype(np.float64)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def i64(values):
    return np.asarray(values, np.int64)


def test_values_held_nhwc_between_convolutions_match_in_every_precision(dev, tmp_path):
    """fp32, fp16 and bf16 models hold 4-D values NHWC, in the model's own
    type, between convolutions (docs/runtime.md): concatenations along the
    channels and along the height, pooling, upsampling, channel slices and
    elementwise maps of such values, against PyTorch."""
    torch = pytest.importorskip("torch")
    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2a, self.c2b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)
            self.c3, self.c4, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(12, 6, 1), nn.Linear(6, 5)

        def forward(self, x):
            a = F.relu(self.c1(x))
            b = torch.cat((self.c2a(a), self.c2b(a)), 1)
            u = F.interpolate(F.relu(self.c3(F.max_pool2d(b, 2))), scale_factor=2.0, mode="nearest")
            y, z = torch.split(u, 4, 1)
            t = self.c4(torch.cat((y * torch.sigmoid(z), a), 1))
            h = torch.cat((t, F.avg_pool2d(t, 3, 1, 1)), 2)
            return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))

    torch.manual_seed(5)
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)  # RNG's sequence left as it was
    onnx_bytes, want = exported(torch, Net().eval(), x, tmp_path / "net.onnx", "x")
    check(dev, onnx_bytes, {"x": x}, lambda _: want)


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
    # Batch 1: Relu, Neg and Abs write into the outer Concat's output; no
    # copies. The convolution runs NHWC, between a transpose of the Concat's
    # output and one of its own.
    assert dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).meta["ops"] == "6"
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


def test_zero_pads_are_a_view(dev):
    x = randn(1, 2, 3, 3)
    zero = model([helper.make_node("Pad", ["x", "pads"], ["y"])], {"x": x.shape}, "y",
                 initializers=[("pads", i64([0] * 8))])
    check(dev, zero, {"x": x}, lambda x: x)


@pytest.mark.parametrize("mode", ["reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 0, 1, 2, 0, 0, 2, 1], [0, 1, 0, 3, 1, 0, 2, 0], [1, 0, 0, 0, 0, 2, 0, 0]])
def test_reflect_and_edge_pads(dev, mode, pads):
    x = randn(2, 3, 4, 5)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "pads"], ["y"], mode=mode)]
    width = [(pads[d], pads[d + 4]) for d in range(4)]
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("pads", i64(pads))])
    check(dev, onnx_bytes, {"x": x}, lambda x: np.pad(np.maximum(x, 0), width, mode="reflect" if mode == "reflect"
                                                       else "edge"))


def test_pads_that_do_not_fit_and_unknown_modes_are_clear_errors(dev):
    x = randn(1, 2, 3, 3)
    too_wide = model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")], {"x": x.shape}, "y",
                     initializers=[("pads", i64([0, 0, 3, 0, 0, 0, 0, 0]))])
    with pytest.raises(tpuhal.InvalidArgument, match="reflect pads 3, 0 on a dimension of 3"):
        tpuhal.compile(too_wide, "fp32")
    wrap = model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")], {"x": x.shape}, "y",
                 initializers=[("pads", i64([0, 0, 1, 1, 0, 0, 1, 1]))], opset=19)
    with pytest.raises(tpuhal.Unsupported, match="mode 'wrap'"):
        tpuhal.compile(wrap, "fp32")


@pytest.mark.parametrize("axis,split", [(1, [1, 3, 2]), (3, None), (-1, [2, 0, 4])])
def test_split_of_device_data(dev, axis, split):
    x = randn(2, 6, 3, 6)
    nodes = [helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Split", ["e"] + (["split"] if split else []), ["p0", "p1", "p2"], axis=axis),
             helper.make_node("Concat", ["p2", "p0", "p1"], ["c"], axis=axis),
             helper.make_node("Mul", ["c", "c"], ["y"])]
    inits = [("split", i64(split))] if split else []
    sizes = split or [2, 2, 2]
    cuts = np.cumsum(sizes)[:-1]

    def reference(x):
        p = np.split(np.exp(x), cuts, axis=axis)
        c = np.concatenate([p[2], p[0], p[1]], axis=axis)
        return c * c

    check(dev, model(nodes, {"x": x.shape}, "y", initializers=inits), {"x": x}, reference)


def test_split_errors_are_clear(dev):
    x = randn(1, 5, 2, 2)
    uneven = model([helper.make_node("Split", ["x"], ["a", "b"], axis=1), helper.make_node("Add", ["a", "b"], ["y"])],
                   {"x": x.shape}, "y")
    with pytest.raises(tpuhal.InvalidArgument, match="does not split into 2 equal parts"):
        tpuhal.compile(uneven, "fp32")
    wrong = model([helper.make_node("Split", ["x", "split"], ["a", "b"], axis=1),
                   helper.make_node("Add", ["a", "b"], ["y"])], {"x": x.shape}, "y",
                  initializers=[("split", i64([2, 2]))])
    with pytest.raises(tpuhal.InvalidArgument, match="parts of 4 for a dimension of 5"):
        tpuhal.compile(wrong, "fp32")


@pytest.mark.parametrize("axis,indices", [(1, [2, 3, 0, 1, 1]), (2, 1), (0, [[1, 0], [1, 1]]), (-1, [-1, 0])])
def test_gather_of_device_data(dev, axis, indices):
    x = randn(2, 4, 3, 5)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Gather", ["s", "i"], ["y"], axis=axis)]
    idx = i64(indices)
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("i", idx)])
    check(dev, onnx_bytes, {"x": x}, lambda x: np.take(sigmoid(x), idx, axis=axis))
    bad = model(nodes, {"x": x.shape}, "y", initializers=[("i", i64([0, 9]))])
    with pytest.raises(tpuhal.InvalidArgument, match="index 9 outside"):
        tpuhal.compile(bad, "fp32")


def test_expand_of_device_data(dev):
    x = randn(3, 1, 4)
    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Expand", ["t", "shape"], ["y"])]
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("shape", i64([2, 3, 5, 1]))])
    check(dev, onnx_bytes, {"x": x}, lambda x: np.broadcast_to(np.tanh(x), (2, 3, 5, 4)))
    bad = model(nodes, {"x": x.shape}, "y", initializers=[("shape", i64([2, 3]))])
    with pytest.raises(tpuhal.InvalidArgument, match="do not broadcast"):
        tpuhal.compile(bad, "fp32")


@pytest.mark.parametrize("equation,a_shape,b_shape", [
    ("bhid,bhjd->bhij", (2, 3, 4, 5), (2, 3, 6, 5)),   # attention scores
    ("bhij,bhjd->bhid", (2, 3, 4, 6), (2, 3, 6, 5)),   # attention output
    ("nc,kc->nk", (4, 7), (3, 7)),
    ("ij,jk->ki", (4, 7), (7, 3)),
    ("bmk,kn->bnm", (2, 4, 7), (7, 3)),
])
def test_einsum_as_a_matrix_product(dev, equation, a_shape, b_shape):
    a, b = randn(*a_shape), randn(*b_shape)
    nodes = [helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Einsum", ["ra", "b"], ["y"], equation=equation)]
    onnx_bytes = model(nodes, {"a": a.shape, "b": b.shape}, "y", opset=13)
    check(dev, onnx_bytes, {"a": a, "b": b}, lambda a, b: np.einsum(equation, np.maximum(a, 0), b))


def test_einsum_beyond_a_matrix_product_is_refused_clearly(dev):
    a = randn(3, 3)
    for equation, why in [("ii->i", "a repeated subscript"), ("ij->i", "summed, not only permuted"),
                          ("...ij,...jk->...ik", "an ellipsis")]:
        ins = ["a"] if "," not in equation else ["a", "a"]
        onnx_bytes = model([helper.make_node("Einsum", ins, ["y"], equation=equation)], {"a": a.shape}, "y")
        with pytest.raises(tpuhal.Unsupported, match=why):
            tpuhal.compile(onnx_bytes, "fp32")


def test_masks_built_from_shapes_are_folded(dev):
    # What exporters write for a shifted-window mask: Range, Mod, Equal, Not,
    # ConstantOfShape, ScatterND and Where on constants; the result is added
    # to device data.
    x = randn(4, 4)
    i64_scalar = lambda v: np.asarray(v, np.int64)  # noqa: E731
    nodes = [helper.make_node("Range", ["zero", "four", "one"], ["r"]),
             helper.make_node("Mod", ["r", "two"], ["m"]),
             helper.make_node("Equal", ["m", "zero"], ["even"]),
             helper.make_node("Not", ["even"], ["odd"]),
             helper.make_node("ConstantOfShape", ["shape"], ["base"],
                              value=numpy_helper.from_array(np.asarray([-1.0], np.float32))),
             helper.make_node("ScatterND", ["base", "where", "upd"], ["scattered"]),
             helper.make_node("Where", ["odd", "scattered", "zf"], ["mask"]),
             helper.make_node("Add", ["x", "mask"], ["y"])]
    inits = [("zero", i64_scalar(0)), ("four", i64_scalar(4)), ("one", i64_scalar(1)), ("two", i64_scalar(2)),
             ("shape", i64([4])), ("where", i64([[1], [2]])), ("upd", np.asarray([5.0, 7.0], np.float32)),
             ("zf", np.asarray(0.0, np.float32))]
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=inits)
    compiled = tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)
    assert sum(n.startswith("folded") for n in compiled.notes) == 7, compiled.notes
    mask = np.asarray([0.0, 5.0, 0.0, -1.0], np.float32)  # odd positions of [-1, 5, 7, -1]
    check(dev, onnx_bytes, {"x": x}, lambda x: x + mask)


def layer_norm(x, axes, scale, bias, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_normalization_of_opset_17(dev, axis):
    x = randn(2, 3, 8) * 2 + 1
    norm = x.shape[axis:] if axis >= 0 else x.shape[axis:]
    scale, bias = RNG.uniform(0.5, 1.5, norm).astype(np.float32), randn(*norm)
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=axis, epsilon=1e-3)]
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("s", scale), ("b", bias)], opset=17)
    axes = tuple(range(axis % 3, 3))
    check(dev, onnx_bytes, {"x": x}, lambda x: layer_norm(x.astype(np.float64), axes, scale, bias, 1e-3))


def test_instance_normalization(dev):
    x = randn(2, 3, 5, 4) * 3 - 1
    scale, bias = RNG.uniform(0.5, 1.5, 3).astype(np.float32), randn(3)
    nodes = [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4)]
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("s", scale), ("b", bias)])
    check(dev, onnx_bytes, {"x": x}, lambda x: layer_norm(x.astype(np.float64), (2, 3), scale.reshape(3, 1, 1),
                                                          bias.reshape(3, 1, 1), 1e-4))
    short = model(nodes, {"x": x.shape}, "y", initializers=[("s", scale[:2]), ("b", bias)])
    with pytest.raises(tpuhal.InvalidArgument, match="its scale has 2 values for 3 channels"):
        tpuhal.compile(short, "fp32")


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
    "ReduceProd": lambda x, axes, keep: x.prod(axis=axes, keepdims=keep),
    "ReduceL1": lambda x, axes, keep: np.abs(x).sum(axis=axes, keepdims=keep),
    "ReduceSumSquare": lambda x, axes, keep: (x ** 2).sum(axis=axes, keepdims=keep),
    "ReduceLogSum": lambda x, axes, keep: np.log(x.sum(axis=axes, keepdims=keep)),
    "ReduceLogSumExp": lambda x, axes, keep: np.log(np.exp(x).sum(axis=axes, keepdims=keep)),
}


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("shape,axes,keep", [((2, 3, 4, 5), [2, 3], 0), ((2, 3, 4, 5), [-1], 1),
                                             ((2, 3, 4, 5), [1], 1), ((2, 3, 4, 5), [0, 2], 0),
                                             ((2, 3, 4, 5), None, 1), ((2, 3, 1, 1), [2, 3], 0)])
def test_reductions_over_any_axes(dev, op, shape, axes, keep):
    # Products of values near 1 stay near 1 however many there are; fp16 and
    # bf16 products are tested exactly below.
    # LogSum takes positive sums; LogSumExp values whose exp overflows f32
    # (and f16 from 11.1): the largest is taken out before exp.
    x = (1 + randn(*shape) * 0.05 if op == "ReduceProd" else np.abs(randn(*shape)) + 0.1 if op == "ReduceLogSum"
         else randn(*shape) * 40 + 60 if op == "ReduceLogSumExp" else randn(*shape))
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
    check(dev, onnx_bytes, {"x": x}, lambda x: REDUCTIONS[op](x.astype(np.float64), numpy_axes, bool(keep)),
          scale=float(np.abs(x).max()), precisions=("fp32",) if op == "ReduceProd" else ("fp32", "fp16", "bf16"))


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "int8"])
@pytest.mark.parametrize("op,keep", [("ReduceMean", 0), ("ReduceMean", 1), ("ReduceMax", 1)])
def test_a_reduction_over_h_and_w_of_a_convolutions_output_is_a_global_pool(dev, precision, op, keep):
    # ShuffleNet's x.mean([2, 3]): the convolution's output is held NHWC, so
    # the reduction is a global pool of it (each output's taps in (row,
    # column) order, as the pool over rows of its NCHW transpose takes them),
    # with no transpose back to NCHW.
    # Its own generator: the module's sequence stays as the tests after it expect.
    rng = np.random.default_rng(23)
    x = rng.standard_normal((2, 3, 7, 5)).astype(np.float32)
    w = (rng.standard_normal((6, 3, 3, 3)) * 0.5).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c"], ["y"], axes=[2, 3], keepdims=keep)]
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("w", w)])

    def reference(x):
        return REDUCTIONS[op](conv3x3(x.astype(np.float64), w), (2, 3), bool(keep))

    kwargs = {"calibration": x[None]} if precision == "int8" else {}
    compiled = tpuhal.compile(onnx_bytes, precision, device=dev.uri, **kwargs)
    inst = dev.load_model(compiled).instance()
    got = inst.run({"x": x})[0]
    want = reference(x)
    assert got.shape == want.shape
    tolerance = 0.05 if precision == "int8" else TOLERANCE[precision]
    assert float(np.abs(got - want).max()) <= tolerance * float(np.abs(want).max()), precision
    layers = inst.profile(2)["layers"]
    pooled = [l for l in layers if l["node"] == f"{op} #1"]
    assert len(pooled) == 1 and pooled[0]["ops"] == ("max_pool2d" if op == "ReduceMax" else "avg_pool2d"), layers
    assert pooled[0]["output"].endswith("[2, 1, 1, 6]"), pooled[0]
    # The compiler's own ops: one change of layout, the input's (a transpose, or a cast that also
    # narrows it to f16 or bf16).
    own = [o for l in layers if l["node"] == "" for o in l["ops"].split("+")]
    assert own.count("transpose") + own.count("cast") == 1, [(l["node"], l["ops"]) for l in layers]


@pytest.mark.parametrize("keep", [0, 1])
def test_an_int8_mean_over_h_and_w_read_by_a_layer_is_a_global_pool_of_bytes(dev, keep):
    # ShuffleNet's x.mean([2, 3]) before its classifier: in int8 the
    # convolution's bytes are pooled as they are (qlinear_global_avg_pool),
    # the same bits as a GlobalAveragePool and Flatten there, which pool so.
    rng = np.random.default_rng(29)
    x = rng.standard_normal((2, 3, 7, 5)).astype(np.float32)
    w = (rng.standard_normal((6, 3, 3, 3)) * 0.5).astype(np.float32)
    wf = (rng.standard_normal((4, 6)) * 0.5).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    gemm = helper.make_node("Gemm", ["m", "wf"], ["y"], transB=1)
    mean = [helper.make_node("ReduceMean", ["c"], ["r" if keep else "m"], axes=[2, 3], keepdims=keep)]
    if keep:
        mean.append(helper.make_node("Flatten", ["r"], ["m"]))
    pooled = [helper.make_node("GlobalAveragePool", ["c"], ["g"]), helper.make_node("Flatten", ["g"], ["m"])]
    outputs = []
    for nodes, pool in (([conv, *mean, gemm], "ReduceMean #1"), ([conv, *pooled, gemm], "GlobalAveragePool #1")):
        onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("w", w), ("wf", wf)])
        inst = dev.load_model(tpuhal.compile(onnx_bytes, "int8", device=dev.uri, calibration=x[None])).instance()
        outputs.append(inst.run({"x": x})[0])
        layers = {l["node"]: l["ops"] for l in inst.profile(1)["layers"]}
        assert layers.get(pool) == "qlinear_global_avg_pool", layers
    np.testing.assert_array_equal(outputs[0], outputs[1])
    want = (conv3x3(x.astype(np.float64), w).mean(axis=(2, 3))) @ wf.T
    assert float(np.abs(outputs[0] - want).max()) <= 0.05 * float(np.abs(want).max())


@pytest.mark.parametrize("inner", [1, 2, 3, 5, 8, 13])
def test_reduce_prod_is_exact_on_powers_of_two(dev, inner):
    # Products of +-1/2, +-1 and +-2 are exact in every precision: the tree
    # of products gives NumPy's product whatever the row's length.
    x = RNG.choice(np.float32([-2, -1, -0.5, 0.5, 1, 2]), size=(3, inner, 4))
    m = model([helper.make_node("ReduceProd", ["x"], ["y"], axes=[1], keepdims=0)], {"x": x.shape}, "y")
    for precision in ("fp32", "fp16", "bf16"):
        np.testing.assert_array_equal(run(dev, m, precision, {"x": x}), x.prod(axis=1), err_msg=precision)


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("axes,keep", [([0, 2], 1), ([1], 0), (None, 1)])
def test_every_reduction_of_a_constant_folds(dev, op, axes, keep):
    c = RNG.uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    c[1, 2, 3] = np.nan if op in ("ReduceMax", "ReduceMin") else c[1, 2, 3]  # NaN propagates, as in NumPy
    attrs, inputs, initializers = {"keepdims": keep}, ["c"], [("c", c)]
    if axes is not None and op == "ReduceSum":
        inputs.append("axes")
        initializers.append(("axes", i64(axes)))
    elif axes is not None:
        attrs["axes"] = axes
    want = REDUCTIONS[op](c.astype(np.float64), None if axes is None else tuple(axes), bool(keep))
    nodes = [helper.make_node(op, inputs, ["r"], **attrs), helper.make_node("Add", ["x", "r"], ["y"])]
    m = model(nodes, {"x": want.shape}, "y", initializers=initializers)
    x = randn(*want.shape)
    compiled = tpuhal.compile(m, "fp32", shapes={"x": want.shape}, device=dev.uri)
    assert [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]] == ["add"]
    np.testing.assert_allclose(dev.load_model(compiled).instance().run({"x": x})[0], x + want, rtol=1e-6)


def test_integer_reductions_of_constants_stay_integers(dev):
    # A shape computed by reductions (as exporters write them) must stay an
    # integer tensor for Reshape: ReduceMean truncates toward zero, as ONNX.
    dims = i64([[2, 7], [3, 5]])  # mean of each row: 4.5 -> 4, 4
    nodes = [helper.make_node("ReduceMean", ["d"], ["m"], axes=[1], keepdims=0),
             helper.make_node("Reshape", ["x", "m"], ["y"])]
    m = model(nodes, {"x": (16,)}, "y", initializers=[("d", dims)])
    x = randn(16)
    np.testing.assert_array_equal(run(dev, m, "fp32", {"x": x}), x.reshape(4, 4))


def test_reductions_of_constants_fold(dev):
    # ReduceProd of a shape (as torchvision's detectors compute a count) and
    # ReduceSum of a weight: folded, so the graph's only device op is the Add.
    c = np.float32([[1, 2, 3], [4, 5, 6]])
    nodes = [helper.make_node("ReduceProd", ["c"], ["p"], axes=[1], keepdims=0),
             helper.make_node("ReduceSum", ["c", "axes"], ["s"], keepdims=0),
             helper.make_node("Add", ["p", "s"], ["ps"]), helper.make_node("Add", ["x", "ps"], ["y"])]
    m = model(nodes, {"x": (2,)}, "y", initializers=[("c", c), ("axes", i64([1]))])
    x = randn(2)
    np.testing.assert_allclose(run(dev, m, "fp32", {"x": x}), x + c.prod(axis=1) + c.sum(axis=1), rtol=1e-6)
    compiled = tpuhal.compile(m, "fp32", shapes={"x": (2,)}, device=dev.uri)
    assert [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]] == ["add"]


def cumsum_ref(x, axis, exclusive, reverse):
    x = np.asarray(x, np.float64)
    src = np.flip(x, axis) if reverse else x
    y = np.cumsum(src, axis=axis)
    if exclusive:
        y = y - src
    return np.flip(y, axis) if reverse else y


@pytest.mark.parametrize("axis,exclusive,reverse", [(0, 0, 0), (1, 1, 0), (-1, 0, 1), (2, 1, 1)])
def test_cumsum_of_device_data(dev, axis, exclusive, reverse):
    # CumSum after a Relu (device data), its axis a constant input.
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("CumSum", ["r", "axis"], ["y"], exclusive=exclusive, reverse=reverse)]
    m = model(nodes, {"x": (2, 3, 5)}, "y", initializers=[("axis", np.int64(axis))], opset=14)
    check(dev, m, {"x": randn(2, 3, 5)}, lambda x: cumsum_ref(np.maximum(x, 0), axis, exclusive, reverse),
          scale=1.0)


def test_cumsum_of_a_constant_folds_and_a_computed_axis_is_refused(dev):
    c = np.float32([[1, 2, 3], [4, 5, 6]])
    nodes = [helper.make_node("CumSum", ["c", "axis"], ["s"], reverse=1), helper.make_node("Add", ["x", "s"], ["y"])]
    m = model(nodes, {"x": (2, 3)}, "y", initializers=[("c", c), ("axis", np.int32(1))], opset=14)
    x = randn(2, 3)
    np.testing.assert_allclose(run(dev, m, "fp32", {"x": x}), x + cumsum_ref(c, 1, 0, 1), rtol=1e-6)
    compiled = tpuhal.compile(m, "fp32", shapes={"x": (2, 3)}, device=dev.uri)
    assert [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]] == ["add"]
    # The axis must be known when compiling: an input is refused, naming it.
    computed = model([helper.make_node("CumSum", ["x", "a"], ["y"])], {"x": (2, 3), "a": ()}, "y", opset=14)
    with pytest.raises(tpuhal.Unsupported, match=r"node '.*' \(CumSum\): .*axis"):
        tpuhal.compile(computed, "fp32", shapes={"x": (2, 3), "a": ()}, device=dev.uri)


def test_cumsum_of_an_integer_mask_counts_positions_exactly(dev):
    # Positions counted from an attention mask (an exclusive CumSum: 0 for
    # the first token), then a lookup: in i32, exact in every precision,
    # also past 2048, where fp16 stops holding integers.
    table = randn(4096, 3)
    graph = helper.make_graph(
        [helper.make_node("CumSum", ["mask", "axis"], ["p"], exclusive=1),
         helper.make_node("Gather", ["table", "p"], ["y"])],
        "positions", [helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 3000])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in [("table", table), ("axis", np.int64(1))]])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    mask = np.ones((2, 3000), np.int64)
    mask[1, :7] = 0  # left padding
    want = table[np.cumsum(mask, axis=1) - mask]
    for precision in ("fp32", "fp16"):
        got = dev.load_model(tpuhal.compile(m.SerializeToString(), precision, device=dev.uri)).instance().run(
            {"mask": mask})[0]
        tol = 0 if precision == "fp32" else 1e-3
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=precision)


def scatter_ref(x, idx, upd, axis, reduction):
    """ONNX ScatterElements: the updates in the indices' row-major order."""
    y = np.array(x, np.float64)
    axis %= x.ndim
    for pos in np.ndindex(*idx.shape):
        to = list(pos)
        to[axis] = idx[pos] % x.shape[axis]
        to = tuple(to)
        u = upd[pos]
        y[to] = {"none": u, "add": y[to] + u, "mul": y[to] * u, "max": max(y[to], u), "min": min(y[to], u)}[reduction]
    return y


@pytest.mark.parametrize("axis,reduction", [(0, "none"), (1, "add"), (-1, "mul"), (0, "max"), (1, "min")])
def test_scatter_elements_of_device_data_with_repeated_and_negative_indices(dev, axis, reduction):
    # ScatterElements into a Relu's output (device data) of updates computed
    # on the device, the indices constants that repeat and count from the end.
    idx = i64([[0, -1, 2], [2, 1, -3]]) if axis != 1 else i64([[0, 3, -1, 3], [1, 1, 2, 0]])
    shape, upd_shape = (3, 4), idx.shape
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["u"], ["n"]),
             helper.make_node("ScatterElements", ["r", "i", "n"], ["y"], axis=axis, reduction=reduction)]
    m = model(nodes, {"x": shape, "u": upd_shape}, "y", initializers=[("i", idx)], opset=18)
    check(dev, m, {"x": randn(*shape), "u": randn(*upd_shape)},
          lambda x, u: scatter_ref(np.maximum(x, 0), idx, -u, axis, reduction))


def test_scatter_elements_by_indices_the_model_takes_and_its_refusals(dev):
    # Indices given at run time (an int64 input): the board checks each; an
    # index outside the axis fails the run, naming it.
    graph = helper.make_graph(
        [helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)], "scatter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    inst = dev.load_model(tpuhal.compile(m.SerializeToString(), "fp32", device=dev.uri)).instance()
    x, u = randn(2, 5), randn(2, 2)
    idx = i64([[4, -5], [0, 0]])
    np.testing.assert_array_equal(inst.run({"x": x, "i": idx, "u": u})[0], scatter_ref(x, idx, u, 1, "none"))
    with pytest.raises(tpuhal.Error, match="holds the index 5, outside \\[-5, 5\\)"):
        inst.run({"x": x, "i": i64([[1, 5], [0, 0]]), "u": u})
    # Of constants, folded; a constant index outside the axis, or an unknown
    # reduction, refused when compiling, naming the node.
    c, ci, cu = np.float32([[1, 2], [3, 4]]), i64([[1, 0]]), np.float32([[10, 20]])
    nodes = [helper.make_node("ScatterElements", ["c", "ci", "cu"], ["s"], reduction="add"),
             helper.make_node("Add", ["x", "s"], ["y"])]
    m = model(nodes, {"x": (2, 2)}, "y", initializers=[("c", c), ("ci", ci), ("cu", cu)], opset=16)
    compiled = tpuhal.compile(m, "fp32", shapes={"x": (2, 2)}, device=dev.uri)
    assert [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]] == ["add"]
    xs = randn(2, 2)
    np.testing.assert_allclose(run(dev, m, "fp32", {"x": xs}), xs + np.float32([[1, 22], [13, 4]]), rtol=1e-6)
    bad = model([helper.make_node("ScatterElements", ["x", "ci", "cu"], ["y"])], {"x": (2, 2)}, "y",
                initializers=[("ci", i64([[2, 0]])), ("cu", cu)], opset=13)
    with pytest.raises(tpuhal.Error, match=r"node '.*' \(ScatterElements\): index 2 outside \[-2, 2\)"):
        tpuhal.compile(bad, "fp32", shapes={"x": (2, 2)}, device=dev.uri)
    odd = model([helper.make_node("ScatterElements", ["x", "ci", "cu"], ["y"], reduction="sum")], {"x": (2, 2)},
                "y", initializers=[("ci", ci), ("cu", cu)], opset=16)
    with pytest.raises(tpuhal.Error, match=r"node '.*' \(ScatterElements\): unknown reduction 'sum'"):
        tpuhal.compile(odd, "fp32", shapes={"x": (2, 2)}, device=dev.uri)


def scatter_nd_ref(x, idx, upd, reduction="none"):
    """ONNX ScatterND: each update slice at its index tuple, in the tuples' row-major order."""
    y = np.array(x, np.float64)
    for t in np.ndindex(*idx.shape[:-1]):
        at = tuple(idx[t])
        y[at] = {"none": upd[t], "add": y[at] + upd[t], "mul": y[at] * upd[t]}[reduction]
    return y


# Whole elements (k = the rank) and slices (k = 1, 2), repeated tuples combined by a reduction, negative
# indices; the data computed on the device, the updates too.
@pytest.mark.parametrize("idx,reduction", [
    (i64([[0, 1, 2], [2, 3, 1], [-1, 0, 0]]), "none"),
    (i64([[1], [0], [1]]), "add"),
    (i64([[[0, 2], [2, -1]], [[1, 0], [0, 2]]]), "mul")])
def test_scatter_nd_of_device_data(dev, idx, reduction):
    shape = (3, 4, 5)
    upd_shape = idx.shape[:-1] + shape[idx.shape[-1]:]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["u"], ["n"]),
             helper.make_node("ScatterND", ["r", "i", "n"], ["y"], **({} if reduction == "none" else
                                                                      {"reduction": reduction}))]
    m = model(nodes, {"x": shape, "u": upd_shape}, "y", initializers=[("i", idx)], opset=16)
    check(dev, m, {"x": randn(*shape), "u": randn(*upd_shape)},
          lambda x, u: scatter_nd_ref(np.maximum(x, 0), idx % np.array(shape[:idx.shape[-1]]), -u, reduction))


def test_scatter_nd_by_tuples_the_model_takes_folding_and_refusals(dev):
    # Tuples given at run time (an int64 input): each index checked on the board.
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["x", "i", "u"], ["y"])], "scatter_nd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 2]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3, 2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    inst = dev.load_model(tpuhal.compile(m.SerializeToString(), "fp32", device=dev.uri)).instance()
    x, u = randn(4, 3, 2), randn(2, 2)
    idx = i64([[3, -1], [0, 1]])
    np.testing.assert_array_equal(inst.run({"x": x, "i": idx, "u": u})[0], scatter_nd_ref(x, idx % [4, 3], u))
    with pytest.raises(tpuhal.Error, match="holds the index 3, outside \\[-3, 3\\)"):
        inst.run({"x": x, "i": i64([[0, 3], [0, 0]]), "u": u})
    # Of constants, folded.
    c, ci, cu = np.float32([[1, 2], [3, 4]]), i64([[1], [1]]), np.float32([[10, 20], [1, 1]])
    nodes = [helper.make_node("ScatterND", ["c", "ci", "cu"], ["s"], reduction="add"),
             helper.make_node("Add", ["x", "s"], ["y"])]
    m = model(nodes, {"x": (2, 2)}, "y", initializers=[("c", c), ("ci", ci), ("cu", cu)], opset=16)
    compiled = tpuhal.compile(m, "fp32", shapes={"x": (2, 2)}, device=dev.uri)
    assert [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]] == ["add"]
    xs = randn(2, 2)
    np.testing.assert_allclose(run(dev, m, "fp32", {"x": xs}), xs + np.float32([[1, 2], [14, 25]]), rtol=1e-6)
    # Updates of another shape than the tuples' slices, and a tuple outside the data, refused when compiling.
    bad = model([helper.make_node("ScatterND", ["x", "ci", "cu"], ["y"])], {"x": (2, 3)}, "y",
                initializers=[("ci", ci), ("cu", cu)], opset=13)
    with pytest.raises(tpuhal.Error, match=r"node '.*' \(ScatterND\): its updates \[2, 2\] are not \[2, 3\]"):
        tpuhal.compile(bad, "fp32", shapes={"x": (2, 3)}, device=dev.uri)
    outside = model([helper.make_node("ScatterND", ["x", "oi", "cu"], ["y"])], {"x": (2, 2)}, "y",
                    initializers=[("oi", i64([[2], [0]])), ("cu", cu)], opset=13)
    with pytest.raises(tpuhal.Error, match=r"node '.*' \(ScatterND\): index 2 outside \[-2, 2\)"):
        tpuhal.compile(outside, "fp32", shapes={"x": (2, 2)}, device=dev.uri)


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


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_hard_swish_fuses_into_the_convolution_before_it(dev, precision):
    # As PyTorch writes nn.Hardswish at opset 13: Mul(x, HardSigmoid(x)); and the opset 14 op.
    w1, w2 = randn(3, 2, 3, 3) * 0.6, randn(2, 3, 3, 3) * 0.4
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSigmoid", ["c1"], ["h1"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["c1", "h1"], ["s1"]),
             helper.make_node("Conv", ["s1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c2"], ["y"])]
    x = randn(1, 2, 6, 6) * 3

    def reference(x):
        c1 = conv3x3(x, w1)
        c2 = conv3x3(c1 * hard_sigmoid(c1, 1 / 6), w2)
        return c2 * hard_sigmoid(c2, 1 / 6)

    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("w1", w1), ("w2", w2)], opset=14)
    compiled = tpuhal.compile(onnx_bytes, precision, device=dev.uri)
    fused = [n for n in compiled.notes if n.startswith("fused")]
    assert any(n.startswith("fused HardSwish (HardSigmoid 'HardSigmoid #1', Mul 'Mul #2')") for n in fused), fused
    assert any(n.startswith("fused HardSwish 'HardSwish #4'") for n in fused), fused
    # Two convolutions and the input's and output's conversions: casts in
    # fp16 and bf16, transposes to and from NHWC in fp32.
    assert dev.load_model(compiled).meta["ops"] == "4"
    check(dev, onnx_bytes, {"x": x}, reference, precisions=(precision,))


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "int8"])
def test_a_residual_add_fuses_into_the_convolution_before_it(dev, precision):
    # ResNet's Conv -> Relu -> Conv -> Add(identity) -> Relu: the last
    # convolution accumulates into the identity's tensor where nothing
    # reads it later (the first block), into a copy where something does
    # (the second: y2 is its convolution's input, and the Mul's), and the
    # Relu fuses after the Add. int8 keeps its qlinear_add.
    w1, w2, w2b = randn(3, 2, 3, 3) * 0.5, randn(3, 3, 3, 3) * 0.3, randn(3, 3, 3, 3) * 0.3
    w3 = randn(3, 3, 3, 3) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["h2"]),
             helper.make_node("Conv", ["h2", "w2b"], ["c2b"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2b", "r1"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["y2"]),
             helper.make_node("Conv", ["y2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["y2", "c3"], ["a3"]),  # the convolution on the right
             helper.make_node("Mul", ["a3", "y2"], ["y"])]
    x = randn(1, 2, 6, 6) * 2

    def reference(x):
        r1 = np.maximum(conv3x3(x, w1), 0)
        y2 = np.maximum(conv3x3(np.maximum(conv3x3(r1, w2), 0), w2b) + r1, 0)
        return (conv3x3(y2, w3) + y2) * y2

    onnx_bytes = model(nodes, {"x": x.shape}, "y",
                       initializers=[("w1", w1), ("w2", w2), ("w2b", w2b), ("w3", w3)])
    if precision == "int8":
        compiled = tpuhal.compile(onnx_bytes, "int8", calibration=x[None], device=dev.uri)
        assert not [n for n in compiled.notes if n.startswith("fused Add")], compiled.notes
        return
    compiled = tpuhal.compile(onnx_bytes, precision, device=dev.uri)
    fused = [n for n in compiled.notes if n.startswith("fused Add")]
    assert fused == ["fused Add 'Add #5' into Conv 'Conv #4' (it adds its result to r1)",
                     "fused Add 'Add #8' into Conv 'Conv #7' (it adds its result to y2)"], compiled.notes
    assert any(n.startswith("fused Relu 'Relu #6' into Conv 'Conv #4'") for n in compiled.notes), compiled.notes
    # A convolution that accumulates needs model format version 4.
    assert int.from_bytes(compiled.to_bytes()[8:12], "little") == 4
    check(dev, onnx_bytes, {"x": x}, reference, precisions=(precision,))
    if precision == "fp16":
        # The precision report measures each layer's output after the run:
        # r1's bytes then hold the second convolution's sum, so r1 has no row.
        reported = tpuhal.compile(onnx_bytes, "fp16", report=True, calibration=x[None], device=dev.uri).report
        assert [e.output for e in reported] == ["h2", "y2", "a3", "y"], [(e.node, e.output) for e in reported]


def test_a_residual_that_is_the_convolutions_own_input_is_copied(dev):
    # y = Relu(Conv(x) + x): the convolution reads x, so it accumulates
    # into a copy of it; and the model's input stays as it was for the
    # next run.
    w = randn(2, 2, 3, 3) * 0.5
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["x", "c"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    onnx_bytes = model(nodes, {"x": (1, 2, 5, 5)}, "y", initializers=[("w", w)])
    compiled = tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)
    assert any(n.startswith("fused Add 'Add #1'") for n in compiled.notes), compiled.notes
    instance = dev.load_model(compiled).instance()
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((1, 2, 5, 5)).astype(np.float32)
        want = np.maximum(conv3x3(x, w) + x, 0)
        np.testing.assert_allclose(instance.run(x)[0], want, rtol=1e-5, atol=1e-5)


def test_a_residual_in_the_models_input_bytes_is_copied_not_overwritten(dev):
    # y = x + Conv(Relu(Conv(x))) of a one-channel x: its NHWC form is a
    # view of the input's bytes, which a program submitted again reads
    # again. Compiled for batches 1 and 2, the file stays version 4.
    rng = np.random.default_rng(5)  # its own: the module's RNG feeds later tests' data
    w1 = (rng.standard_normal((2, 1, 3, 3)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((1, 2, 3, 3)) * 0.5).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["y"])]
    onnx_bytes = model(nodes, {"x": ("batch", 1, 6, 6)}, "y", initializers=[("w1", w1), ("w2", w2)])
    compiled = tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (1, 1, 6, 6)}, device=dev.uri)
    assert any(n.startswith("fused Add 'Add #3'") for n in compiled.notes), compiled.notes
    x = rng.standard_normal((1, 1, 6, 6)).astype(np.float32)
    want = conv3x3(np.maximum(conv3x3(x, w1), 0), w2) + x
    instance = dev.load_model(compiled).instance()
    instance.input_tensors[0].upload(x)
    queue = dev.queue("compute")
    for _ in range(2):  # the same input, submitted twice
        instance.submit(queue).wait()
        np.testing.assert_allclose(instance.output_tensors[0].download(), want, rtol=1e-5, atol=1e-5)
    staged = tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (2, 1, 6, 6)}, max_batch=2, device=dev.uri)
    assert int.from_bytes(staged.to_bytes()[8:12], "little") == 4


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "int8"])
def test_a_linear_layers_bias_add_fuses_into_its_matmul(dev, precision):
    # A transformer's Linear layers as PyTorch exports them: MatMul of a
    # [batch, tokens, d] value by a constant, then Add of the bias ([n], or
    # [1, 1, n]), then an activation, which fuses too. Not fused: an Add of
    # a value, a bias along the rows ([tokens, 1]), and an Add whose
    # product another node also reads. int8 keeps its own layers.
    rng = np.random.default_rng(11)  # its own: the module's RNG feeds later tests' data
    f32 = np.float32
    w1, b1 = rng.standard_normal((8, 6)).astype(f32), rng.standard_normal(6).astype(f32)
    w2, b2 = rng.standard_normal((6, 4)).astype(f32), rng.standard_normal((1, 1, 4)).astype(f32)
    rows = rng.standard_normal((5, 1)).astype(f32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"]),
             helper.make_node("Add", ["b2", "m2"], ["a2"]),  # the bias on the left
             helper.make_node("MatMul", ["a2", "w3"], ["m3"]),
             helper.make_node("Add", ["m3", "rows"], ["a3"]),  # along the rows: stays
             helper.make_node("MatMul", ["a3", "w3"], ["m4"]),
             helper.make_node("Add", ["m4", "b3"], ["a4"]),
             helper.make_node("Mul", ["a4", "m4"], ["y"])]  # m4 read twice: the Add stays
    w3, b3 = rng.standard_normal((4, 4)).astype(f32), rng.standard_normal(4).astype(f32)
    x = rng.standard_normal((2, 5, 8)).astype(f32)

    def reference(x):
        x = x.astype(np.float64)
        a2 = np.maximum(x @ w1 + b1, 0) @ w2 + b2
        m4 = (a2 @ w3 + rows) @ w3
        return (m4 + b3) * m4

    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[
        ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2), ("w3", w3), ("rows", rows), ("b3", b3)])
    if precision == "int8":
        compiled = tpuhal.compile(onnx_bytes, "int8", calibration=x[None], device=dev.uri)
        assert not [n for n in compiled.notes if "into MatMul" in n and n.startswith("fused Add")], compiled.notes
        return
    compiled = tpuhal.compile(onnx_bytes, precision, device=dev.uri)
    fused = [n for n in compiled.notes if n.startswith("fused")]
    assert fused == ["fused Add 'Add #1' into MatMul 'MatMul #0' (its bias b1)",
                     "fused Add 'Add #4' into MatMul 'MatMul #3' (its bias b2)",
                     "fused Relu 'Relu #2' into MatMul 'MatMul #0'"], fused
    check(dev, onnx_bytes, {"x": x}, reference, precisions=(precision,))


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
    "Sin": (np.sin, lambda x: x * 2),
    "Cos": (np.cos, lambda x: x * 2),
    "Tan": (np.tan, lambda x: x * 0.3),  # away from the poles at +-pi/2
    "Asin": (np.arcsin, lambda x: np.tanh(x) * 0.9),
    "Acos": (np.arccos, lambda x: np.tanh(x) * 0.9),
    "Atan": (np.arctan, lambda x: x * 2),
    "Sinh": (np.sinh, lambda x: x),
    "Cosh": (np.cosh, lambda x: x),
    "Asinh": (np.arcsinh, lambda x: x * 2),
    "Acosh": (np.arccosh, lambda x: np.abs(x) + 1.1),
    "Atanh": (np.arctanh, lambda x: np.tanh(x) * 0.9),
}


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_of_device_data_broadcast(dev, fmod):
    # Mod after a Mul (device data), the divisor a broadcast constant of
    # both signs: the divisor's sign (fmod 0) or the dividend's (fmod 1).
    b = np.float32([3, -3, 2.5, -0.75])
    nodes = [helper.make_node("Mul", ["x", "two"], ["m"]), helper.make_node("Mod", ["m", "b"], ["y"], fmod=fmod)]
    m = model(nodes, {"x": (3, 4)}, "y", initializers=[("two", np.float32(2)), ("b", b)])
    x = randn(3, 4) * 4
    want = np.fmod(2 * x, b) if fmod else np.mod(2 * x, b)
    np.testing.assert_allclose(run(dev, m, "fp32", {"x": x}), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_maps(dev, op):
    fn, domain = UNARY[op]
    x = domain(randn(2, 3, 7)).astype(np.float32)
    check(dev, model([helper.make_node(op, ["x"], ["y"])], {"x": x.shape}, "y"), {"x": x},
          lambda x: fn(x.astype(np.float64)))


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_hardmax_is_one_at_the_first_maximum_along_its_axis(dev, axis):
    # After a Mul (device data), values on a coarse grid so that maxima
    # tie, the first taken; every precision holds the grid exactly.
    x = (np.round(randn(3, 5, 4) * 2) / 2).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "one"], ["m"]), helper.make_node("Hardmax", ["m"], ["y"], axis=axis)]
    onnx_bytes = model(nodes, {"x": x.shape}, "y", initializers=[("one", np.float32(1))])

    def reference(x):
        first = np.argmax(x, axis=axis)
        return (np.arange(x.shape[axis]).reshape([-1 if d == axis % 3 else 1 for d in range(3)])
                == np.expand_dims(first, axis)).astype(np.float64)
    assert (reference(x).sum(axis=axis) == 1).all()
    check(dev, onnx_bytes, {"x": x}, reference)


def test_hardmax_before_opset_13_is_refused_clearly(dev):
    # Before opset 13 Hardmax flattened the dimensions from its axis.
    onnx_bytes = model([helper.make_node("Hardmax", ["x"], ["y"])], {"x": (2, 3)}, "y", opset=11)
    with pytest.raises(tpuhal.Unsupported, match="opset below 13"):
        tpuhal.compile(onnx_bytes, "fp32")


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


def conv_transpose_reference(x, w, b, strides, pads, dilations, group, out_hw):
    """ONNX ConvTranspose by scattering each input element, in float64."""
    n, cin, h, wd = x.shape
    cout_g, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    y = np.zeros((n, cout_g * group, out_hw[0], out_hw[1]))
    for ci in range(cin):
        g = ci // (cin // group)
        for a in range(kh):
            for c in range(kw):
                for ih in range(h):
                    r = ih * strides[0] - pads[0] + a * dilations[0]
                    if not 0 <= r < out_hw[0]:
                        continue
                    for iw in range(wd):
                        col = iw * strides[1] - pads[1] + c * dilations[1]
                        if 0 <= col < out_hw[1]:
                            y[:, g * cout_g:(g + 1) * cout_g, r, col] += (
                                x[:, ci, ih, iw, None].astype(np.float64) * w[ci, :, a, c])
    return y + (0 if b is None else b.reshape(1, -1, 1, 1))


@pytest.mark.parametrize("strides,pads,dilations,group,output_padding", [
    ((1, 1), (0, 0, 0, 0), (1, 1), 1, (0, 0)),
    ((2, 2), (1, 1, 1, 1), (1, 1), 1, (1, 1)),
    ((2, 3), (0, 1, 2, 0), (2, 1), 2, (1, 0)),
])
def test_conv_transpose(dev, strides, pads, dilations, group, output_padding):
    x, w, b = randn(2, 4, 5, 6), randn(4, 3, 3, 2), randn(3 * group)
    out_hw = [strides[k] * (x.shape[2 + k] - 1) + output_padding[k] + (w.shape[2 + k] - 1) * dilations[k] + 1
              - pads[k] - pads[k + 2] for k in range(2)]
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=strides, pads=pads, dilations=dilations,
                            group=group, output_padding=output_padding)
    m = model([node], {"x": x.shape}, "y", initializers=[("w", w), ("b", b)])
    check(dev, m, {"x": x}, lambda x: conv_transpose_reference(x, w, b, strides, pads, dilations, group, out_hw))


@pytest.mark.parametrize("strides,pads,dilations,group,output_padding", [
    ((1,), (0, 0), (1,), 1, (0,)),
    ((2,), (1, 2), (1,), 2, (1,)),
    ((3,), (0, 1), (2,), 1, (2,)),
])
def test_conv_transpose_1d(dev, strides, pads, dilations, group, output_padding):
    # [N, C, L]: the 2-D reference with H = 1.
    x, w, b = randn(2, 4, 7), randn(4, 3, 3), randn(3 * group)
    length = strides[0] * (x.shape[2] - 1) + output_padding[0] + (w.shape[2] - 1) * dilations[0] + 1 - pads[0] - pads[1]
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=strides, pads=pads, dilations=dilations,
                            group=group, output_padding=output_padding)
    m = model([node], {"x": x.shape}, "y", initializers=[("w", w), ("b", b)])
    check(dev, m, {"x": x}, lambda x: conv_transpose_reference(
        x[:, :, None, :], w[:, :, None, :], b, (1, strides[0]), (0, pads[0], 0, pads[1]), (1, dilations[0]), group,
        (1, length))[:, :, 0, :])


def test_conv_transpose_with_output_shape_matches_pytorch(dev, tmp_path):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.ConvTranspose2d(6, 4, 4, stride=2, padding=1), torch.nn.ReLU()).eval()
    x = randn(1, 6, 7, 7)
    path = tmp_path / "up.onnx"
    torch.onnx.export(net, torch.from_numpy(x), str(path), opset_version=13, input_names=["x"], output_names=["y"])
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    check(dev, path.read_bytes(), {"x": x}, lambda x: want.astype(np.float64))


@pytest.mark.parametrize("op,axis,keep,last", [("ArgMax", 1, 1, 0), ("ArgMax", -1, 0, 1), ("ArgMin", 0, 1, 1),
                                              ("ArgMin", 2, 0, 0)])
def test_argmax_and_argmin_of_device_data(dev, op, axis, keep, last):
    # Rounded values: ties, which select_last_index decides.
    x = np.round(randn(3, 4, 5) * 2).astype(np.float32)
    node = helper.make_node(op, ["r"], ["y"], axis=axis, keepdims=keep, select_last_index=last)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), node], "case",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    r = np.maximum(x, 0)
    pick = np.argmax if op == "ArgMax" else np.argmin
    if last:
        flipped = np.flip(r, axis=axis)
        want = r.shape[axis] - 1 - pick(flipped, axis=axis)
    else:
        want = pick(r, axis=axis)
    if keep:
        want = np.expand_dims(want, axis)
    for precision in ("fp32", "fp16"):
        got = run(dev, m.SerializeToString(), precision, {"x": x})
        np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=precision)


def test_top_k_values_and_indices(dev):
    x = randn(2, 9)
    k = np.asarray([4], np.int64)
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0)], "case",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 9])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)],
        [numpy_helper.from_array(k, "k")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    compiled = tpuhal.compile(m.SerializeToString(), "fp32", device=dev.uri)
    values, indices = dev.load_model(compiled).instance().run({"x": x})
    order = np.argsort(x, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(indices, order.astype(np.float32))
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=1))


def test_where_with_a_constant_condition_on_device_data(dev):
    x = randn(2, 3, 4)
    cond = RNG.integers(0, 2, (3, 1)).astype(bool)
    other = randn(4)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Where", ["c", "r", "o"], ["y"])], "case",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(cond, "c"), numpy_helper.from_array(other, "o")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    check(dev, m.SerializeToString(), {"x": x}, lambda x: np.where(cond, np.maximum(x, 0), other).astype(np.float64))


def quarters(*shape):
    """Multiples of 1/4 in [-3, 3]: exact in every precision, none equal to the thresholds below but 0.5."""
    return (RNG.integers(-12, 13, shape) / 4).astype(np.float32)


def test_where_with_a_condition_computed_on_the_device(dev):
    # c = (0.1 < x < 2 and not x == 0.5) or x <= -1, with a broadcast threshold; y = c ? x : -2x.
    x = quarters(2, 3, 4)
    x[0, 0, :3] = [0.5, -1.5, 1.25]  # each branch taken, whatever the draws before
    lo = np.array([0.1, 0.1, 0.1, 0.1], np.float32)
    nodes = [helper.make_node("Greater", ["x", "lo"], ["g"]),
             helper.make_node("Less", ["x", "two"], ["l"]),
             helper.make_node("And", ["g", "l"], ["inside"]),
             helper.make_node("Equal", ["x", "half"], ["e"]),
             helper.make_node("Not", ["e"], ["ne"]),
             helper.make_node("And", ["inside", "ne"], ["keep"]),
             helper.make_node("LessOrEqual", ["x", "minus_one"], ["low"]),
             helper.make_node("Or", ["keep", "low"], ["c"]),
             helper.make_node("Mul", ["x", "minus_two"], ["other"]),
             helper.make_node("Where", ["c", "x", "other"], ["y"])]
    inits = [("lo", lo), ("two", np.float32(2)), ("half", np.float32(0.5)), ("minus_one", np.float32(-1)),
             ("minus_two", np.float32(-2))]

    def reference(x):
        c = (((x > lo) & (x < 2)) & ~(x == 0.5)) | (x <= -1)
        return np.where(c, x, -2 * x).astype(np.float64)

    check(dev, model(nodes, {"x": x.shape}, "y", initializers=inits), {"x": x}, reference)
    assert (x == 0.5).any() and (x <= -1).any() and ((x > 0.1) & (x < 2)).any()


def test_comparisons_and_logic_as_numbers(dev):
    # A boolean cast to float, a boolean graph output (as 1.0 and 0.0), Xor and GreaterOrEqual.
    x, z = quarters(3, 5), quarters(3, 5)
    nodes = [helper.make_node("GreaterOrEqual", ["x", "z"], ["ge"]),
             helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("Xor", ["ge", "pos"], ["c"]),
             helper.make_node("Cast", ["c"], ["cf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["cf", "x"], ["y"])]
    check(dev, model(nodes, {"x": x.shape, "z": z.shape}, "y", initializers=[("zero", np.float32(0))]),
          {"x": x, "z": z}, lambda x, z: (((x >= z) != (x > 0)) * x).astype(np.float64))
    bool_out = model([helper.make_node("Less", ["x", "z"], ["y"])], {"x": x.shape, "z": z.shape}, "y")
    for precision in ("fp32", "fp16", "int8"):
        if precision == "int8":
            compiled = tpuhal.compile(bool_out, "int8", calibration=[x[None], z[None]], device=dev.uri)
            got = dev.load_model(compiled).instance().run({"x": x, "z": z})[0]
        else:
            got = run(dev, bool_out, precision, {"x": x, "z": z})
        np.testing.assert_array_equal(got, (x < z).astype(np.float32), err_msg=precision)


def test_logic_on_a_number_computed_on_the_device_is_refused_clearly(dev):
    x = randn(2, 3)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Not", ["r"], ["y"])]
    with pytest.raises(tpuhal.Unsupported, match="input 'r' is not a boolean the device computed"):
        tpuhal.compile(model(nodes, {"x": x.shape}, "y"), "fp32", device=dev.uri)


def log_softmax(x, axis):
    m = x.astype(np.float64).max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("shape,axis,opset", [((2, 3, 5), -1, 13), ((2, 4, 3), 1, 13), ((2, 3, 4), 1, 11)])
def test_log_softmax(dev, shape, axis, opset):
    # Logits far apart: log(softmax(x)) would underflow to -inf where these stay finite.
    x = randn(*shape) * 40
    node = helper.make_node("LogSoftmax", ["x"], ["y"], axis=axis)
    m = model([node], {"x": x.shape}, "y", opset=opset)
    if opset >= 13:
        reference = lambda x: log_softmax(x, axis)  # noqa: E731
    else:  # over the dimensions from `axis` on, flattened
        reference = lambda x: log_softmax(x.reshape(*x.shape[:axis], -1), -1).reshape(x.shape)  # noqa: E731
    check(dev, m, {"x": x}, reference)
    assert np.isfinite(run(dev, m, "fp32", {"x": x})).all()


def conv1d_reference(x, w, b, stride, pads, dilation, group):
    """ONNX's 1-D Conv in float64: [N, C, L] by [Cout, C/group, k]."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[1])))
    cout, cin_g, k = w.shape
    length = (xp.shape[2] - dilation * (k - 1) - 1) // stride + 1
    y = np.zeros((x.shape[0], cout, length))
    for o in range(cout):
        g = o // (cout // group)
        for i in range(length):
            taps = xp[:, g * cin_g:(g + 1) * cin_g, i * stride:i * stride + dilation * (k - 1) + 1:dilation]
            y[:, o, i] = (taps * w[o]).sum(axis=(1, 2))
    return y + (0 if b is None else b.reshape(1, -1, 1))


@pytest.mark.parametrize("stride,pads,dilation,group,relu", [(1, (0, 0), 1, 1, False), (2, (1, 2), 1, 2, True),
                                                             (3, (2, 0), 2, 1, False)])
def test_conv_1d(dev, stride, pads, dilation, group, relu):
    x, w, b = randn(2, 4, 23), randn(6, 4 // group, 5), randn(6)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], strides=[stride], pads=list(pads),
                              dilations=[dilation], group=group, kernel_shape=[5])]
    if relu:  # fused into the convolution, as in 2-D
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    m = model(nodes, {"x": x.shape}, "y", initializers=[("w", w), ("b", b)])

    def reference(x):
        y = conv1d_reference(x, w, b, stride, pads, dilation, group)
        return np.maximum(y, 0) if relu else y

    check(dev, m, {"x": x}, reference)


@pytest.mark.parametrize("auto_pad,pads", [("SAME_LOWER", (2, 1)), ("VALID", (0, 0))])
def test_conv_1d_auto_pad(dev, auto_pad, pads):
    x, w = randn(1, 3, 17), randn(4, 3, 4)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[2], dilations=[1], auto_pad=auto_pad)],
              {"x": x.shape}, "y", initializers=[("w", w)])
    # SAME_LOWER puts the odd one of the 3 padding positions at the start.
    check(dev, m, {"x": x}, lambda x: conv1d_reference(x, w, None, 2, pads, 1, 1))


def test_conv_1d_same_padding_and_in_an_int8_model(dev):
    x, w = randn(1, 3, 17), randn(4, 3, 4)
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[2], auto_pad="SAME_UPPER")
    m = model([node], {"x": x.shape}, "y", initializers=[("w", w)])
    # SAME_UPPER: ceil(17 / 2) = 9 outputs, total padding 2 * 8 + 4 - 17 = 3, 1 at the start and 2 at the end.
    check(dev, m, {"x": x}, lambda x: conv1d_reference(x, w, None, 2, (1, 2), 1, 1))
    # int8: a 1-D convolution runs in float (f32) within the int8 model.
    compiled = tpuhal.compile(m, "int8", shapes={"x": x.shape}, device=dev.uri, calibration=[x])
    got = dev.load_model(compiled).instance().run({"x": x})[0]
    want = conv1d_reference(x, w, None, 2, (1, 2), 1, 1)
    assert float(np.abs(got - want).max()) <= TOLERANCE["fp32"] * float(np.abs(want).max())


@pytest.mark.parametrize("op,attrs", [("MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
                                      ("MaxPool", dict(kernel_shape=[2], strides=[2], ceil_mode=1)),
                                      ("AveragePool", dict(kernel_shape=[3], strides=[1], pads=[1, 0])),
                                      ("AveragePool", dict(kernel_shape=[4], strides=[3], pads=[2, 2],
                                                           count_include_pad=1)),
                                      ("MaxPool", dict(kernel_shape=[3], strides=[1], dilations=[2])),
                                      ("MaxPool", dict(kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER")),
                                      ("GlobalAveragePool", {}), ("GlobalMaxPool", {})])
def test_pools_1d(dev, op, attrs):
    x = randn(2, 3, 11)
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x.shape}, "y")

    def reference(x):
        if op == "GlobalAveragePool":
            return x.astype(np.float64).mean(axis=2, keepdims=True)
        if op == "GlobalMaxPool":
            return x.astype(np.float64).max(axis=2, keepdims=True)
        k, s, d = attrs["kernel_shape"][0], attrs["strides"][0], attrs.get("dilations", [1])[0]
        p0, p1 = attrs.get("pads", [0, 0])
        if attrs.get("auto_pad") == "SAME_UPPER":  # ceil(L / s) outputs, the odd padding position at the end
            total = max((-(-x.shape[2] // s) - 1) * s + (k - 1) * d + 1 - x.shape[2], 0)
            p0, p1 = total // 2, total - total // 2
        span = (k - 1) * d + 1
        length = x.shape[2] + p0 + p1 - span
        out = (-(-length // s) if attrs.get("ceil_mode") else length // s) + 1
        if attrs.get("ceil_mode") and (out - 1) * s >= x.shape[2] + p0:
            out -= 1
        fill = -np.inf if op == "MaxPool" else np.nan
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p0, p1 + span)), constant_values=fill)
        windows = np.stack([xp[:, :, i * s:i * s + span:d] for i in range(out)], axis=2)
        if op == "MaxPool":
            return windows.max(axis=3)
        if attrs.get("count_include_pad"):  # the pads count as zeros; past them, nothing
            inside = np.stack([np.pad(np.ones(x.shape[2]), (p0, p1 + k))[i * s:i * s + k] for i in range(out)])
            within = np.stack([np.pad(np.ones(x.shape[2] + p0 + p1), (0, k))[i * s:i * s + k] for i in range(out)])
            return np.nansum(windows, axis=3) / within.sum(axis=1) * (inside.sum(axis=1) > 0)
        return np.nanmean(windows, axis=3)

    check(dev, m, {"x": x}, reference)


def conv3d_reference(x, w, b, strides, pads, dilations, group):
    """ONNX's 3-D Conv in float64: [N, C, D, H, W] by [Cout, C/group, kd, kh, kw]; pads (front, top, left, back,
    bottom, right)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[3]), (pads[1], pads[4]), (pads[2], pads[5])))
    cout, cin_g = w.shape[:2]
    k = w.shape[2:]
    out = [(xp.shape[2 + i] - dilations[i] * (k[i] - 1) - 1) // strides[i] + 1 for i in range(3)]
    y = np.zeros((x.shape[0], cout, *out))
    for o in range(cout):
        g = o // (cout // group)
        for d in range(out[0]):
            for h in range(out[1]):
                for v in range(out[2]):
                    at = [(d, h, v)[i] * strides[i] for i in range(3)]
                    taps = xp[:, g * cin_g:(g + 1) * cin_g, at[0]:at[0] + dilations[0] * (k[0] - 1) + 1:dilations[0],
                              at[1]:at[1] + dilations[1] * (k[1] - 1) + 1:dilations[1],
                              at[2]:at[2] + dilations[2] * (k[2] - 1) + 1:dilations[2]]
                    y[:, o, d, h, v] = (taps * w[o]).sum(axis=(1, 2, 3, 4))
    return y + (0 if b is None else b.reshape(1, -1, 1, 1, 1))


# Depth padding at both ends (taps that land in it read zeros), strides and dilations that differ per axis,
# groups, a depthwise one whose depth stride passes its kernel, a kernel one deep (one output depth per input
# depth) and one as deep as the input (one output depth).
@pytest.mark.parametrize("kernel,strides,pads,dilations,group,relu", [
    ((3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1), 1, False),
    ((3, 2, 3), (2, 1, 2), (2, 0, 1, 1, 1, 0), (1, 2, 1), 2, True),
    ((2, 3, 1), (1, 2, 1), (0, 1, 0, 3, 1, 0), (3, 1, 1), 1, False),
    ((1, 3, 3), (1, 1, 1), (0, 1, 1, 0, 1, 1), (1, 1, 1), 1, True),
    ((2, 3, 3), (3, 1, 2), (1, 1, 1, 0, 1, 1), (1, 1, 1), 4, False),
    ((5, 1, 1), (1, 1, 1), (0, 0, 0, 0, 0, 0), (1, 1, 1), 1, False)])
def test_conv_3d(dev, kernel, strides, pads, dilations, group, relu):
    x, w, b = randn(2, 4, 5, 6, 7), randn(8, 4 // group, *kernel), randn(8)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], strides=list(strides), pads=list(pads),
                              dilations=list(dilations), group=group, kernel_shape=list(kernel))]
    if relu:  # fused into the convolution, as in 2-D
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    m = model(nodes, {"x": x.shape}, "y", initializers=[("w", w), ("b", b)])

    def reference(x):
        y = conv3d_reference(x, w, b, strides, pads, dilations, group)
        return np.maximum(y, 0) if relu else y

    check(dev, m, {"x": x}, reference)


@pytest.mark.parametrize("auto_pad,front,back", [("SAME_UPPER", 1, 2), ("SAME_LOWER", 2, 1)])
def test_conv_3d_same_padding_and_in_an_int8_model(dev, auto_pad, front, back):
    x, w = randn(1, 3, 7, 6, 5), randn(4, 3, 4, 2, 3)
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2, 1], auto_pad=auto_pad)
    m = model([node], {"x": x.shape}, "y", initializers=[("w", w)])
    # ceil(7 / 2) = 4 deep, padding 3 * 2 + 4 - 7 = 3, the odd one at the end (UPPER) or the front (LOWER);
    # ceil(6 / 2) = 3 high, padding 2 * 2 + 2 - 6 = 0; 5 wide, padding 2, 1 at each end.
    want = conv3d_reference(x, w, None, (2, 2, 1), (front, 0, 1, back, 0, 1), (1, 1, 1), 1)
    check(dev, m, {"x": x}, lambda x: want)
    # int8: a 3-D convolution runs in float (f32) within the int8 model.
    compiled = tpuhal.compile(m, "int8", shapes={"x": x.shape}, device=dev.uri, calibration=[x])
    got = dev.load_model(compiled).instance().run({"x": x})[0]
    assert float(np.abs(got - want).max()) <= TOLERANCE["fp32"] * float(np.abs(want).max())


def conv_transpose3d_reference(x, w, b, strides, pads, dilations, group, out):
    """ONNX's 3-D ConvTranspose in float64: [N, C, D, H, W] by [C, Cout/group, kd, kh, kw]; each input element
    scatters x * w to output (i * stride - pad_begin + t * dilation) per axis; `out` the output's D, H, W."""
    n, c = x.shape[:2]
    mg = w.shape[1]
    cg = c // group
    y = np.zeros((n, mg * group, *out))
    for ci, d, h, v in np.ndindex(c, *x.shape[2:]):
        g = ci // cg
        for t in np.ndindex(*w.shape[2:]):
            o = [(d, h, v)[i] * strides[i] - pads[i] + t[i] * dilations[i] for i in range(3)]
            if all(0 <= o[i] < out[i] for i in range(3)):
                y[:, g * mg:(g + 1) * mg, o[0], o[1], o[2]] += x[:, ci, d, h, v, None] * w[ci, :, t[0], t[1], t[2]]
    return y + (0 if b is None else b.reshape(1, -1, 1, 1, 1))


# Strides, dilations and pads that differ per axis, groups, output padding (depths that only the bias reaches),
# a depth stride past the kernel (output depths no input lands on), and output_shape instead of pads.
@pytest.mark.parametrize("kernel,strides,pads,dilations,group,out_pad,out_shape", [
    ((3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1), 1, None, None),
    ((2, 3, 2), (2, 1, 2), (1, 0, 1, 0, 1, 0), (1, 2, 1), 2, (1, 0, 1), None),
    ((1, 2, 2), (3, 2, 1), (0, 0, 0, 0, 0, 0), (1, 1, 2), 2, None, None),
    ((2, 2, 3), (2, 2, 1), None, (1, 1, 1), 1, None, (7, 8, 5))])
def test_conv_transpose_3d(dev, kernel, strides, pads, dilations, group, out_pad, out_shape):
    x, w, b = randn(2, 4, 3, 4, 3), randn(4, 6 // group, *kernel), randn(6)
    attrs = dict(strides=list(strides), dilations=list(dilations), group=group, kernel_shape=list(kernel))
    if pads is not None:
        attrs["pads"] = list(pads)
    if out_pad is not None:
        attrs["output_padding"] = list(out_pad)
    if out_shape is not None:
        attrs["output_shape"] = list(out_shape)
    m = model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)], {"x": x.shape}, "y",
              initializers=[("w", w), ("b", b)])
    full = [strides[i] * (x.shape[2 + i] - 1) + (out_pad or (0, 0, 0))[i] + (kernel[i] - 1) * dilations[i] + 1
            for i in range(3)]
    if out_shape is None:
        begin, out = pads[:3], [full[i] - pads[i] - pads[3 + i] for i in range(3)]
    else:  # ONNX: the pads that give output_shape, the odd one at the front (no auto_pad: not SAME_UPPER)
        out = list(out_shape)
        begin = [(full[i] - out[i]) - (full[i] - out[i]) // 2 for i in range(3)]
    want = conv_transpose3d_reference(x, w, b, strides, begin, dilations, group, out)
    check(dev, m, {"x": x}, lambda x: want)


@pytest.mark.parametrize("rank", [4, 5])
@pytest.mark.parametrize("op,reduce", [("GlobalAveragePool", np.mean), ("GlobalMaxPool", np.max)])
def test_global_pools_2d_and_3d(dev, rank, op, reduce):
    x = randn(*(2, 3, 4, 5, 6)[5 - rank:])
    m = model([helper.make_node(op, ["x"], ["y"])], {"x": x.shape}, "y")
    axes = tuple(range(2, rank))
    check(dev, m, {"x": x}, lambda x: reduce(x.astype(np.float64), axis=axes, keepdims=True))


def test_an_int8_global_max_pool_after_an_int8_convolution_matches_fp32(dev):
    # Conv + Relu in int8 leave a u8 NHWC value; GlobalMaxPool takes the max of its u8 values, which keep
    # their scale (as MaxPool's do), within a quantization step of the fp32 model's.
    x, w = randn(2, 3, 9, 9), randn(8, 3, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalMaxPool", ["r"], ["y"], name="gmp")]
    m = model(nodes, {"x": x.shape}, "y", initializers=[("w", w)])
    compiled = tpuhal.compile(m, "int8", shapes={"x": x.shape}, device=dev.uri, calibration=[x])
    (got,) = dev.load_model(compiled).instance().run({"x": x})
    want = run(dev, m, "fp32", {"x": x})
    assert got.shape == want.shape == (2, 8, 1, 1)
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


def pool_nd_reference(x, op, kernel, strides, pads, dilations, ceil_mode=False, count_include_pad=False):
    """ONNX's MaxPool or AveragePool over the last len(kernel) axes in float64, window by window; pads (begins,
    then ends). With count_include_pad an average divides by the window's positions inside the padded input
    (the pads count as zeros; past them, nothing)."""
    x = x.astype(np.float64)
    dims = len(kernel)
    size = x.shape[-dims:]
    out = []
    for i in range(dims):
        span = (kernel[i] - 1) * dilations[i] + 1
        length = size[i] + pads[i] + pads[dims + i] - span
        o = (-(-length // strides[i]) if ceil_mode else length // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= size[i] + pads[i]:
            o -= 1
        out.append(o)
    y = np.zeros(x.shape[:-dims] + tuple(out))
    for at in itertools.product(*(range(o) for o in out)):
        axes = [[at[i] * strides[i] - pads[i] + j * dilations[i] for j in range(kernel[i])] for i in range(dims)]
        inside = [[p for p in a if 0 <= p < size[i]] for i, a in enumerate(axes)]
        window = x[(...,) + np.ix_(*inside)].reshape(x.shape[:-dims] + (-1,))
        if op == "MaxPool":
            y[(...,) + at] = window.max(axis=-1)
        else:
            padded = np.prod([sum(-pads[i] <= p < size[i] + pads[dims + i] for p in a) for i, a in enumerate(axes)])
            y[(...,) + at] = window.sum(axis=-1) / (padded if count_include_pad else window.shape[-1])
    return y


# Padding at either end of each axis, strides and dilations that differ per axis, ceil mode, both divisors of an
# average, SAME padding, and a 1 x kh x kw window (no depth step).
@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[2, 3, 3], strides=[2, 2, 2], pads=[1, 1, 0, 0, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 2, 2], strides=[1, 2, 1], dilations=[2, 1, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3, 2], strides=[2, 1, 2], pads=[1, 0, 1, 1, 2, 0])),
    ("AveragePool", dict(kernel_shape=[3, 2, 3], strides=[2, 2, 2], pads=[1, 1, 1, 2, 1, 1], count_include_pad=1,
                         ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2], auto_pad="SAME_UPPER"))])
def test_pools_3d(dev, op, attrs):
    x = randn(2, 3, 5, 6, 7)
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x.shape}, "y")
    kernel = attrs["kernel_shape"]
    pads = attrs.get("pads", [0] * 6)
    if attrs.get("auto_pad") == "SAME_UPPER":  # ceil(size / 2) outputs, the odd padding position at the end
        total = [max((-(-size // 2) - 1) * 2 + k - size, 0) for size, k in zip(x.shape[2:], kernel)]
        pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    want = pool_nd_reference(x, op, kernel, attrs["strides"], pads, attrs.get("dilations", [1] * 3),
                             attrs.get("ceil_mode", 0), attrs.get("count_include_pad", 0))
    check(dev, m, {"x": x}, lambda x: want)
    # int8: a 3-D pool runs in float (f32) within the int8 model.
    compiled = tpuhal.compile(m, "int8", shapes={"x": x.shape}, device=dev.uri, calibration=[x])
    got = dev.load_model(compiled).instance().run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_4d_convolution_and_pool_are_refused_naming_what_the_compiler_takes(dev):
    x, w = randn(1, 2, 3, 3, 3, 3), randn(2, 2, 2, 2, 2, 2)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": x.shape}, "y", initializers=[("w", w)])
    with pytest.raises(tpuhal.Unsupported, match="4-D convolution; the compiler takes 1-D, 2-D .NCHW. and 3-D"):
        run(dev, m, "fp32", {"x": x})
    m = model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2, 2])], {"x": x.shape}, "y")
    with pytest.raises(tpuhal.Unsupported, match="input of rank 6; the compiler pools .* and 5-D .NCDHW. tensors"):
        run(dev, m, "fp32", {"x": x})


def test_a_3d_convolution_whose_pads_are_not_six_is_refused(dev):
    x, w = randn(1, 2, 4, 5, 6), randn(3, 2, 2, 2, 2)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x.shape}, "y",
              initializers=[("w", w)])
    with pytest.raises(tpuhal.InvalidArgument, match="pads .* has 4 entries; 3-D windows take 6"):
        run(dev, m, "fp32", {"x": x})


def test_a_c3d_style_network_as_pytorch_exports_it(dev, tmp_path):
    """C3D's pattern (Tran et al.): 3x3x3 convolutions, a first MaxPool3d that keeps the frames (1x2x2), later
    ones that halve them (2x2x2, one with ceil_mode), an AvgPool3d, and a Linear, on 8 frames of 24x24."""
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    nn = torch.nn
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv3d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool3d((1, 2, 2)),
        nn.Conv3d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool3d(2),
        nn.Conv3d(16, 16, 3, padding=1), nn.ReLU(), nn.MaxPool3d(2, ceil_mode=True),
        nn.AvgPool3d((2, 3, 3)), nn.Flatten(), nn.Linear(16, 10)).eval()
    x = randn(1, 3, 8, 24, 24)
    onnx_bytes, want = exported(torch, net, x, tmp_path / "c3d.onnx", "clip")
    check(dev, onnx_bytes, {"clip": x}, lambda x: want)


# torchvision's R3D-18 for 16 classes, its BatchNorms' statistics spread, exported at opset 13 into
# argv[1]/r3d_18.onnx, with PyTorch's output on the clip argv[1]/x.npy in argv[1]/y.npy.
R3D_18 = """
import sys, numpy as np, torch
from torchvision.models import video
torch.manual_seed(0)
net = video.r3d_18(num_classes=16).eval()
with torch.no_grad():
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm3d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
x = torch.from_numpy(np.load(sys.argv[1] + "/x.npy"))
torch.onnx.export(net, x, sys.argv[1] + "/r3d_18.onnx", opset_version=13, input_names=["clip"], output_names=["y"])
with torch.no_grad():
    np.save(sys.argv[1] + "/y.npy", net(x).numpy().astype(np.float64))
"""


def test_r3d_18_a_video_network_as_torchvision_builds_it(tmp_path):
    """torchvision's R3D-18 (Tran et al., 3-D ResNet for action recognition): 3-D convolutions with BatchNorm
    folded in, residual adds, a global 3-D average pool and a Linear, on 4 frames of 32x32. Its 33 million
    weights need a board with more memory than sim:tiny. Exported by an interpreter without the sanitizer
    runtime (under it, the export took 13 s)."""
    pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    pytest.importorskip("torchvision.models.video", reason="python3-torchvision is not installed")
    x = randn(1, 3, 4, 32, 32)
    np.save(tmp_path / "x.npy", x)
    run_plain(R3D_18, tmp_path)
    want = np.load(tmp_path / "y.npy")
    with tpuhal.open("sim:0") as board:
        check(board, (tmp_path / "r3d_18.onnx").read_bytes(), {"clip": x}, lambda x: want, precisions=("fp32",),
              scale=1.0)


@pytest.mark.parametrize("opset,aligned", [(11, False), (16, True)])
def test_a_second_stage_detector_head_with_roi_align_as_torchvision_exports_it(dev, tmp_path, opset, aligned):
    """A two-stage detector's box head: a convolution to a stride-2 feature map, torchvision's roi_align of
    the regions (an input of [K, 5] rows, the batch index first, as torchvision keeps them) to 7x7, and a
    Linear. torchvision exports the rows' split as Gather, Squeeze and Cast, then ONNX RoiAlign; aligned=False
    only at opset 11 (torchvision 0.14 exports it at opset 16 without output_half_pixel, which ONNX then reads
    as half_pixel)."""
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    tv_ops = pytest.importorskip("torchvision.ops", reason="python3-torchvision is not installed")

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
            self.fc = torch.nn.Linear(16 * 7 * 7, 10)

        def forward(self, image, boxes):
            f = torch.relu(self.conv(image))
            r = tv_ops.roi_align(f, boxes, (7, 7), spatial_scale=0.5, sampling_ratio=2, aligned=aligned)
            return self.fc(r.flatten(1))

    torch.manual_seed(0)
    net = Head().eval()
    image = randn(2, 3, 64, 64)
    corners = RNG.uniform(-4, 68, (6, 4)).astype(np.float32)
    boxes = np.concatenate([RNG.integers(0, 2, (6, 1)).astype(np.float32), np.minimum(corners[:, :2], corners[:, 2:]),
                            np.maximum(corners[:, :2], corners[:, 2:])], 1)
    path = tmp_path / "head.onnx"
    torch.onnx.export(net, (torch.from_numpy(image), torch.from_numpy(boxes)), str(path), opset_version=opset,
                      input_names=["image", "boxes"], output_names=["y"])
    with torch.no_grad():
        want = net(torch.from_numpy(image), torch.from_numpy(boxes)).numpy().astype(np.float64)
    check(dev, path.read_bytes(), {"image": image, "boxes": boxes}, lambda *_: want, precisions=("fp32",))


def test_an_m5_audio_network_as_pytorch_exports_it(dev, tmp_path):
    """M5 (Dai et al., the torchaudio tutorial's keyword spotter): 1-D convolutions, BatchNorm, 1-D pools, a
    Linear and LogSoftmax, on 8000 samples."""
    torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
    nn, fn = torch.nn, torch.nn.functional

    class M5(nn.Module):
        def __init__(self):
            super().__init__()
            widths = [(1, 32, 80, 16), (32, 32, 3, 1), (32, 64, 3, 1), (64, 64, 3, 1)]
            self.convs = nn.ModuleList(nn.Conv1d(i, o, k, stride=s) for i, o, k, s in widths)
            self.norms = nn.ModuleList(nn.BatchNorm1d(o) for _, o, _, _ in widths)
            self.fc = nn.Linear(64, 35)

        def forward(self, x):
            for conv, norm in zip(self.convs, self.norms):
                x = fn.max_pool1d(fn.relu(norm(conv(x))), 4)
            x = fn.avg_pool1d(x, int(x.shape[-1])).permute(0, 2, 1)
            return fn.log_softmax(self.fc(x), dim=2)

    torch.manual_seed(0)
    net = M5().eval()
    with torch.no_grad():
        for norm in net.norms:
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.2, 0.2)
    x = randn(1, 1, 8000)
    onnx_bytes, want = exported(torch, net, x, tmp_path / "m5.onnx", "audio")
    check(dev, onnx_bytes, {"audio": x}, lambda x: want)


def test_mixed_precision_leaves_a_1d_convolution_in_f32(dev):
    # The target SNR search moves the layers that run in int8 to fp16. A 1-D convolution already runs in f32:
    # with small integers (exact in fp16, so moving it would cost nothing) it would otherwise be moved too, once
    # the MatMul after it has gone to fp16 and the output is still short of an unreachable target.
    x = RNG.integers(-4, 5, (4, 3, 32)).astype(np.float32)
    w = RNG.integers(-2, 3, (8, 3, 5)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Flatten", ["c"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"], name="matmul")]
    m = model(nodes, {"x": (1, 3, 32)}, "y", initializers=[("w", w), ("m", randn(224, 6))])
    compiled = tpuhal.compile(m, "int8", shapes={"x": (1, 3, 32)}, calibration=x, target_snr_db=200,
                              device=dev.uri)
    assert "1 layer(s) in fp16: matmul" in compiled.notes, compiled.notes
    assert any("no int8 layer left that helps" in n for n in compiled.notes), compiled.notes


def test_a_convolution_whose_weights_and_input_disagree_in_rank_is_refused(dev):
    x, w = randn(1, 2, 9), randn(3, 2, 3, 3)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": x.shape}, "y", initializers=[("w", w)])
    with pytest.raises(tpuhal.InvalidArgument, match="weights of rank 4 for an input of rank 3"):
        run(dev, m, "fp32", {"x": x})


@pytest.mark.parametrize("op,ref", [("Ceil", np.ceil), ("Floor", np.floor), ("Round", np.round)])
def test_rounding_maps(dev, op, ref):
    # Halves of both signs (Round: to even, as np.round), integers, and values between: random eighths, which
    # bf16 holds exactly doubled, as the reference takes them (a value that rounds to an integer in the model's
    # precision would be floored there and not here).
    between = np.round(randn(3 * 7 - 19) * 6 * 8) / 8
    x = np.concatenate([np.arange(-4.5, 5, 0.5), between]).astype(np.float32).reshape(1, 3, 7)
    m = model([helper.make_node("Mul", ["x", "two"], ["x2"]), helper.make_node(op, ["x2"], ["y"])], {"x": x.shape},
              "y", initializers=[("two", np.float32(2.0))])
    check(dev, m, {"x": x}, lambda x: ref(x.astype(np.float64) * 2))
    # Exact in fp32 and fp16 alike on inputs fp16 holds (multiples of 1/4).
    xe = np.arange(-2.5, 2.75, 0.25, dtype=np.float32).reshape(1, 3, 7)
    for precision in ("fp32", "fp16"):
        np.testing.assert_array_equal(run(dev, m, precision, {"x": xe}), ref(xe * 2))


@pytest.mark.parametrize("shape,repeats", [((2, 3), (1, 2)), ((2, 3), (3, 1)), ((1, 2, 3, 4), (1, 2, 1, 3)),
                                           ((2, 1, 3, 5), (2, 2, 1, 1)), ((4,), (3,))])
def test_tile(dev, shape, repeats):
    x = randn(*shape)
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Tile", ["r", "reps"], ["y"])],
              {"x": x.shape}, "y", initializers=[("reps", i64(repeats))])
    check(dev, m, {"x": x}, lambda x: np.tile(np.maximum(x, 0), repeats))


def test_tile_of_constants_folds_and_bad_repeats_are_refused(dev):
    # Tile of a constant is folded: the graph's only device op is the Add.
    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = model([helper.make_node("Tile", ["c", "reps"], ["t"]), helper.make_node("Add", ["x", "t"], ["y"])],
              {"x": (4, 6)}, "y", initializers=[("c", c), ("reps", i64([2, 2]))])
    x = randn(4, 6)
    np.testing.assert_allclose(run(dev, m, "fp32", {"x": x}), x + np.tile(c, (2, 2)), rtol=1e-6)
    compiled = tpuhal.compile(m, "fp32", shapes={"x": (4, 6)}, device=dev.uri)
    assert [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]] == ["add"]
    for reps, why in [([2], "repeats \\[2\\] for an input of rank 2"), ([0, 1], "has an entry below 1"),
                      ([1 << 62, 1], "a dimension of 2\\^32 or more")]:
        bad = model([helper.make_node("Tile", ["x", "reps"], ["y"])], {"x": (2, 3)}, "y",
                    initializers=[("reps", i64(reps))])
        with pytest.raises(tpuhal.InvalidArgument, match=why):
            tpuhal.compile(bad, "fp32", shapes={"x": (2, 3)}, device=dev.uri)
    # Repeats on four axes apart need a view of rank 8: refused, naming why.
    wide = model([helper.make_node("Tile", ["x", "reps"], ["y"])], {"x": (2, 3, 4, 5)}, "y",
                 initializers=[("reps", i64([2, 2, 2, 2]))])
    with pytest.raises(tpuhal.Unsupported, match="rank above 6"):
        tpuhal.compile(wide, "fp32", shapes={"x": (2, 3, 4, 5)}, device=dev.uri)


def test_gather_by_indices_computed_on_the_device(dev):
    # ArgMax's indices pick rows of a constant table: the board's gather.
    table = randn(5, 3)
    x = randn(4, 5)
    m = model([helper.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0),
               helper.make_node("Gather", ["t", "i"], ["y"], axis=0)],
              {"x": x.shape}, "y", initializers=[("t", table)])
    check(dev, m, {"x": x}, lambda x: table[np.argmax(x, axis=1)])
    compiled = tpuhal.compile(m, "fp32", shapes={"x": x.shape}, device=dev.uri)
    ops = [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]]
    assert "gather" in ops, ops


def test_token_ids_cast_inside_the_model_look_up_an_embedding(dev):
    # Float ids cast to int64 inside the model (rounded toward zero, as ONNX
    # casts), then an embedding lookup and a layer on top: a language model's
    # first layers. A negative id counts from the end; ids beyond 256 and
    # 2048 (where bf16 and fp16 stop holding integers) stay exact in every
    # precision, since the cast reads f32.
    emb, w = randn(3000, 8), randn(8, 4)
    ids = np.array([[0, 2999.7, 257, -1.5], [2049, 1001, 5.2, 2990]], np.float32)
    m = model([helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.INT64),
               helper.make_node("Gather", ["emb", "i"], ["e"]),
               helper.make_node("MatMul", ["e", "w"], ["y"])],
              {"ids": ids.shape}, "y", initializers=[("emb", emb), ("w", w)])
    check(dev, m, {"ids": ids}, lambda ids: emb[np.trunc(ids).astype(np.int64)] @ w)


def test_integer_model_inputs_take_token_ids(dev, tmp_path):
    # A language model's inputs as exporters write them: int64 token ids
    # (and int32 positions), an embedding lookup of each, summed.
    tok, pos, w = randn(3000, 6), randn(16, 6), randn(6, 3)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["tok", "ids"], ["t"]), helper.make_node("Gather", ["pos", "p"], ["q"]),
         helper.make_node("Add", ["t", "q"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"])],
        "lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5]),
               helper.make_tensor_value_info("p", TensorProto.INT32, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in [("tok", tok), ("pos", pos), ("w", w)]])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx_bytes = m.SerializeToString()
    ids = np.array([[101, 2999, 7, 0, 2048], [257, -1, 5, 5, 1999]], np.int64)
    p = np.tile(np.arange(5, dtype=np.int32), (2, 1))
    want = (tok[ids] + pos[p]) @ w
    for precision in ("fp32", "fp16", "bf16"):
        compiled = tpuhal.compile(onnx_bytes, precision, device=dev.uri)
        loaded = dev.load_model(compiled)
        assert [(s.name, str(s.dtype)) for s in loaded.inputs] == [("ids", "i32"), ("p", "i32")], precision
        got = loaded.instance().run({"ids": ids, "p": p})[0]
        err = float(np.abs(got - want).max()) / float(np.abs(want).max())
        assert err <= TOLERANCE[precision], f"{precision}: error {err:.3g}"
    inst = loaded.instance()
    with pytest.raises(tpuhal.InvalidArgument, match="input 'ids' takes integers \\(i32\\); the array holds float32"):
        inst.run({"ids": ids.astype(np.float32), "p": p})
    with pytest.raises(tpuhal.InvalidArgument, match="input 'ids' holds 4294967296, outside int32"):
        inst.run({"ids": np.full((2, 5), 1 << 32, np.int64), "p": p})
    # `tpuhal profile` fills an i32 input with 0, an index every table has.
    tpuhal_cli = os.path.join(os.environ.get("TPUHAL_BIN_DIR", ""), "tpuhal")
    if os.path.exists(tpuhal_cli):
        path = tmp_path / "lm.tpm"
        compiled.save(str(path))
        out = subprocess.run([tpuhal_cli, "profile", "--device", dev.uri, "--iterations", "2", "--json", str(path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert [layer["ops"] for layer in json.loads(out.stdout)["layers"]][:2] == ["gather", "gather"]
    # int8, calibrated on ids: the calibration arrays hold integers.
    calib = [np.concatenate([ids, ids[::-1]]), np.concatenate([p, p])]
    q = tpuhal.compile(onnx_bytes, "int8", calibration=calib, device=dev.uri)
    got = dev.load_model(q).instance().run({"ids": ids, "p": p})[0]
    assert float(np.abs(got - want).max()) <= 0.05 * float(np.abs(want).max())


def test_models_on_one_device_run_again_after_one_of_them_was_refused(dev):
    emb = randn(6, 2)
    m = model([helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.INT64),
               helper.make_node("Gather", ["emb", "i"], ["y"])],
              {"ids": (3,)}, "y", initializers=[("emb", emb)])
    compiled = tpuhal.compile(m, "fp32", shapes={"ids": (3,)}, device=dev.uri)
    a, b = dev.load_model(compiled), dev.load_model(compiled)
    ia, ib = a.instance(), b.instance()
    for _ in range(2):
        with pytest.raises(tpuhal.Error, match="holds the index 6"):
            ia.run({"ids": np.array([1, 6, 0], np.float32)})
    good = np.array([1, -6, 5], np.float32)
    np.testing.assert_array_equal(ia.run({"ids": good})[0], emb[[1, -6, 5]])
    np.testing.assert_array_equal(ib.run({"ids": good})[0], emb[[1, -6, 5]])


def test_argmax_cast_to_int64_then_gather_reads_the_indices_as_they_are(dev):
    # ArgMax's indices are i32 already: the Cast only views them.
    table, x = randn(7, 3), randn(2, 7)
    m = model([helper.make_node("ArgMax", ["x"], ["a"], axis=1, keepdims=0),
               helper.make_node("Cast", ["a"], ["i"], to=TensorProto.INT64),
               helper.make_node("Gather", ["t", "i"], ["y"])], {"x": x.shape}, "y", initializers=[("t", table)])
    check(dev, m, {"x": x}, lambda x: table[np.argmax(x, axis=1)])
    compiled = tpuhal.compile(m, "fp32", shapes={"x": x.shape}, device=dev.uri)
    ops = [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]]
    assert not any("cast" in o for o in ops), ops


def test_cast_to_integers_on_the_device_rounds_toward_zero(dev):
    # Values whose fp16 and bf16 forms round toward zero to the same integers.
    x = np.array([[-2.7, -0.5, 0.5, 2.7], [3.0, -3.0, 100.25, -7.9]], np.float32)
    m = model([helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
               helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)], {"x": x.shape}, "y")
    for precision in ("fp32", "fp16", "bf16"):
        np.testing.assert_array_equal(run(dev, m, precision, {"x": x}), np.trunc(x), err_msg=precision)
    bad = model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT16)], {"x": (2,)}, "y")
    with pytest.raises(tpuhal.Unsupported, match="to ONNX type 4 on data computed on the device"):
        tpuhal.compile(bad, "fp32", shapes={"x": (2,)}, device=dev.uri)


def test_castlike_casts_to_the_type_of_a_constant_and_refuses_a_computed_target(dev):
    # CastLike to an int64 constant: Cast to int64 on the device, toward zero.
    x = np.array([[-2.7, -0.5, 0.5, 2.7], [3.0, -3.0, 100.25, -7.9]], np.float32)
    nodes = [helper.make_node("CastLike", ["x", "like"], ["i"]),
             helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)]
    m = model(nodes, {"x": x.shape}, "y", initializers=[("like", np.int64(0))], opset=15)
    for precision in ("fp32", "fp16", "bf16"):
        np.testing.assert_array_equal(run(dev, m, precision, {"x": x}), np.trunc(x), err_msg=precision)
    # A target the model computes: its type is not known to the compiler.
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("CastLike", ["x", "r"], ["y"], name="cl")]
    with pytest.raises(tpuhal.Unsupported, match=r"'cl' \(CastLike\): .*a target \('r'\) computed in the model"):
        tpuhal.compile(model(nodes, {"x": (2,)}, "y", opset=15), "fp32", shapes={"x": (2,)}, device=dev.uri)
    # Before opset 15 there is no CastLike.
    nodes = [helper.make_node("CastLike", ["x", "like"], ["y"])]
    with pytest.raises(tpuhal.Unsupported, match=r"opset 13 \(CastLike came in 15\)"):
        tpuhal.compile(model(nodes, {"x": (2,)}, "y", initializers=[("like", np.float32(0))]), "fp32",
                       shapes={"x": (2,)}, device=dev.uri)


def test_an_index_outside_the_axis_fails_the_run_and_the_model_runs_again(dev):
    emb = randn(6, 2)
    m = model([helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.INT64),
               helper.make_node("Gather", ["emb", "i"], ["y"])],
              {"ids": (3,)}, "y", initializers=[("emb", emb)])
    compiled = tpuhal.compile(m, "fp32", shapes={"ids": (3,)}, device=dev.uri)
    loaded = dev.load_model(compiled)
    with pytest.raises(tpuhal.Error, match=r"holds the index 6, outside \[-6, 6\)"):
        loaded.instance().run({"ids": np.array([1, 6, 0], np.float32)})
    good = loaded.instance().run({"ids": np.array([1, -6, 5], np.float32)})[0]
    np.testing.assert_array_equal(good, emb[[1, -6, 5]])


def gather_nd(data, indices, batch_dims=0):
    """ONNX GatherND, written from its definition."""
    indices = np.asarray(indices, np.int64)
    b = batch_dims
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape((batch,) + data.shape[b:])
    i = indices.reshape((batch,) + indices.shape[b:])
    k = indices.shape[-1]
    out = []
    for n in range(batch):
        tuples = i[n].reshape(-1, k)
        out.append(np.stack([d[n][tuple(t)] for t in tuples]).reshape(i[n].shape[:-1] + data.shape[b + k:]))
    return np.stack(out).reshape(indices.shape[:-1] + data.shape[b + k:])


@pytest.mark.parametrize("data_shape,indices,batch_dims", [
    ((3, 4, 5), [[0, 1], [2, -1], [-3, 3]], 0),
    ((3, 4, 5), [[[1, 2, 3]], [[0, 0, -1]]], 0),
    ((4, 6), [1, -2], 0),
    ((2, 3, 4), [[1], [0]], 1),
    ((2, 3, 4, 2), [[[2, 1], [0, -1], [1, 3]], [[0, 0], [2, 2], [-1, 1]]], 1),
])
def test_gather_nd_with_constant_and_device_indices(dev, data_shape, indices, batch_dims):
    x = randn(*data_shape)
    want = gather_nd(x, indices, batch_dims)
    # Constant indices, device data.
    m = model([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("GatherND", ["r", "i"], ["y"], batch_dims=batch_dims)],
              {"x": x.shape}, "y", initializers=[("i", i64(indices))])
    check(dev, m, {"x": x}, lambda x: gather_nd(np.maximum(x, 0), indices, batch_dims))
    # Indices computed on the device (float ids cast inside), a constant table.
    ids = np.asarray(indices, np.float32)
    m = model([helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.INT64),
               helper.make_node("GatherND", ["t", "i"], ["y"], batch_dims=batch_dims)],
              {"ids": ids.shape}, "y", initializers=[("t", x)])
    check(dev, m, {"ids": ids}, lambda ids: want)


def test_gather_nd_folds_on_constants_and_refuses_indices_outside(dev):
    c = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = model([helper.make_node("GatherND", ["c", "i"], ["t"]), helper.make_node("Add", ["x", "t"], ["y"])],
              {"x": (2,)}, "y", initializers=[("c", c), ("i", i64([[2, 1], [0, -1]]))])
    compiled = tpuhal.compile(m, "fp32", shapes={"x": (2,)}, device=dev.uri)
    assert [layer["ops"] for layer in dev.load_model(compiled).instance().profile(1)["layers"]] == ["add"]
    np.testing.assert_array_equal(run(dev, m, "fp32", {"x": np.zeros(2, np.float32)}), [9, 3])
    bad = model([helper.make_node("GatherND", ["x", "i"], ["y"])], {"x": (3, 4)}, "y",
                initializers=[("i", i64([[0, 4]]))])
    with pytest.raises(tpuhal.InvalidArgument, match=r"index 4 outside \[-4, 4\)"):
        tpuhal.compile(bad, "fp32", shapes={"x": (3, 4)}, device=dev.uri)
    deep = model([helper.make_node("GatherND", ["x", "i"], ["y"])], {"x": (3, 4)}, "y",
                 initializers=[("i", i64([[0, 1, 2]]))])
    with pytest.raises(tpuhal.InvalidArgument, match="index tuples of length 3 into 2 dimensions"):
        tpuhal.compile(deep, "fp32", shapes={"x": (3, 4)}, device=dev.uri)
    # On the device, an index outside its dimension fails the run (the tuple
    # (1, 4) would otherwise name row 2's first element).
    emb = randn(3, 4)
    dyn = model([helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.INT64),
                 helper.make_node("GatherND", ["t", "i"], ["y"])], {"ids": (1, 2)}, "y", initializers=[("t", emb)])
    loaded = dev.load_model(tpuhal.compile(dyn, "fp32", shapes={"ids": (1, 2)}, device=dev.uri))
    with pytest.raises(tpuhal.Error, match=r"holds the index 4, outside \[-4, 4\)"):
        loaded.instance().run({"ids": np.array([[1, 4]], np.float32)})
    np.testing.assert_array_equal(loaded.instance().run({"ids": np.array([[1, 3]], np.float32)})[0], emb[1, 3:4])


def elu(x, alpha):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


# Compositions of the elementwise maps: (attributes, reference).
COMPOSITES = {
    "Elu": ({"alpha": 0.7}, lambda x: elu(x, 0.7)),
    "Selu": ({}, lambda x: 1.05070102214813232421875 * elu(x, 1.67326319217681884765625)),
    "Celu": ({"alpha": 2.0}, lambda x: np.maximum(x, 0) + np.minimum(0, 2.0 * np.expm1(np.minimum(x, 0) / 2.0))),
    "ThresholdedRelu": ({"alpha": 0.4}, lambda x: np.where(x > 0.4, x, 0)),
    # Large x: log(1 + exp(x)) would overflow exp; the lowering does not.
    "Softplus": ({}, lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x))),
    "Shrink": ({"lambd": 0.6, "bias": 0.25}, lambda x: np.where(x < -0.6, x + 0.25, np.where(x > 0.6, x - 0.25, 0))),
}


@pytest.mark.parametrize("op", sorted(COMPOSITES))
def test_activations_composed_of_maps(dev, op):
    attrs, reference = COMPOSITES[op]
    x = randn(2, 3, 4, 5) * 3
    x[0, 0, 0, :3] = [200.0, -200.0, 0.0]
    onnx_bytes = model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x.shape}, "y")
    check(dev, onnx_bytes, {"x": x}, lambda x: reference(x.astype(np.float64)))


@pytest.mark.parametrize("slope_shape", [(3, 1, 1), (1,), (5,)])
def test_prelu_with_a_slope_per_channel_or_broadcast(dev, slope_shape):
    x = randn(2, 3, 4, 5)
    slope = RNG.uniform(0.05, 0.5, slope_shape).astype(np.float32)
    onnx_bytes = model([helper.make_node("PRelu", ["x", "slope"], ["y"])], {"x": x.shape}, "y",
                       initializers=[("slope", slope)])
    check(dev, onnx_bytes, {"x": x}, lambda x: np.where(x < 0, x * slope, x).astype(np.float64))
    for shape, why in [((4,), "shapes \\[2, 3, 4, 5\\] and \\[1, 1, 1, 4\\] do not broadcast"),
                       ((2, 1, 1, 1, 1), "its slope \\[2, 1, 1, 1, 1\\] does not broadcast to x \\[2, 3, 4, 5\\]")]:
        bad = model([helper.make_node("PRelu", ["x", "slope"], ["y"])], {"x": x.shape}, "y",
                    initializers=[("slope", np.ones(shape, np.float32))])
        with pytest.raises(tpuhal.InvalidArgument, match=why):
            tpuhal.compile(bad, "fp32")


@pytest.mark.parametrize("op", ["Sum", "Mean"])
def test_sum_and_mean_of_several_broadcast_inputs(dev, op):
    a, b, c = randn(2, 3, 4), randn(3, 1), randn(4)
    onnx_bytes = model([helper.make_node(op, ["a", "b", "c"], ["y"])], {"a": a.shape, "b": b.shape, "c": c.shape}, "y")
    check(dev, onnx_bytes, {"a": a, "b": b, "c": c},
          lambda a, b, c: (a.astype(np.float64) + b + c) / (3 if op == "Mean" else 1))


def depth_to_space(x, b, crd):
    n, c, h, w = x.shape
    if crd:
        return x.reshape(n, c // b // b, b, b, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c // b // b, h * b, w * b)
    return x.reshape(n, b, b, c // b // b, h, w).transpose(0, 3, 4, 1, 5, 2).reshape(n, c // b // b, h * b, w * b)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(dev, mode):
    x = randn(2, 8, 3, 5)
    onnx_bytes = model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)], {"x": x.shape}, "y")
    check(dev, onnx_bytes, {"x": x}, lambda x: depth_to_space(x, 2, mode == "CRD"))
    s = randn(2, 3, 6, 4)
    onnx_bytes = model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)], {"x": s.shape}, "y")
    check(dev, onnx_bytes, {"x": s}, lambda s: s.reshape(2, 3, 3, 2, 2, 2).transpose(0, 3, 5, 1, 2, 4).reshape(2, 12, 3, 2))
    odd = model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2)], {"x": (1, 6, 2, 2)}, "y")
    with pytest.raises(tpuhal.InvalidArgument, match="C of \\[1, 6, 2, 2\\] is not a multiple of 4"):
        tpuhal.compile(odd, "fp32")


@pytest.mark.parametrize("upper,k", [(1, 0), (0, 0), (1, 2), (0, -1)])
def test_trilu_keeps_a_triangle_of_the_last_two_dimensions(dev, upper, k):
    x = randn(2, 4, 6)
    x[(0, 3, 0) if upper else (0, 0, 5)] = np.inf  # outside the triangle: zeroed, not multiplied by 0
    onnx_bytes = model([helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)], {"x": x.shape}, "y",
                       initializers=[("k", np.int64(k))], opset=14)
    check(dev, onnx_bytes, {"x": x}, lambda x: (np.triu(x, k) if upper else np.tril(x, k)).astype(np.float64))


@pytest.mark.parametrize("axis,indices", [
    (1, [[[0, 2], [-1, 1]], [[1, 1], [2, -3]]]),   # shorter than the data in dimension 2
    (0, [[[1, 0, 1], [0, 1, 0]]]),
    (-1, [[[2], [0]], [[-1], [1]]]),
])
def test_gather_elements_with_constant_and_device_indices(dev, axis, indices):
    x = randn(2, 3, 4)
    idx = np.asarray(indices)
    # NumPy's take_along_axis needs the indices as long as the data but along the axis; ONNX's may be shorter.
    part = x[tuple(slice(None) if d == axis % 3 else slice(0, s) for d, s in enumerate(idx.shape))]
    want = np.take_along_axis(part.astype(np.float64), np.where(idx < 0, idx + x.shape[axis], idx), axis=axis)
    m = model([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("GatherElements", ["r", "i"], ["y"], axis=axis)],
              {"x": x.shape}, "y", initializers=[("i", i64(idx))])
    check(dev, m, {"x": x}, lambda x: np.maximum(want, 0))
    ids = idx.astype(np.float32)
    m = model([helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.INT64),
               helper.make_node("GatherElements", ["t", "i"], ["y"], axis=axis)],
              {"ids": ids.shape}, "y", initializers=[("t", x)], opset=13)
    check(dev, m, {"ids": ids}, lambda ids: want)


def test_gather_elements_refuses_indices_outside_and_a_device_index_outside_fails_the_run(dev):
    bad = model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)], {"x": (2, 3)}, "y",
                initializers=[("i", i64([[0, 3]]))])
    with pytest.raises(tpuhal.InvalidArgument, match=r"index 3 outside \[-3, 3\)"):
        tpuhal.compile(bad, "fp32", shapes={"x": (2, 3)}, device=dev.uri)
    wide = model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)], {"x": (2, 3)}, "y",
                 initializers=[("i", i64([[0], [1], [2]]))])
    with pytest.raises(tpuhal.InvalidArgument, match=r"longer than the data \[2, 3\] in dimension 0"):
        tpuhal.compile(wide, "fp32", shapes={"x": (2, 3)}, device=dev.uri)
    # On the device, an index outside its axis fails the run (flat, the index
    # 3 of row 0 would otherwise name row 1's first element).
    t = randn(2, 3)
    dyn = model([helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.INT64),
                 helper.make_node("GatherElements", ["t", "i"], ["y"], axis=1)], {"ids": (2, 1)}, "y",
                initializers=[("t", t)])
    loaded = dev.load_model(tpuhal.compile(dyn, "fp32", shapes={"ids": (2, 1)}, device=dev.uri))
    with pytest.raises(tpuhal.Error, match=r"holds the index 3, outside \[-3, 3\)"):
        loaded.instance().run({"ids": np.array([[3], [0]], np.float32)})
    np.testing.assert_array_equal(loaded.instance().run({"ids": np.array([[2], [-1]], np.float32)})[0],
                                  [[t[0, 2]], [t[1, 2]]])


def test_integer_bool_and_narrow_float_inputs(dev):
    # An 8-bit image and a bool mask come in as i32; a float16 input as
    # float32. uint8 / uint8 divides as integers (toward zero).
    image = RNG.integers(0, 256, (2, 3), dtype=np.uint8)
    step = RNG.integers(1, 9, (2, 3), dtype=np.uint8)
    mask = RNG.integers(0, 2, (2, 3)).astype(bool)
    scale = randn(2, 3).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node("Div", ["image", "step"], ["q"]),
         helper.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["scale"], ["sf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["qf", "sf"], ["m"]),
         helper.make_node("Where", ["mask", "m", "qf"], ["y"])], "inputs",
        [helper.make_tensor_value_info("image", TensorProto.UINT8, [2, 3]),
         helper.make_tensor_value_info("step", TensorProto.UINT8, [2, 3]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 3]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT16, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    compiled = tpuhal.compile(m.SerializeToString(), "fp32")
    loaded = dev.load_model(compiled)
    assert [i.dtype for i in loaded.inputs] == ["i32", "i32", "i32", "f32"]
    got = loaded.instance().run({"image": image, "step": step, "mask": mask, "scale": scale.astype(np.float32)})[0]
    q = (image // step).astype(np.float32)
    np.testing.assert_allclose(got, np.where(mask, q * scale.astype(np.float32), q), rtol=1e-6)


def test_a_dropout_in_training_mode_is_refused_and_one_in_inference_removed(dev):
    def dropout(training):
        return model([helper.make_node("Dropout", ["x", "ratio", "training"], ["y"])], {"x": (2, 3)}, "y",
                     initializers=[("ratio", np.float32(0.5)), ("training", np.bool_(training))], opset=13)
    with pytest.raises(tpuhal.Unsupported, match="training mode"):
        tpuhal.compile(dropout(True), "fp32")
    x = randn(2, 3)
    np.testing.assert_array_equal(run(dev, dropout(False), "fp32", {"x": x}), x)


def test_integers_cast_to_float_divide_as_floats(dev):
    # Div of two int64 inputs rounds toward zero; of their Casts to float it
    # does not, though the device holds both as i32.
    a, b = np.array([[7, -7, 9]], np.int64), np.array([[2, 2, 4]], np.int64)
    def divide(cast):
        nodes = ([helper.make_node("Cast", ["a"], ["fa"], to=TensorProto.FLOAT),
                  helper.make_node("Cast", ["b"], ["fb"], to=TensorProto.FLOAT),
                  helper.make_node("Div", ["fa", "fb"], ["y"])] if cast else
                 [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)])
        graph = helper.make_graph(nodes, "div", [helper.make_tensor_value_info("a", TensorProto.INT64, [1, 3]),
                                                 helper.make_tensor_value_info("b", TensorProto.INT64, [1, 3])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        return dev.load_model(tpuhal.compile(m.SerializeToString(), "fp32")).instance().run({"a": a, "b": b})[0]
    np.testing.assert_array_equal(divide(False), [[3, -3, 2]])
    np.testing.assert_allclose(divide(True), [[3.5, -3.5, 2.25]])


@pytest.mark.parametrize("op,attrs,reference", [
    ("IsNaN", {}, np.isnan),
    ("IsInf", {}, np.isinf),
    ("IsInf", {"detect_negative": 0}, np.isposinf),
    ("IsInf", {"detect_positive": 0}, np.isneginf),
    ("IsInf", {"detect_positive": 0, "detect_negative": 0}, lambda x: np.zeros(x.shape, bool)),
    ("Sign", {}, np.sign),
])
def test_nan_inf_and_sign_tests(dev, op, attrs, reference):
    x = randn(2, 7)
    x[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    onnx_bytes = model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x.shape}, "y")
    want = reference(x).astype(np.float32)
    for precision in ("fp32", "fp16", "bf16"):
        got = run(dev, onnx_bytes, precision, {"x": x})
        if op == "Sign":  # away from the special values, the signs of rounded values
            np.testing.assert_array_equal(got[0, :5], [np.nan, 1, -1, 0, 0], err_msg=precision)
        np.testing.assert_array_equal(got, want, err_msg=precision)


def test_a_models_permute_runs_on_its_own_and_the_compilers_layout_changes_stay_grouped(dev):
    # The board's compiler runs a model's permute DDR to DDR (docs/timing.md): costed by the board's
    # timing model, both its tensors stream from device memory, the one read out of order a 32-byte
    # burst per element. The compiler's own change of the convolution's output from NHWC back to NCHW
    # stays in its group, on chip. The result is the model's either way.
    x, w = randn(1, 3, 8, 8), randn(4, 3, 1, 1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2], name="permute")]
    m = model(nodes, {"x": x.shape}, "y", initializers=[("w", w)])
    compiled = tpuhal.compile(m, "fp32", shapes={"x": x.shape}, device=dev.uri)
    inst = dev.load_model(compiled).instance()
    want = np.einsum("oc,nchw->nowh", w[:, :, 0, 0].astype(np.float64), x)
    np.testing.assert_allclose(inst.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)
    layers = inst.modelled()["layers"]
    permute = [l for l in layers if l["node"] == "permute"]
    # [1, 4, 8, 8] f32: 256 elements read at 32 bytes each and 1024 bytes written, at the tiny board's
    # 16000 MB/s.
    assert len(permute) == 1 and permute[0]["ops"] == "transpose"
    assert permute[0]["memory_ns"] == (256 * 32 + 1024) * 1000 // 16000
    own = [l for l in layers if l["node"] == ""]
    assert any("transpose" in l["ops"] for l in own)
    assert all(l["memory_ns"] == 0 for l in own)
