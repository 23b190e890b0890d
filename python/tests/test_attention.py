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


def masked_reference(q_rows, keys, values, positions, window=-1, sinks=0, chunk=0):
    """`reference` under a mask, written from its definition: key k is visible from the query
    at p when k <= p and, under a local mask, k < sinks or (k > p - window when windowed, and
    k // chunk == p // chunk when chunked)."""
    out = np.zeros((len(q_rows), H, D), np.float32)
    local = window >= 0 or chunk > 0
    for r, (q, pos) in enumerate(zip(q_rows, positions)):
        ks = np.arange(pos + 1)
        seen = np.ones(pos + 1, bool)
        if local:
            inside = np.ones(pos + 1, bool)
            if window >= 0:
                inside &= ks > pos - window
            if chunk > 0:
                inside &= ks // chunk == pos // chunk
            seen = inside | (ks < sinks)
        if not seen.any():
            continue  # no visible key: zeros, the kernels' convention
        for h in range(H):
            kk = keys[: pos + 1, h // (H // KH)][seen]
            vv = values[: pos + 1, h // (H // KH)][seen]
            s = (kk.astype(np.float64) @ q[h]) / np.sqrt(D)
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


@pytest.mark.parametrize("window, sinks, chunk", [(5, 0, 0), (5, 2, 0), (-1, 0, 8), (-1, 3, 8),
                                                  (6, 0, 16), (-1, 0, 1), (0, 2, 0)])
def test_window_sink_and_chunk_masks(window, sinks, chunk):
    # A hybrid engine passes each layer's mask; prefill rows cross chunk and block boundaries.
    new = [19, 1, 7]
    m, meta, k, v, keys, values = build(3, 4, [54, 9, 40], new=new)
    q = np.random.default_rng(4).standard_normal((sum(new), H, D), dtype=np.float32)
    mask = dict(window_left=window, sink_tokens=sinks, chunk_size=chunk)
    out = pk.paged_prefill_attention(q, k, v, meta, **mask)
    rows, start = [], 0
    for i, n in enumerate(new):
        L = len(keys[i])
        rows.append(masked_reference(q[start:start + n], keys[i], values[i], range(L - n, L),
                                     window, sinks, chunk))
        start += n
    np.testing.assert_allclose(out, np.concatenate(rows), rtol=2e-5, atol=2e-6)
    dq = q[[start - 1 for start in np.cumsum(new)]]
    np.testing.assert_allclose(pk.paged_decode_attention(dq, k, v, meta.block_tables,
                                                         meta.seq_lens, **mask),
                               np.concatenate([masked_reference(dq[i:i + 1], keys[i], values[i],
                                                                [len(keys[i]) - 1], window,
                                                                sinks, chunk)
                                               for i in range(3)]), rtol=2e-5, atol=2e-6)
    with pytest.raises(pk.ContractError, match="chunk_size must be >= 0"):
        pk.paged_decode_attention(dq, k, v, meta.block_tables, meta.seq_lens, chunk_size=-1)


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
        (lambda: pk.paged_decode_attention(q.astype(np.float64), k, v, meta),
         "q: dtype float64 is not float32"),
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


@pytest.mark.parametrize("form", ["NHD", "HND", "combined-NHD", "fp16-HND"])
def test_engine_steps_write_kv_then_attend(form):
    # An engine's loop on its own pools: the manager gives the slots, write_kv stores K/V
    # there, attention reads them back; compared with numpy over the tokens written.
    layout = form.split("-")[-1]
    dtype = np.float16 if form.startswith("fp16") else np.float32
    bs, blocks = 8, 32
    m = pk.KVCacheManager(pk.KVCacheManagerConfig(blocks, bs))
    shape = (blocks, bs, KH, D) if layout == "NHD" else (blocks, KH, bs, D)
    if form.startswith("combined"):
        kv = np.full((blocks, 2) + shape[1:], np.nan, dtype)
        k, v, pools = kv[:, 0], kv[:, 1], (kv, None)
    else:
        k, v = np.full(shape, np.nan, dtype), np.full(shape, np.nan, dtype)
        pools = (k, v)
    rng = np.random.default_rng(5)
    lens = {0: 21, 1: 8, 2: 3}
    hist = {s: ([], []) for s in lens}

    def step(seqs, slots_per_seq):
        n = sum(len(x) for x in slots_per_seq)
        key = rng.standard_normal((n, KH, D), dtype=np.float32)
        val = rng.standard_normal((n, KH, D), dtype=np.float32)
        pk.write_kv(key, val, *pools, np.concatenate(slots_per_seq), layout=layout)
        at = 0
        for s, sl in zip(seqs, slots_per_seq):
            hist[s][0].extend(key[at:at + len(sl)].astype(dtype).astype(np.float32))
            hist[s][1].extend(val[at:at + len(sl)].astype(dtype).astype(np.float32))
            at += len(sl)

    step(list(lens), [m.add_sequence(s, [1] * n).slots for s, n in lens.items()])
    for _ in range(10):  # decode steps: one token each, past block boundaries
        seqs = list(lens)
        step(seqs, [m.append_slots(s, 1).slots for s in seqs])
        meta = m.batch_metadata(seqs, [1] * len(seqs))
        q = rng.standard_normal((len(seqs), H, D), dtype=np.float32)
        out = pk.paged_decode_attention(q, *pools, meta, layout=layout)
        keys = [np.array(hist[s][0]) for s in seqs]
        values = [np.array(hist[s][1]) for s in seqs]
        tol = dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(out, decode_reference(q, keys, values), **tol)
    # Exactly the written slots changed: the rest of the pool is still NaN.
    held = sum(m.num_tokens(s) for s in lens)
    assert np.count_nonzero(~np.isnan(k)) == held * KH * D
    assert np.count_nonzero(~np.isnan(v)) == held * KH * D


def test_write_kv_places_exactly_and_checks_every_slot_first():
    k = np.full((2, 4, KH, D), np.nan, np.float32)
    v = np.full_like(k, np.nan)
    key = np.arange(3 * KH * D, dtype=np.float32).reshape(3, KH, D)
    pk.write_kv(key, -key, k, v, np.array([5, -1, 0]))
    np.testing.assert_array_equal(k[1, 1], key[0])  # slot 5: block 1, token 1
    np.testing.assert_array_equal(v[0, 0], -key[2])
    assert np.count_nonzero(~np.isnan(k)) == 2 * KH * D  # the padding token was skipped
    before = k.copy()
    with pytest.raises(pk.ContractError, match="slot 8 of token 1"):
        pk.write_kv(key[:2], key[:2], k, v, np.array([1, 8]))
    np.testing.assert_array_equal(k, before)  # slot 1 was not written either
    for call, named in [
        (lambda: pk.write_kv(key, key, k, v, np.array([0, 1, 2], np.int32)), "slot_mapping"),
        (lambda: pk.write_kv(key[:, :1].copy(), key, k, v, np.array([0, 1, 2])), "key shape"),
        (lambda: pk.write_kv(key, key[:2], k, v, np.array([0, 1, 2])), "value shape"),
        (lambda: pk.write_kv(key.astype(np.float16), key, k, v, np.array([0, 1, 2])),
         "value: dtype float32 differs from key's float16"),
        (lambda: pk.write_kv(key.astype(np.int32), key, k, v, np.array([0, 1, 2])),
         "key: dtype int32 is not float32, float16 or bfloat16"),
        (lambda: pk.write_kv(key, key.astype(np.int8), k, v, np.array([0, 1, 2])),
         "value: dtype int8 is not float32, float16 or bfloat16"),
        (lambda: pk.write_kv(key, key, k, v[:1], np.array([0, 1, 2])), "v_cache"),
    ]:
        with pytest.raises(ValueError, match=named):
            call()
    ro = k.copy()
    ro.flags.writeable = False
    with pytest.raises(TypeError):  # a read-only pool is never written
        pk.write_kv(key, key, ro, v, np.array([0, 1, 2]))


def test_write_kv_into_torch_pools_in_place():
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests skip")
    k = torch.zeros(4, 8, KH, D, dtype=torch.bfloat16)
    v = torch.zeros_like(k)
    key = torch.randn(2, KH, D)
    pk.write_kv(key, 2 * key, k, v, torch.tensor([9, 30]))
    assert torch.equal(k[1, 1], key[0].bfloat16()) and torch.equal(v[3, 6], (2 * key[1]).bfloat16())
    assert int((k != 0).sum()) <= 2 * KH * D


@pytest.mark.parametrize("pool_dtype", ["float32", "float16", "bfloat16"])
def test_write_kv_from_float16_and_bfloat16_equals_the_float32_write(pool_dtype):
    # An engine's bf16 (torch) or fp16 (numpy) activations: the pools hold exactly what the
    # float32 write of the same (exactly widened) values puts there. The values include fp16's
    # largest finite, subnormals and ties of the pool's rounding.
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests skip")
    tdtype = getattr(torch, pool_dtype)
    rng = np.random.default_rng(7)
    raw = rng.standard_normal((3, KH, D)).astype(np.float32)
    raw[0, 0, :4] = [65504.0, -2.0**-24, 1.0 + 2.0**-11, 1.0 + 2.0**-8]
    slots = torch.tensor([6, -1, 1])
    for key, value in [(torch.from_numpy(raw).bfloat16(), torch.from_numpy(-raw).bfloat16()),
                       (raw.astype(np.float16), (-raw).astype(np.float16))]:
        k = torch.full((2, 4, KH, D), 7.0, dtype=tdtype)
        v = torch.full_like(k, 7.0)
        pk.write_kv(key, value, k, v, slots)
        k32, v32 = torch.full_like(k, 7.0), torch.full_like(k, 7.0)
        as32 = lambda x: (x.float() if isinstance(x, torch.Tensor) else
                          torch.from_numpy(x.astype(np.float32)))
        pk.write_kv(as32(key), as32(value), k32, v32, slots)
        # Bit for bit: the pools' elements as integers of their size.
        bits = lambda t: t.view(torch.int32 if t.element_size() == 4 else torch.int16)
        assert torch.equal(bits(k), bits(k32)), (pool_dtype, key.dtype)
        assert torch.equal(bits(v), bits(v32)), (pool_dtype, key.dtype)
        assert k[1, 2, 0, 0] == as32(key)[0, 0, 0].to(tdtype)  # slot 6 = block 1, token 2
        assert int((k != 7).sum()) <= 2 * KH * D  # the padding token went nowhere
