"""8-bit pools from Python: fp8_e4m3 / fp8_e5m2 bytes in uint8 tensors (kv_dtype names the
format), int8 in int8 tensors, with k_scale / v_scale per tensor or per kv head. write_kv must
store exactly the bytes the C++ HostKVCache stores for the same K/V and scales, attention must
give exactly its output, and both must agree with a numpy decode of the bytes written here
(e4m3 / e5m2 fields, int8 two's complement) within the format's rounding."""

import numpy as np
import pytest

import pagedkv as pk
from pagedkv import _pagedkv

H, KH, D, BS, NB = 6, 2, 16, 8, 7  # GQA group 3
TABLES = np.array([[3, 0, 5], [1, 6, -1], [4, -1, -1]], np.int32)
LENS = np.array([20, 9, 1], np.int32)
FORMATS = {"fp8_e4m3": (np.uint8, 448.0), "fp8_e5m2": (np.uint8, 57344.0), "int8": (np.int8, 127.0)}


def decode_table(kv_dtype):
    """Value of each of the 256 fp8 codes, from the format's fields (OCP OFP8)."""
    codes = np.arange(256)
    man, bias = (3, 7) if kv_dtype == "fp8_e4m3" else (2, 15)
    e, m = (codes >> man) & ((1 << (7 - man)) - 1), codes & ((1 << man) - 1)
    val = np.where(e == 0, m * 2.0 ** (1 - bias - man), ((1 << man) + m) * 2.0 ** (e - bias - man))
    top = (1 << (7 - man)) - 1
    special = (e == top) & (m == (1 << man) - 1) if kv_dtype == "fp8_e4m3" else e == top
    val = np.where(special, np.nan, val)
    return np.where(codes & 0x80, -val, val)


def dequantize(raw, kv_dtype, scale):
    """raw [..., KH, D] stored bytes -> float64 values x = decoded * scale[kv head]."""
    codes = raw.view(np.uint8)
    dec = (codes.view(np.int8).astype(np.float64) if kv_dtype == "int8"
           else decode_table(kv_dtype)[codes.astype(np.int64)])
    return dec * scale.reshape(KH, 1)


