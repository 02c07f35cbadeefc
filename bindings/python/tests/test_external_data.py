"""Models whose weights lie in ONNX external data files: tpuhal.compile() of a path.

The model is saved by ONNX itself (onnx.save_model(..., save_as_external_data=True)),
as PyTorch saves models over 2 GB, and compiled and run against the same model
with its weights inside."""
import numpy as np
import pytest

import tpuhal

onnx = pytest.importorskip("onnx", reason="python3-onnx is not installed (scripts/setup.sh installs it)")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(11)
BATCH = 2


def cnn_model():
    """x[N, 2, 6, 6] -> Conv 3x3 (3 channels) -> Relu -> Flatten -> Reshape (int64 shape) -> Gemm(108 -> 4)."""
    wc = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32) * 0.5
    bc = RNG.standard_normal(3).astype(np.float32) * 0.1
    shape = np.array([BATCH, 48], np.int64)
    wf = RNG.standard_normal((4, 48)).astype(np.float32) * 0.2
    bf = RNG.standard_normal(4).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "wc", "bc"], ["c"], name="conv", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["f"], name="reshape"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 4])],
        [numpy_helper.from_array(a, n) for a, n in ((wc, "wc"), (bc, "bc"), (shape, "shape"), (wf, "wf"),
                                                    (bf, "bf"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def save_external(model, path):
    """Saves `model` at `path` with every tensor in one file next to it, as ONNX writes it."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=0)
    return path


def run(dev, compiled, x):
    (y,) = dev.load_model(compiled).instance().run(x)
    return y


@pytest.fixture(scope="module")
def model():
    return cnn_model()


def test_external_weights_compile_from_the_path_and_match_the_embedded_model(dev, model, tmp_path):
    path = save_external(model, tmp_path / "cnn.onnx")
    saved = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in saved.graph.initializer)
    assert (tmp_path / "cnn.onnx.data").stat().st_size >= (3 * 2 * 9 + 3 + 4 * 48 + 4) * 4 + 2 * 8
    x = RNG.standard_normal((BATCH, 2, 6, 6)).astype(np.float32)
    embedded = run(dev, tpuhal.compile(model.SerializeToString(), "fp32", device=dev.uri), x)
    external = run(dev, tpuhal.compile(path, "fp32", device=dev.uri), x)  # a pathlib.Path
    np.testing.assert_array_equal(external, embedded)
    assert np.abs(external).max() > 0
    # ONNX's own loader reads the same numbers.
    loaded = onnx.load(str(path))
    np.testing.assert_array_equal(run(dev, tpuhal.compile(loaded.SerializeToString(), "fp32", device=dev.uri), x),
                                  embedded)


def test_external_weights_from_bytes_are_refused_with_what_to_do(model, tmp_path):
    path = save_external(model, tmp_path / "cnn.onnx")
    with pytest.raises(tpuhal.InvalidArgument,
                       match=r"initializer 'wc' keeps its data in the external file 'cnn\.onnx\.data'.*"
                             r"compile the model from its file path"):
        tpuhal.compile(path.read_bytes(), "fp32")


def test_a_missing_or_short_data_file_is_refused_naming_the_tensor(model, tmp_path):
    path = save_external(model, tmp_path / "cnn.onnx")
    data = tmp_path / "cnn.onnx.data"
    content = data.read_bytes()
    data.write_bytes(content[:len(content) - 8])
    with pytest.raises(tpuhal.InvalidArgument, match=r"initializer 'bf': its external data 'cnn\.onnx\.data'.*"
                                                     r"run past the end of the file"):
        tpuhal.compile(str(path), "fp32")
    data.unlink()
    with pytest.raises(tpuhal.NotFound, match=r"initializer 'wc': its external data 'cnn\.onnx\.data': no file"):
        tpuhal.compile(str(path), "fp32")


def test_data_reached_through_a_symbolic_link_is_refused(model, tmp_path):
    """A link in a directory someone else prepared must not copy a file only the compiling user can read
    into the model: a location that is, or passes through, a symbolic link is refused wherever it points."""
    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere").mkdir()
    path = save_external(model, tmp_path / "model" / "cnn.onnx")
    data = tmp_path / "model" / "cnn.onnx.data"
    data.rename(tmp_path / "elsewhere" / "secret.data")
    data.symlink_to(tmp_path / "elsewhere" / "secret.data")
    with pytest.raises(tpuhal.InvalidArgument, match=r"initializer 'wc': its external data 'cnn\.onnx\.data': .*"
                                                     r"is, or lies under, a symbolic link"):
        tpuhal.compile(path, "fp32")
    data.unlink()
    data.symlink_to("cnn.onnx.real")  # inside the directory: refused all the same
    (tmp_path / "elsewhere" / "secret.data").rename(tmp_path / "model" / "cnn.onnx.real")
    with pytest.raises(tpuhal.InvalidArgument, match=r"symbolic link"):
        tpuhal.compile(path, "fp32")
