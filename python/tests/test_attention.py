"""Paged attention on pools the test owns (numpy arrays, torch CPU tensors), against an
attention written here in numpy over the positions each sequence holds. Cases in the style of
FlashInfer's decode tests: batches of 12, 17 and 128, context lengths not page-aligned (54, 97,
1023, 4097), page sizes 1, 8 and 16, and every slot no sequence holds (unused tails of
referenced blocks, unreferenced blocks) filled with NaN, which must never reach an output."""

import numpy as np
import pytest

import pagedkv as pk

H, KH, D = 4, 2, 16  # query heads, kv heads (GQA group 2), head dim


def build(batch, page, lens, dtype=np.float32, layout="NHD", seed=0, new=None):
    """A manager holding `batch` sequences (lengths cycling through `lens`), a pool with
    their K/V at their slots and NaN everywhere else, and the batch's metadata."""
    rng = np.random.default_rng(seed)
    ctx = [lens[i % len(lens)] for i in range(batch)]
    blocks = sum(-(-n // page) for n in ctx) + 8
    m = pk.KVCacheManager(pk.KVCacheManagerConfig(blocks, page))
    m.add_sequence(-2 + 10**6, [0] * (3 * page))  # scatter the ids: hold then free 3 blocks
    for i, n in enumerate(ctx):
        m.add_sequence(i, [1] * n)
    m.free_sequence(-2 + 10**6)
    shape = (blocks, page, KH, D)
    k = np.full(shape, np.nan, dtype=np.float32)
    v = np.full(shape, np.nan, dtype=np.float32)
    keys, values = [], []
    for i, n in enumerate(ctx):
        t = m.block_table(i)
        p = np.arange(n)
        kk = rng.standard_normal((n, KH, D), dtype=np.float32)
        vv = rng.standard_normal((n, KH, D), dtype=np.float32)
        k[t[p // page], p % page] = kk
        v[t[p // page], p % page] = vv
        keys.append(kk.astype(dtype).astype(np.float32))
        values.append(vv.astype(dtype).astype(np.float32))
    k, v = k.astype(dtype), v.astype(dtype)
    if layout == "HND":
        k, v = k.transpose(0, 2, 1, 3).copy(), v.transpose(0, 2, 1, 3).copy()
    meta = m.batch_metadata(list(range(batch)), new or [1] * batch)
    return m, meta, k, v, keys, values


def reference(q_rows, keys, values, positions, scale=None):
    """Causal attention of query rows at `positions` over keys/values [n, KH, D] (fp32)."""
    scale = 1 / np.sqrt(D) if scale is None else scale
    out = np.zeros((len(q_rows), H, D), np.float32)
    for r, (q, pos) in enumerate(zip(q_rows, positions)):
        for h in range(H):
            kk, vv = keys[: pos + 1, h // (H // KH)], values[: pos + 1, h // (H // KH)]
            s = (kk.astype(np.float64) @ q[h]) * scale
            w = np.exp(s - s.max())
            out[r, h] = (w / w.sum()) @ vv
    return out


def decode_reference(q, keys, values, scale=None):
    return np.concatenate([reference(q[i:i + 1], keys[i], values[i], [len(keys[i]) - 1], scale)
                           for i in range(len(keys))])


@pytest.mark.parametrize("batch, page", [(12, 16), (17, 8), (12, 1), (128, 16)])
def test_decode_matches_numpy_and_never_reads_unused_slots(batch, page):
    lens = [54, 97, 1023, 4097] if batch != 12 or page != 1 else [54, 97, 1023]
    m, meta, k, v, keys, values = build(batch, page, lens)
    q = np.random.default_rng(1).standard_normal((batch, H, D), dtype=np.float32)
    out = pk.paged_decode_attention(q, k, v, meta)
    assert out.dtype == np.float32 and out.shape == (batch, H, D)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, decode_reference(q, keys, values), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layouts_dtypes_and_the_combined_pool(layout, dtype):
    m, meta, k, v, keys, values = build(5, 8, [54, 97, 13], dtype=dtype, layout=layout)
    q = np.random.default_rng(2).standard_normal((5, H, D), dtype=np.float32)
    want = decode_reference(q, keys, values)
    tol = dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(pk.paged_decode_attention(q, k, v, meta, layout=layout), want, **tol)
    # FlashInfer's combined pool [num_pages, 2, ...]: index 1 of dim 1 is V.
    kv = np.stack([k, v], axis=1)
    np.testing.assert_allclose(pk.paged_decode_attention(q, kv, None, meta, layout=layout), want,
                               **tol)
    # The array form, and a strided view read in place (an NHD pool seen as HND).
    got = pk.paged_decode_attention(q, k, v, meta.block_tables, meta.seq_lens, layout=layout)
    np.testing.assert_allclose(got, want, **tol)
    other = "HND" if layout == "NHD" else "NHD"
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(pk.paged_decode_attention(q, kt, vt, meta, layout=other), want,
                               **tol)


def test_prefill_chunk_after_a_cached_prefix():
    # Sequence i holds ctx[i] tokens; the step's chunk is its last new[i] positions.
    new = [5, 1, 17]
    m, meta, k, v, keys, values = build(3, 8, [54, 9, 40], new=new)
    q = np.random.default_rng(3).standard_normal((sum(new), H, D), dtype=np.float32)
    out = pk.paged_prefill_attention(q, k, v, meta, scale=0.3)
    rows, start = [], 0
    for i, n in enumerate(new):
        L = len(keys[i])
        rows.append(reference(q[start:start + n], keys[i], values[i], range(L - n, L), 0.3))
        start += n
    np.testing.assert_allclose(out, np.concatenate(rows), rtol=2e-5, atol=2e-6)


def test_zero_copy_pools_and_out():
    m, meta, k, v, keys, values = build(3, 4, [9, 5, 12])
    q = np.random.default_rng(4).standard_normal((3, H, D), dtype=np.float32)
    out = np.empty((3, H, D), np.float32)
    assert pk.paged_decode_attention(q, k, v, meta, out=out) is not None
    first = out.copy()
    # Scale sequence 0's values in the pool: its output scales, so the pool was read in place.
    t = m.block_table(0)
    v[t] *= 2
    pk.paged_decode_attention(q, k, v, meta, out=out)
    np.testing.assert_allclose(out[0], 2 * first[0], rtol=1e-6)
    np.testing.assert_array_equal(out[1:], first[1:])


def test_torch_tensors_in_place():
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests skip")
    m, meta, k, v, keys, values = build(4, 8, [54, 97, 30, 8])
    q = torch.randn(4, H, D)
    out = torch.empty(4, H, D)
    kt, vt = torch.from_numpy(k), torch.from_numpy(v)
    pk.paged_decode_attention(q, kt, vt, meta, out=out)
    want = decode_reference(q.numpy(), keys, values)
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-5, atol=2e-6)
    # bfloat16 pools (no numpy dtype: torch only).
    kb, vb = kt.to(torch.bfloat16), vt.to(torch.bfloat16)
    got = pk.paged_decode_attention(q, kb, vb, meta)
    wantb = decode_reference(q.numpy(), [torch.from_numpy(x).bfloat16().float().numpy()
                                         for x in keys],
                             [torch.from_numpy(x).bfloat16().float().numpy() for x in values])
    np.testing.assert_allclose(got, wantb, rtol=1e-3, atol=1e-3)


def test_hostile_arguments_name_what_is_wrong():
    m, meta, k, v, keys, values = build(2, 4, [9, 5])
    q = np.zeros((2, H, D), np.float32)
    value_errors = [
        (lambda: pk.paged_decode_attention(q.astype(np.float64), k, v, meta), "q: expected float32"),
        (lambda: pk.paged_decode_attention(q[:, :, ::2], k[..., ::2].copy(), v[..., ::2].copy(),
                                           meta), "q must be C-contiguous"),
        (lambda: pk.paged_decode_attention(q[:1], k, v, meta), "1 rows"),
        (lambda: pk.paged_decode_attention(q, np.zeros(k.shape, np.int32),
                                           np.zeros(v.shape, np.int32), meta),
         "int32 is not float32"),
        (lambda: pk.paged_decode_attention(q, k, v.astype(np.float16), meta), "v_cache"),
        (lambda: pk.paged_decode_attention(q, k, v[:-1], meta), "v_cache"),
        (lambda: pk.paged_decode_attention(q, k[0], v[0], meta), "4 dims"),
        (lambda: pk.paged_decode_attention(q, np.stack([k, v, k], 1), None, meta), "2 at dim 1"),
        (lambda: pk.paged_decode_attention(q, k[..., ::-1], v[..., ::-1], meta), "negative"),
        (lambda: pk.paged_decode_attention(q, k, v, meta, layout="XYZ"), "'XYZ'"),
        (lambda: pk.paged_decode_attention(q, k, v, meta, out=np.zeros((2, H, 1), np.float32)),
         "out shape"),
        (lambda: pk.paged_decode_attention(q, k, v, meta.block_tables.astype(np.int64),
                                           meta.seq_lens), "block_tables"),
        (lambda: pk.paged_decode_attention(q, k, v, meta.block_tables, meta.seq_lens[:1]),
         "num_seqs"),
    ]
    for call, named in value_errors:
        with pytest.raises(ValueError, match=named):
            call()
    bad_ids = meta.block_tables.copy()
    bad_ids[0, 0] = 10**6
    contract = [
        (lambda: pk.paged_decode_attention(q, k, v, bad_ids, meta.seq_lens), "1000000"),
        (lambda: pk.paged_decode_attention(np.zeros((2, H, 8), np.float32), k, v, meta),
         "head_dim"),
        (lambda: pk.paged_decode_attention(q, k[:, :2].copy(), v[:, :2].copy(), meta),
         "block_size 4"),
    ]
    for call, named in contract:
        with pytest.raises(pk.ContractError, match=named):
            call()
    with pytest.raises(TypeError):  # a read-only out cannot be written
        ro = np.zeros((2, H, D), np.float32)
        ro.flags.writeable = False
        pk.paged_decode_attention(q, k, v, meta, out=ro)
