"""pagedkv.KVPools: the pools of every layer imported once, per-layer calls on activations.
Against the numpy attention of test_attention.py and the bytes each write must put where (no
comparison with the free ops alone: a shared mistake would pass), in both layouts, vLLM's
separate pools and FlashInfer's combined one, numpy and torch; the object keeps the pools'
memory alive; errors name what is wrong."""

import gc

import numpy as np
import pytest

import pagedkv as pk
from test_attention import D, H, KH, build, decode_reference, reference


def layered(k, v, layers, combined):
    """`layers` copies of one layer's pools, as separate (k, v) tuples or combined pools."""
    if combined:
        return [np.stack([k, v], axis=1).copy() for _ in range(layers)]
    return [(k.copy(), v.copy()) for _ in range(layers)]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("combined", [False, True])
def test_decode_and_prefill_of_every_layer_match_numpy(layout, combined):
    m, meta, k, v, keys, values = build(5, 8, [54, 97, 13], layout=layout)
    pools = layered(k, v, 3, combined)
    # Layer 2's V differs (doubled): a call must read the layer it names.
    if combined:
        pools[2][:, 1] *= 2
    else:
        pools[2][1][...] *= 2
    kp = pk.KVPools(pools, layout=layout)
    assert (kp.num_layers, kp.layout, kp.is_cuda) == (3, layout, False)
    assert (kp.num_blocks, kp.block_size, kp.num_kv_heads, kp.head_dim) == (len(k), 8, KH, D)
    q = np.random.default_rng(4).standard_normal((5, H, D), dtype=np.float32)
    want = decode_reference(q, keys, values)
    out = np.empty_like(q)
    assert kp.decode(0, q, meta, out=out) is out  # the caller's array, written in place
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(kp.decode(2, q, meta), 2 * want, rtol=2e-5, atol=4e-6)
    # Decode rows as prefill rows of one token (what the example engine runs).
    np.testing.assert_allclose(kp.prefill(1, q, meta), want, rtol=2e-5, atol=2e-6)


