"""Compiled models from Python: tpuhal.compile(), load_model(), Model, Instance.

The models are built here with ONNX's helper (Debian's python3-onnx) and
checked against NumPy computing the same network."""
import threading

import numpy as np
import pytest

import tpuhal

onnx = pytest.importorskip("onnx", reason="python3-onnx is not installed (scripts/setup.sh installs it)")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(7)
BATCH = 4


def mlp_bytes():
    """x[N, 16] -> Gemm(16->32) -> Relu -> Gemm(32->10) -> Softmax, batch symbolic."""
    w1 = RNG.standard_normal((32, 16)).astype(np.float32) * 0.3
    b1 = RNG.standard_normal(32).astype(np.float32) * 0.1
    w2 = RNG.standard_normal((10, 32)).astype(np.float32) * 0.3
    b2 = RNG.standard_normal(10).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu1"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], name="fc2", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8

    def reference(x):
        h = np.maximum(x @ w1.T + b1, 0)
        z = h @ w2.T + b2
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    return model.SerializeToString(), reference


def cnn_bytes():
    """x[N, 1, 8, 8] -> Conv 3x3 pad 1 (4 channels) -> Relu -> MaxPool 2 -> Flatten -> Gemm(64 -> 5)."""
    wc = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32) * 0.5
    bc = RNG.standard_normal(4).astype(np.float32) * 0.1
    wf = RNG.standard_normal((5, 64)).astype(np.float32) * 0.2
    bf = RNG.standard_normal(5).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "wc", "bc"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(a, n) for a, n in ((wc, "wc"), (bc, "bc"), (wf, "wf"), (bf, "bf"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8

    def reference(x):
        n = x.shape[0]
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        c = np.zeros((n, 4, 8, 8), np.float32)
        for i in range(3):
            for j in range(3):
                c += np.einsum("nhw,o->nohw", xp[:, 0, i:i + 8, j:j + 8], wc[:, 0, i, j])
        r = np.maximum(c + bc[None, :, None, None], 0)
        p = r.reshape(n, 4, 4, 2, 4, 2).max(axis=(3, 5))
        return p.reshape(n, 64) @ wf.T + bf

    return model.SerializeToString(), reference


@pytest.fixture(scope="module")
def mlp():
    return mlp_bytes()


@pytest.fixture(scope="module")
def cnn():
    return cnn_bytes()


def test_fp32_mlp_matches_numpy_and_specs_describe_the_fixed_shapes(dev, mlp):
    onnx_bytes, reference = mlp
    compiled = tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (BATCH, 16)}, device=dev.uri)
    model = tpuhal.load_model(dev, compiled)
    assert model.precision == "fp32"
    assert [(s.name, s.shape, str(s.dtype)) for s in model.inputs] == [("x", (BATCH, 16), "f32")]
    assert [(s.name, s.shape) for s in model.outputs] == [("probs", (BATCH, 10))]
    assert model.weight_bytes >= (32 * 16 + 32 + 10 * 32 + 10) * 4
    assert model.activation_bytes >= (BATCH * 16 + BATCH * 10) * 4  # the input and the output at least
    x = RNG.standard_normal((BATCH, 16)).astype(np.float32)
    (probs,) = model.instance().run(x)
    assert probs.dtype == np.float32 and probs.shape == (BATCH, 10)
    np.testing.assert_allclose(probs, reference(x), rtol=1e-4, atol=1e-5)


def test_fp32_cnn_matches_numpy_from_a_file_path_and_a_saved_model(dev, cnn, tmp_path):
    onnx_bytes, reference = cnn
    src = tmp_path / "cnn.onnx"
    src.write_bytes(onnx_bytes)
    compiled = tpuhal.compile(src, "fp32", shapes={"x": [BATCH, 1, 8, 8]}, device=dev.uri)
    compiled.save(tmp_path / "cnn.tpm")
    assert (tmp_path / "cnn.tpm").read_bytes() == compiled.to_bytes()
    from_file = dev.load_model(str(tmp_path / "cnn.tpm"))
    x = RNG.standard_normal((BATCH, 1, 8, 8)).astype(np.float32)
    (y,) = from_file.instance().run([x])
    np.testing.assert_allclose(y, reference(x), rtol=1e-4, atol=1e-4)
    # Inputs by name and float64 data (converted) give the same result.
    (y2,) = from_file.instance().run({"x": x.astype(np.float64)})
    np.testing.assert_array_equal(y, y2)


@pytest.mark.parametrize("precision,tolerance", [("fp16", 2e-2), ("bf16", 6e-2)])
def test_reduced_float_precisions_stay_close_to_numpy(dev, cnn, precision, tolerance):
    onnx_bytes, reference = cnn
    model = dev.load_model(tpuhal.compile(onnx_bytes, precision, shapes={"x": (BATCH, 1, 8, 8)}, device=dev.uri))
    assert model.precision == precision
    x = RNG.standard_normal((BATCH, 1, 8, 8)).astype(np.float32)
    (y,) = model.instance().run(x)
    ref = reference(x)
    assert np.abs(y - ref).max() <= tolerance * max(1.0, np.abs(ref).max())


def test_int8_is_calibrated_close_to_fp32_identical_run_to_run_and_reports_each_layer(dev, cnn):
    onnx_bytes, reference = cnn
    calib = RNG.standard_normal((32, 1, 8, 8)).astype(np.float32)
    compiled = tpuhal.compile(onnx_bytes, "int8", shapes={"x": (BATCH, 1, 8, 8)}, calibration=calib,
                              method="minmax", report=True, device=dev.uri)
    layers = {e.node: e for e in compiled.report}
    assert {"conv", "fc"} <= set(layers), compiled.report
    for e in compiled.report:
        assert np.isfinite([e.max_abs, e.rms, e.rel_rms, e.snr_db]).all()
        assert 0 <= e.rel_rms < 0.2, e
    model = dev.load_model(compiled)
    assert model.meta.get("precision") == "int8"
    x = calib[:BATCH]
    inst = model.instance()
    (a,) = inst.run(x)
    (b,) = inst.run(x)
    (c,) = model.instance().run(x)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    ref = reference(x)
    assert np.abs(a - ref).max() <= 0.1 * np.abs(ref).max()


