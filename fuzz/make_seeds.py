#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/: a handful of valid
inputs per target (docs/fuzzing.md). The files are committed; run this again
after changing it (it rewrites only the seeds it names, so inputs merged in
with scripts/fuzz.sh --update-corpus stay).

    fuzz/make_seeds.py [--out DIR]

Layouts follow firmware_iface/include/tpuhal/fw/command.h, tensor.h and op_attrs.inc, and
the header comments of the fuzz targets.
"""
import argparse
import os
import shutil
import struct
import sys

# ---- firmware interface constants (command.h, status.h) -------------------
NOP, COPY, COPY_SG, FILL, WAIT_VALUE, WRITE_VALUE, TIMESTAMP, TENSOR_OP, CALL = range(1, 10)
WAIT_TIME = 13
FLAG_FENCE, FLAG_INTERRUPT = 1, 2
HOST = 1 << 48
FAILED = 1 << 63

# ---- board_fuzzer layout (see its header comment) --------------------------
DRAM_DATA = 0x10000           # input data in DRAM
STATUS_IOVA = HOST            # read/write status window
HOST_RW = HOST + 0x100000     # read/write host window (input data)
HOST_RO = HOST + 0x200000     # read-only host window (input data)
DRAM_BYTES = 1 << 20


def desc(opcode, *args, flags=0, seq=0, fence=0):
    args = list(args) + [0] * (6 - len(args))
    return struct.pack("<HHIQ6Q", opcode, flags, seq, fence, *args)


def ring(*descs):
    """Descriptors with sequence = ring position (already packed with seq 0)."""
    out = b""
    for i, d in enumerate(descs):
        out += d[:4] + struct.pack("<I", i) + d[8:]
    return out


def board_input(descs, data=b"", queue=0, entries_log=0, placement=0, page_mode=0,
                page_offset=0, interrupt=False, tail=0):
    """Header, ring slots (sequences set), then data."""
    config = queue | entries_log << 2 | placement << 4 | page_mode << 6
    return bytes([config, page_offset | interrupt << 7, len(descs), tail]) + ring(*descs) + data


def fence_record(value, status, opcode, field, seq, err_fence, val, detail, ts=0):
    return struct.pack("<QQQIHHIIQQQ", value, ts, err_fence, status, opcode, field, seq, 0,
                       val, detail, 0)


# ---- tensor op parameter blocks (tensor.h) ---------------------------------
F32, F16, BF16, I8, U8, I32 = range(1, 7)
OP_MAGIC = 0x31504F54  # "TOP1"


def schema():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schema"))
    sys.dont_write_bytecode = True
    import ops  # schema/ops.py
    return ops


SCHEMA = schema()
# Op kind codes by name ("matmul": 1, ...), from the op schema.
OP = {k["id"]: code for code, k in enumerate(SCHEMA.KINDS, start=1)}
NONE_TENSOR = bytes(128)


def tensor(address, dtype, shape, strides=None):
    """A TensorRef: row-major strides unless given (in elements)."""
    if strides is None:
        strides, step = [], 1
        for dim in reversed(shape):
            strides.insert(0, step)
            step *= dim
    pad = lambda v: list(v) + [0] * (6 - len(v))
    return struct.pack("<QII6Q6Q2Q", address, dtype, len(shape), *pad(shape), *pad(strides), 0, 0)


def op_block(kind, tensors, attrs):
    return struct.pack("<IIII2Q", OP_MAGIC, kind, len(tensors), len(attrs), 0, 0) + b"".join(tensors) + attrs


def matmul_attrs(trans_a=0, trans_b=0, alpha=1.0, beta=1.0, act=0, act_alpha=0.0, act_beta=0.0):
    return struct.pack("<IIffIffI", trans_a, trans_b, alpha, beta, act, act_alpha, act_beta, 0)


def conv_attrs(layout=0, groups=1, stride=(1, 1), dilation=(1, 1), pad=(0, 0, 0, 0), act=0):
    return struct.pack("<II2I2I4IIff3I", layout, groups, *stride, *dilation, *pad, act, 0.0, 0.0, 0, 0, 0)


def pool_attrs(kind, layout, kernel, stride, dilation=(1, 1), pad=(0, 0, 0, 0), ceil_mode=0, include_pad=0):
    return struct.pack("<II2I2I2I4III2I", kind, layout, *kernel, *stride, *dilation, *pad, ceil_mode,
                       include_pad, 0, 0)


def op_seeds():
    """One or more valid parameter blocks of every op kind."""
    o = {}
    k = 0x10000  # tensors 64 KiB apart: no output overlaps an input
    o["matmul"] = op_block(OP["matmul"], [tensor(k, F32, [4, 8]), tensor(2 * k, F32, [8, 16]), NONE_TENSOR,
                                    tensor(3 * k, F32, [4, 16])], matmul_attrs())
    # Batched, B transposed and broadcast over the batch (stride 0), C, relu.
    o["matmul_batched"] = op_block(OP["matmul"], [
        tensor(k, BF16, [2, 3, 5]), tensor(2 * k, BF16, [2, 7, 5], [0, 5, 1]),
        tensor(3 * k, F32, [2, 3, 7]), tensor(HOST, F32, [2, 3, 7])],
        matmul_attrs(trans_b=1, beta=0.5, act=1))
    o["conv2d"] = op_block(OP["conv2d"], [tensor(k, F32, [1, 3, 8, 8]), tensor(2 * k, F32, [4, 3, 3, 3]),
                                    tensor(3 * k, F32, [4]), tensor(4 * k, F32, [1, 4, 6, 6])], conv_attrs())
    # NHWC, two groups, stride 2, padding 1: 9 -> 5.
    o["conv2d_nhwc_grouped"] = op_block(OP["conv2d"], [
        tensor(k, F16, [1, 9, 9, 4]), tensor(2 * k, F16, [4, 2, 3, 3]), NONE_TENSOR,
        tensor(3 * k, F16, [1, 5, 5, 4])], conv_attrs(layout=1, groups=2, stride=(2, 2), pad=(1, 1, 1, 1), act=2))
    # Max pool, ceil mode: 8 -> 4 with a 3x3 window, stride 2.
    o["max_pool_ceil"] = op_block(OP["pool2d"], [tensor(k, F32, [1, 2, 8, 8]), tensor(2 * k, F32, [1, 2, 4, 4])],
                                  pool_attrs(0, 0, (3, 3), (2, 2), ceil_mode=1))
    o["avg_pool_nhwc_padded"] = op_block(OP["pool2d"], [tensor(k, F32, [1, 5, 5, 3]), tensor(2 * k, F32, [1, 5, 5, 3])],
                                         pool_attrs(1, 1, (3, 3), (1, 1), pad=(1, 1, 1, 1), include_pad=1))
    o["max_pool_u8_dilated"] = op_block(OP["pool2d"], [tensor(k, U8, [1, 1, 9, 9]), tensor(2 * k, U8, [1, 1, 5, 5])],
                                        pool_attrs(0, 0, (3, 3), (1, 1), dilation=(2, 2)))
    # add with B broadcast along the first two dimensions.
    o["add_broadcast"] = op_block(OP["elementwise"], [
        tensor(k, F32, [2, 3, 4]), tensor(2 * k, F32, [2, 3, 4], [0, 0, 1]), tensor(3 * k, F32, [2, 3, 4])],
        struct.pack("<IIff", 1, 0, 0.0, 0.0))
    o["clip"] = op_block(OP["elementwise"], [tensor(k, F16, [16]), NONE_TENSOR, tensor(2 * k, F16, [16])],
                         struct.pack("<IIff", 7, 2, 0.0, 6.0))
    # erf (elementwise mode 13, interface 1.3).
    o["erf"] = op_block(OP["elementwise"], [tensor(k, BF16, [3, 5]), NONE_TENSOR, tensor(2 * k, BF16, [3, 5])],
                        struct.pack("<IIff", 13, 0, 0.0, 0.0))
    # round (elementwise mode 25, interface 1.10).
    o["round"] = op_block(OP["elementwise"], [tensor(k, F16, [4, 6]), NONE_TENSOR, tensor(2 * k, F16, [4, 6])],
                          struct.pack("<IIff", 25, 0, 0.0, 0.0))
    # fmod (elementwise mode 27, interface 1.14): i8, B broadcast.
    o["fmod"] = op_block(OP["elementwise"], [tensor(k, I8, [2, 7]), tensor(3 * k, I8, [2, 7], [0, 1]),
                                             tensor(2 * k, I8, [2, 7])], struct.pack("<IIff", 27, 0, 0.0, 0.0))
    # atanh (elementwise mode 38, interface 1.17), the last mode: f16.
    o["atanh"] = op_block(OP["elementwise"], [tensor(k, F16, [3, 4]), NONE_TENSOR, tensor(2 * k, F16, [3, 4])],
                          struct.pack("<IIff", 38, 0, 0.0, 0.0))
    # A comparison (elementwise mode 15, less, interface 1.7): i32 in, u8 out, B broadcast.
    o["less"] = op_block(OP["elementwise"], [tensor(k, I32, [3, 5]), tensor(3 * k, I32, [3, 5], [0, 1]),
                                             tensor(2 * k, U8, [3, 5])], struct.pack("<IIff", 15, 0, 0.0, 0.0))
    # Cast and transpose at once: an f32 [3, 4] read as [4, 3] into u8.
    o["cast_transpose"] = op_block(OP["elementwise"], [tensor(k, F32, [4, 3], [1, 4]), NONE_TENSOR,
                                                 tensor(2 * k, U8, [4, 3])], struct.pack("<IIff", 0, 0, 0.0, 0.0))
    o["softmax"] = op_block(OP["softmax"], [tensor(k, F32, [2, 10]), tensor(2 * k, F32, [2, 10])],
                            struct.pack("<4I", 1, 0, 0, 0))
    o["log_softmax_3d"] = op_block(OP["softmax"], [tensor(k, BF16, [2, 3, 4]), tensor(2 * k, BF16, [2, 3, 4])],
                                   struct.pack("<4I", 0, 1, 0, 0))
    quant = bytes(16)
    o["dequantize_per_axis"] = op_block(OP["dequantize"], [
        tensor(k, I8, [2, 4]), tensor(2 * k, F32, [2, 4], [0, 1]), tensor(3 * k, I8, [2, 4], [0, 1]),
        tensor(4 * k, F32, [2, 4])], quant)
    o["conv_integer"] = op_block(OP["conv_integer"], [
        tensor(k, U8, [1, 2, 5, 5]), tensor(2 * k, I8, [3, 2, 3, 3]), tensor(3 * k, U8, [1, 2, 5, 5], [0, 0, 0, 0]),
        tensor(4 * k, I8, [3, 2, 3, 3], [1, 0, 0, 0]), tensor(5 * k, I32, [1, 3, 3, 3])], conv_attrs())
    o["qlinear_conv"] = op_block(OP["qlinear_conv"], [
        tensor(k, U8, [1, 1, 4, 4]), tensor(2 * k, F32, [1, 1, 4, 4], [0, 0, 0, 0]),
        tensor(3 * k, U8, [1, 1, 4, 4], [0, 0, 0, 0]), tensor(4 * k, U8, [2, 1, 3, 3]),
        tensor(5 * k, F32, [2, 1, 3, 3], [1, 0, 0, 0]), tensor(6 * k, U8, [2, 1, 3, 3], [0, 0, 0, 0]),
        tensor(7 * k, F32, [1, 2, 2, 2], [0, 0, 0, 0]), tensor(8 * k, U8, [1, 2, 2, 2], [0, 0, 0, 0]),
        tensor(9 * k, I32, [2]), tensor(10 * k, U8, [1, 2, 2, 2])], conv_attrs())
    o["resize_linear"] = op_block(OP["resize"], [tensor(k, F32, [1, 3, 4, 4]), tensor(2 * k, F32, [1, 3, 8, 8])],
                                  struct.pack("<IIII2f2I", 1, 0, 0, 0, 2.0, 2.0, 0, 0))
    o["resize_nearest_nhwc"] = op_block(OP["resize"], [tensor(k, U8, [1, 4, 4, 3]), tensor(2 * k, U8, [1, 2, 2, 3])],
                                        struct.pack("<IIII2f2I", 0, 1, 2, 1, 0.5, 0.5, 0, 0))
    color = lambda fmt: struct.pack("<II3f3f6I", fmt, 0, 0.5, 0.5, 0.5, 1 / 255, 1 / 255, 1 / 255, *[0] * 6)
    o["nv12_to_rgb"] = op_block(OP["color_convert"], [
        tensor(k, U8, [4, 6]), tensor(2 * k, U8, [2, 3, 2]), NONE_TENSOR, tensor(3 * k, F32, [3, 4, 6])], color(0))
    o["i420_to_rgb"] = op_block(OP["color_convert"], [
        tensor(k, U8, [4, 6]), tensor(2 * k, U8, [2, 3]), tensor(3 * k, U8, [2, 3]), tensor(4 * k, U8, [3, 4, 6])],
        color(1))
    o["argmin_last"] = op_block(OP["top_k"], [tensor(k, U8, [5, 4]), NONE_TENSOR, tensor(2 * k, I32, [1, 4])],
                                struct.pack("<4I", 0, 0, 1, 0))
    o["conv_transpose2d"] = op_block(OP["conv_transpose2d"], [
        tensor(k, F32, [1, 4, 3, 3]), tensor(2 * k, F32, [4, 3, 3, 3]), tensor(3 * k, F32, [6]),
        tensor(4 * k, F32, [1, 6, 8, 7])], conv_attrs(groups=2, stride=(2, 2), pad=(0, 1, 0, 0)))
    o["where_broadcast"] = op_block(OP["where"], [
        tensor(k, U8, [2, 3], [0, 1]), tensor(2 * k, F32, [2, 3]), tensor(3 * k, F32, [2, 3], [0, 0]),
        tensor(4 * k, F32, [2, 3])], quant)
    o["gather_bf16"] = op_block(OP["gather"], [tensor(k, BF16, [3, 10, 4]), tensor(2 * k, I32, [2, 5]),
                                          tensor(3 * k, BF16, [3, 2, 5, 4])], struct.pack("<4I", 1, 0, 0, 0))
    o["qlinear_add_broadcast"] = op_block(OP["qlinear_add"], [
        tensor(k, U8, [2, 3, 4]), tensor(2 * k, F32, [2, 3, 4], [0, 0, 0]), tensor(3 * k, U8, [2, 3, 4], [0, 0, 0]),
        tensor(4 * k, I8, [2, 3, 4], [0, 4, 1]), tensor(5 * k, F32, [2, 3, 4], [0, 0, 0]),
        tensor(6 * k, I8, [2, 3, 4], [0, 0, 0]), tensor(7 * k, F32, [2, 3, 4], [0, 0, 0]),
        tensor(8 * k, U8, [2, 3, 4], [0, 0, 0]), tensor(9 * k, U8, [2, 3, 4])], quant)
    o.update(rule_samples())
    return o


def rule_samples():
    """The sample block of each kind the schema gives rules (schema/ops.py:
    sample): its tensors 64 KiB apart, its attribute words, then reserved
    zero words to a multiple of 16 bytes."""
    codes = {"f32": F32, "f16": F16, "bf16": BF16, "i8": I8, "u8": U8, "i32": I32}
    structs = {st["name"]: st for st in SCHEMA.ATTR_STRUCTS}
    o = {}
    for kind in SCHEMA.KINDS:
        if "sample" not in kind:
            continue
        s = kind["sample"]
        roles = [r.rstrip("?") for r in kind["tensors"]]
        along = kind["rule"].get("per_axis", {})  # a per-axis tensor in its target's shape, as the builder sends it
        one = kind["rule"].get("scalars", {})  # likewise a scalar, stride 0 throughout
        # A per-row or per-column tensor of an [M, K] or [K, N] sample: its
        # matrix's shape, one value per row (strides [1, 0]) or column ([0, 1]).
        rows, columns = kind["rule"].get("per_row", {}), kind["rule"].get("per_column", {})
        like = {**along, **one, **rows, **columns}

        def strides(r):
            return [0] * len(s["shapes"][one[r]]) if r in one else [1, 0] if r in rows else [0, 1] if r in columns \
                else None
        tensors = [tensor((i + 1) * 0x10000, codes[s["dtypes"][r]], s["shapes"][like.get(r, r)], strides(r))
                   for i, r in enumerate(roles)]
        words = []
        fields = structs[kind["fw_attrs"]]["fields"] if kind["fw_attrs"] in structs else []  # QuantAttrs: none
        for name, typ, default, _ in fields:
            v = s.get("attrs", {}).get(name, default)
            enum = next((e for e in SCHEMA.ENUMS if e["name"] == typ), None)
            if enum:  # a value's name: its code
                words.append([x[1] for x in enum["values"]].index(v))
            elif typ == "f32":
                words.append(struct.unpack("<I", struct.pack("<f", float(v)))[0])
            else:
                words.append(1 if v in (True, "true") else 0 if v in (False, "false") else int(v))
        words += [0] * (-len(words) % 4 or (0 if words else 4))
        o[kind["id"]] = op_block(OP[kind["id"]], tensors, struct.pack(f"<{len(words)}I", *words))
    return o


# ---- frame_record_fuzzer: fw::decode_frame_record --------------------------
def plane_layout(w, h, i420):
    align = lambda v: (v + 63) // 64 * 64
    cw, ch = (w + 1) // 2, (h + 1) // 2
    pitch, offset = [align(w), 0, 0], [0, 0, 0]
    at = align(pitch[0] * h)
    if not i420:
        pitch[1], offset[1] = align(2 * cw), at
    else:
        for p in (1, 2):
            pitch[p], offset[p] = align(cw), at
            at += align(pitch[p] * ch)
    return pitch, offset


def frame_record_input(max_w, max_h, i420=False, slots=4, records=16, extra_pages=0, **rec):
    cfg = struct.pack("<BHHBBB4x", 1 if i420 else 0, (max_w - 1) % 8192, (max_h - 1) % 8192,
                      (slots - 1) % 64, (records - 1) % 256, extra_pages)
    kind = rec.get("kind", 1)
    w, h = rec.get("width", max_w), rec.get("height", max_h)
    pitch, offset = plane_layout(w, h, i420) if kind == 1 else ([0] * 3, [0] * 3)
    pitch, offset = rec.get("pitch", pitch), rec.get("offset", offset)
    return cfg + struct.pack("<IIQqII3I3III", kind, rec.get("slot", 0), rec.get("packet", 7), rec.get("pts", 33),
                             w if kind == 1 else 0, h if kind == 1 else 0, *pitch, *offset,
                             rec.get("status", 0), rec.get("detail", 0))


def frame_record_seeds():
    return {
        "nv12_1080p": frame_record_input(1920, 1088, width=1920, height=1080, slot=3),
        "i420_odd": frame_record_input(641, 361, i420=True, extra_pages=2, width=639, height=359, slot=1),
        "too_wide": frame_record_input(640, 360, width=641, height=360),
        "bad_slot": frame_record_input(640, 360, slot=4),
        "moved_plane": frame_record_input(640, 360, offset=[0, 64, 0]),
        "error_corrupt": frame_record_input(640, 360, kind=2, status=16, detail=5),
        "eos": frame_record_input(640, 360, kind=3),
        "unknown_kind": frame_record_input(640, 360, kind=9),
    }


# ---- model_file_fuzzer: runtime/include/tpuhal/rt/model_file.hpp ----------
def model_file(sections, version=1):
    """A compiled-model container: sections are (kind, optional, bytes)."""
    import zlib
    align = lambda v: (v + 63) // 64 * 64
    at = align(64 + 32 * len(sections))
    table, body_at = b"", []
    for kind, optional, data in sections:
        table += struct.pack("<IIQQII", kind, 1 if optional else 0, at, len(data), zlib.crc32(data), 0)
        body_at.append(at)
        at = align(at + len(data))
    out = bytearray(at)
    out[64:64 + len(table)] = table
    for (_, _, data), off in zip(sections, body_at):
        out[off:off + len(data)] = data
    out[0:32] = b"TPUHALMF" + struct.pack("<IIQII", version, 64, at, len(sections), zlib.crc32(table))
    out[60:64] = struct.pack("<I", zlib.crc32(bytes(out[0:60])))
    return bytes(out)


# A compiled model as `tpuhal compile` writes it (docs/model-format.md): one
# 1x1 convolution with a bias and a fused Relu.
compiled_io = (b'{"inputs": [{"name": "x", "dtype": "f32", "shape": [1, 4, 2, 2]}],'
               b' "outputs": [{"name": "y", "dtype": "f32", "shape": [1, 4, 2, 2]}]}')
compiled_graph = (b'{"arena_bytes": 128, "weight_bytes": 80, "tensors": ['
                  b'{"dtype": "f32", "shape": [1, 4, 2, 2], "storage": "arena", "offset": 0, "value": "x"},'
                  b'{"dtype": "f32", "shape": [4, 4, 1, 1], "storage": "weights", "offset": 0},'
                  b'{"dtype": "f32", "shape": [4], "storage": "weights", "offset": 64},'
                  b'{"dtype": "f32", "shape": [1, 4, 2, 2], "storage": "arena", "offset": 64, "value": "y"}],'
                  b' "ops": [{"op": "conv2d", "node": "conv", "operands": {"x": 0, "w": 1, "bias": 2, "y": 3},'
                  b' "attrs": {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "groups": 1,'
                  b' "activation": {"kind": "relu", "alpha": 0, "beta": 0}}}],'
                  b' "inputs": [0], "outputs": [3]}')




def conv_graph(batch):
    """compiled_graph's convolution for `batch` samples, as an object's text."""
    x = batch * 64
    return (b'{"arena_bytes": %d, "weight_bytes": 80, "tensors": ['
            b'{"dtype": "f32", "shape": [%d, 4, 2, 2], "storage": "arena", "offset": 0, "value": "x"},'
            b'{"dtype": "f32", "shape": [4, 4, 1, 1], "storage": "weights", "offset": 0},'
            b'{"dtype": "f32", "shape": [4], "storage": "weights", "offset": 64},'
            b'{"dtype": "f32", "shape": [%d, 4, 2, 2], "storage": "arena", "offset": %d, "value": "y"}],'
            b' "ops": [{"op": "conv2d", "node": "conv", "operands": {"x": 0, "w": 1, "bias": 2, "y": 3},'
            b' "attrs": {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "groups": 1,'
            b' "activation": {"kind": "relu", "alpha": 0, "beta": 0}}}],'
            b' "inputs": [0], "outputs": [3]}') % (2 * x, batch, batch, x)


# The same compiled for batches 1 to 3 (--max-batch 3): the graph runs 3,
# the stages 1 and 2.
stages_io = compiled_io.replace(b"[1, 4, 2, 2]", b"[3, 4, 2, 2]")
stages_json = b'{"stages": [{"batch": 1, "graph": %s}, {"batch": 2, "graph": %s}]}' % (conv_graph(1), conv_graph(2))


def model_file_seeds():
    meta = b"producer=tpuhal compile\nprecision=int8\n"
    weights = bytes(range(256)) * 5
    return {
        "empty": model_file([]),
        "typical": model_file([(1, False, meta), (2, False, b"\x01" * 40), (3, False, b"\x02" * 100),
                               (4, False, weights), (5, False, b"\x03" * 24), (6, True, b"conv1 0.001\n")]),
        "empty_sections": model_file([(3, False, b""), (4, False, b"")]),
        "unknown_optional": model_file([(1, False, meta), (42, True, b"later")]),
        "unknown_required": model_file([(42, False, b"later")]),
        "version_2": model_file([(1, False, meta)], version=2),
        "compiled": model_file([(1, False, b"precision=fp32\n"), (2, False, compiled_io), (3, False, compiled_graph),
                                (4, False, bytes(64 + 16))]),
        "graph_json": compiled_graph,  # straight to the section decoders
        "stages": model_file([(1, False, b"precision=fp32\n"), (2, False, stages_io), (3, False, conv_graph(3)),
                              (4, False, bytes(64 + 16)), (7, True, stages_json)], version=2),
        "stages_json": stages_json,
    }


# ---- firmware images (image.h) and the USB wire format (usb.h) -------------
def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def image(sections, board=1684, fw_version=0x01020003, iface=(0x10000, 0x10002)):
    """sections: (kind, load_address, payload); laid out as build_image does."""
    table_end = 64 + 32 * len(sections)
    at = (table_end + 15) // 16 * 16
    entries, body = b"", bytearray(at)
    for kind, load, payload in sections:
        entries += struct.pack("<IIQQQ", kind, 0, load, at, len(payload))
        body[at:at + len(payload)] = payload
        at = (at + len(payload) + 15) // 16 * 16
        body.extend(bytes(at - len(body)))
    body = body[:at]
    header = struct.pack("<IHHIIIIIIQI5I", 0x57465054, 1, 64, board, fw_version, iface[0], iface[1],
                         len(sections), 0, len(body), 0, 0, 0, 0, 0, 0)
    body[0:64] = header
    body[64:table_end] = entries
    crc = crc32c(bytes(body))
    body[40:44] = struct.pack("<I", crc)
    return bytes(body)


def image_seeds():
    return {
        "one_code": image([(1, 0, b"\x13" * 64)]),
        "three_kinds": image([(1, 0, b"code" * 8), (2, 0x10000, b"data" * 3), (3, 0x20000, b'{"ddr": 3200}')]),
        "max_sections": image([(1 + i % 3, i * 0x1000, bytes([i]) * (i + 1)) for i in range(16)]),
    }


USB_MAGIC = 0x42535554


def usb(type_, tag, a0, a1=0, data=b"", seq=0, flags=0):
    return struct.pack("<IHHIIQ2Q", USB_MAGIC, type_, flags, seq, len(data), tag, a0, a1) + data


def usb_seeds():
    to_board = 0x00  # byte 0: direction bit 0, max_data choice in bits 1-2
    to_host = 0x01
    host_stream = (usb(0x01, 1, 0x40, 0xDEADBEEF) + usb(0x02, 2, 0x44) + usb(0x03, 3, 0x1000, 0, b"\xAA" * 100) +
                   usb(0x04, 4, 0x1000, 100) + usb(0x05, 5, 1 << 48, 0, b"\x55" * 32) +
                   usb(0x05, 6, 1 << 48, 0, b"", 0, 1))
    board_stream = (usb(0x81, 2, 0x44, 7, b"", 1) + usb(0x83, 4, 0x1000, 0, b"\xAA" * 100, 2) +
                    usb(0x84, 9, 1 << 48, 64, b"", 3) + usb(0x85, 10, (1 << 48) + 8, 0, b"\x01" * 8, 4) +
                    usb(0x86, 11, 5, 0x03, b"", 5) + usb(0x90, 12, 0, 0x207, b"", 6))
    upload = usb(0x10, 1, 4096) + usb(0x11, 2, 0, 0, b"\x00" * 2048) + usb(0x11, 3, 2048, 0, b"\x00" * 2048) + \
        usb(0x12, 4, 0x12345678)
    identity = struct.pack("<6I10I", USB_MAGIC, 2, 1684, 0x10002, 0x01020003, 65536, *([0] * 10))
    irq = struct.pack("<IIQ", USB_MAGIC, 0b11, 6)
    return {
        "host_to_board": bytes([to_board]) + host_stream,
        "board_to_host": bytes([to_host]) + board_stream,
        "upload": bytes([to_board]) + upload,
        "small_limit": bytes([to_board | 1 << 1]) + usb(0x03, 1, 0, 0, b"\x01" * 2000),
        "identity": bytes([to_host]) + identity,
        "interrupt": bytes([to_host]) + irq,
    }


# ---- simd_fuzzer: the daemon's protocol (drivers/tpu/transports/simd/protocol) ----------
SIMD_MAGIC, SIMD_VERSION = 0x44534854, 3
LIST, ATTACH, MAP_DMA, UNMAP_DMA, STATS = 1, 2, 3, 4, 5


def simd_record(kind, payload):
    return struct.pack("<BH", kind, len(payload)) + payload


def simd_msg(type_, body=b""):  # kind 1: the fuzzer builds the header
    return simd_record(1, struct.pack("<H", type_) + body)


def simd_msg_memfd(type_, pages, seals, body):  # kind 2: with a memfd
    return simd_record(2, struct.pack("<HHB", type_, pages, seals) + body)


def simd_msg_fd(type_, which, body):  # kind 3: with another descriptor
    return simd_record(3, struct.pack("<HB", type_, which) + body)


def simd_raw(data):  # kind 0: bytes as they are
    return simd_record(0, data)


def simd_seeds():
    header = lambda type_, n, magic=SIMD_MAGIC, version=SIMD_VERSION: struct.pack("<IHHII", magic, version, type_, n, 0)
    attach = lambda board=0: struct.pack("<II", board, 0)
    map_req = lambda iova, offset, size, access: struct.pack("<QQQII", iova, offset, size, access, 0)
    unmap_req = lambda iova, size: struct.pack("<QQ", iova, size)
    sealed = 1  # F_SEAL_SHRINK
    return {
        "list": simd_msg(LIST),
        "stats": simd_msg(STATS),
        "attach": simd_msg(ATTACH, attach()),
        "attach_no_board": simd_msg(ATTACH, attach(9)),
        "attach_twice": simd_msg(ATTACH, attach()) + simd_msg(ATTACH, attach()),
        "attach_list_stats": simd_msg(ATTACH, attach()) + simd_msg(LIST) + simd_msg(STATS),
        "map_without_attach": simd_msg_memfd(MAP_DMA, 4, sealed, map_req(HOST, 0, 16384, 3)),
        "map_unmap": simd_msg(ATTACH, attach()) + simd_msg_memfd(MAP_DMA, 4, sealed, map_req(HOST, 0, 16384, 3)) +
        simd_msg(UNMAP_DMA, unmap_req(HOST, 16384)) + simd_msg(STATS),
        "map_to_the_quota": simd_msg(ATTACH, attach()) + b"".join(
            simd_msg_memfd(MAP_DMA, 16, sealed, map_req(HOST + i * 65536, 0, 65536, 1)) for i in range(6)),
        "map_huge": simd_msg(ATTACH, attach()) + simd_msg_memfd(MAP_DMA, 65535, sealed, map_req(HOST, 0, 65535 * 4096, 3)),
        "map_unsealed": simd_msg(ATTACH, attach()) + simd_msg_memfd(MAP_DMA, 4, 0, map_req(HOST, 0, 16384, 3)),
        "map_outside": simd_msg(ATTACH, attach()) + simd_msg_memfd(MAP_DMA, 4, sealed, map_req(HOST, 8192, 16384, 3)),
        "map_pipe": simd_msg(ATTACH, attach()) + simd_msg_fd(MAP_DMA, 0, map_req(HOST, 0, 4096, 1)),
        "map_two_fds": simd_msg(ATTACH, attach()) + simd_msg_fd(MAP_DMA, 4, map_req(HOST, 0, 4096, 1)),
        "unmap_unknown": simd_msg(ATTACH, attach()) + simd_msg(UNMAP_DMA, unmap_req(HOST, 4096)),
        "unknown_type": simd_msg(77, b"x" * 8) + simd_msg(102),
        "short_header": simd_raw(b"THSD"),
        "bad_magic": simd_raw(header(LIST, 0, magic=0x12345678)),
        "old_version": simd_raw(header(LIST, 0, version=2)),
        "body_mismatch": simd_raw(header(ATTACH, 100) + attach()),
        "oversized": simd_raw(header(LIST, 5000) + b"\0" * 5000),
        "short_bodies": simd_msg(ATTACH, b"\1") + simd_msg(MAP_DMA, b"\1\2") + simd_msg(UNMAP_DMA),
    }


def seeds():
    s = {}
    fill4 = lambda pattern: pattern | 4 << 32

    # ---- command: one valid descriptor per opcode, fenced and plain -------
    c = s["command"] = {}
    c["nop"] = desc(NOP)
    c["nop_fenced"] = desc(NOP, flags=FLAG_FENCE | FLAG_INTERRUPT, seq=7, fence=1)
    c["copy"] = desc(COPY, 0x1000, 0x2000, 4096)
    c["copy_host"] = desc(COPY, HOST, 0x100000, 1 << 20, flags=FLAG_FENCE, fence=42)
    c["copy_sg"] = desc(COPY_SG, 0x4000, 2, 8192)
    c["fill1"] = desc(FILL, 0x1000, 100, 0xAB | 1 << 32)
    c["fill2"] = desc(FILL, 0x1000, 100, 0xBEEF | 2 << 32)
    c["fill4"] = desc(FILL, 0x1000, 4096, fill4(0xDEADBEEF))
    c["wait_ge"] = desc(WAIT_VALUE, 0x3000, 5, 0)
    c["wait_timeline"] = desc(WAIT_VALUE, HOST, 9, 1)
    c["write_value"] = desc(WRITE_VALUE, 0x3000, 0x1234)
    c["timestamp"] = desc(TIMESTAMP, 0x3008, flags=FLAG_FENCE, fence=3)
    c["tensor_inline"] = desc(TENSOR_OP, 0, 200)
    c["tensor_addr"] = desc(TENSOR_OP, 0x8000, 1024)
    c["call"] = desc(CALL, 0x8000, 16, flags=FLAG_FENCE, fence=2)
    c["wait_time"] = desc(WAIT_TIME, 40_000_000)
    c["wait_time_max"] = desc(WAIT_TIME, 1 << 62, flags=FLAG_FENCE, fence=4)

    # ---- op: valid tensor op parameter blocks -------------------------------
    s["op"] = op_seeds()

    # ---- segment: valid scatter-gather elements ---------------------------
    g = s["segment"] = {}
    g["dram"] = struct.pack("<4Q", 0x1000, 0x2000, 4096, 0)
    g["host_to_dram"] = struct.pack("<4Q", HOST, 0x100000, 1 << 20, 0)
    g["max"] = struct.pack("<4Q", 0, 1 << 41, 1 << 40, 0)

    # ---- version: board, driver min, driver max, requested ----------------
    v = s["version"] = {}
    pk = lambda major, minor: major << 16 | minor
    v["same"] = struct.pack("<4I", pk(1, 1), pk(1, 0), pk(1, 1), pk(1, 1))
    v["old_board"] = struct.pack("<4I", pk(1, 0), pk(1, 0), pk(1, 1), pk(1, 0))
    v["new_board"] = struct.pack("<4I", pk(1, 5), pk(1, 0), pk(1, 1), pk(1, 1))
    v["major_mismatch"] = struct.pack("<4I", pk(2, 0), pk(1, 0), pk(1, 1), pk(2, 0))

    # ---- fence_record: failures as the board records them -----------------
    f = s["fence_record"] = {}
    f["dma_fault"] = fence_record(FAILED | 4, 7, COPY, 0, 5, 5, HOST + 0x1000, 1, ts=123456)
    f["bad_sequence"] = fence_record(FAILED, 4, NOP, 0x102, 9, 0, 9, 3)
    f["invalid_opcode"] = fence_record(FAILED | 1, 1, 0x77, 0x100, 2, 2, 0x77, 0)
    f["reserved"] = fence_record(FAILED, 3, COPY, 4, 0, 0, 0xFF, 0)
    f["fence_order"] = fence_record(FAILED | 10, 8, NOP, 0x103, 3, 10, 10, 10)
    f["dependency"] = fence_record(FAILED | 1, 9, WAIT_VALUE, 0, 1, 1, HOST, 7)
    f["unsupported"] = fence_record(FAILED, 10, TENSOR_OP, 0x100, 0, 0, TENSOR_OP, 2)
    f["tensor_shape"] = fence_record(FAILED, 5, TENSOR_OP, 0x200 + 16 + 3, 0, 0, 7, 4)
    f["version"] = fence_record(FAILED, 5, 0, 0x104, 0, 0, 0x20000, 0x10001)
    f["hang"] = fence_record(FAILED | 2, 14, COPY, 0xFFFF, 4, 2, 5_000_000_000, 0)

    # ---- board: ring contents ----------------------------------------------
    b = s["board"] = {}
    data = bytes(range(256)) * 16  # 4 KiB of data, at DRAM_DATA, HOST_RW and HOST_RO
    b["nop_copy_fill"] = board_input(
        [desc(NOP), desc(COPY, DRAM_DATA, 0x20000, 4096), desc(FILL, 0x30000, 4096, fill4(0xA5A5A5A5),
                                                               flags=FLAG_FENCE, fence=1)], data)
    b["every_dma_opcode"] = board_input(
        [desc(NOP, flags=FLAG_FENCE, fence=1),
         desc(COPY, HOST_RO, 0x20000, 1024, flags=FLAG_FENCE, fence=2),
         desc(COPY, 0x20000, HOST_RW + 0x1000, 1024),
         desc(FILL, 0x30000, 100, 0x5A | 1 << 32),
         desc(FILL, 0x30100, 100, 0x1234 | 2 << 32),
         desc(WRITE_VALUE, 0x40000, 77),
         desc(WAIT_VALUE, 0x40000, 77, 0),
         desc(TIMESTAMP, HOST_RW + 8, flags=FLAG_FENCE | FLAG_INTERRUPT, fence=3),
         desc(WAIT_VALUE, STATUS_IOVA, 3, 1)], data, entries_log=1, interrupt=True)
    # copy_sg with its two-segment list in the data (DRAM and host).
    sg = struct.pack("<8Q", DRAM_DATA + 0x800, 0x50000, 256, 0, HOST_RO, 0x50100, 256, 0)
    b["copy_sg_dram_list"] = board_input([desc(COPY_SG, DRAM_DATA, 2, 512, flags=FLAG_FENCE, fence=1)],
                                         sg + data[len(sg):])
    b["copy_sg_host_list"] = board_input([desc(COPY_SG, HOST_RW, 2, 512)], sg + data[len(sg):],
                                         queue=2)
    # kCall of a three-descriptor program in the data.
    program = ring(desc(NOP), desc(FILL, 0x60000, 64, 0xFF | 1 << 32), desc(COPY, 0x60000, 0x61000, 64))
    b["call"] = board_input([desc(CALL, DRAM_DATA, 3, flags=FLAG_FENCE, fence=9)], program)
    # Failures: a bad sequence, a DMA fault, a fence out of order, a tensor op
    # with an inline block, on a copy queue and a compute queue.
    b["bad_sequence"] = bytes([0, 0, 1, 0]) + desc(NOP, seq=5)
    b["dma_fault"] = board_input([desc(COPY, DRAM_BYTES, 0, 64)], interrupt=True)
    b["fence_order"] = board_input([desc(NOP, flags=FLAG_FENCE, fence=5),
                                    desc(NOP, flags=FLAG_FENCE, fence=5)])
    b["tensor_inline_compute"] = board_input([desc(TENSOR_OP, 0, 100), b"\0" * 64, b"\0" * 64])
    b["tensor_on_copy_queue"] = board_input([desc(TENSOR_OP, DRAM_DATA, 100)], data, queue=2)
    b["wait_forever"] = board_input([desc(WAIT_VALUE, 0x70000, 1, 0)])
    # Configurations: the ring at the end of DRAM, a read-only and an
    # unmapped status page, a ring the board must refuse, TAIL past the ring.
    b["ring_at_dram_end"] = board_input([desc(NOP), desc(FILL, DRAM_BYTES - 64, 64, 0xCC | 1 << 32)],
                                        placement=1, entries_log=3, queue=3)
    b["status_read_only"] = board_input([desc(NOP, flags=FLAG_FENCE, fence=1)], page_mode=1)
    b["status_straddling"] = board_input([desc(NOP, flags=FLAG_FENCE, fence=1)], page_offset=65)
    b["status_unmapped"] = board_input([desc(COPY, 0, DRAM_BYTES, 64)], page_mode=2)
    b["ring_refused"] = board_input([desc(NOP)], placement=2)
    b["tail_past_ring"] = board_input([desc(NOP)], tail=17)
    s["model_file"] = model_file_seeds()
    s["frame_record"] = frame_record_seeds()
    s["image"] = image_seeds()
    s["usb"] = usb_seeds()
    s["simd"] = simd_seeds()
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
    ap.add_argument("--profiles", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "..", "simulator", "profiles"))
    args = ap.parse_args()
    all_seeds = seeds()
    # profile: the built-in board profiles.
    all_seeds["profile"] = {}
    for name in sorted(os.listdir(args.profiles)):
        if name.endswith(".json"):
            with open(os.path.join(args.profiles, name), "rb") as fh:
                all_seeds["profile"][name[:-5]] = fh.read()
    for target, files in all_seeds.items():
        d = os.path.join(args.out, target)
        os.makedirs(d, exist_ok=True)
        for name, blob in files.items():
            with open(os.path.join(d, "seed-" + name), "wb") as fh:
                fh.write(blob)
        print(f"{target}: {len(files)} seeds in {os.path.relpath(d)}")


if __name__ == "__main__":
    main()
