"""Tensor ops and programs, compared with NumPy."""
import gc
import json
import math
import mmap
import pathlib
import re

import numpy as np
import pytest

import tpuhal
from tpuhal import ops


def conv2d_ref(x, w, b, stride, pad):
    n, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - kh) // stride + 1
    wo = (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, co, ho, wo), np.float64)
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            y[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return y + b[None, :, None, None]


def test_matmul_matches_numpy(dev, queue):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 16, 24)).astype(np.float32)
    b = rng.standard_normal((24, 8)).astype(np.float32)
    ta, tb = tpuhal.Tensor(dev.upload(a)), tpuhal.Tensor(dev.upload(b))
    assert ta.shape == (2, 16, 24) and ta.dtype == "f32" and ta.contiguous
    y = dev.tensor((2, 16, 8), "f32")
    op = ops.matmul(ta, tb, y)
    assert op.name == "matmul"
    queue.run(op).submit().wait(timeout=10)
    np.testing.assert_allclose(y.download(), a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_options_and_activation(dev, queue):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal((8, 5)).astype(np.float32)
    c = rng.standard_normal((5,)).astype(np.float32)
    y = dev.tensor((4, 5), np.float32)
    op = ops.matmul(tpuhal.Tensor(dev.upload(a)), tpuhal.Tensor(dev.upload(b)), y, transpose_a=True,
                    alpha=0.5, beta=2.0, c=tpuhal.Tensor(dev.upload(c)), activation="relu")
    queue.run(op).submit().wait()
    want = np.maximum(0.5 * a.T @ b + 2.0 * c, 0)
    np.testing.assert_allclose(y.download(), want, rtol=1e-5, atol=1e-5)
    assert (y.download() >= 0).all() and (y.download() > 0).any()


def test_conv2d_matches_numpy(dev, queue):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    y = dev.tensor((1, 4, 5, 5), "f32")
    op = ops.conv2d(tpuhal.Tensor(dev.upload(x)), tpuhal.Tensor(dev.upload(w)), y, strides=2, pads=1,
                    bias=tpuhal.Tensor(dev.upload(bias)))
    queue.run(op).submit().wait()
    np.testing.assert_allclose(y.download(), conv2d_ref(x, w, bias, 2, 1), rtol=1e-4, atol=1e-4)


def test_conv2d_accumulates_into_what_y_holds(dev, queue):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    prior = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    y = dev.tensor((1, 4, 5, 5), "f32")
    y.upload(prior)
    op = ops.conv2d(tpuhal.Tensor(dev.upload(x)), tpuhal.Tensor(dev.upload(w)), y, strides=2, pads=1,
                    activation="relu", accumulate=True)
    queue.run(op).submit().wait()
    want = np.maximum(conv2d_ref(x, w, np.zeros(4, np.float32), 2, 1) + prior, 0)
    np.testing.assert_allclose(y.download(), want, rtol=1e-4, atol=1e-4)


def test_elementwise_broadcast_and_cast(dev, queue):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.array([10, 20, 30, 40], np.int32)
    y = dev.tensor((3, 4), "i32")
    queue.run(ops.add(tpuhal.Tensor(dev.upload(a)), tpuhal.Tensor(dev.upload(b)), y)).submit().wait()
    np.testing.assert_array_equal(y.download(), a + b)
    f = dev.tensor((3, 4), "f16")
    queue.run(ops.cast(y, f)).submit().wait()
    np.testing.assert_array_equal(f.download(), (a + b).astype(np.float16))


def test_comparisons_and_logic_give_u8_ones_and_zeros(dev, queue):
    a = np.array([[-1, 0, 1, 2, np.nan, np.inf]], np.float32)
    b = np.array([[0], [1], [np.nan]], np.float32)  # broadcast to [3, 6]
    ta, tb = tpuhal.Tensor(dev.upload(a)), tpuhal.Tensor(dev.upload(b))
    with np.errstate(invalid="ignore"):
        for name, ref in [("equal", np.equal), ("less", np.less), ("less_equal", np.less_equal),
                          ("greater", np.greater), ("greater_equal", np.greater_equal)]:
            y = dev.tensor((3, 6), "u8")
            op = getattr(ops, name)(ta, tb, y)
            assert op.name == name
            queue.run(op).submit().wait()
            np.testing.assert_array_equal(y.download(), ref(a, b).astype(np.uint8), err_msg=name)
    p = np.array([0, 1, 7, 0, 255], np.uint8)
    q = np.array([0, 0, 3, 9, 1], np.uint8)
    tp, tq = tpuhal.Tensor(dev.upload(p)), tpuhal.Tensor(dev.upload(q))
    for name, ref in [("logical_and", np.logical_and), ("logical_or", np.logical_or),
                      ("logical_xor", np.logical_xor)]:
        y = dev.tensor(p.shape, "u8")
        queue.run(getattr(ops, name)(tp, tq, y)).submit().wait()
        np.testing.assert_array_equal(y.download(), ref(p, q).astype(np.uint8), err_msg=name)
    y = dev.tensor(p.shape, "u8")
    queue.run(ops.logical_not(tp, y)).submit().wait()
    np.testing.assert_array_equal(y.download(), np.logical_not(p).astype(np.uint8))
    with pytest.raises(tpuhal.InvalidArgument, match="less: y is f32; supported: u8"):
        ops.less(ta, tb, dev.tensor((3, 6), "f32"))


def test_unary_maps_match_math(dev, queue):
    x = np.array([-4, -1.5, -0.5, -1e-6, 0, 1e-6, 0.25, 1, 2.5, 6, np.inf, -np.inf], np.float32)
    tx = tpuhal.Tensor(dev.upload(x))
    for name, ref in [("sqrt", np.sqrt), ("exp", np.exp), ("erf", np.vectorize(math.erf))]:
        y = dev.tensor(x.shape, "f32")
        op = getattr(ops, name)(tx, y)
        assert op.name == name
        queue.run(op).submit().wait()
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(y.download(), ref(x.astype(np.float64)), rtol=1e-6, atol=0)
    h = x.astype(np.float16)
    y = dev.tensor(x.shape, "f16")
    queue.run(ops.erf(tpuhal.Tensor(dev.upload(h)), y)).submit().wait()
    want = np.vectorize(math.erf)(h.astype(np.float64)).astype(np.float16)
    np.testing.assert_allclose(y.download(), want, rtol=1e-3, atol=2.0**-24)  # f16 subnormals: 2^-24 apart
    with pytest.raises(tpuhal.InvalidArgument, match="erf: x is i32"):
        ops.erf(dev.tensor((4,), "i32"), dev.tensor((4,), "i32"))


def test_rounding_maps_are_exact(dev, queue):
    x = np.array([-2.5, -1.5, -0.5, -0.49, 0, 0.5, 1.5, 2.5, 2.51, 1e7 + 0.5, 3e38, np.inf, -np.inf, np.nan],
                 np.float32)
    for dtype in ("f32", "f16"):
        xs = x.astype(np.float16) if dtype == "f16" else x
        tx = tpuhal.Tensor(dev.upload(xs))
        for name, ref in [("ceil", np.ceil), ("floor", np.floor), ("round", np.round)]:  # np.round: halves to even
            y = dev.tensor(x.shape, dtype)
            op = getattr(ops, name)(tx, y)
            assert op.name == name
            queue.run(op).submit().wait()
            with np.errstate(invalid="ignore"):
                np.testing.assert_array_equal(y.download(), ref(xs))
    with pytest.raises(tpuhal.InvalidArgument, match="round: x is i32"):
        ops.round(dev.tensor((4,), "i32"), dev.tensor((4,), "i32"))


def test_softmax_and_views(dev, queue):
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    tx = tpuhal.Tensor(dev.upload(x))
    y = dev.tensor((4, 6), "f32")
    queue.run(ops.softmax(tx, y, axis=1)).submit().wait()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y.download(), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    assert tx.reshape(2, 12).shape == (2, 12)
    t = tx.permute(1, 0)
    assert t.shape == (6, 4) and t.strides == (1, 6) and not t.contiguous
    yt = dev.tensor((6, 4), "f32")
    queue.run(ops.transpose(tx, yt, [1, 0])).submit().wait()
    np.testing.assert_array_equal(yt.download(), x.T)


def test_ops_check_operands_before_running(dev):
    a = tpuhal.Tensor(dev.upload(np.zeros((4, 5), np.float32)))
    b = tpuhal.Tensor(dev.upload(np.zeros((6, 3), np.float32)))
    y = dev.tensor((4, 3), "f32")
    with pytest.raises(tpuhal.InvalidArgument) as info:
        ops.matmul(a, b, y)
    assert info.value.code == int(tpuhal.Status.InvalidArgument)
    assert "matmul" in str(info.value)
    with pytest.raises(tpuhal.OutOfRange):
        tpuhal.Tensor(dev.alloc(16), "f32", (5,))
    with pytest.raises(tpuhal.InvalidArgument, match="float64"):
        tpuhal.Tensor(dev.upload(np.zeros(4)))
    with pytest.raises(tpuhal.InvalidArgument, match="give a dtype"):
        tpuhal.Tensor(dev.alloc(16))
    with pytest.raises(tpuhal.InvalidArgument, match="unknown layout"):
        ops.conv2d(a, a, y, layout="chwn")
    with pytest.raises(tpuhal.InvalidArgument, match="unknown activation"):
        ops.activation(a, a, "swish")


def test_hard_swish_activation(dev, queue):
    x = np.linspace(-5, 5, 41, dtype=np.float32)
    tx = tpuhal.Tensor(dev.upload(x))
    for act, alpha, beta in [("hard_swish", 1 / 6, 0.5), (tpuhal.Activation.hard_swish(0.25, 0.4), 0.25, 0.4)]:
        y = dev.tensor(41, "f32")
        queue.run(ops.activation(tx, y, act)).submit().wait()
        want = x * np.clip(np.float32(alpha) * x + np.float32(beta), 0, 1)
        np.testing.assert_allclose(y.download(), want, rtol=1e-6, atol=1e-7)
    assert tpuhal.Activation("hard_swish").kind == "hard_swish"


def test_top_k_argmax_and_where(dev, queue):
    x = np.array([[3, 1, 3, -2, 8], [0, 0, 5, 5, -1]], np.float32)
    tx = tpuhal.Tensor(dev.upload(x))
    values, indices = dev.tensor((2, 3), "f32"), dev.tensor((2, 3), "i32")
    queue.run(ops.top_k(tx, values, indices, axis=1)).submit().wait()
    np.testing.assert_array_equal(indices.download(), [[4, 0, 2], [2, 3, 0]])
    np.testing.assert_array_equal(values.download(), [[8, 3, 3], [5, 5, 0]])
    only = dev.tensor((2, 2), "i32")
    queue.run(ops.top_k(tx, None, only, axis=1, largest=False, last_index=True)).submit().wait()
    np.testing.assert_array_equal(only.download(), [[3, 1], [4, 1]])
    arg = dev.tensor((1, 5), "i32")
    queue.run(ops.argmax(tx, arg, axis=0)).submit().wait()
    np.testing.assert_array_equal(arg.download(), [[0, 0, 1, 1, 0]])
    queue.run(ops.argmin(tx, arg, axis=0, last_index=True)).submit().wait()
    np.testing.assert_array_equal(arg.download(), [[1, 1, 0, 0, 1]])
    with pytest.raises(tpuhal.InvalidArgument, match="argmax: indices has shape"):
        ops.argmax(tx, dev.tensor((2, 2), "i32"), axis=1)

    cond = np.array([1, 0, 1, 0, 0], np.uint8)
    y = dev.tensor((2, 5), "f32")
    queue.run(ops.where(tpuhal.Tensor(dev.upload(cond)), tx, tpuhal.Tensor(dev.upload(-x)), y)).submit().wait()
    np.testing.assert_array_equal(y.download(), np.where(cond.astype(bool), x, -x))
    with pytest.raises(tpuhal.InvalidArgument, match="where: cond is f32"):
        ops.where(tx, tx, tx, y)


def test_gather_takes_along_an_axis_and_refuses_an_index_outside_it(dev):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 6, 3)).astype(np.float32)
    idx = np.array([[5, -1, 0], [2, 2, -6]], np.int32)
    tx, ti = tpuhal.Tensor(dev.upload(x)), tpuhal.Tensor(dev.upload(idx))
    y = dev.tensor((4, 2, 3, 3), "f32")
    queue = dev.queue("compute")
    queue.run(ops.gather(tx, ti, y, axis=1)).submit().wait()
    np.testing.assert_array_equal(y.download(), np.take(x, idx, axis=1))
    table = np.arange(20, dtype=np.int32).reshape(10, 2)
    ids = np.array(7, np.int32)  # a scalar index: y loses the axis
    row = dev.tensor((2,), "i32")
    queue.run(ops.gather(tpuhal.Tensor(dev.upload(table)), tpuhal.Tensor(dev.upload(ids)), row)).submit().wait()
    np.testing.assert_array_equal(row.download(), table[7])
    lut = np.arange(255, -1, -1, dtype=np.uint8)  # a table lookup by byte indices
    codes = np.array([[0, 7, 255], [128, 1, 2]], np.uint8)
    looked = dev.tensor(codes.shape, "u8")
    queue.run(ops.gather(tpuhal.Tensor(dev.upload(lut)), tpuhal.Tensor(dev.upload(codes)), looked)).submit().wait()
    np.testing.assert_array_equal(looked.download(), lut[codes])
    with pytest.raises(tpuhal.InvalidArgument, match="gather: indices is f32; supported: i32, u8, i8"):
        ops.gather(tx, tx, y)
    bad = tpuhal.Tensor(dev.upload(np.array([[0, 6, 0], [0, 0, 0]], np.int32)))
    failing = dev.queue("compute")
    with pytest.raises(tpuhal.Error, match=r"holds the index 6, outside \[-6, 6\)"):
        failing.run(ops.gather(tx, bad, y, axis=1)).submit().wait()