def test_a_layer_that_loses_everything_to_infinities_is_reported_so_not_as_exact(dev):
    # fp16 holds no 1e5 * x for x above 0.66: a = inf, and a - a NaN, where
    # fp32 gives 0. Both layers lose the whole signal.
    scale = numpy_helper.from_array(np.asarray([1e5], np.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["a"], name="big"),
         helper.make_node("Sub", ["a", "a"], ["y"], name="none")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    calib = np.full((2, 4), 2.0, np.float32)
    compiled = tpuhal.compile(model.SerializeToString(), "fp16", calibration=calib, report=True, device=dev.uri)
    layers = {e.node: e for e in compiled.report}
    for name in ("big", "none"):
        e = layers[name]
        assert e.snr_db == -np.inf and e.max_abs == np.inf and e.rel_rms == np.inf, e


def outlier_bytes():
    """x[N, 4, 8, 8] -> Conv 1x1 (4 -> 4) -> Relu -> Conv 1x1 (4 -> 2): two int8 layers."""
    w1 = (np.eye(4, dtype=np.float32) + 0.1 * RNG.standard_normal((4, 4)).astype(np.float32)).reshape(4, 4, 1, 1)
    w2 = RNG.standard_normal((2, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="first"),
             helper.make_node("Relu", ["c1"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="second")]
    graph = helper.make_graph(
        nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 2, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_entropy_calibration_cuts_rare_outliers_that_minmax_keeps(dev):
    onnx_bytes = outlier_bytes()
    calib = RNG.standard_normal((16, 4, 8, 8)).astype(np.float32)
    calib[0, 0, 0, 0] = 500.0  # one value in 4096: minmax spends the u8 steps on it
    fp32 = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri))
    x = calib[1:1 + BATCH]
    (ref,) = fp32.instance().run(x)
    errors = {}
    for method in ("minmax", "entropy"):
        compiled = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method=method, device=dev.uri)
        model = dev.load_model(compiled)
        assert model.meta["calibration"] == method
        (y,) = model.instance().run(x)
        errors[method] = float(np.abs(y - ref).max())
    assert errors["entropy"] < errors["minmax"] / 4, errors


def test_layers_kept_in_fp16_by_name_or_by_a_target_snr(dev):
    onnx_bytes = outlier_bytes()
    calib = RNG.standard_normal((16, 4, 8, 8)).astype(np.float32)
    calib[0, 0, 0, 0] = 500.0
    x = calib[1:1 + BATCH]
    (ref,) = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).instance().run(x)

    def error(compiled):
        (y,) = dev.load_model(compiled).instance().run(x)
        return float(np.abs(y - ref).max())

    int8 = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method="minmax", device=dev.uri)
    kept = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method="minmax", keep_fp16=["first", "second"],
                          report=True, device=dev.uri)
    assert "2 layer(s) in fp16: first, second" in kept.notes
    assert not any("qlinear_conv" in n and not n.startswith("0 ") for n in kept.notes), kept.notes
    assert error(kept) < error(int8) / 20
    # Automatic: layers move to fp16 until the output reaches the target on the calibration data.
    auto = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method="minmax", target_snr_db=45, report=True,
                          device=dev.uri)
    assert any(n.startswith("mixed precision: outputs at") for n in auto.notes), auto.notes
    assert any("layer(s) in fp16" in n for n in auto.notes), auto.notes
    assert {e.node: e for e in auto.report}["second"].snr_db >= 45
    # Bad requests name the problem.
    with pytest.raises(tpuhal.InvalidArgument, match="'third' names no layer"):
        tpuhal.compile(onnx_bytes, "int8", calibration=calib, keep_fp16=["third"], device=dev.uri)
    with pytest.raises(tpuhal.InvalidArgument, match="need precision int8"):
        tpuhal.compile(onnx_bytes, "fp16", keep_fp16=["first"], device=dev.uri)


def one_input_model(nodes, x_shape, weights, y_shape=None):
    """An opset-13 ONNX model of `nodes` from float input x of `x_shape` to output y (of `y_shape`, or x's)."""
    graph = helper.make_graph(
        nodes, "case", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape or x_shape)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_kept_layers_silu_runs_as_its_activation(dev):
    # Conv, x * Sigmoid(x), Conv: with the first convolution kept in fp16 in an int8 model, the SiLU runs as
    # that convolution's activation, as in an fp16 model, not as a Sigmoid and a Mul of their own.
    w1 = (0.3 * RNG.standard_normal((8, 4, 3, 3))).astype(np.float32)
    w2 = (0.3 * RNG.standard_normal((4, 8, 1, 1))).astype(np.float32)
    onnx_bytes = one_input_model(
        [helper.make_node("Conv", ["x", "w1"], ["c"], name="first", pads=[1, 1, 1, 1]),
         helper.make_node("Sigmoid", ["c"], ["s"], name="gate"),
         helper.make_node("Mul", ["c", "s"], ["m"], name="silu"),
         helper.make_node("Conv", ["m", "w2"], ["y"], name="second")], [BATCH, 4, 8, 8], {"w1": w1, "w2": w2})
    calib = RNG.standard_normal((16, 4, 8, 8)).astype(np.float32)
    x = calib[:BATCH]
    (ref,) = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).instance().run(x)
    kept = tpuhal.compile(onnx_bytes, "int8", calibration=calib, keep_fp16=["first"], device=dev.uri)
    assert "1 layer(s) in fp16: first" in kept.notes, kept.notes
    inst = dev.load_model(kept).instance()
    layers = {l["node"]: l["ops"] for l in inst.modelled()["layers"]}
    assert layers["first"] == "conv2d" and "gate" not in layers and "silu" not in layers, layers
    (y,) = inst.run(x)
    # The second convolution in int8: within a few of its output steps.
    assert float(np.abs(y - ref).max()) < 0.05 * float(np.abs(ref).max())


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_a_squeeze_and_excitation_blocks_1x1_convolutions_run_as_matrix_products(dev, precision):
    # GlobalAveragePool, Conv 1x1 + SiLU, Conv 1x1, Sigmoid, Mul: the two convolutions see a 1x1 image, so
    # they run as matrix products (weights read row by row in place); a 1x1 convolution of a larger image,
    # or one whose pads make its output larger, stays a convolution.
    c, r = 8, 4
    w1 = (0.5 * RNG.standard_normal((r, c, 1, 1))).astype(np.float32)
    b1 = (0.1 * RNG.standard_normal(r)).astype(np.float32)
    w2 = (0.5 * RNG.standard_normal((c, r, 1, 1))).astype(np.float32)
    b2 = (0.1 * RNG.standard_normal(c)).astype(np.float32)
    w3 = (0.5 * RNG.standard_normal((c, c, 1, 1))).astype(np.float32)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"], name="squeeze"),
             helper.make_node("Conv", ["p", "w1", "b1"], ["f1"], name="fc1"),
             helper.make_node("Sigmoid", ["f1"], ["g1"], name="gate1"),
             helper.make_node("Mul", ["f1", "g1"], ["s1"], name="silu1"),
             helper.make_node("Conv", ["s1", "w2", "b2"], ["f2"], name="fc2"),
             helper.make_node("Conv", ["p", "w3"], ["f3"], name="padded", pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["f3"], ["m3"], name="mean", axes=[2, 3], keepdims=1),
             helper.make_node("Add", ["f2", "m3"], ["e"], name="add"),
             helper.make_node("Sigmoid", ["e"], ["g"], name="excite"),
             helper.make_node("Mul", ["x", "g"], ["z"], name="scale"),
             helper.make_node("Conv", ["z", "w3"], ["y"], name="pointwise")]
    onnx_bytes = one_input_model(nodes, [BATCH, c, 6, 6], {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3})
    inst = dev.load_model(tpuhal.compile(onnx_bytes, precision, device=dev.uri)).instance()
    layers = {l["node"]: l["ops"] for l in inst.modelled()["layers"]}
    assert layers["fc1"] == "matmul" and layers["fc2"] == "matmul", layers
    assert "gate1" not in layers and "silu1" not in layers, layers  # the SiLU is fc1's activation
    assert layers["padded"] == "conv2d" and layers["pointwise"] == "conv2d", layers
    x = RNG.standard_normal((BATCH, c, 6, 6)).astype(np.float32)
    (y,) = inst.run(x)

    def conv1x1(v, w, b=None):
        out = np.einsum("nchw,kc->nkhw", v, w[:, :, 0, 0].astype(np.float64))
        return out if b is None else out + b.astype(np.float64)[None, :, None, None]

    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    p = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    f1 = conv1x1(p, w1, b1)
    f3 = conv1x1(np.pad(p, ((0, 0), (0, 0), (1, 1), (1, 1))), w3)
    z = x * sigmoid(conv1x1(f1 * sigmoid(f1), w2, b2) + f3.mean(axis=(2, 3), keepdims=True))
    ref = conv1x1(z, w3)
    tolerance = {"fp32": 1e-5, "fp16": 2e-2, "bf16": 1e-1}[precision]
    assert float(np.abs(y - ref).max()) < tolerance * float(np.abs(ref).max())