def inputs(kv_dtype, per_head, seed=0):
    rng = np.random.default_rng(seed)
    n = int(LENS.sum())
    key = (rng.standard_normal((n, KH, D)) * [[2.0], [0.25]]).astype(np.float32)
    value = rng.standard_normal((n, KH, D)).astype(np.float32)
    slots = np.concatenate([TABLES[s][p // BS] * BS + p % BS
                            for s, L in enumerate(LENS) for p in [np.arange(L)]]).astype(np.int64)
    fmax = FORMATS[kv_dtype][1]
    amax = lambda x: np.abs(x).max(axis=(0, 2)) if per_head else np.abs(x).max().reshape(1)
    k_scale = (amax(key) / fmax).astype(np.float32)
    v_scale = (amax(value) / fmax * 1.5).astype(np.float32)  # not calibrated: headroom
    q = rng.standard_normal((len(LENS), H, D)).astype(np.float32)
    return key, value, slots, q, k_scale, v_scale


def pools(kv_dtype, layout, combined, fill=0):
    tdtype = FORMATS[kv_dtype][0]
    inner = (BS, KH, D) if layout == "NHD" else (KH, BS, D)
    if combined:
        c = np.full((NB, 2) + inner, fill, tdtype)
        return c, None, c[:, 0], c[:, 1]
    k, v = np.full((NB,) + inner, fill, tdtype), np.full((NB,) + inner, fill, tdtype)
    return k, v, k, v


def reference(q, keys, values):
    """numpy attention per sequence over [n, KH, D] float64 K/V."""
    out = np.zeros(q.shape, np.float64)
    start = 0
    for s, L in enumerate(LENS):
        kk, vv = keys[start:start + L], values[start:start + L]
        for h in range(H):
            sc = kk[:, h // (H // KH)] @ q[s, h] / np.sqrt(D)
            w = np.exp(sc - sc.max())
            out[s, h] = (w / w.sum()) @ vv[:, h // (H // KH)]
        start += L
    return out


@pytest.mark.parametrize("kv_dtype", list(FORMATS))
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("layout, combined", [("NHD", False), ("HND", False), ("NHD", True),
                                              ("HND", True)])
def test_write_and_decode_equal_the_host_kv_cache(kv_dtype, per_head, layout, combined):
    key, value, slots, q, ks, vs = inputs(kv_dtype, per_head)
    k, v, kview, vview = pools(kv_dtype, layout, combined)
    quant = dict(kv_dtype=kv_dtype if kv_dtype != "int8" or per_head else None, k_scale=ks,
                 v_scale=vs)
    pk.write_kv(key, value, k, v, slots, layout=layout, **quant)
    out = pk.paged_decode_attention(q, k, v, TABLES, LENS, layout=layout, **quant)
    want, kb, vb = _pagedkv._host_kv_cache_attention(
        key, value, slots, q, TABLES, LENS, None, kv_dtype, NB, BS, layout, ks.tolist(),
        vs.tolist())
    np.testing.assert_array_equal(kview.view(np.uint8).reshape(NB, -1), kb)
    np.testing.assert_array_equal(vview.view(np.uint8).reshape(NB, -1), vb)
    np.testing.assert_array_equal(out, want)
    # Independent of the C++ conversions: the bytes decode (numpy) to K/V within half a step,
    # and attention over those decoded values is the kernel's output.
    stored = lambda pool: (pool if layout == "NHD" else pool.transpose(0, 2, 1, 3)).reshape(
        NB * BS, KH, D)[slots]
    deq_k = dequantize(stored(kview), kv_dtype, np.resize(ks, KH))
    deq_v = dequantize(stored(vview), kv_dtype, np.resize(vs, KH))
    for deq, x, s in ((deq_k, key, np.resize(ks, KH)), (deq_v, value, np.resize(vs, KH))):
        if kv_dtype == "int8":
            step = np.broadcast_to(s.reshape(KH, 1), x.shape)
        else:
            man = 3 if kv_dtype == "fp8_e4m3" else 2
            step = np.maximum(np.abs(x) * 2.0 ** -man, s.reshape(KH, 1) * 2.0 ** (
                (-6 if kv_dtype == "fp8_e4m3" else -14) - man))
        assert np.all(np.abs(deq - x) <= 0.5 * step * (1 + 1e-6))
    np.testing.assert_allclose(out, reference(q.astype(np.float64), deq_k, deq_v), rtol=1e-5,
                               atol=2e-6)


@pytest.mark.parametrize("kv_dtype", list(FORMATS))
def test_prefill_equals_the_host_kv_cache(kv_dtype):
    key, value, slots, _, ks, vs = inputs(kv_dtype, True, seed=1)
    k, v, _, _ = pools(kv_dtype, "NHD", False)
    pk.write_kv(key, value, k, v, slots, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    m = pk.KVCacheManager(pk.KVCacheManagerConfig(NB, BS))
    qs = [0, 4, 13, 14]  # chunks of 4, 9 (whole prompt) and 1 rows
    q = np.random.default_rng(2).standard_normal((qs[-1], H, D)).astype(np.float32)
    want, _, _ = _pagedkv._host_kv_cache_attention(
        key, value, slots, q, TABLES, LENS, qs, kv_dtype, NB, BS, "NHD", ks.tolist(), vs.tolist())
    # A metadata object with these rows: three sequences of the same lengths and chunks.
    for s, L in enumerate(LENS):
        m.add_sequence(s, [7] * int(L))
    meta = m.batch_metadata([0, 1, 2], [4, 9, 1])
    assert meta.query_start_loc.tolist() == qs
    # The manager's tables differ from TABLES: rewrite the pools through its slots.
    k2, v2, _, _ = pools(kv_dtype, "NHD", False)
    slots2 = np.concatenate([m.block_table(s)[np.arange(L) // BS] * BS + np.arange(L) % BS
                             for s, L in enumerate(LENS)]).astype(np.int64)
    pk.write_kv(key, value, k2, v2, slots2, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    got = pk.paged_prefill_attention(q, k2, v2, meta, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    np.testing.assert_array_equal(got, want)


def test_copy_and_swap_move_the_bytes_and_attention_reads_the_copy():
    key, value, slots, q, ks, vs = inputs("fp8_e5m2", False, seed=3)
    k, v, _, _ = pools("fp8_e5m2", "NHD", False)
    quant = dict(kv_dtype="fp8_e5m2", k_scale=ks, v_scale=vs)
    pk.write_kv(key, value, k, v, slots, **quant)
    want = pk.paged_decode_attention(q, k, v, TABLES, LENS, **quant)
    pk.copy_blocks([(k, v)], np.array([[3, 2]], np.int32))  # no kv_dtype: bytes are bytes
    np.testing.assert_array_equal(k[2], k[3])
    moved = TABLES.copy()
    moved[0, 0] = 2
    np.testing.assert_array_equal(pk.paged_decode_attention(q, k, v, moved, LENS, **quant), want)
    hk, hv, _, _ = pools("fp8_e5m2", "HND", False)
    pk.swap_blocks([(k, v)], [(hk, hv)], np.array([[0, 0], [5, 5]], np.int32), dst_layout="HND")
    np.testing.assert_array_equal(hk[5], k[5].transpose(1, 0, 2))


def test_torch_uint8_and_int8_pools():
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests skip")
    for kv_dtype in ("fp8_e4m3", "int8"):
        key, value, slots, q, ks, vs = inputs(kv_dtype, True, seed=4)
        k, v, _, _ = pools(kv_dtype, "NHD", False)
        kt, vt = torch.from_numpy(k), torch.from_numpy(v)
        quant = dict(kv_dtype=kv_dtype, k_scale=torch.from_numpy(ks), v_scale=torch.from_numpy(vs))
        pk.write_kv(key, value, kt, vt, slots, **quant)
        out = pk.paged_decode_attention(torch.from_numpy(q), kt, vt, TABLES, LENS, **quant)
        want, kb, _ = _pagedkv._host_kv_cache_attention(
            key, value, slots, q, TABLES, LENS, None, kv_dtype, NB, BS, "NHD", ks.tolist(),
            vs.tolist())
        np.testing.assert_array_equal(k.view(np.uint8).reshape(NB, -1), kb)
        np.testing.assert_array_equal(out, want)


def test_bad_kv_dtype_and_scales_are_value_errors_naming_them():
    key, value, slots, q, ks, vs = inputs("fp8_e4m3", True)
    k, v, _, _ = pools("fp8_e4m3", "NHD", False, fill=0x11)
    i8k, i8v, _, _ = pools("int8", "NHD", False)
    f32 = np.zeros((NB, BS, KH, D), np.float32)
    ok = dict(kv_dtype="fp8_e4m3", k_scale=ks, v_scale=vs)
    cases = [
        (k, v, dict(ok, kv_dtype=None), "k_cache is uint8: pass kv_dtype='fp8_e4m3' or "
                                        "'fp8_e5m2'"),
        (k, v, dict(ok, kv_dtype="int8"), "got kv_dtype='int8'"),
        (k, v, dict(ok, kv_dtype="fp4"), "kv_dtype: unknown dtype 'fp4'"),
        (i8k, i8v, dict(ok), "kv_dtype='fp8_e4m3' does not match k_cache's dtype int8"),
        (f32, f32.copy(), dict(ok), "kv_dtype='fp8_e4m3' does not match k_cache's dtype float32"),
        (f32, f32.copy(), dict(k_scale=ks), "k_scale is for the 8-bit pools"),
        (k, v, dict(ok, k_scale=None), "k_scale is required for an 8-bit pool (fp8_e4m3)"),
        (k, v, dict(ok, v_scale=None), "v_scale is required"),
        (k, v, dict(ok, k_scale=np.ones(3, np.float32)),
         "k_scale: expected float32 [1] or [2] (num_kv_heads), got float32 of shape (3,)"),
        (k, v, dict(ok, v_scale=np.ones((1, 2), np.float32)), "v_scale: expected float32 [1]"),
        (k, v, dict(ok, k_scale=np.ones(2, np.float64)), "got float64 of shape (2,)"),
        (k, v, dict(ok, k_scale=np.array([0.5, 0.0], np.float32)),
         "k_scale[1] = 0 is not finite and > 0"),
        (k, v, dict(ok, v_scale=np.array([-1.0], np.float32)), "v_scale[0] = -1 is not finite"),
        (k, v, dict(ok, k_scale=np.array([np.nan, 1], np.float32)), "k_scale[0] = nan"),
        (k, v, dict(ok, v_scale=np.array([1, np.inf], np.float32)), "v_scale[1] = inf"),
    ]
    for kp, vp, kw, msg in cases:
        before = kp.copy()
        for call in (lambda: pk.write_kv(key, value, kp, vp, slots, **kw),
                     lambda: pk.paged_decode_attention(q, kp, vp, TABLES, LENS, **kw)):
            with pytest.raises(ValueError) as e:
                call()
            assert msg in str(e.value), (msg, str(e.value))
        np.testing.assert_array_equal(kp, before)  # a failed write wrote nothing


@pytest.mark.parametrize("kv_dtype", list(FORMATS))
def test_write_kv_from_float16_and_bfloat16_equals_the_float32_write(kv_dtype):
    # numpy float16 and torch bfloat16 K/V: the 8-bit bytes are those of the float32 write of
    # the exactly widened values (x / scale, rounded, saturated after the widening).
    key, value, slots, _, ks, vs = inputs(kv_dtype, True, seed=5)
    key[0, 0, :3] = [65504.0, -65504.0, 1e-6]  # saturates at every scale; a subnormal in fp16
    quant = dict(kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    forms = [(key.astype(np.float16), value.astype(np.float16), lambda x: x.astype(np.float32))]
    try:
        import torch
        forms.append((torch.from_numpy(key).bfloat16(), torch.from_numpy(value).bfloat16(),
                      lambda x: x.float().numpy()))
    except ImportError:
        pass
    for k16, v16, widen in forms:
        k, v, _, _ = pools(kv_dtype, "NHD", False, fill=0x55)
        pk.write_kv(k16, v16, k, v, slots, **quant)
        k32, v32, _, _ = pools(kv_dtype, "NHD", False, fill=0x55)
        pk.write_kv(widen(k16), widen(v16), k32, v32, slots, **quant)
        np.testing.assert_array_equal(k.view(np.uint8), k32.view(np.uint8))
        np.testing.assert_array_equal(v.view(np.uint8), v32.view(np.uint8))
        assert np.count_nonzero(k.view(np.uint8) != 0x55) > 0
    with pytest.raises(ValueError, match="value: dtype float32 differs from key's float16"):
        pk.write_kv(key.astype(np.float16), value, k, v, slots, **quant)