def qlinear_add_ref(a, sa, za, b, sb, zb, sy, zy, dtype):
    """dequantize, add and quantize, each step in float32 (halves to even)."""
    f32 = np.float32
    fa = (a.astype(np.int32) - za).astype(f32) * f32(sa)
    fb = (b.astype(np.int32) - zb).astype(f32) * f32(sb)
    q = np.rint((fa + fb) / f32(sy)).astype(np.int64) + zy
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


def test_qlinear_add_is_dequantize_add_quantize_in_f32(dev, queue):
    rng = np.random.default_rng(12)
    a = rng.integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    b = rng.integers(-128, 128, (1, 1, 7, 3), dtype=np.int8)  # broadcast over N and H
    sa, za, sb, zb, sy, zy = 0.05, 128, 0.02, -3, 0.07, 10

    def scalar(v, dtype):
        return tpuhal.Tensor(dev.upload(np.array(v, dtype)))

    for out in (np.uint8, np.int8):
        y = dev.tensor(a.shape, "u8" if out is np.uint8 else "i8")
        queue.run(ops.qlinear_add(tpuhal.Tensor(dev.upload(a)), scalar(sa, np.float32), scalar(za, np.uint8),
                                  tpuhal.Tensor(dev.upload(b)), scalar(sb, np.float32), scalar(zb, np.int8),
                                  scalar(sy, np.float32), scalar(zy, out), y)).submit().wait()
        np.testing.assert_array_equal(y.download(), qlinear_add_ref(a, sa, za, b, sb, zb, sy, zy, out))
    y = dev.tensor(a.shape, "u8")
    with pytest.raises(tpuhal.InvalidArgument, match="qlinear_add: a_scale must be one value"):
        ops.qlinear_add(tpuhal.Tensor(dev.upload(a)), tpuhal.Tensor(dev.upload(np.ones(3, np.float32))),
                        scalar(za, np.uint8), tpuhal.Tensor(dev.upload(b)), scalar(sb, np.float32),
                        scalar(zb, np.int8), scalar(sy, np.float32), scalar(zy, np.uint8), y)