def graph_ops(compiled):
    """The op kinds of a compiled model's program, from its graph section (docs/model-format.md)."""
    import json
    import struct
    data = compiled.to_bytes()
    (count,) = struct.unpack_from("<I", data, 24)
    for i in range(count):
        kind, _, offset, size = struct.unpack_from("<IIQQ", data, 32 + 32 * i)
        if kind == 3:
            return [op["op"] for op in json.loads(data[offset:offset + size])["ops"]]
    raise AssertionError("no graph section")


def test_an_int8_squeeze_and_excitation_block_stays_nhwc(dev):
    # Conv, GlobalAveragePool, two 1x1 Convs, Sigmoid, Mul by the [N, C, 1, 1] gate, Conv: in int8 the
    # pooling reads the convolution's bytes in NHWC (qlinear_global_avg_pool) and the Mul broadcasts the
    # gate over them in NHWC on bytes (qlinear_mul), so the only transposes are the model input's and
    # output's, and the only conversions the input's quantize and the output's dequantize.
    c = 8
    w0 = (0.3 * RNG.standard_normal((c, 4, 3, 3))).astype(np.float32)
    w1 = (0.5 * RNG.standard_normal((4, c, 1, 1))).astype(np.float32)
    w2 = (0.5 * RNG.standard_normal((c, 4, 1, 1))).astype(np.float32)
    w3 = (0.3 * RNG.standard_normal((c, c, 1, 1))).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r0"], ["p"], name="squeeze"),
             helper.make_node("Conv", ["p", "w1"], ["f1"], name="fc1"),
             helper.make_node("Relu", ["f1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["f2"], name="fc2"),
             helper.make_node("Sigmoid", ["f2"], ["g"], name="excite"),
             helper.make_node("Mul", ["r0", "g"], ["z"], name="scale"),
             helper.make_node("Conv", ["z", "w3"], ["y"], name="pointwise")]
    onnx_bytes = one_input_model(nodes, [BATCH, 4, 6, 6], {"w0": w0, "w1": w1, "w2": w2, "w3": w3},
                                 [BATCH, c, 6, 6])
    calib = RNG.standard_normal((16, 4, 6, 6)).astype(np.float32)
    x = calib[:BATCH]
    (ref,) = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).instance().run(x)
    compiled = tpuhal.compile(onnx_bytes, "int8", calibration=calib, device=dev.uri)
    ops = graph_ops(compiled)
    assert ops.count("transpose") == 2, ops  # x to NHWC, y back to NCHW
    assert ops.count("qlinear_conv") == 4 and ops.count("qlinear_mul") == 1 and "mul" not in ops, ops
    assert ops.count("qlinear_global_avg_pool") == 1 and "avg_pool2d" not in ops, ops
    assert ops.count("quantize") == 1 and ops.count("dequantize") == 1, ops
    assert any(" 1 global averages (qlinear_global_avg_pool);" in n for n in compiled.notes), compiled.notes
    (y,) = dev.load_model(compiled).instance().run(x)
    assert float(np.abs(y - ref).max()) < 0.05 * float(np.abs(ref).max())


def test_layers_kept_where_fp16_cannot_hold_their_values_run_in_fp32(dev):
    # Activations near 1e-6 (as in random-weight networks whose values
    # shrink layer by layer) are fp16 subnormals: kept layers run in fp32.
    onnx_bytes = outlier_bytes()
    calib = (1e-6 * RNG.standard_normal((16, 4, 8, 8))).astype(np.float32)
    x = calib[:BATCH]
    (ref,) = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).instance().run(x)

    def snr(compiled):
        (y,) = dev.load_model(compiled).instance().run(x)
        noise = np.square(ref.astype(np.float64) - y).sum()
        return np.inf if noise == 0 else 10 * np.log10(np.square(ref.astype(np.float64)).sum() / noise)

    kept = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method="minmax", keep_fp16=["first", "second"],
                          device=dev.uri)
    assert any(n.startswith("2 layer(s) kept in fp32") and n.endswith(": first, second") for n in kept.notes), \
        kept.notes
    assert not any("layer(s) in fp16" in n for n in kept.notes), kept.notes
    half = tpuhal.compile(onnx_bytes, "fp16", device=dev.uri)
    assert snr(half) < 50, snr(half)  # what fp16 would have made of them
    assert snr(kept) > 100, snr(kept)


def test_an_int8_layer_whose_bias_would_not_fit_int32_runs_in_fp32(dev):
    # Inputs near 1e-10 and a bias of 1: in units of the input scale times
    # the weight scale the bias is about 1e12, past int32. The layer runs in
    # fp32 and the output keeps its bias.
    w = RNG.standard_normal((2, 4, 1, 1)).astype(np.float32)
    b = np.array([1.0, -0.5], np.float32)
    onnx_bytes = one_input_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="biased")],
                                 [BATCH, 4, 8, 8], {"w": w, "b": b}, y_shape=[BATCH, 2, 8, 8])
    calib = (1e-10 * RNG.standard_normal((16, 4, 8, 8))).astype(np.float32)
    x = calib[:BATCH]
    (ref,) = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).instance().run(x)
    compiled = tpuhal.compile(onnx_bytes, "int8", calibration=calib, device=dev.uri)
    assert any(n.startswith("1 layer(s) in fp32, their bias too large") and n.endswith(": biased")
               for n in compiled.notes), compiled.notes
    assert any(n.startswith("0 layers run in int8") for n in compiled.notes), compiled.notes
    (y,) = dev.load_model(compiled).instance().run(x)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-6)


