"""scripts/timing: the random weights the timing model's networks get
(models.unit_variance) and the layers calibrate.py keeps in fp16 where
SOPHGO's own int8 program does (calibrate.fp_forward), docs/timing.md."""
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
onnx = pytest.importorskip("onnx", reason="python3-onnx is not installed")
from onnx import TensorProto, helper  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "timing"))
import calibrate  # noqa: E402
import models  # noqa: E402


def conv_outputs(model, image):
    """Each Conv block's convolution output on `image`, in running order."""
    seen = []
    hooks = [m.conv.register_forward_hook(lambda _, __, out: seen.append(out))
             for m in model.modules() if isinstance(m, models.Conv)]
    with torch.no_grad():
        model.eval()(image)
    for h in hooks:
        h.remove()
    return seen


def test_unit_variance_holds_every_conv_block_at_unit_scale_through_the_depth():
    torch.manual_seed(0)
    size = 64
    model = models.unit_variance(models.unit_scale(models.YOLOXs()), size)
    # The image unit_variance measured on: every output's deviation is 1.
    same = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    outs = conv_outputs(model, same)
    assert len(outs) == 74  # 83 convolutions, 9 of them the head's predictions
    for i, out in enumerate(outs):
        assert out.std().item() == pytest.approx(1, rel=1e-3), f"conv block {i}"
    # Another image: the head's last layers stay where fp16 holds them
    # (He-normal weights alone left them below 2^-6).
    for out in conv_outputs(model, torch.rand(1, 3, size, size))[-12:]:
        assert 2 ** -6 < out.abs().max().item() < 2 ** 14


def test_unit_variance_leaves_the_network_it_exports_the_same_but_for_scale():
    torch.manual_seed(0)
    plain = models.unit_scale(models.YOLOv5s())
    torch.manual_seed(0)
    scaled = models.unit_variance(models.unit_scale(models.YOLOv5s()), 64)
    for a, b in zip(plain.modules(), scaled.modules()):
        if isinstance(a, models.Conv):
            ratio = b.conv.weight / a.conv.weight
            assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), rtol=1e-5)


def chain(path):
    """a -> A -> B -> C -> D -> out, and a branch B -> E -> F -> out2:
    Conv nodes named as a network's layers are."""
    nodes, inputs, value = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])], "x"
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 1, 1], [1.0])

    def conv(name, x):
        nodes.append(helper.make_node("Conv", [x, "w"], [name + "_out"], name=name))
        return name + "_out"

    def relu(name, x):
        nodes.append(helper.make_node("Relu", [x], [name + "_out"], name=name))
        return name + "_out"

    b = conv("/B", relu("/r0", conv("/A", value)))
    d = conv("/D", conv("/C", b))
    f = conv("/F", relu("/r1", conv("/E", b)))
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 4, 4]) for n in (d, f)]
    graph = helper.make_graph(nodes, "chain", inputs, outputs, initializer=[w])
    onnx.save(helper.make_model(graph), path)


def test_fp_forward_takes_each_named_layer_with_all_before_or_all_after_it(tmp_path):
    path = str(tmp_path / "chain.onnx")
    chain(path)
    assert calibrate.fp_forward(path, ["/B"], []) == ["/A", "/B"]
    assert calibrate.fp_forward(path, [], ["/E"]) == ["/E", "/F"]
    assert calibrate.fp_forward(path, [], ["/B"]) == ["/B", "/C", "/D", "/E", "/F"]
    assert calibrate.fp_forward(path, ["/A"], ["/D"]) == ["/A", "/D"]
    # The two walks are apart: what one took does not stop the other.
    assert calibrate.fp_forward(path, ["/C"], ["/A"]) == ["/A", "/B", "/C", "/D", "/E", "/F"]


def test_fp_forward_refuses_a_layer_the_graph_lacks(tmp_path):
    path = str(tmp_path / "chain.onnx")
    chain(path)
    with pytest.raises(SystemExit, match=r"chain.onnx has no node /G"):
        calibrate.fp_forward(path, ["/A"], ["/G"])


def test_sophgos_yolox_program_keeps_its_stem_dark2_and_head_in_fp16(tmp_path):
    """The layers FP_FORWARD gives on models.py's own YOLOX-s export (at
    64x64: the names do not depend on the size)."""
    torch.manual_seed(0)
    model = models.fuse(models.unit_scale(models.YOLOXs())).eval()
    path = str(tmp_path / "yoloxs.onnx")
    with torch.no_grad():
        torch.onnx.export(model, torch.rand(1, 3, 64, 64), path, opset_version=13)
    kept = calibrate.fp_forward(path, *calibrate.FP_FORWARD["yoloxs"])
    assert len(kept) == 31
    assert kept[:7] == ["/stem/conv/conv/Conv", "/d2/d2.0/conv/Conv", "/d2/d2.1/cv1/conv/Conv",
                        "/d2/d2.1/m/m.0/cv1/conv/Conv", "/d2/d2.1/m/m.0/cv2/conv/Conv", "/d2/d2.1/cv2/conv/Conv",
                        "/d2/d2.1/cv3/conv/Conv"]
    head = ("/stems.", "/cls_convs.", "/reg_convs.", "/cls_preds.", "/reg_preds.", "/obj_preds.")
    assert all(name.startswith(head) for name in kept[7:])
    assert not any(name.startswith(("/d3/", "/d4/", "/d5/", "/neck/")) for name in kept)