def qlinear_mul_ref(a, sa, za, b, sb, zb, sy, zy, dtype):
    """dequantize, multiply and quantize, each step in float32 (halves to even)."""
    f32 = np.float32
    fa = (a.astype(np.int32) - za).astype(f32) * f32(sa)
    fb = (b.astype(np.int32) - zb).astype(f32) * f32(sb)
    with np.errstate(over="ignore"):
        v = (fa * fb) / f32(sy)
    q = np.rint(np.clip(v, -4194304, 4194304)).astype(np.int64) + zy
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


# Shapes of a and b (y: their broadcast): an SE block's gate on either side,
# two dense operands, one value, a gate whose rows repeat past one stage of
# the kernel's floats (4096), a long single row split across threads, a
# operand that repeats only along H, and one value per row (a stride-0 last
# dimension).
@pytest.mark.parametrize("ashape,bshape", [((2, 6, 7, 5), (2, 1, 1, 5)), ((1, 1, 1, 48), (1, 9, 11, 48)),
                                           ((3, 4, 5, 6), (3, 4, 5, 6)), ((2, 3, 4, 5), (1, 1, 1, 1)),
                                           ((1, 70, 80, 3), (1, 1, 1, 3)), ((1, 1, 1, 9000), (1, 1, 1, 9000)),
                                           ((1, 1, 1, 9000), (1,)), ((2, 5, 7, 3), (1, 1, 7, 3)),
                                           ((2, 5, 7, 3), (2, 5, 7, 1))])