def test_prefill_chunk_after_a_cached_prefix():
    new = [5, 1, 17]
    m, meta, k, v, keys, values = build(3, 8, [54, 9, 40], new=new)
    kp = pk.KVPools([(k, v)])
    q = np.random.default_rng(3).standard_normal((sum(new), H, D), dtype=np.float32)
    out = kp.prefill(0, q, meta, scale=0.3)
    rows, start = [], 0
    for i, n in enumerate(new):
        L = len(keys[i])
        rows.append(reference(q[start:start + n], keys[i], values[i], range(L - n, L), 0.3))
        start += n
    np.testing.assert_allclose(out, np.concatenate(rows), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("combined", [False, True])
def test_write_kv_lands_in_the_named_layer_only(combined):
    blocks, bs = 6, 4
    shape = (blocks, bs, KH, D)
    pools = layered(np.zeros(shape, np.float32), np.zeros(shape, np.float32), 2, combined)
    kp = pk.KVPools(pools)
    rng = np.random.default_rng(5)
    key = rng.standard_normal((3, KH, D), dtype=np.float32)
    value = rng.standard_normal((3, KH, D), dtype=np.float32)
    slots = np.array([13, -1, 0], np.int64)  # block 3 token 1, padding, block 0 token 0
    kp.write_kv(1, key, value, slots)
    k1, v1 = (pools[1][:, 0], pools[1][:, 1]) if combined else pools[1]
    np.testing.assert_array_equal(k1[3, 1], key[0])
    np.testing.assert_array_equal(v1[3, 1], value[0])
    np.testing.assert_array_equal(k1[0, 0], key[2])
    np.testing.assert_array_equal(v1[0, 0], value[2])
    assert np.count_nonzero(k1) == np.count_nonzero(key[[0, 2]])
    layer0 = pools[0] if combined else np.stack(pools[0])
    assert not layer0.any()


def test_copy_blocks_in_every_layer():
    shape = (6, 4, KH, D)
    rng = np.random.default_rng(6)
    pools = [(rng.standard_normal(shape, dtype=np.float32),
              rng.standard_normal(shape, dtype=np.float32)) for _ in range(3)]
    before = [(k.copy(), v.copy()) for k, v in pools]
    pk.KVPools(pools).copy_blocks(np.array([[1, 4], [4, 5]], np.int32))  # in order: 1 -> 4 -> 5
    for (k, v), (k0, v0) in zip(pools, before):
        for a, a0 in ((k, k0), (v, v0)):
            np.testing.assert_array_equal(a[4], a0[1])
            np.testing.assert_array_equal(a[5], a0[1])
            np.testing.assert_array_equal(a[[0, 1, 2, 3]], a0[[0, 1, 2, 3]])


def test_the_object_keeps_the_pools_alive():
    m, meta, k, v, keys, values = build(4, 8, [30, 7])
    kp = pk.KVPools([(k.copy(), v.copy())])  # the only references to these copies
    gc.collect()
    q = np.random.default_rng(7).standard_normal((4, H, D), dtype=np.float32)
    np.testing.assert_allclose(kp.decode(0, q, meta), decode_reference(q, keys, values),
                               rtol=2e-5, atol=2e-6)


def test_torch_pools_and_activations():
    torch = pytest.importorskip("torch", reason="torch is not installed: its cases skip")
    m, meta, k, v, keys, values = build(3, 8, [20, 41, 9])
    tk, tv = torch.from_numpy(k), torch.from_numpy(v)
    kp = pk.KVPools([(tk, tv)])
    q = torch.from_numpy(np.random.default_rng(8).standard_normal((3, H, D), dtype=np.float32))
    out = torch.empty_like(q)
    assert kp.decode(0, q, meta, out=out) is out
    np.testing.assert_allclose(out.numpy(), decode_reference(q.numpy(), keys, values),
                               rtol=2e-5, atol=2e-6)
    # A write through the object lands in the torch tensor's memory.
    kp.write_kv(0, torch.ones(1, KH, D), torch.full((1, KH, D), 2.0),
                np.array([len(k) * 8 - 1], np.int64))
    assert (tk[-1, -1] == 1).all() and (tv[-1, -1] == 2).all()
    # Plain CPU tensors are imported without Tensor.__dlpack__ (its last step, directly); what
    # __dlpack__ refuses is refused, and the usual checks still apply.
    with pytest.raises(TypeError, match=r"q: a torch tensor that requires grad .* q.detach\(\)"):
        kp.decode(0, q.clone().requires_grad_(), meta)
    with pytest.raises(ValueError, match="q must be C-contiguous"):
        kp.decode(0, q.transpose(1, 2).contiguous().transpose(1, 2), meta, out=out)
    with pytest.raises(ValueError, match="out: dtype float16 differs from q's float32"):
        kp.decode(0, q, meta, out=out.half())
    got = kp.decode(0, q, meta)  # no out: a new array, valid after the call
    np.testing.assert_allclose(np.asarray(got), out.numpy(), rtol=0, atol=0)


def test_torch_pools_whose_data_moved_are_refused():
    # torch's resize_() and set_() give a tensor new memory and free the old, which the object's
    # DLPack handle does not keep: every call compares data_ptr() with the imported address.
    torch = pytest.importorskip("torch", reason="torch is not installed: its cases skip")
    m, meta, k, v, keys, values = build(2, 8, [20, 9])
    tk, tv = torch.tensor(k), torch.tensor(v)  # torch's own (resizable) memory
    kp = pk.KVPools([(tk, tv)])
    q = torch.from_numpy(np.random.default_rng(9).standard_normal((2, H, D), dtype=np.float32))
    before = np.asarray(kp.decode(0, q, meta)).copy()
    np.testing.assert_allclose(before, decode_reference(q.numpy(), keys, values),
                               rtol=2e-5, atol=2e-6)
    tv.resize_(len(v) * 100, *v.shape[1:])  # a larger size: new memory, the old one freed
    moved = r"pools\[0\]\[1\]: the torch tensor's data moved since KVPools imported it"
    with pytest.raises(ValueError, match=moved):
        kp.decode(0, q, meta)
    with pytest.raises(ValueError, match=moved):
        kp.write_kv(0, torch.ones(1, KH, D), torch.ones(1, KH, D), np.array([0], np.int64))
    with pytest.raises(ValueError, match=moved):
        kp.copy_blocks(np.array([[0, 1]], np.int32))
    assert np.array_equal(tk.numpy(), k, equal_nan=True)  # the refused write and copy: no change
    tk.set_(torch.zeros_like(tk))
    with pytest.raises(ValueError, match=r"pools\[0\]\[0\]: the torch tensor's data moved"):
        kp.prefill(0, q, meta)
    # A combined pool is named pools[i]; a fresh object over the moved tensors works.
    kc = torch.tensor(np.stack([k, v], axis=1))
    kpc = pk.KVPools([kc])
    kc.resize_(kc.shape[0] * 4, *kc.shape[1:])
    with pytest.raises(ValueError, match=r"pools\[0\]: the torch tensor's data moved"):
        kpc.decode(0, q, meta)


def test_int8_pools_with_per_layer_scales():
    m, meta, k, v, keys, values = build(3, 8, [20, 41, 9])
    scale = np.float32(0.05)
    k8 = np.clip(np.rint(np.nan_to_num(k) / scale), -127, 127).astype(np.int8)
    v8 = np.clip(np.rint(np.nan_to_num(v) / scale), -127, 127).astype(np.int8)
    s1 = np.array([scale], np.float32)
    kp = pk.KVPools([(k8, v8), (k8, v8)], kv_dtype="int8", k_scale=[s1, s1 * 2],
                    v_scale=s1)
    q = np.random.default_rng(9).standard_normal((3, H, D), dtype=np.float32)
    # The stored values are what attention sees: int8 x scale.
    deq = lambda rows, a: [a[m.block_table(i)[np.arange(len(r)) // 8], np.arange(len(r)) % 8]
                           .astype(np.float32) for i, r in enumerate(rows)]  # noqa: E731
    kq, vq = deq(keys, k8), deq(values, v8)
    want0 = decode_reference(q, [x * scale for x in kq], [x * scale for x in vq])
    want1 = decode_reference(q, [x * 2 * scale for x in kq], [x * scale for x in vq])
    np.testing.assert_allclose(kp.decode(0, q, meta), want0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kp.decode(1, q, meta), want1, rtol=1e-4, atol=1e-5)


def test_errors_name_what_is_wrong():
    m, meta, k, v, keys, values = build(2, 8, [9, 3])
    kp = pk.KVPools([(k, v), (k, v)])
    q = np.zeros((2, H, D), np.float32)
    with pytest.raises(ValueError, match=r"layer = 2 is outside \[0, 2\)"):
        kp.decode(2, q, meta)
    with pytest.raises(ValueError, match=r"layer = -1 is outside \[0, 2\)"):
        kp.write_kv(-1, np.zeros((1, KH, D), np.float32), np.zeros((1, KH, D), np.float32),
                    np.zeros(1, np.int64))
    with pytest.raises(ValueError, match=r"q \(3, 4, 16\) has 3 rows, the tables 2 sequences"):
        kp.decode(0, np.zeros((3, H, D), np.float32), meta)
    with pytest.raises(ValueError, match="out: dtype float16 differs from q's float32"):
        kp.decode(0, q, meta, out=np.zeros((2, H, D), np.float16))
    with pytest.raises(TypeError, match="out: expected a writable array .* got list"):
        kp.decode(0, q, meta, out=[1.0])
    with pytest.raises(ValueError, match="pools: empty"):
        pk.KVPools([])
    with pytest.raises(ValueError, match=r"pools\[1\]: a tuple item must be \(k_cache, v_cache\)"):
        pk.KVPools([(k, v), (k,)])
    with pytest.raises(ValueError, match="every layer needs pools\\[0\\]'s dtype and geometry"):
        pk.KVPools([(k, v), (k[:-1], v[:-1])])
    with pytest.raises(ValueError, match="k_scale: a list of 1 for 2 layers of pools"):
        pk.KVPools([(k, v), (k, v)], k_scale=[np.ones(1, np.float32)])
    with pytest.raises(ValueError, match="k_scale is for the 8-bit pools"):
        pk.KVPools([(k, v)], k_scale=np.ones(1, np.float32))
    with pytest.raises(ValueError, match="layout = 'XYZ' is not 'NHD' or 'HND'"):
        pk.KVPools([(k, v)], layout="XYZ")


def test_pool_items_that_are_no_writable_arrays_are_type_errors_naming_them():
    # Was nanobind's RuntimeError "std::bad_cast", naming neither the item nor the problem.
    m, meta, k, v, keys, values = build(2, 8, [9, 3])
    ro = k.copy()
    ro.setflags(write=False)
    pairs = np.zeros((0, 2), np.int32)
    i8 = np.zeros(k.shape, np.int8)
    cases = [
        (lambda: pk.KVPools([(k, v), (ro, v)]), r"pools\[1\]\[0\]: .* got a read-only ndarray"),
        (lambda: pk.KVPools([(k, None)]), r"pools\[0\]\[1\]: expected a writable array .* NoneType"),
        (lambda: pk.KVPools([(k, v), [k, v]]), r"pools\[1\]: expected a writable array .* list"),
        (lambda: pk.KVPools([(i8, i8)], k_scale="x", v_scale=np.ones(1, np.float32)),
         r"k_scale: .* got str"),
        (lambda: pk.KVPools([(i8, i8)], k_scale=[None], v_scale=np.ones(1, np.float32)),
         r"k_scale\[0\]: .* NoneType"),
        (lambda: pk.copy_blocks([(k, v), (k, ro)], pairs), r"pools\[1\]\[1\]: .* read-only"),
        (lambda: pk.copy_blocks([7], pairs), r"pools\[0\]: expected a writable array .* int"),
        (lambda: pk.swap_blocks([(k, v)], [(ro, v)], pairs), r"dst_pools\[0\]\[0\]: .* read-only"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError, match=message):
            call()
    np.testing.assert_array_equal(ro, k)  # nothing was written