def three_conv_bytes(nodes, name):
    """An ONNX model x[N, 4, 8, 8] -> `nodes` -> y[N, 4, 8, 8]; the nodes' 3x3 weights are wa, wb and wc."""
    w = [RNG.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3 for _ in range(3)]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 4, 8, 8])],
                              [numpy_helper.from_array(v, n) for v, n in zip(w, ["wa", "wb", "wc"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def conv3(x, w, y, name):
    return helper.make_node("Conv", [x, w], [y], name=name, pads=[1, 1, 1, 1])


def run_int8_against_fp32(dev, onnx_bytes, compiled, x):
    """The int8 model's output (within a tenth of fp32's largest) and its layers' ops by node."""
    inst = dev.load_model(compiled).instance()
    (y,) = inst.run(x)
    layers = {l["node"]: l["ops"] for l in inst.profile(iterations=1)["layers"] if l["node"]}
    (ref,) = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).instance().run(x)
    assert np.abs(y - ref).max() <= 0.1 * np.abs(ref).max()
    return layers


def int8_graph_against_fp32(dev, graph, calibration_shape):
    """`graph` as an opset-13 model, compiled to int8 on random calibration
    samples (min-max), and run_int8_against_fp32 of it: the compiled model
    and its layers' ops by node."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx_bytes = model.SerializeToString()
    calib = RNG.standard_normal(calibration_shape).astype(np.float32)
    compiled = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method="minmax", device=dev.uri)
    return compiled, run_int8_against_fp32(dev, onnx_bytes, compiled, calib[:BATCH])


@pytest.mark.parametrize("tail", ["relu_conv", "output"])
def test_an_int8_residual_add_and_its_relu_run_as_one_qlinear_add(dev, tail):
    # x -> Conv a, Conv b; Add(a, b) -> Relu -> Conv c: the Add of two int8
    # layers' outputs runs on bytes, quantized to the Relu's range. Or the
    # Add's sum is the model's output, quantized to its own range.
    nodes = [conv3("x", "wa", "a", "conv_a"), conv3("x", "wb", "b", "conv_b"),
             helper.make_node("Add", ["a", "b"], ["s" if tail == "relu_conv" else "y"], name="add")]
    if tail == "relu_conv":
        nodes += [helper.make_node("Relu", ["s"], ["r"], name="relu"), conv3("r", "wc", "y", "conv_c")]
    onnx_bytes = three_conv_bytes(nodes, "residual")
    calib = RNG.standard_normal((16, 4, 8, 8)).astype(np.float32)
    compiled = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method="minmax", device=dev.uri)
    convs = 3 if tail == "relu_conv" else 2
    assert any(n.startswith(f"{convs} layers run in int8 (qlinear_conv), and 1 additions (qlinear_add)")
               for n in compiled.notes), compiled.notes
    layers = run_int8_against_fp32(dev, onnx_bytes, compiled, calib[:BATCH])
    assert layers["add"] == "qlinear_add" and "relu" not in layers, layers


@pytest.mark.parametrize("gate", ["Sigmoid", "HardSigmoid"])
def test_int8_activations_run_as_table_lookups_and_a_gate_as_one_table(dev, gate):
    # x -> Conv a -> Sigmoid -> Mul(a, sigmoid) (YOLO's SiLU; with HardSigmoid, MobileNetV3's HardSwish) ->
    # Conv b -> Tanh -> Conv c: each activation of an int8 layer's bytes is a lookup in a 256-entry table
    # (gather by byte indices), the gate and its Mul one table.
    attrs = {"alpha": 1 / 6, "beta": 0.5} if gate == "HardSigmoid" else {}
    onnx_bytes = three_conv_bytes([
        conv3("x", "wa", "a", "conv_a"),
        helper.make_node(gate, ["a"], ["g"], name="gate", **attrs),
        helper.make_node("Mul", ["a", "g"], ["s"], name="silu"),
        conv3("s", "wb", "b", "conv_b"),
        helper.make_node("Tanh", ["b"], ["t"], name="tanh"),
        conv3("t", "wc", "y", "conv_c"),
    ], "gated")
    calib = RNG.standard_normal((16, 4, 8, 8)).astype(np.float32)
    compiled = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method="minmax", device=dev.uri)
    layers = run_int8_against_fp32(dev, onnx_bytes, compiled, calib[:BATCH])
    assert layers["gate"] == "gather" and layers["tanh"] == "gather" and "silu" not in layers, layers


@pytest.mark.parametrize("mode,coordinate,nearest", [("nearest", "asymmetric", "floor"),
                                                     ("nearest", "half_pixel", "round_prefer_floor"),
                                                     ("nearest", "half_pixel", "floor"),
                                                     ("linear", "asymmetric", "floor")])
def test_int8_split_concat_and_nearest_upsampling_move_bytes(dev, mode, coordinate, nearest):
    # YOLO's neck: x -> Conv a -> Split (s0, s1); x -> Conv b; Concat(s1, b,
    # s0) -> Resize x2 -> Conv c. On an int8 layer's bytes the Split's parts
    # and a whole-factor nearest upsample are copies of bytes, and the
    # Concat copies each part in, through a requantisation table where its
    # range is not the Concat's (b's). A linear resize, and a nearest one
    # whose rounding does not repeat each element (half_pixel with floor
    # shifts by one), stay in f32.
    w = {"wa": RNG.standard_normal((4, 4, 3, 3)), "wb": RNG.standard_normal((4, 4, 3, 3)),
         "wc": RNG.standard_normal((4, 8, 3, 3)) * 0.5}
    graph = helper.make_graph(
        [conv3("x", "wa", "a", "conv_a"), conv3("x", "wb", "b", "conv_b"),
         helper.make_node("Split", ["a"], ["s0", "s1"], name="split", axis=1),
         helper.make_node("Concat", ["s1", "b", "s0"], ["c"], name="concat", axis=1),
         helper.make_node("Resize", ["c", "", "scales"], ["u"], name="up", mode=mode,
                          coordinate_transformation_mode=coordinate, nearest_mode=nearest),
         conv3("u", "wc", "y", "conv_c")],
        "neck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 4, 12, 12])],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in w.items()] +
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    compiled, layers = int8_graph_against_fp32(dev, graph, (16, 4, 6, 6))
    assert layers["split/0"] == layers["split/1"] == "cast", layers
    assert set(layers["concat"].split("+")) == {"cast", "gather"}, layers
    repeats = mode == "nearest" and (coordinate == "asymmetric" or nearest != "floor")
    assert layers["up"] == ("cast" if repeats else "resize"), layers
    # What they write is bytes, NHWC (a part of the output, for the copies
    # into one); a resize's output is f32, NCHW.
    outputs = {l["node"]: l["output"] for l in dev.load_model(compiled).instance().profile(iterations=1)["layers"]}
    assert outputs["split/0"] == f"u8[{BATCH}, 6, 6, 2]", outputs
    assert outputs["concat"] in (f"u8[{BATCH}, 6, 6, 2]", f"u8[{BATCH}, 6, 6, 4]"), outputs
    assert outputs["up"] == (f"u8[{BATCH}, 6, 6, 8]" if repeats else f"f32[{BATCH}, 8, 12, 12]"), outputs


def test_an_int8_global_average_that_is_a_model_output_keeps_its_f32_mean(dev):
    # x -> Conv -> Relu -> GlobalAveragePool -> y (a feature extractor): the pool reads the convolution's bytes,
    # but the model's output is the f32 mean, not one quantized to the pool's range.
    w = (0.3 * RNG.standard_normal((8, 4, 3, 3))).astype(np.float32)
    onnx_bytes = one_input_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                                  helper.make_node("Relu", ["c"], ["r"], name="relu"),
                                  helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")],
                                 [BATCH, 4, 6, 6], {"w": w}, y_shape=[BATCH, 8, 1, 1])
    calib = RNG.standard_normal((16, 4, 6, 6)).astype(np.float32)
    compiled = tpuhal.compile(onnx_bytes, "int8", calibration=calib, method="minmax", device=dev.uri)
    ops = graph_ops(compiled)
    assert "avg_pool2d" in ops and "qlinear_global_avg_pool" not in ops, ops
    x = calib[:BATCH]
    (y,) = dev.load_model(compiled).instance().run(x)
    (ref,) = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).instance().run(x)
    assert float(np.abs(y - ref).max()) < 0.05 * float(np.abs(ref).max())


def test_int8_channel_shuffle_and_its_halves_move_bytes(dev):
    # ShuffleNet's unit: x -> Conv a (8) -> channel shuffle in 2 groups
    # (Reshape, Transpose, Reshape) -> Slice into halves; Conv b of the
    # second -> Concat(first, b) -> Conv c. On an int8 layer's bytes the
    # shuffle is one copy within each position's channels and the halves
    # are copies of bytes, all NHWC: nothing between the convolutions
    # dequantizes.
    w = {"wa": RNG.standard_normal((8, 4, 3, 3)), "wb": RNG.standard_normal((4, 4, 3, 3)) * 0.5,
         "wc": RNG.standard_normal((4, 8, 3, 3)) * 0.5}
    ints = {"groups": [BATCH, 2, 4, 6, 6], "whole": [BATCH, 8, 6, 6], "axes": [1], "lo": [0], "mid": [4], "hi": [8]}
    graph = helper.make_graph(
        [conv3("x", "wa", "a", "conv_a"),
         helper.make_node("Reshape", ["a", "groups"], ["g"], name="shuffle"),
         helper.make_node("Transpose", ["g"], ["gt"], name="shuffle_t", perm=[0, 2, 1, 3, 4]),
         helper.make_node("Reshape", ["gt", "whole"], ["sh"], name="shuffle_back"),
         helper.make_node("Slice", ["sh", "lo", "mid", "axes"], ["s0"], name="first"),
         helper.make_node("Slice", ["sh", "mid", "hi", "axes"], ["s1"], name="second"),
         conv3("s1", "wb", "b", "conv_b"),
         helper.make_node("Concat", ["s0", "b"], ["c"], name="concat", axis=1),
         conv3("c", "wc", "y", "conv_c")],
        "shuffle_unit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 4, 6, 6])],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in w.items()] +
        [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in ints.items()])
    compiled, layers = int8_graph_against_fp32(dev, graph, (16, 4, 6, 6))
    # Read only by the halves, the shuffled value is not made: each half is
    # the shuffle's copy of its own channels.
    assert layers["first"] == layers["second"] == "cast", layers
    assert not {"shuffle", "shuffle_t", "shuffle_back"} & set(layers), layers
    assert set(layers["concat"].split("+")) <= {"cast", "gather"}, layers
    assert not any({"quantize", "dequantize"} & set(ops.split("+")) for ops in layers.values()), layers
    outputs = {l["node"]: l["output"] for l in dev.load_model(compiled).instance().profile(iterations=1)["layers"]}
    assert outputs["first"] == outputs["second"] == f"u8[{BATCH * 6 * 6}, 2, 2]", outputs


def residual_bytes():
    """A ResNet-style fp32 network of the ops that stay NHWC between
    convolutions: x[N, 3, 10, 12] -> Conv 3x3 (5) -> Relu -> MaxPool 3x3 s2
    pad 1 -> two 3x3 Convs -> Add of the pooled value -> Relu -> Concat
    with a 1x1 Conv (7) along channels -> Mul by a per-channel constant
    [1, 12, 1, 1], Add of a [12, 1, 1] one -> Sigmoid -> GlobalAveragePool
    -> Flatten -> Gemm (12 -> 6). H, W and C differ, so a layout mix-up
    cannot pass."""
    w = {name: RNG.standard_normal(shape).astype(np.float32) * 0.3 for name, shape in
         (("w0", (5, 3, 3, 3)), ("b0", (5,)), ("w1", (5, 5, 3, 3)), ("w2", (5, 5, 3, 3)), ("b2", (5,)),
          ("w3", (7, 5, 1, 1)), ("scale", (1, 12, 1, 1)), ("shift", (12, 1, 1)), ("wf", (6, 12)), ("bf", (6,)))}
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", **conv),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("MaxPool", ["r0"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w1"], ["c1"], name="conv1", **conv),
        helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], name="conv2", **conv),
        helper.make_node("Add", ["c2", "p"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w3"], ["c3"], name="conv3", kernel_shape=[1, 1]),
        helper.make_node("Concat", ["r", "c3"], ["cat"], name="concat", axis=1),
        helper.make_node("Mul", ["cat", "scale"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "shift"], ["a"], name="shift"),
        helper.make_node("Sigmoid", ["a"], ["g"], name="sigmoid"),
        helper.make_node("GlobalAveragePool", ["g"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 3, 10, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 6])],
        [numpy_helper.from_array(v, n) for n, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8

    def conv2d(x, k, b=None, pad=1):
        n, c, h, wd = x.shape
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        kh, kw = k.shape[2:]
        y = np.zeros((n, k.shape[0], h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1))
        for i in range(kh):
            for j in range(kw):
                y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + y.shape[2], j:j + y.shape[3]], k[:, :, i, j])
        return y if b is None else y + b.reshape(1, -1, 1, 1)

    def reference(x):
        r0 = np.maximum(conv2d(x, w["w0"], w["b0"]), 0)
        rp = np.pad(r0, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
        p = np.stack([rp[:, :, i:i + 10:2, j:j + 12:2] for i in range(3) for j in range(3)]).max(axis=0)
        r = np.maximum(conv2d(conv2d(p, w["w1"]), w["w2"], w["b2"]) + p, 0)
        cat = np.concatenate([r, conv2d(r, w["w3"], pad=0)], axis=1)
        g = 1 / (1 + np.exp(-(cat * w["scale"] + w["shift"])))
        return g.mean(axis=(2, 3)) @ w["wf"].T.astype(np.float64) + w["bf"]

    return model.SerializeToString(), reference


def fp32_layers(dev, network, shape):
    """network() compiled in fp32 and run on a random input of `shape`,
    checked against its reference; the input and the profile's layers."""
    onnx_bytes, reference = network()
    x = RNG.standard_normal(shape).astype(np.float32)
    inst = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", device=dev.uri)).instance()
    np.testing.assert_allclose(inst.run(x)[0], reference(x), rtol=1e-4, atol=1e-5)
    return x, inst.profile(iterations=1)["layers"]


def test_an_fp32_network_runs_nhwc_from_its_first_convolution_to_its_last_pool(dev):
    x, layers = fp32_layers(dev, residual_bytes, (BATCH, 3, 10, 12))
    outputs = {l["node"]: l["output"] for l in layers if l["node"]}
    # Every layer from the first convolution to the global pool writes
    # [N, H, W, C]; the Relus fuse into the convolutions before them (the
    # Add too: conv2 accumulates into the pool's output), the Sigmoid is a
    # layer of its own. The Concat's last op copies its second input into
    # its part.
    assert "add" not in outputs, outputs
    for node, shape in (("conv0", (10, 12, 5)), ("pool", (5, 6, 5)), ("conv1", (5, 6, 5)), ("conv2", (5, 6, 5)),
                        ("conv3", (5, 6, 7)), ("concat", (5, 6, 7)), ("mul", (5, 6, 12)),
                        ("shift", (5, 6, 12)), ("sigmoid", (5, 6, 12)), ("gap", (1, 1, 12))):
        assert outputs[node] == f"f32[{BATCH}, {', '.join(map(str, shape))}]", (node, outputs)
    # One transpose, in the layer of conversions: the input's, an element
    # each (flops). The pooled [N, 1, 1, C] is read as [N, C, 1, 1] in place.
    transposes = [l for l in layers if "transpose" in l["ops"].split("+")]
    assert [(l["node"], l["ops"], l["output"]) for l in transposes] == [("", "transpose", f"f32[{BATCH}, 10, 12, 3]")]
    assert transposes[0]["flops"] == x.size, layers


def channels_last_bytes():
    """The other ops an fp32 network keeps NHWC: x[N, 4, 6, 8] -> Conv 1x1
    (6) -> Slice of channels 1..4 -> nearest Resize x2 -> Conv 3x3 (4) ->
    ShuffleNet's channel shuffle in 2 groups -> Transpose (0, 2, 3, 1) ->
    LayerNorm's mean and centring over the last axis -> MatMul (4 -> 5) ->
    Transpose (0, 3, 1, 2) -> Conv 1x1 (3)."""
    w = {name: RNG.standard_normal(shape).astype(np.float32) * 0.4 for name, shape in
         (("w0", (6, 4, 1, 1)), ("w1", (4, 4, 3, 3)), ("m", (4, 5)), ("w2", (3, 5, 1, 1)))}
    consts = [numpy_helper.from_array(v, n) for n, v in w.items()] + [
        numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
        (("starts", [1]), ("ends", [5]), ("axes", [1]), ("groups", [BATCH, 2, 2, 12, 16]),
         ("whole", [BATCH, 4, 12, 16]))] + [
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", kernel_shape=[1, 1]),
        helper.make_node("Slice", ["c0", "starts", "ends", "axes"], ["s"], name="slice"),
        helper.make_node("Resize", ["s", "", "scales"], ["u"], name="up", mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Conv", ["u", "w1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c1", "groups"], ["g"], name="shuffle"),
        helper.make_node("Transpose", ["g"], ["gt"], name="shuffle_t", perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["gt", "whole"], ["sh"], name="shuffle_back"),
        helper.make_node("Transpose", ["sh"], ["t"], name="to_last", perm=[0, 2, 3, 1]),
        helper.make_node("ReduceMean", ["t"], ["mean"], name="mean", axes=[-1], keepdims=1),
        helper.make_node("Sub", ["t", "mean"], ["d"], name="centre"),
        helper.make_node("MatMul", ["d", "m"], ["l"], name="linear"),
        helper.make_node("Transpose", ["l"], ["back"], name="to_first", perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["back", "w2"], ["y"], name="conv2", kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "channels_last", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 4, 6, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 3, 12, 16])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8

    def reference(x):
        x = x.astype(np.float64)
        c0 = np.einsum("nchw,oc->nohw", x, w["w0"][:, :, 0, 0])
        u = c0[:, 1:5].repeat(2, axis=2).repeat(2, axis=3)
        up = np.pad(u, ((0, 0), (0, 0), (1, 1), (1, 1)))
        c1 = sum(np.einsum("nchw,oc->nohw", up[:, :, i:i + 12, j:j + 16], w["w1"][:, :, i, j])
                 for i in range(3) for j in range(3))
        sh = c1.reshape(BATCH, 2, 2, 12, 16).transpose(0, 2, 1, 3, 4).reshape(BATCH, 4, 12, 16)
        t = sh.transpose(0, 2, 3, 1)
        back = ((t - t.mean(axis=-1, keepdims=True)) @ w["m"]).transpose(0, 3, 1, 2)
        return np.einsum("nchw,oc->nohw", back, w["w2"][:, :, 0, 0])

    return model.SerializeToString(), reference


def test_an_fp32_network_keeps_slices_upsampling_and_channels_last_blocks_nhwc(dev):
    x, layers = fp32_layers(dev, channels_last_bytes, (BATCH, 4, 6, 8))
    outputs = {l["node"]: (l["ops"], l["output"]) for l in layers if l["node"]}
    # Slice and upsampling copy NHWC elements; the convolution after them
    # reads them where they are.
    assert outputs["slice"] == ("cast", f"f32[{BATCH}, 6, 8, 4]"), outputs
    assert outputs["up"][1] == f"f32[{BATCH}, 6, 8, 4]" and set(outputs["up"][0].split("+")) == {"cast"}, outputs
    assert outputs["conv1"] == ("conv2d", f"f32[{BATCH}, 12, 16, 4]"), outputs
    # The channel shuffle is one copy within each position's channels.
    assert outputs["shuffle"] == ("cast", f"f32[{BATCH * 12 * 16}, 2, 2]"), outputs
    assert "shuffle_t" not in outputs and "shuffle_back" not in outputs, outputs
    # The permutes into and out of the channels-last block are views.
    assert "to_last" not in outputs and "to_first" not in outputs, outputs
    assert outputs["conv2"] == ("conv2d", f"f32[{BATCH}, 12, 16, 3]"), outputs
    # Two transposes, both in the layer of conversions (node ""): the
    # input's to NHWC and the output's back, an element each (flops).
    transposes = [l for l in layers if "transpose" in l["ops"].split("+")]
    assert [(l["node"], l["ops"]) for l in transposes] == [("", "transpose")], layers
    assert transposes[0]["flops"] == x.size + BATCH * 3 * 12 * 16, layers


def shuffle_split_bytes(first_end):
    """ShuffleNet's unit with 3 groups: x[N, 4, 6, 6] -> Conv 3x3 (12) ->
    channel shuffle in 3 groups -> Slice of channels [0, first_end) and
    [first_end, 12) -> Conv 1x1 of the second (5) -> Concat(first, it) ->
    Conv 1x1 (4)."""
    rest = 12 - first_end
    w = {name: RNG.standard_normal(shape).astype(np.float32) * 0.4 for name, shape in
         (("wa", (12, 4, 3, 3)), ("wb", (5, rest, 1, 1)), ("wc", (4, first_end + 5, 1, 1)))}
    ints = {"groups": [BATCH, 3, 4, 6, 6], "whole": [BATCH, 12, 6, 6], "axes": [1], "lo": [0], "mid": [first_end],
            "hi": [12]}
    nodes = [
        conv3("x", "wa", "a", "conv_a"),
        helper.make_node("Reshape", ["a", "groups"], ["g"], name="shuffle"),
        helper.make_node("Transpose", ["g"], ["gt"], name="shuffle_t", perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["gt", "whole"], ["sh"], name="shuffle_back"),
        helper.make_node("Slice", ["sh", "lo", "mid", "axes"], ["s0"], name="first"),
        helper.make_node("Slice", ["sh", "mid", "hi", "axes"], ["s1"], name="second"),
        helper.make_node("Conv", ["s1", "wb"], ["b"], name="conv_b", kernel_shape=[1, 1]),
        helper.make_node("Concat", ["s0", "b"], ["c"], name="concat", axis=1),
        helper.make_node("Conv", ["c", "wc"], ["y"], name="conv_c", kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "shuffle_split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 4, 6, 6])],
        [numpy_helper.from_array(v, n) for n, v in w.items()] +
        [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in ints.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8

    def reference(x):
        x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        a = sum(np.einsum("nchw,oc->nohw", x[:, :, i:i + 6, j:j + 6], w["wa"][:, :, i, j])
                for i in range(3) for j in range(3))
        sh = a.reshape(BATCH, 3, 4, 6, 6).transpose(0, 2, 1, 3, 4).reshape(BATCH, 12, 6, 6)
        b = np.einsum("nchw,oc->nohw", sh[:, first_end:], w["wb"][:, :, 0, 0])
        return np.einsum("nchw,oc->nohw", np.concatenate([sh[:, :first_end], b], axis=1), w["wc"][:, :, 0, 0])

    return model.SerializeToString(), reference


@pytest.mark.parametrize("first_end", [3, 4])
def test_a_channel_shuffle_read_only_by_slices_of_whole_groups_is_copied_into_them(dev, first_end):
    # Slices at whole groups of the 3 (channels 0..3 and 3..12): each is
    # the shuffle's copy of its own channels, and the shuffled value is not
    # made; the first, read only by the Concat, is copied into its part of
    # the Concat's output, which then copies in conv_b's 5 channels alone.
    # At channel 4 (not a whole group) the shuffle is made, then sliced, and
    # the Concat copies both of its inputs.
    x, layers = fp32_layers(dev, lambda: shuffle_split_bytes(first_end), (BATCH, 4, 6, 6))
    outputs = {l["node"]: (l["ops"], l["output"]) for l in layers if l["node"]}
    copied = {l["node"]: l["flops"] for l in layers if l["node"]}
    assert "shuffle_t" not in outputs and "shuffle_back" not in outputs, outputs
    if first_end == 3:
        assert "shuffle" not in outputs, outputs
        assert outputs["first"] == ("cast", f"f32[{BATCH * 6 * 6}, 1, 3]"), outputs
        assert outputs["second"] == ("cast", f"f32[{BATCH * 6 * 6}, 3, 3]"), outputs
        assert copied["concat"] == BATCH * 6 * 6 * 5, copied
    else:
        assert outputs["shuffle"] == ("cast", f"f32[{BATCH * 6 * 6}, 4, 3]"), outputs
        assert outputs["first"] == ("cast", f"f32[{BATCH}, 6, 6, 4]"), outputs
        assert outputs["second"] == ("cast", f"f32[{BATCH}, 6, 6, 8]"), outputs
        assert copied["concat"] == BATCH * 6 * 6 * 9, copied


def test_profile_times_every_layer_by_node_name(dev, cnn):
    onnx_bytes, reference = cnn
    x = RNG.standard_normal((BATCH, 1, 8, 8)).astype(np.float32)
    inst = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", shapes={"x": x.shape}, device=dev.uri)).instance()
    inst.run(x)
    p = inst.profile(iterations=3)
    assert p["iterations"] == 3
    # The Relu fuses into the convolution; Flatten is a view.
    assert [l["node"] for l in p["layers"] if l["node"]] == ["conv", "pool", "fc"]
    conv = next(l for l in p["layers"] if l["node"] == "conv")
    # fp32 convolutions run NHWC ([N, H, W, C]).
    assert conv["ops"] == "conv2d" and conv["output"] == f"f32[{BATCH}, 8, 8, 4]"
    assert conv["flops"] == 2 * BATCH * 4 * 8 * 8 * 9
    assert all(l["device_ns"] > 0 for l in p["layers"])
    assert abs(sum(l["share"] for l in p["layers"]) - 1) < 1e-9
    assert p["device_ns"] > 0 and p["run_ns"] > 0
    # The layers add up to the run: means over the same runs (3 // 4 = 0
    # dropped at each end, so all 3 kept).
    assert p["runs_kept"] == 3
    assert abs(sum(l["device_ns"] for l in p["layers"]) - p["device_ns"]) <= len(p["layers"])
    np.testing.assert_allclose(inst.run(x)[0], reference(x), rtol=1e-4, atol=1e-5)


def test_the_timing_model_gives_a_run_per_layer_without_running_it(dev, cnn):
    onnx_bytes, _ = cnn
    inst = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (BATCH, 1, 8, 8)}, device=dev.uri)).instance()
    m = inst.modelled()
    # Named and grouped as profile() does; the layers one after another.
    assert [l["node"] for l in m["layers"] if l["node"]] == ["conv", "pool", "fc"]
    assert m["ns"] == sum(l["ns"] for l in m["layers"])
    conv = m["layers"][0]
    assert conv["ops"] == "conv2d" and conv["bound"] in ("compute", "memory", "overhead")
    assert conv["ns"] == max(conv["compute_ns"], conv["memory_ns"]) + conv["overhead_ns"]
    assert m["input_copy_ns"] > 0 and m["output_copy_ns"] > 0
    assert inst.modelled() == m  # arithmetic on the ops: the same every time


def test_outputs_can_be_given_and_are_filled_in_place(dev, mlp):
    onnx_bytes, reference = mlp
    model = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (BATCH, 16)}, device=dev.uri))
    x = RNG.standard_normal((BATCH, 16)).astype(np.float32)
    out = np.full((BATCH, 10), np.nan, np.float32)
    result = model.instance().run(x, outputs=[out])
    assert result[0] is out
    np.testing.assert_allclose(out, reference(x), rtol=1e-4, atol=1e-5)