def test_qlinear_mul_is_dequantize_mul_quantize_in_f32(dev, queue, ashape, bshape):
    rng = np.random.default_rng(13)
    a = rng.integers(0, 256, ashape, dtype=np.uint8)
    b = rng.integers(-128, 128, bshape, dtype=np.int8)
    yshape = np.broadcast_shapes(ashape, bshape)

    def scalar(v, dtype):
        return tpuhal.Tensor(dev.upload(np.array(v, dtype)))

    for out, (sa, za, sb, zb, sy, zy) in ((np.uint8, (0.05, 128, 0.02, -3, 0.0007, 10)),
                                          (np.int8, (0.3, 7, 0.9, 100, 0.01, -20)),
                                          (np.uint8, (3e30, 0, 3e30, 0, 1e-30, 0))):  # products past f32
        y = dev.tensor(yshape, "u8" if out is np.uint8 else "i8")
        queue.run(ops.qlinear_mul(tpuhal.Tensor(dev.upload(a)), scalar(sa, np.float32), scalar(za, np.uint8),
                                  tpuhal.Tensor(dev.upload(b)), scalar(sb, np.float32), scalar(zb, np.int8),
                                  scalar(sy, np.float32), scalar(zy, out), y)).submit().wait()
        np.testing.assert_array_equal(y.download(), qlinear_mul_ref(a, sa, za, b, sb, zb, sy, zy, out))


def test_qlinear_mul_of_a_permuted_view_takes_its_elements_where_they_are(dev, queue):
    # a seen through permute: not dense along the result's rows, so the op
    # goes element by element, with the same arithmetic.
    rng = np.random.default_rng(14)
    a = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
    b = rng.integers(0, 256, (3, 4, 5), dtype=np.uint8)
    y = dev.tensor((3, 4, 5), "u8")

    def scalar(v, dtype):
        return tpuhal.Tensor(dev.upload(np.array(v, dtype)))

    queue.run(ops.qlinear_mul(tpuhal.Tensor(dev.upload(a)).permute(2, 1, 0), scalar(0.1, np.float32),
                              scalar(3, np.uint8), tpuhal.Tensor(dev.upload(b)), scalar(0.2, np.float32),
                              scalar(200, np.uint8), scalar(0.05, np.float32), scalar(128, np.uint8),
                              y)).submit().wait()
    np.testing.assert_array_equal(y.download(),
                                  qlinear_mul_ref(a.transpose(2, 1, 0), 0.1, 3, b, 0.2, 200, 0.05, 128, np.uint8))


def test_qlinear_mul_refuses_what_does_not_broadcast_and_scales_that_are_not_one_value(dev):
    a = tpuhal.Tensor(dev.upload(np.zeros((2, 3, 4, 5), np.uint8)))
    one = tpuhal.Tensor(dev.upload(np.array(1, np.float32)))
    zero = tpuhal.Tensor(dev.upload(np.array(0, np.uint8)))
    y = dev.tensor((2, 3, 4, 5), "u8")
    with pytest.raises(tpuhal.InvalidArgument, match="qlinear_mul"):
        ops.qlinear_mul(a, one, zero, tpuhal.Tensor(dev.upload(np.zeros((2, 3, 4, 4), np.uint8))), one, zero, one,
                        zero, y)
    with pytest.raises(tpuhal.InvalidArgument, match="qlinear_mul: b_scale must be one value"):
        ops.qlinear_mul(a, one, zero, a, tpuhal.Tensor(dev.upload(np.ones(5, np.float32))), zero, one, zero, y)


