"""Queries and outputs in float16 (numpy) and bfloat16 (torch) for paged_decode_attention and
paged_prefill_attention: the result must be the float32 path's on the widened q, rounded to the
output dtype by numpy's / torch's own cast (round to nearest even), element for element."""

import numpy as np
import pytest

import pagedkv as pk
from test_attention import D, H, build


def cases():
    return [("NHD", np.float32), ("HND", np.float32), ("NHD", np.float16), ("HND", np.float16)]


def decode_batch(layout, dtype):
    return build(12, 8, [54, 97, 1, 16, 8, 9], dtype=dtype, layout=layout, seed=3)


def prefill_batch(layout, dtype):
    return build(3, 8, [40, 17, 9], dtype=dtype, layout=layout, seed=4, new=[5, 17, 1])


@pytest.mark.parametrize("layout, dtype", cases())
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_float16_q_and_out_equal_the_float32_path_rounded(op, layout, dtype):
    _, meta, k, v, _, _ = (decode_batch if op == "decode" else prefill_batch)(layout, dtype)
    fn = pk.paged_decode_attention if op == "decode" else pk.paged_prefill_attention
    rows = int(meta.query_start_loc[-1])
    q16 = np.random.default_rng(5).standard_normal((rows, H, D)).astype(np.float16)
    want = fn(q16.astype(np.float32), k, v, meta, layout=layout).astype(np.float16)
    got = fn(q16, k, v, meta, layout=layout)
    assert got.dtype == np.float16 and got.shape == (rows, H, D)
    np.testing.assert_array_equal(got, want)
    out = np.full((rows, H, D), np.nan, np.float16)
    assert fn(q16, k, v, meta, layout=layout, out=out) is not None
    np.testing.assert_array_equal(out, want)
    assert np.abs(want.astype(np.float32)).max() > 0.05  # not an all-zero agreement


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_bfloat16_torch_q_and_out_equal_the_float32_path_rounded(op):
    torch = pytest.importorskip("torch", reason="torch is not installed: bfloat16 needs it")
    _, meta, k, v, _, _ = (decode_batch if op == "decode" else prefill_batch)("NHD", np.float32)
    fn = pk.paged_decode_attention if op == "decode" else pk.paged_prefill_attention
    rows = int(meta.query_start_loc[-1])
    qb = torch.randn(rows, H, D, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    kb, vb = torch.from_numpy(k).to(torch.bfloat16), torch.from_numpy(v).to(torch.bfloat16)
    want = torch.from_numpy(fn(qb.float().numpy(), kb, vb, meta)).to(torch.bfloat16)
    got = fn(qb, kb, vb, meta)  # a new torch tensor: numpy has no bfloat16
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert torch.equal(got, want)
    out = torch.full((rows, H, D), float("nan"), dtype=torch.bfloat16)
    fn(qb, kb, vb, meta, out=out)
    assert torch.equal(out, want)
    # torch float16 queries: a new numpy float16 out
    qh = qb.to(torch.float16)
    half = fn(qh, kb, vb, meta)
    assert isinstance(half, np.ndarray) and half.dtype == np.float16
    np.testing.assert_array_equal(half, fn(qh.float().numpy(), kb, vb, meta).astype(np.float16))
    # float32 queries over the same pools still give float32, unrounded
    f32 = fn(qb.float(), kb, vb, meta)
    assert f32.dtype == np.float32 and not np.array_equal(f32, want.float().numpy())


def test_wrong_q_or_out_dtype_is_a_value_error_naming_it():
    _, meta, k, v, _, _ = decode_batch("NHD", np.float32)
    q = np.zeros((12, H, D), np.float16)
    out = np.zeros((12, H, D), np.float16)
    bad = [
        (dict(q=q.astype(np.float64)), "q: dtype float64 is not float32, float16 or bfloat16"),
        (dict(q=q.astype(np.int8)), "q: dtype int8"),
        (dict(out=out.astype(np.float32)), "out: dtype float32 differs from q's float16"),
        (dict(out=out.astype(np.float64)), "out: dtype float64 is not float32"),
        (dict(out=np.zeros((12, H, D + 1), np.float16)), "out shape (12, 4, 17) != q shape"),
        (dict(q=np.zeros((12, H), np.float16)), "q: expected [num_seqs, heads, dim]"),
    ]
    for kw, msg in bad:
        args = dict(q=q, out=out) | kw
        before = out.copy()
        with pytest.raises(ValueError, match=None) as e:
            pk.paged_decode_attention(args["q"], k, v, meta, out=args["out"])
        assert msg in str(e.value), (msg, str(e.value))
        np.testing.assert_array_equal(out, before)