def test_device_side_submit_reads_input_tensors_and_writes_output_tensors(dev, queue, mlp):
    onnx_bytes, reference = mlp
    model = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (BATCH, 16)}, device=dev.uri))
    inst = model.instance()
    (xin,) = inst.input_tensors
    (yout,) = inst.output_tensors
    assert tuple(xin.shape) == (BATCH, 16) and tuple(yout.shape) == (BATCH, 10)
    x = RNG.standard_normal((BATCH, 16)).astype(np.float32)
    xin.upload(x)
    inst.submit(queue).wait(timeout=30)
    np.testing.assert_allclose(yout.download(), reference(x), rtol=1e-4, atol=1e-5)
    # The same in one batch of the caller's: fill the input, the program, copy the output.
    x2 = RNG.standard_normal((BATCH, 16)).astype(np.float32)
    src, dst = dev.alloc(x2.nbytes), dev.alloc(BATCH * 10 * 4)
    src.upload(x2)
    b = queue.batch().copy(src, xin.buffer, dst_offset=xin.offset, size=x2.nbytes)
    assert inst.record(b) is b
    b.copy(yout.buffer, dst, src_offset=yout.offset, size=dst.size).submit().wait(timeout=30)
    np.testing.assert_allclose(dst.download(np.float32, (BATCH, 10)), reference(x2), rtol=1e-4, atol=1e-5)