def qlinear_global_avg_pool_ref(x, sx, zx, sy, zy, dtype):
    """x [N, H, W, C] dequantized, summed in float32 tap by tap in (row, column) order, divided by H * W, and
    quantized (halves to even)."""
    f32 = np.float32
    deq = (x.astype(np.int32) - zx).astype(f32) * f32(sx)
    acc = np.zeros((x.shape[0], x.shape[3]), f32)
    for h in range(x.shape[1]):
        for w in range(x.shape[2]):
            acc = acc + deq[:, h, w, :]
    mean = acc / f32(x.shape[1] * x.shape[2])
    q = np.rint(np.clip(mean / f32(sy), -4194304, 4194304)).astype(np.int64) + zy
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype).reshape(x.shape[0], 1, 1, x.shape[3])


# x's dtype, its NHWC shape and how it is held: dense; its channels apart
# (an NCHW tensor permuted to NHWC); rows not one after another (a slice of
# W); channel blocks past one of 64. Scales that saturate the output too.
@pytest.mark.parametrize("xdtype,shape,held", [(np.uint8, (2, 7, 9, 5), "dense"), (np.int8, (1, 14, 14, 200), "dense"),
                                               (np.uint8, (2, 6, 5, 70), "nchw"), (np.int8, (3, 4, 6, 9), "slice"),
                                               (np.uint8, (1, 112, 112, 32), "dense")])
def test_qlinear_global_avg_pool_gives_the_bits_of_dequantize_pool_and_quantize(dev, queue, xdtype, shape, held):
    rng = np.random.default_rng(15)
    info = np.iinfo(xdtype)
    n, h, w, c = shape

    def scalar(v, dtype):
        return tpuhal.Tensor(dev.upload(np.array(v, dtype)))

    if held == "nchw":
        full = rng.integers(info.min, info.max + 1, (n, c, h, w), dtype=xdtype)
        x, tx = full.transpose(0, 2, 3, 1), tpuhal.Tensor(dev.upload(full)).permute(0, 2, 3, 1)
    elif held == "slice":
        full = rng.integers(info.min, info.max + 1, (n, h, w + 3, c), dtype=xdtype)
        x = full[:, :, 1:w + 1, :]
        tx = tpuhal.Tensor(dev.upload(full), "i8", shape, (h * (w + 3) * c, (w + 3) * c, c, 1), c)  # 1-byte elements
    else:
        x = rng.integers(info.min, info.max + 1, shape, dtype=xdtype)
        tx = tpuhal.Tensor(dev.upload(x))
    xz = 3 if xdtype is np.uint8 else -5
    for out, (sx, sy, zy) in ((np.uint8, (0.05, 0.01, 128)), (np.int8, (0.3, 0.02, -7)), (np.uint8, (1.0, 1e-4, 0))):
        odt = "u8" if out is np.uint8 else "i8"
        y = dev.tensor((n, 1, 1, c), odt)
        queue.run(ops.qlinear_global_avg_pool(tx, scalar(sx, np.float32), scalar(xz, xdtype), scalar(sy, np.float32),
                                              scalar(zy, out), y)).submit().wait()
        got = y.download()
        np.testing.assert_array_equal(got, qlinear_global_avg_pool_ref(x, sx, xz, sy, zy, out))
        # The three ops it stands for, on the board: the same bytes.
        f = dev.tensor(shape, "f32")
        pooled = dev.tensor((n, 1, 1, c), "f32")
        q = dev.tensor((n, 1, 1, c), odt)
        queue.run(ops.dequantize(tx, scalar(sx, np.float32), scalar(xz, xdtype), f)).run(
            ops.avg_pool2d(f, pooled, kernel=(h, w), layout="nhwc")).run(
            ops.quantize(pooled, scalar(sy, np.float32), scalar(zy, out), q)).submit().wait()
        np.testing.assert_array_equal(got, q.download())


def test_qlinear_global_avg_pool_of_an_image_of_no_pixels_gives_the_zero_point(dev, queue):
    # Each mean of nothing is 0 (as the f32 pool gives), quantized: the output's zero point. X, and its scale and
    # zero point seen in X's shape, hold no bytes at all.
    def scalar(v, dtype):
        return tpuhal.Tensor(dev.upload(np.array(v, dtype)))

    y = dev.tensor((2, 1, 1, 5), "i8")
    queue.run(ops.qlinear_global_avg_pool(dev.tensor((2, 0, 3, 5), "u8"), scalar(0.5, np.float32),
                                          scalar(3, np.uint8), scalar(0.25, np.float32), scalar(-7, np.int8),
                                          y)).submit().wait()
    np.testing.assert_array_equal(y.download(), np.full((2, 1, 1, 5), -7, np.int8))


