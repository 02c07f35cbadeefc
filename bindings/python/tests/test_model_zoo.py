"""examples/model_zoo/zoo.py's comparison with PyTorch's own int8 (--torch-ptq)
and its per-layer report (--layer-report), on resnet18 at 48x48: the row
of PyTorch's FX graph mode post-training static quantisation beside ours,
the report's layers, and the row a model FX cannot trace gets."""
import argparse
import importlib.util
import math
import os

import pytest

import tpuhal

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
pytest.importorskip("torchvision", reason="python3-torchvision is not installed (scripts/setup.sh installs it)")
pytest.importorskip("onnx", reason="python3-onnx is not installed (scripts/setup.sh installs it)")

ZOO_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "model_zoo", "zoo.py")
_spec = importlib.util.spec_from_file_location("zoo", ZOO_PATH)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)

DEVICE = "sim:0"
# PyTorch's int8 of resnet18 at 48x48 is near 30 dB against its fp32; well
# below that means the comparison is broken, not that PyTorch got worse.
TORCH_MIN_SNR_DB = 10.0


def arguments(qconfig="fbgemm"):
    """zoo.py's options for an int8 row with --torch-ptq and --layer-report."""
    engine = zoo.torch_engine(torch, qconfig)
    if engine is None:
        pytest.skip(f"this PyTorch has no quantized engine for the {qconfig} qconfig")
    torch.backends.quantized.engine = engine
    return argparse.Namespace(size=48, batch=1, precisions=["int8"], calibration=4, percentile=99.99,
                              method="percentile", target_snr=zoo.MIXED_MIN_SNR_DB + 5, seed=0, device=DEVICE,
                              bench=False, torch_ptq=True, torch_qconfig=qconfig, torch_engine=engine,
                              layer_report=5)


@pytest.fixture(scope="module")
def dev():
    with tpuhal.open(DEVICE) as d:
        yield d


def rows_of(dev, tmp_path, name, builder, args):
    return {row["precision"]: row for row in zoo.run_model(tpuhal, dev, name, builder, False, args, str(tmp_path))}


def test_resnet18_beside_pytorch_int8(dev, tmp_path):
    args = arguments()
    rows = rows_of(dev, tmp_path, "resnet18", zoo.zoo()["resnet18"][0], args)
    assert list(rows) == ["int8", zoo.TORCH_INT8]

    ours, theirs = rows["int8"], rows[zoo.TORCH_INT8]
    assert ours["status"] == "ok", ours.get("message")
    assert math.isfinite(ours["snr_db"]) and ours["snr_db"] >= zoo.INT8_MIN_SNR_DB
    assert theirs["status"] == "ok", theirs.get("message")
    assert theirs["qconfig"] == "fbgemm" and theirs["engine"] == args.torch_engine
    assert math.isfinite(theirs["snr_db"]) and theirs["snr_db"] > TORCH_MIN_SNR_DB
    assert 0 < theirs["max_error_over_range"] < 1
    assert "note" not in theirs

    # The precision report: one line per layer, in ONNX order, the first
    # reading the model's input and the last giving the output.
    layers = ours["layer_report"]
    assert len(layers) > 20
    assert layers[0]["input_snr_db"] is None
    assert layers[0]["own_snr_db"] == pytest.approx(layers[0]["snr_db"])
    assert layers[-1]["output"] == "out"
    for layer in layers:
        assert math.isfinite(layer["snr_db"]) and layer["snr_db"] > zoo.INT8_MIN_SNR_DB, layer
        assert layer["own_snr_db"] >= layer["snr_db"] - 1e-9, layer
    assert any(layer["input_snr_db"] is not None and math.isfinite(layer["own_snr_db"]) for layer in layers)


class DataDependentBranch(torch.nn.Module):
    """A network FX cannot trace: its forward branches on a value."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        x = self.conv(x)
        if x.sum() > 0:
            x = x * 2
        return x


def test_model_fx_cannot_trace(dev, tmp_path):
    args = arguments()
    args.layer_report = None
    rows = rows_of(dev, tmp_path, "branch", lambda weights=None: DataDependentBranch(), args)
    assert rows["int8"]["status"] == "ok", rows["int8"].get("message")
    assert "layer_report" not in rows["int8"]
    theirs = rows[zoo.TORCH_INT8]
    assert theirs["status"].startswith("torch PTQ failed: "), theirs["status"]
    assert "\n" not in theirs["status"]
    assert theirs["snr_db"] is None
