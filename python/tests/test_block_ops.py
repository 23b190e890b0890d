"""copy_blocks (copy-on-write, every layer in one call) and swap_blocks (device <-> host pools
of any layout) on pools the test owns, driven by the manager's copy lists."""

import numpy as np
import pytest
from test_attention import D, H, KH

import pagedkv as pk


def pools(layers, blocks, bs, layout="NHD", fill=np.nan):
    shape = (blocks, bs, KH, D) if layout == "NHD" else (blocks, KH, bs, D)
    return [(np.full(shape, fill, np.float32), np.full(shape, fill, np.float32))
            for _ in range(layers)]


def fill(layer_pools, m, seq, rng, start=0):
    """Writes fresh K/V for positions [start, num_tokens) of seq in every layer."""
    n = m.num_tokens(seq)
    table = m.block_table(seq)
    slots = np.array([table[p // m.config.block_size] * m.config.block_size +
                      p % m.config.block_size for p in range(start, n)], np.int64)
    for k, v in layer_pools:
        pk.write_kv(rng.standard_normal((len(slots), KH, D), dtype=np.float32),
                    rng.standard_normal((len(slots), KH, D), dtype=np.float32), k, v, slots)


def test_copy_on_write_after_fork_in_every_layer():
    rng = np.random.default_rng(0)
    m = pk.KVCacheManager(pk.KVCacheManagerConfig(8, 4))
    layers = pools(3, 8, 4)
    m.add_sequence(1, [1] * 6)  # blocks 0, 1 (block 1 half full)
    fill(layers, m, 1, rng)
    m.fork(1, 2)
    r = m.append_slots(2, 1)
    assert r.copies.tolist() == [[1, 2]]
    pk.copy_blocks(layers, r.copies)
    for k, v in layers:
        np.testing.assert_array_equal(k[2], k[1])  # NaN-for-NaN equal: whole block copied
        np.testing.assert_array_equal(v[2], v[1])
    fill(layers, m, 2, rng, start=6)
    # The parent's block 1 is untouched by the child's new token.
    assert np.isnan(layers[0][0][1, 2]).all() and not np.isnan(layers[0][0][2, 2]).any()


def test_combined_pools_and_errors():
    kv = [np.arange(4 * 2 * 4 * KH * D, dtype=np.float32).reshape(4, 2, 4, KH, D)]
    before = kv[0].copy()
    pk.copy_blocks(kv, np.array([[0, 3]], np.int32))
    np.testing.assert_array_equal(kv[0][3], before[0])
    np.testing.assert_array_equal(kv[0][:3], before[:3])
    with pytest.raises(pk.ContractError, match=r"pair 1 \(1, 4\)"):
        pk.copy_blocks(kv, np.array([[0, 1], [1, 4]], np.int32))
    np.testing.assert_array_equal(kv[0][1], before[1])  # checked before any copy
    for call, named in [
        (lambda: pk.copy_blocks(kv, np.array([[0, 1]], np.int64)), "block_copies"),
        (lambda: pk.copy_blocks(kv, np.array([[0, 1, 2]], np.int32)), r"\[n, 2\]"),
        (lambda: pk.copy_blocks([(kv[0],)], np.array([[0, 1]], np.int32)), "tuple"),
        (lambda: pk.swap_blocks(kv, kv + kv, np.array([[0, 1]], np.int32)), "1 layers"),
    ]:
        with pytest.raises(ValueError, match=named):
            call()
    with pytest.raises(pk.ContractError, match="dst is fp16"):
        pk.swap_blocks(kv, [kv[0].astype(np.float16)], np.array([[0, 1]], np.int32))


@pytest.mark.parametrize("host_layout", ["NHD", "HND"])
def test_swap_out_and_in_keeps_attention_bit_identical(host_layout):
    rng = np.random.default_rng(1)
    m = pk.KVCacheManager(pk.KVCacheManagerConfig(8, 4, num_host_blocks=4))
    device = pools(2, 8, 4)
    host = pools(2, 4, 4, host_layout)
    m.add_sequence(1, [1] * 10)  # blocks 0, 1, 2
    fill(device, m, 1, rng)
    q = rng.standard_normal((1, H, D), dtype=np.float32)
    meta = m.batch_metadata([1], [1])
    want = [pk.paged_decode_attention(q, k, v, meta) for k, v in device]
    out = m.swap_out(1)
    pk.swap_blocks(device, host, out.copies, dst_layout=host_layout)
    m.add_sequence(2, [1] * 12)  # takes the freed device blocks meanwhile: 3..7 then 0
    fill(device, m, 2, rng)
    back = m.swap_in(1)
    assert back.copies[:, 1].tolist() == m.block_table(1).tolist() != [0, 1, 2]
    pk.swap_blocks(host, device, back.copies, src_layout=host_layout)
    meta = m.batch_metadata([1], [1])
    for (k, v), w in zip(device, want):
        np.testing.assert_array_equal(pk.paged_decode_attention(q, k, v, meta), w)