def test_qlinear_global_avg_pool_refuses_a_pooled_shape_and_scales_that_are_not_one_value(dev):
    x = tpuhal.Tensor(dev.upload(np.zeros((2, 3, 4, 5), np.uint8)))
    one = tpuhal.Tensor(dev.upload(np.array(1, np.float32)))
    zero = tpuhal.Tensor(dev.upload(np.array(0, np.uint8)))
    with pytest.raises(tpuhal.InvalidArgument, match="qlinear_global_avg_pool"):
        ops.qlinear_global_avg_pool(x, one, zero, one, zero, dev.tensor((2, 1, 1, 4), "u8"))
    with pytest.raises(tpuhal.InvalidArgument, match="qlinear_global_avg_pool"):
        ops.qlinear_global_avg_pool(x, one, zero, one, zero, dev.tensor((2, 3, 1, 5), "u8"))
    with pytest.raises(tpuhal.InvalidArgument, match="qlinear_global_avg_pool: x_scale must be one value"):
        ops.qlinear_global_avg_pool(x, tpuhal.Tensor(dev.upload(np.ones(5, np.float32))), zero, one, zero,
                                    dev.tensor((2, 1, 1, 5), "u8"))


@pytest.mark.parametrize("aligned,ratio,scale", [(True, 2, 0.25), (False, 0, 0.5), (True, 0, 1.0)])
def test_roi_align_matches_torchvision(dev, queue, aligned, ratio, scale):
    """The average mode against torchvision.ops.roi_align, an implementation
    of its own (aligned is ONNX's half_pixel; sampling_ratio 0 is its
    adaptive grid), on a detector's feature map and regions in image pixels."""
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    tv_ops = pytest.importorskip("torchvision.ops", reason="python3-torchvision is not installed")
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 8, 20, 24)).astype(np.float32)
    corners = rng.uniform(-10, 110, (30, 4)).astype(np.float32)
    rois = np.concatenate([np.minimum(corners[:, :2], corners[:, 2:]), np.maximum(corners[:, :2], corners[:, 2:])], 1)
    idx = rng.integers(0, 2, 30).astype(np.int32)
    y = dev.tensor((30, 8, 7, 7), "f32")
    queue.run(ops.roi_align(tpuhal.Tensor(dev.upload(x)), tpuhal.Tensor(dev.upload(rois)),
                            tpuhal.Tensor(dev.upload(idx)), y, sampling_ratio=ratio, spatial_scale=scale,
                            half_pixel=aligned)).submit().wait()
    boxes = torch.from_numpy(np.concatenate([idx[:, None].astype(np.float32), rois], 1))
    want = tv_ops.roi_align(torch.from_numpy(x), boxes, (7, 7), spatial_scale=scale, sampling_ratio=ratio,
                            aligned=aligned).numpy()
    np.testing.assert_allclose(y.download(), want, rtol=1e-5, atol=1e-6)


def test_roi_align_of_an_empty_image_gives_zeros(dev, queue):
    rois = tpuhal.Tensor(dev.upload(np.array([[0, 0, 2, 2], [1, 1, 3, 3]], np.float32)))
    idx = tpuhal.Tensor(dev.upload(np.array([0, 0], np.int32)))
    for shape in ((1, 2, 0, 4), (1, 2, 3, 0)):
        for mode in ("avg", "max"):
            y = dev.tensor((2, 2, 2, 2), "f32")
            queue.run(ops.roi_align(dev.tensor(shape, "f32"), rois, idx, y, mode=mode)).submit().wait()
            np.testing.assert_array_equal(y.download(), np.zeros((2, 2, 2, 2), np.float32))


def test_roi_align_refuses_a_batch_index_outside_the_batch_when_it_runs(dev):
    x = tpuhal.Tensor(dev.upload(np.ones((2, 1, 4, 4), np.float32)))
    rois = tpuhal.Tensor(dev.upload(np.array([[0, 0, 2, 2]], np.float32)))
    idx = tpuhal.Tensor(dev.upload(np.array([2], np.int32)))
    with pytest.raises(tpuhal.InvalidArgument, match="roi_align: sampling_ratio is -1; expected 0 to 65536"):
        ops.roi_align(x, rois, idx, dev.tensor((1, 1, 2, 2), "f32"), sampling_ratio=-1)
    with pytest.raises(tpuhal.Error, match=r"holds the index 2, outside \[-2, 2\)"):
        dev.queue("compute").run(ops.roi_align(x, rois, idx, dev.tensor((1, 1, 2, 2), "f32"))).submit().wait()