def test_instances_of_one_model_run_in_parallel_threads(dev, cnn):
    onnx_bytes, reference = cnn
    model = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (BATCH, 1, 8, 8)}, device=dev.uri))
    xs = [RNG.standard_normal((BATCH, 1, 8, 8)).astype(np.float32) for _ in range(4)]
    results, errors = {}, []

    def work(i):
        try:
            inst = model.instance()
            for _ in range(5):
                results[i] = inst.run(xs[i])[0]
        except Exception as e:  # reported below, not swallowed
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(4):
        np.testing.assert_allclose(results[i], reference(xs[i]), rtol=1e-4, atol=1e-4)


def test_bad_inputs_raise_clear_errors_and_the_instance_still_works(dev, mlp):
    onnx_bytes, reference = mlp
    model = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (BATCH, 16)}, device=dev.uri))
    inst = model.instance()
    with pytest.raises(tpuhal.InvalidArgument, match=r"input 'x' has shape \(4, 15\).*compiled for \(4, 16\)"):
        inst.run(np.zeros((BATCH, 15), np.float32))
    with pytest.raises(tpuhal.InvalidArgument, match="takes 1 input"):
        inst.run([np.zeros((BATCH, 16), np.float32)] * 2)
    with pytest.raises(tpuhal.InvalidArgument, match="no input 'y'"):
        inst.run({"x": np.zeros((BATCH, 16), np.float32), "y": 1})
    with pytest.raises(tpuhal.InvalidArgument, match="dtype object"):
        inst.run(np.array([[object()] * 16] * BATCH))
    with pytest.raises(tpuhal.InvalidArgument, match="output 'probs' has shape"):
        inst.run(np.zeros((BATCH, 16), np.float32), outputs=[np.zeros((BATCH, 9), np.float32)])
    with pytest.raises(tpuhal.InvalidArgument, match="float32"):
        inst.run(np.zeros((BATCH, 16), np.float32), outputs=[np.zeros((BATCH, 10), np.float64)])
    x = RNG.standard_normal((BATCH, 16)).astype(np.float32)
    np.testing.assert_allclose(inst.run(x)[0], reference(x), rtol=1e-4, atol=1e-5)


