"""The host stage (docs/runtime.md): a model whose outputs' shapes depend on
its data runs its program on the device, then the nodes from the first
such one (NonZero, NonMaxSuppression, an If on a computed condition) on,
evaluated on the host. A whole torchvision detector compiles and gives
PyTorch's detections; the Python API returns the model's own outputs."""
import numpy as np
import pytest

import tpuhal
from conftest import run_plain


@pytest.fixture(scope="module")
def dev():
    with tpuhal.open("sim:0") as d:
        yield d


def positives_model():
    """x [2, 3] -> the coordinates of its positive values (NonZero, int64
    [2, n]) and the values themselves (GatherND, float32 [n])."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["mask"], name="greater"),
        helper.make_node("NonZero", ["mask"], ["where"], name="nonzero"),
        helper.make_node("Transpose", ["where"], ["rows"], name="transpose", perm=[1, 0]),
        helper.make_node("GatherND", ["x", "rows"], ["values"], name="gather"),
    ]
    graph = helper.make_graph(
        nodes, "positives", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("where", TensorProto.INT64, None),
         helper.make_tensor_value_info("values", TensorProto.FLOAT, None)],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_a_data_dependent_output_comes_back_with_the_shape_the_data_gave(dev, tmp_path):
    cm = tpuhal.compile(positives_model())
    assert any(n.startswith("host stage: 3 nodes from 'nonzero' (NonZero) on") for n in cm.notes), cm.notes
    path = tmp_path / "pos.tpm"
    cm.save(str(path))
    model = tpuhal.load_model(dev, str(path))
    assert model.host_stage == {"outputs": ["where", "values"], "nodes": 3,
                                "ops": {"GatherND": 1, "NonZero": 1, "Transpose": 1}}
    assert [o.name for o in model.outputs] == ["mask", "x"]  # what the program gives the stage
    inst = model.instance()
    x = np.array([[1.5, -2, 3], [-1, 0, 4.25]], np.float32)
    where, values = inst.run(x)
    assert where.dtype == np.int64 and values.dtype == np.float32
    np.testing.assert_array_equal(where, np.array(np.nonzero(x > 0)))
    np.testing.assert_array_equal(values, x[x > 0])
    where, values = inst.run(-np.ones((2, 3), np.float32))
    assert where.shape == (2, 0) and values.shape == (0,)
    with pytest.raises(tpuhal.InvalidArgument, match="host stage, whose outputs' shapes depend on the data"):
        inst.run(x, outputs=[np.zeros(6, np.float32), np.zeros(6, np.float32)])
    # The instance goes on after the refusal.
    assert inst.run(x)[1].shape == (3,)


def test_a_layer_after_the_data_dependent_shape_is_refused_naming_both():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    model = onnx.load_from_string(positives_model())
    model.graph.node.append(helper.make_node("Sigmoid", ["values"], ["y"], name="sigmoid"))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    with pytest.raises(tpuhal.Unsupported, match="node 'sigmoid' \\(Sigmoid\\): it needs values known only once "
                                                 "the program has run \\(after NonZero 'nonzero'"):
        tpuhal.compile(model.SerializeToString())


def iou(a, b):
    lt = np.maximum(a[:2], b[:, :2])
    rb = np.minimum(a[2:], b[:, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[:, 0] * wh[:, 1]
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0)


# Builds SSDlite, runs PyTorch on one image and exports the model: in a
# process of its own, without the sanitizers' runtime that a sanitized
# build preloads into this one (under it the export alone takes 30 s).
SSDLITE = """
import sys, numpy as np, torch
from torchvision.models import detection
torch.manual_seed(0)
net = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=11,
                                              score_thresh=0.1).eval()
for m in net.modules():
    if isinstance(m, torch.nn.Conv2d):
        torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
with torch.no_grad():
    for p in net.head.parameters():
        p.add_(torch.randn_like(p) * 0.05)
image = torch.rand(3, 320, 320)
with torch.no_grad():
    want = net([image])[0]
np.savez(sys.argv[1] + "/want.npz", image=image.numpy(), **{k: v.numpy() for k, v in want.items()})
torch.onnx.export(net, ([image],), sys.argv[1] + "/ssdlite.onnx", opset_version=11, input_names=["image"])
"""


def test_torchvisions_whole_ssdlite_compiles_and_gives_pytorchs_detections(dev, tmp_path):
    """SSDlite320 (MobileNetV3-Large), exported whole by torchvision: backbone and head on the device, its
    post-processing (per class: scores above the threshold, the best 300, then batched NMS and the best 300
    of all) in the host stage. Random weights, Kaiming-initialised convolutions so that the scores differ
    from box to box (torchvision's own initialisation leaves most equal, and equal scores may go in either
    order). Ten classes rather than COCO's 90 (the export unrolls the loop over them: 90 took 28 s), at a
    threshold of 0.1 that about a sixth of the scores pass, between 346 and 908 boxes per class: each step
    still drops some."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision.models.detection", reason="python3-torchvision is not installed")
    run_plain(SSDLITE, tmp_path)
    want = np.load(tmp_path / "want.npz")
    cm = tpuhal.compile(str(tmp_path / "ssdlite.onnx"))
    model = dev.load_model(cm)
    assert model.host_stage["ops"]["NonZero"] == 20 and model.host_stage["ops"]["If"] == 1
    boxes, scores, labels = model.instance().run(want["image"])
    wb, ws, wl = want["boxes"], want["scores"], want["labels"]
    assert boxes.shape == wb.shape and scores.shape == ws.shape and labels.shape == wl.shape
    assert labels.dtype == np.int64
    # Every detection of PyTorch's is one of ours: same label, the same score to within the board's f32
    # rounding, and the same box (IoU, or for an empty box on the image's edge, its corners).
    for b, s, label in zip(wb, ws, wl):
        same = (labels == label) & (np.abs(scores - s) <= 1e-5)
        near = (iou(b, boxes) >= 0.99) | (np.abs(boxes - b).max(axis=1) <= 0.05)
        assert (same & near).any(), (b, s, label)
    np.testing.assert_allclose(np.sort(scores), np.sort(ws), atol=1e-5)