def test_the_roi_align_benchmark_measures_both_sides_and_agrees_with_torchvision():
    """scripts/roi-align-bench.py, small: its figures are not checked (benchmarks report them); that it
    measures both sides and that they agree, is."""
    pytest.importorskip("torchvision", reason="python3-torchvision is not installed")
    import subprocess
    import sys
    script = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "roi-align-bench.py"
    run = subprocess.run([sys.executable, str(script), "--regions", "20", "--channels", "8", "--json"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    assert figures["device_ms"] > 0 and figures["torchvision_ms"] > 0
    assert figures["max_abs_difference"] <= 1e-5


def test_every_op_has_its_stub():
    import ast
    import pathlib

    stubs = ast.parse((pathlib.Path(tpuhal.__file__).parent / "ops.pyi").read_text())
    stubbed = {n.name for n in stubs.body if isinstance(n, ast.FunctionDef)}
    public = {name for name in dir(ops) if not name.startswith("_") and callable(getattr(ops, name))}
    assert public - stubbed == set(), "tpuhal.ops functions without a stub in ops.pyi"
    assert stubbed - public == set(), "stubs in ops.pyi of no tpuhal.ops function"


_REQUIRED = "(no default)"


def _default(text):
    """A default as a value (tuples as lists, numbers as the f32 the
    binding holds), or the text where it is not a literal."""
    import ast
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text

    def f32(x):
        return float(np.float32(x)) if isinstance(x, float) else x
    return [f32(x) for x in v] if isinstance(v, (tuple, list)) else f32(v)


def _signature_params(doc):
    """(name, keyword-only, default or _REQUIRED) per parameter of a pybind11
    signature line: "f(x: T, *, k: int = 1) -> Op"."""
    text = doc.split("\n")[0]
    body = text[text.index("(") + 1:text.rindex(") -> ")]
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(body):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    parts.append(body[start:].strip())
    out, kw = [], False
    for p in parts:
        if p == "*":
            kw = True
            continue
        out.append((p.split(":")[0].strip(), kw, _default(p.split(" = ", 1)[1]) if " = " in p else _REQUIRED))
    return out


def test_every_stub_takes_what_its_function_takes():
    import ast
    import pathlib

    stubs = ast.parse((pathlib.Path(tpuhal.__file__).parent / "ops.pyi").read_text())
    checked = 0
    for f in (n for n in stubs.body if isinstance(n, ast.FunctionDef)):
        a = f.args
        first = len(a.args) - len(a.defaults)
        positional = [(x.arg, False, _default(ast.unparse(a.defaults[i - first])) if i >= first else _REQUIRED)
                      for i, x in enumerate(a.args)]
        keywords = [(x.arg, True, _default(ast.unparse(d)) if d is not None else _REQUIRED)
                    for x, d in zip(a.kwonlyargs, a.kw_defaults)]
        assert positional + keywords == _signature_params(getattr(ops, f.name).__doc__), f.name
        checked += 1
    assert checked >= 60


def test_conv_transpose2d_doubles_the_size(dev, queue):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = rng.standard_normal((2, 1, 2, 2)).astype(np.float32)
    y = dev.tensor((1, 1, 6, 6), "f32")
    queue.run(ops.conv_transpose2d(tpuhal.Tensor(dev.upload(x)), tpuhal.Tensor(dev.upload(w)), y, strides=2)
              ).submit().wait()
    # stride 2 and a 2x2 kernel: each input pixel paints its own 2x2 block.
    want = np.einsum("nchw,cokl->nohkwl", x.astype(np.float64), w.astype(np.float64)).reshape(1, 1, 6, 6)
    np.testing.assert_allclose(y.download(), want, rtol=1e-5, atol=1e-6)


def test_program_records_and_replays(dev, queue):
    x = np.arange(8, dtype=np.float32) - 4
    tx = tpuhal.Tensor(dev.upload(x))
    h = dev.tensor(8, "f32")
    y = dev.tensor(8, "f32")
    seen = []

    def body(b):
        seen.append(b)
        b.run(ops.relu(tx, h)).run(ops.mul(h, h, y))

    program = dev.record(body)
    assert len(program) == 2
    queue.run(program).submit().wait()
    np.testing.assert_array_equal(y.download(), np.maximum(x, 0) ** 2)
    tx.upload(-x)  # new input, same buffer
    queue.batch().run(program).submit().wait()
    np.testing.assert_array_equal(y.download(), np.maximum(-x, 0) ** 2)
    with pytest.raises(tpuhal.FailedPrecondition, match="returned"):
        seen[0].run(ops.relu(tx, h))  # the body's batch is gone


def test_program_body_errors_propagate(dev):
    with pytest.raises(ZeroDivisionError):
        dev.record(lambda b: 1 / 0)
    with pytest.raises(tpuhal.InvalidArgument, match="no commands"):
        dev.record(lambda b: None)
    with pytest.raises(tpuhal.FailedPrecondition, match="program"):
        dev.record(lambda b: b.submit())


def test_op_keeps_imported_operands_alive(dev, queue):
    m = mmap.mmap(-1, 4096)
    a = np.frombuffer(m, np.float32)
    a[:] = 3.0
    t = tpuhal.Tensor(tpuhal.from_dlpack(a, dev, copy=False))
    y = dev.tensor(1024, "f32")
    op = ops.neg(t, y)
    del a, t, m
    gc.collect()
    queue.run(op).submit().wait()
    assert (y.download() == -3.0).all()


def test_the_timing_model_costs_ops_copies_and_frames_without_running_them(dev, tmp_path):
    # sim:tiny's model: the same integers tests/hal/timing_test.cpp pins
    # (a 3x3 convolution whose fixed costs exceed its arithmetic and data).
    conv = ops.conv2d(dev.tensor((1, 3, 8, 8), "f32"), dev.tensor((16, 3, 3, 3), "f32"), dev.tensor((1, 16, 8, 8), "f32"),
                      pads=1)
    assert dev.modelled(conv) == {"ns": 3064, "compute_ns": 864, "memory_ns": 108, "overhead_ns": 2200,
                                  "bound": "overhead"}
    mm = ops.matmul(dev.tensor((64, 128), "f32"), dev.tensor((128, 256), "f32"), dev.tensor((64, 256), "f32"))
    assert dev.modelled(mm)["ns"] == 67736
    copy = dev.modelled_copy(1 << 20, "host_pinned", "device")
    assert copy["ns"] == max(copy["compute_ns"], copy["memory_ns"]) + copy["overhead_ns"] > 0
    assert dev.modelled_copy(1 << 21)["ns"] > copy["ns"]
    assert dev.modelled_decode_ns("h264", "I", 1920, 1080) > 0
    with pytest.raises(tpuhal.InvalidArgument, match="frame_type must be 'I', 'P' or 'B', not 'X'"):
        dev.modelled_decode_ns("h264", "X", 1920, 1080)
    # The same board without timing.model in its profile has no model.
    profile = json.loads((pathlib.Path(__file__).parents[3] / "simulator/profiles/tiny.json").read_text())
    del profile["timing"]
    path = tmp_path / "untimed.json"
    path.write_text(json.dumps(profile))
    with tpuhal.open(f"sim:{path}") as untimed:
        x = untimed.tensor((1, 3, 8, 8), "f32")
        op = ops.conv2d(x, untimed.tensor((16, 3, 3, 3), "f32"), untimed.tensor((1, 16, 8, 8), "f32"), pads=1)
        assert untimed.modelled(op) is None
        assert untimed.modelled_copy(1 << 20) is None
        assert untimed.modelled_decode_ns("h264", "I", 1920, 1080) is None


def op_schema():
    """schema/ops.py of this checkout: the kinds whose functions it generates."""
    import importlib.util

    path = pathlib.Path(__file__).resolve().parents[3] / "schema" / "ops.py"
    spec = importlib.util.spec_from_file_location("tpuhal_op_schema", path)
    schema = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(schema)
    return schema


NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "u8": np.uint8, "i32": np.int32}


def filled(dev, dtype, shape, value):
    """A tensor of `dtype` (a schema name) holding `value`; bf16 from f32, by the board."""
    if dtype in NUMPY_DTYPES:
        return tpuhal.Tensor(dev.upload(np.full(shape, value, NUMPY_DTYPES[dtype])))
    y = dev.tensor(shape, dtype)
    queue = dev.queue("compute")
    queue.run(ops.cast(filled(dev, "f32", shape, value), y)).submit().wait(timeout=10)
    return y


def test_every_kind_with_rules_runs_its_sample_and_refuses_other_dtypes(dev, queue):
    # The generated functions (schema/ops.py: a kind's rule and sample):
    # tensors positional, but those the rule takes after the output
    # ("trailing") by keyword, as attributes are; the op named as the kind.
    kinds = [k for k in op_schema().KINDS if "rule" in k]
    assert kinds
    snake = lambda role: re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", role).lower()  # AScale: a_scale

    def call(build, kind, given):
        trailing = kind["rule"].get("trailing", [])
        positional = [given[r] for r in given if r not in trailing]
        return build(*positional, **{snake(r): given[r] for r in trailing}, **kind["sample"].get("attrs", {}))

    for kind in kinds:
        sample, roles = kind["sample"], [r.rstrip("?") for r in kind["tensors"]]
        build = getattr(ops, kind["id"])
        given = {r: filled(dev, sample["dtypes"][r], sample["shapes"][r], 1) for r in roles[:-1]}
        out = roles[-1]
        y = filled(dev, sample["dtypes"][out], sample["shapes"][out], 77)
        before = y.download()
        op = call(build, kind, {**given, out: y})
        assert op.name == kind["id"]
        queue.run(op).submit().wait(timeout=10)
        assert (y.download() != before).any(), f"{kind['id']} left its output as it was"
        # The first tensor whose dtype list leaves a dtype out, in that dtype.
        role, other = next((r, d) for r in roles for d in NUMPY_DTYPES
                           if isinstance(kind["rule"]["dtypes"][r], list) and d not in kind["rule"]["dtypes"][r])
        given[out] = y
        given[role] = filled(dev, other, sample["shapes"][role], 1)
        with pytest.raises(tpuhal.InvalidArgument, match=f"{kind['id']}: {snake(role)} is {other}; supported"):
            call(build, kind, given)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_cumsum_matches_numpy(dev, queue, dtype):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((3, 5, 4)) * 100).astype(dtype)
    tx = tpuhal.Tensor(dev.upload(x))
    for axis in (0, 1, -1):
        for exclusive in (False, True):
            for reverse in (False, True):
                y = dev.tensor(x.shape, dtype)
                queue.run(ops.cumsum(tx, y, axis=axis, exclusive=exclusive, reverse=reverse)).submit().wait()
                # numpy adds float32 in order, in float32: the same bits.
                src = np.flip(x, axis) if reverse else x
                want = np.cumsum(src, axis=axis, dtype=dtype)
                if exclusive:
                    want = np.concatenate([np.zeros_like(np.take(want, [0], axis)),
                                           np.delete(want, -1, axis)], axis)
                if reverse:
                    want = np.flip(want, axis)
                np.testing.assert_array_equal(y.download(), want, err_msg=f"axis {axis} {exclusive} {reverse}")
    with pytest.raises(tpuhal.InvalidArgument, match="cumsum: axis 3 is out of range for rank 3"):
        ops.cumsum(tx, dev.tensor(x.shape, dtype), axis=3)