def test_a_model_compiled_for_a_maximum_batch_runs_any_batch_up_to_it(dev, mlp, tmp_path):
    onnx_bytes, reference = mlp
    compiled = tpuhal.compile(onnx_bytes, "fp32", max_batch=BATCH, device=dev.uri)
    assert any(f"batches 1 to {BATCH}" in n for n in compiled.notes)
    compiled.save(tmp_path / "mlp.tpm")
    model = dev.load_model(tmp_path / "mlp.tpm")
    assert model.max_batch == BATCH
    assert model.inputs[0].shape == (BATCH, 16)  # the specs give the largest batch
    assert f", batch 1 to {BATCH}:" in repr(model)
    inst = model.instance()
    x = RNG.standard_normal((BATCH, 16)).astype(np.float32)
    for n in range(1, BATCH + 1):
        (probs,) = inst.run(x[:n])
        assert probs.shape == (n, 10)
        np.testing.assert_allclose(probs, reference(x[:n]), rtol=1e-4, atol=1e-5)
        filled = np.zeros((n, 10), np.float32)
        assert inst.run({"x": x[:n]}, outputs=[filled])[0] is filled
        np.testing.assert_array_equal(filled, probs)
    assert inst.profile(2, batch=1)["device_ns"] > 0
    with pytest.raises(tpuhal.InvalidArgument, match=r"shape \(5, 16\); the model takes \(N, 16\), N from 1 to 4"):
        inst.run(np.zeros((BATCH + 1, 16), np.float32))
    with pytest.raises(tpuhal.InvalidArgument, match=r"shape \(0, 16\); the model takes \(N, 16\)"):
        inst.run(np.zeros((0, 16), np.float32))
    with pytest.raises(tpuhal.InvalidArgument, match=r"output 'probs' has shape \(3, 10\); the model gives \(2, 10\)"):
        inst.run(x[:2], outputs=[np.zeros((3, 10), np.float32)])
    with pytest.raises(tpuhal.InvalidArgument, match="runs 1 to 4 samples"):
        inst.profile(1, batch=BATCH + 1)
    np.testing.assert_allclose(inst.run(x[:3])[0], reference(x[:3]), rtol=1e-4, atol=1e-5)
    # A model of fixed shapes runs its own batch only.
    fixed = dev.load_model(tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (BATCH, 16)}, device=dev.uri))
    assert fixed.max_batch == 0
    assert "batch 1 to" not in repr(fixed)
    with pytest.raises(tpuhal.InvalidArgument, match=r"compiled for \(4, 16\)"):
        fixed.instance().run(x[:2])


