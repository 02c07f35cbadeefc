"""ONNX's node tests (Debian's libonnx-testdata) through the model compiler:
each one-node model is compiled by tpuhal.compile() in fp32, loaded on
sim:0 and run on the test's inputs, and its outputs compared with ONNX's
expected ones (relative 1e-3, absolute 1e-7; integers exact), as
tests/onnx/onnx_node_test.cpp does for single tpuhal ops. This covers what
that harness cannot: lowerings of several ops (ScatterND, 3-D ConvTranspose,
...), constant folding and the compiler's own checks.

The compiler needs weights, shapes and exponents as constants; a node test
gives them as inputs. Where the compiler refuses a node for that reason,
every input but the first is frozen at the test's values (the model then
computes from its first input) and the model compiled again.

tests/onnx/compiled_node_tests.txt lists the tests that compile today. A
listed test that no longer compiles, any compiled test whose outputs
differ, and a test that compiles but is not listed (add it) all fail.
"""
import glob
import os

import pytest

NODE_DATA = os.environ.get("TPUHAL_ONNX_TESTDATA", "/usr/share/libonnx-testdata/data/node")
LISTED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "onnx", "compiled_node_tests.txt")


def listed():
    with open(LISTED) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def node_tests():
    if not os.path.isdir(NODE_DATA):
        return []
    return sorted(n for n in os.listdir(NODE_DATA) if os.path.isdir(os.path.join(NODE_DATA, n, "test_data_set_0")))


@pytest.fixture(scope="module")
def device():
    import tpuhal
    if not os.path.isdir(NODE_DATA):
        pytest.fail(f"{NODE_DATA} is missing (Debian: libonnx-testdata; scripts/setup.sh installs it)")
    return tpuhal.open("sim:0")


def tensors(data_set, kind):
    import onnx
    from onnx import numpy_helper
    paths = sorted(glob.glob(os.path.join(data_set, f"{kind}_*.pb")), key=lambda p: int(p[:-3].rsplit("_", 1)[1]))
    return [numpy_helper.to_array(onnx.load_tensor(p)) for p in paths]


def as_values(arrays, infos):
    """bfloat16 data come as their bits (uint16): their values, as float32."""
    import numpy as np
    from onnx import TensorProto
    return [(a.astype(np.uint32) << 16).view(np.float32) if i.type.tensor_type.elem_type == TensorProto.BFLOAT16
            else a for a, i in zip(arrays, infos)]


def compile_node_test(name):
    """(compiled model, inputs by name, expected outputs), or (None, reason,
    None) where the compiler refuses the model or its data are not tensors."""
    import onnx
    import tpuhal
    from onnx import numpy_helper
    d = os.path.join(NODE_DATA, name)
    try:
        ins, outs = tensors(os.path.join(d, "test_data_set_0"), "input"), tensors(os.path.join(d, "test_data_set_0"),
                                                                                  "output")
    except (ValueError, TypeError) as e:  # sequences and optionals: the compiler takes tensors only
        return None, f"data not tensors ({e})", None
    model = onnx.load(os.path.join(d, "model.onnx"))
    g = model.graph
    fed = [i for i in g.input if i.name not in {t.name for t in g.initializer}]
    outs = as_values(outs, g.output)
    try:
        return tpuhal.compile(model.SerializeToString()), dict(zip([i.name for i in fed], as_values(ins, fed))), outs
    except tpuhal.Error as e:
        if "not a constant" not in str(e):
            return None, str(e), None
    for i, value in zip(fed[1:], ins[1:]):
        g.initializer.append(numpy_helper.from_array(value, i.name))
    del g.input[:]
    g.input.extend(fed[:1])
    try:
        return tpuhal.compile(model.SerializeToString()), dict(zip([fed[0].name], as_values(ins[:1], fed))), outs
    except tpuhal.Error as e:
        return None, str(e), None


@pytest.mark.parametrize("name", node_tests())
def test_node_test_compiles_and_matches_onnx(device, name):
    import numpy as np
    import tpuhal
    compiled, ins, outs = compile_node_test(name)
    if compiled is None:
        assert name not in listed(), f"{name} is listed as compiling, and now: {ins}"
        return
    model = device.load_model(compiled)
    try:
        got = model.instance().run(ins)
    except tpuhal.InvalidArgument as e:
        # A test whose data contradict the shapes its model declares (an
        # input read only for its type): nothing to compare.
        assert "the model was compiled for" in str(e) and name not in listed(), str(e)
        return
    assert len(got) == len(outs)
    for i, (g, want) in enumerate(zip(got, outs)):
        assert g.shape == want.shape, f"output {i}: shape {g.shape}, expected {want.shape}"
        if want.dtype.kind == "f":
            np.testing.assert_allclose(g, want.astype(np.float32), rtol=1e-3, atol=1e-7, equal_nan=True,
                                       err_msg=f"output {i}")
        else:
            assert np.array_equal(g, want.astype(np.float32)), f"output {i}: {g} != {want}"
    assert name in listed(), f"{name} compiles and matches ONNX: add it to tests/onnx/compiled_node_tests.txt"


def test_every_listed_test_is_in_the_test_data(device):
    stale = sorted(listed() - set(node_tests()))
    assert not stale, f"listed in tests/onnx/compiled_node_tests.txt but not in {NODE_DATA}: {stale}"
