"""scripts/model-bench, the speed table of docs/benchmarks.md: every precision
of a zoo model timed by the CLI, and the Q/DQ export it times (zoo.qat_export).
Figures are not checked (benchmarks report them); that each cell is measured
or says why it is not, is."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tpuhal
from conftest import run_plain

pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")
pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
onnx = pytest.importorskip("onnx", reason="python3-onnx is not installed")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "model-bench")
CLI = os.path.join(os.environ.get("TPUHAL_BIN_DIR", os.path.join(ROOT, "build", "bin")), "tpuhal")


def bench(*argv):
    # The script runs PyTorch and the CLI, not this package: without the
    # sanitizer runtime this interpreter preloads (a sanitized build's
    # tests), PyTorch's export takes a third less time. The CLI carries
    # its own.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([sys.executable, SCRIPT, "--tpuhal", CLI, "--threads", "2", "--size", "32",
                           "--iterations", "2", "--calibration", "2", *argv], capture_output=True, text=True, env=env)


def test_every_precision_of_a_model_is_timed_at_every_batch(tmp_path):
    out = tmp_path / "figures.json"
    done = bench("--models", "squeezenet1_1", "--batches", "1,2", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "| model | batch | fp32 ms | fp16 ms | bf16 ms | int8 ms | qdq ms |" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["isa"] in done.stdout.splitlines()[0]
    assert [(r["model"], r["batch"]) for r in figures["rows"]] == [("squeezenet1_1", 1), ("squeezenet1_1", 2)]
    for row in figures["rows"]:
        assert row["failed"] == {}
        assert sorted(row["ms"]) == ["bf16", "fp16", "fp32", "int8", "qdq"]
        assert all(ms > 0 for ms in row["ms"].values())
        fp32 = row["ms"]["fp32"]
        line = next(l for l in done.stdout.splitlines() if l.startswith(f"| squeezenet1_1 | {row['batch']} |"))
        assert f"{fp32:.2f}" in line and f"({fp32 / row['ms']['int8']:.2f}x)" in line


def test_a_cell_that_cannot_be_measured_says_why_and_the_rest_are_measured(tmp_path):
    # FX cannot trace ShuffleNet's channel shuffle, so it has no Q/DQ export.
    out = tmp_path / "figures.json"
    done = bench("--models", "shufflenet_v2_x0_5", "--batches", "1", "--precisions", "fp32,qdq", "--json", str(out))
    assert done.returncode == 1
    row = json.loads(out.read_text())["rows"][0]
    assert list(row["ms"]) == ["fp32"] and row["ms"]["fp32"] > 0
    assert "qdq export" in row["failed"]
    assert f"shufflenet_v2_x0_5 batch 1 qdq export: {row['failed']['qdq export']}" in done.stderr
    assert "| shufflenet_v2_x0_5 | 1 |" in done.stdout and done.stdout.rstrip().endswith("| - |")


def test_rounds_time_each_cell_again_in_turn_and_give_the_median(tmp_path):
    out = tmp_path / "figures.json"
    done = bench("--models", "squeezenet1_1", "--batches", "1", "--precisions", "fp32,int8", "--rounds", "3",
                 "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "the median of 3 rounds" in done.stdout.splitlines()[0]
    figures = json.loads(out.read_text())
    assert figures["rounds"] == 3
    row = figures["rows"][0]
    assert sorted(row["rounds"]) == ["fp32", "int8"]
    for column, times in row["rounds"].items():
        assert len(times) == 3 and all(ms > 0 for ms in times)
        assert row["ms"][column] == sorted(times)[1]


def test_a_held_out_network_is_timed_on_an_input_of_its_own_shape(tmp_path):
    # The 1-D audio network takes [batch, 1, 16000], not an image: its ONNX
    # input says so, and each precision asked for is measured.
    out = tmp_path / "figures.json"
    done = bench("--models", "audio_1d", "--batches", "2", "--precisions", "fp32,int8", "--json", str(out))
    assert done.returncode == 0, done.stderr
    row = json.loads(out.read_text())["rows"][0]
    assert (row["model"], row["batch"], row["failed"]) == ("audio_1d", 2, {})
    assert sorted(row["ms"]) == ["fp32", "int8"] and all(ms > 0 for ms in row["ms"].values())
    assert "| audio_1d | 2 |" in done.stdout


@pytest.mark.parametrize("argv, says", [
    (["--precisions", "fp32,fp8"], "--precisions: unknown fp8"),
    (["--models", "resnet18,nosuchnet"], "--models: unknown nosuchnet"),
    (["--models", "bert"], "held out: bert_encoder,gpt_decoder,audio_1d"),
    (["--batches", "1,x"], "--batches"),
    (["--rounds", "0"], "--rounds must be positive"),
    (["--ort", "/nonexistent"], "has no node_modules/onnxruntime-node"),
])
def test_bad_arguments_are_refused_before_any_work(argv, says):
    done = bench(*argv)
    assert done.returncode == 2
    assert says in done.stderr
    assert "| model |" not in done.stdout


# zoo.qat_export of MobileNetV3-Small at 32x32 into argv[1], its output on
# the input into argv[2] (argv[3]: the zoo's folder).
QAT_EXPORT = """
import sys
import numpy as np
import torch
sys.path.insert(0, sys.argv[3])
import zoo
net = zoo.build(*zoo.zoo()["mobilenet_v3_small"])
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 3, 32, 32), dtype=np.float32)
with torch.no_grad():
    want = zoo.qat_export(net, x, sys.argv[1], rng.standard_normal((4, 3, 32, 32), dtype=np.float32))
np.save(sys.argv[2], want)
"""


def test_the_qat_export_is_int8_from_its_own_pairs_with_scalar_per_tensor_scales(tmp_path):
    # MobileNetV3's Hardsigmoid takes fixed scales; its per-tensor scales must be scalars for ONNX Runtime.
    path, out = str(tmp_path / "qdq.onnx"), str(tmp_path / "want.npy")
    run_plain(QAT_EXPORT, path, out, os.path.join(ROOT, "examples", "model_zoo"))
    want = np.load(out)
    m = onnx.load(path)
    inits = {t.name: t for t in m.graph.initializer}
    pairs = [n for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert len(pairs) > 50
    for n in pairs:
        per_axis = any(a.name == "axis" for a in n.attribute)
        for name in n.input[1:]:
            if name in inits and not per_axis:
                assert list(inits[name].dims) == [], (n.name, name)
    compiled = tpuhal.compile(path, "int8")
    assert any("in int8 from the model's Q/DQ" in note for note in compiled.notes)
    assert want.shape == (1, 1000)