def test_compile_errors_name_the_problem(dev, mlp):
    onnx_bytes, _ = mlp
    with pytest.raises(tpuhal.InvalidArgument, match="unknown precision 'fp8'"):
        tpuhal.compile(onnx_bytes, "fp8", shapes={"x": (BATCH, 16)})
    with pytest.raises(tpuhal.InvalidArgument, match="unknown calibration method 'mse'"):
        tpuhal.compile(onnx_bytes, "int8", shapes={"x": (BATCH, 16)}, method="mse")
    with pytest.raises(tpuhal.InvalidArgument, match="calibration"):
        tpuhal.compile(onnx_bytes, "int8", shapes={"x": (BATCH, 16)}, device=dev.uri)
    with pytest.raises(tpuhal.InvalidArgument):
        tpuhal.compile(b"this is not an ONNX model", "fp32")
    with pytest.raises(TypeError):
        tpuhal.compile(onnx_bytes, "fp32", shapes=[("x", (BATCH, 16))])
    # Every unsupported op is named, with its node.
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["s"], name="det"),
         helper.make_node("LpNormalization", ["s"], ["y"], name="lpnorm")],
        "refused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    refused = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    refused.ir_version = 8
    with pytest.raises(tpuhal.Unsupported) as e:
        tpuhal.compile(refused.SerializeToString(), "fp32")
    assert "det" in str(e.value) and "Det" in str(e.value)
    assert "lpnorm" in str(e.value) and "LpNormalization" in str(e.value)


def test_damaged_model_files_are_refused_and_the_device_stays_usable(dev, mlp, tmp_path):
    onnx_bytes, reference = mlp
    good = tpuhal.compile(onnx_bytes, "fp32", shapes={"x": (BATCH, 16)}, device=dev.uri).to_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF
    (tmp_path / "damaged.tpm").write_bytes(bytes(damaged))
    with pytest.raises(tpuhal.InvalidArgument, match="damaged.tpm"):
        tpuhal.load_model(dev, tmp_path / "damaged.tpm")
    (tmp_path / "short.tpm").write_bytes(good[:40])
    with pytest.raises(tpuhal.InvalidArgument):
        tpuhal.load_model(dev, tmp_path / "short.tpm")
    with pytest.raises(tpuhal.NotFound):
        tpuhal.load_model(dev, tmp_path / "missing.tpm")
    (tmp_path / "good.tpm").write_bytes(good)
    x = RNG.standard_normal((BATCH, 16)).astype(np.float32)
    np.testing.assert_allclose(tpuhal.load_model(dev, tmp_path / "good.tpm").instance().run(x)[0],
                               reference(x), rtol=1e-4, atol=1e-5)
