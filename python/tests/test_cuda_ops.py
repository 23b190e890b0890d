"""The ops on torch CUDA tensors against the same ops on CPU copies: write_kv and block copies
byte for byte, attention within a tolerance (CPU and CUDA kernels sum in different orders), on
torch's current stream and on an explicit one; and hostile calls (mixed devices, a CPU array
among CUDA ones, fp16 q, block_copies on the device). Skipped, with the reason printed, when
torch is absent, torch has no CUDA device, or this pagedkv was built without CUDA. The CUDA
kernels take head_dim 64 / 128 / 256 and block_size 8 / 16 / 32 (supported_configs.hpp)."""

import numpy as np
import pytest

import pagedkv as pk

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA device: torch is not installed", allow_module_level=True)
if not pk.WITH_CUDA:
    pytest.skip("no CUDA device: this pagedkv was built without CUDA", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)

H, KH, D, BS = 8, 2, 64, 16  # query heads, kv heads (GQA 4), head dim, block size
TOL = dict(rtol=1e-4, atol=1e-5)


def cuda(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def host(t):
    return t.cpu().numpy()


def batch(lens, new=None, seed=0, dtype=np.float32):
    """A manager holding sequences of `lens` tokens, NHD pools with their K/V (NaN elsewhere) and
    the step's metadata."""
    rng = np.random.default_rng(seed)
    blocks = sum(-(-n // BS) for n in lens) + 4
    m = pk.KVCacheManager(pk.KVCacheManagerConfig(blocks, BS))
    m.add_sequence(10**6, [0] * (2 * BS))  # scatter the ids
    for i, n in enumerate(lens):
        m.add_sequence(i, [1] * n)
    m.free_sequence(10**6)
    k = np.full((blocks, BS, KH, D), np.nan, np.float32)
    v = np.full_like(k, np.nan)
    for i, n in enumerate(lens):
        t, p = m.block_table(i), np.arange(n)
        k[t[p // BS], p % BS] = rng.standard_normal((n, KH, D), dtype=np.float32)
        v[t[p // BS], p % BS] = rng.standard_normal((n, KH, D), dtype=np.float32)
    meta = m.batch_metadata(list(range(len(lens))), new or [1] * len(lens))
    return m, meta, k.astype(dtype), v.astype(dtype)


@pytest.mark.parametrize("pool_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("key_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_write_kv_writes_the_cpu_bytes(pool_dtype, layout, key_dtype):
    shape = (6, BS, KH, D) if layout == "NHD" else (6, KH, BS, D)
    k, v = np.zeros(shape, pool_dtype), np.full(shape, 3.0, pool_dtype)
    key = torch.randn(20, KH, D).to(key_dtype)
    value = torch.randn(20, KH, D).to(key_dtype)
    slots = np.random.default_rng(1).permutation(6 * BS)[:20].astype(np.int64)
    slots[[3, 11]] = -1  # padding
    kd, vd = cuda(k), cuda(v)
    pk.write_kv(key.cuda(), value.cuda(), kd, vd, cuda(slots), layout=layout)
    pk.write_kv(key, value, k, v, slots, layout=layout)
    torch.cuda.synchronize()
    assert host(kd).tobytes() == k.tobytes() and host(vd).tobytes() == v.tobytes()


def test_write_kv_fp8_pool_with_device_scales():
    k = np.zeros((4, BS, KH, D), np.uint8)
    v = np.zeros_like(k)
    key, value = torch.randn(9, KH, D) * 5, torch.randn(9, KH, D)
    slots = np.arange(9, dtype=np.int64) * 7
    scales = dict(kv_dtype="fp8_e4m3")
    kd, vd = cuda(k), cuda(v)
    pk.write_kv(key.cuda(), value.cuda(), kd, vd, cuda(slots), k_scale=torch.tensor([0.5]).cuda(),
                v_scale=torch.tensor([0.25, 2.0]).cuda(), **scales)
    pk.write_kv(key, value, k, v, slots, k_scale=np.array([0.5], np.float32),
                v_scale=np.array([0.25, 2.0], np.float32), **scales)
    torch.cuda.synchronize()
    assert host(kd).tobytes() == k.tobytes() and host(vd).tobytes() == v.tobytes()
    with pytest.raises(ValueError, match=r"v_scale\[1\] = -1 is not finite and > 0"):
        pk.write_kv(key.cuda(), value.cuda(), kd, vd, cuda(slots), k_scale=torch.ones(1).cuda(),
                    v_scale=torch.tensor([1.0, -1.0]).cuda(), **scales)


@pytest.mark.parametrize("lens", [[54, 97, 13], [4097], [1, 300, 2048, 31, 16]])
def test_decode_matches_the_cpu(lens):
    # One long sequence plans split-K (a cudaMallocAsync workspace); batches of mixed lengths.
    m, meta, k, v = batch(lens)
    q = np.random.default_rng(2).standard_normal((len(lens), H, D), dtype=np.float32)
    want = pk.paged_decode_attention(q, k, v, meta)
    kd, vd, qd = cuda(k), cuda(v), cuda(q)
    np.testing.assert_allclose(host(pk.paged_decode_attention(qd, kd, vd, meta)), want, **TOL)
    got = pk.paged_decode_attention(qd, kd, vd, cuda(meta.block_tables), cuda(meta.seq_lens))
    np.testing.assert_allclose(host(got), want, **TOL)
    kv = torch.stack([kd, vd], dim=1)  # FlashInfer's combined pool
    np.testing.assert_allclose(host(pk.paged_decode_attention(qd, kv, None, meta)), want, **TOL)
    out = torch.full_like(qd, float("nan"))
    assert pk.paged_decode_attention(qd, kd.transpose(1, 2), vd.transpose(1, 2), meta,
                                     layout="HND", out=out) is not None
    np.testing.assert_allclose(host(out), want, **TOL)  # a strided view read in place


def test_decode_on_a_side_stream_and_an_explicit_one():
    m, meta, k, v = batch([300, 77])
    q = np.random.default_rng(3).standard_normal((2, H, D), dtype=np.float32)
    want = pk.paged_decode_attention(q, k, v, meta, window_left=64, sink_tokens=4)
    kd, vd, qd = cuda(k), cuda(v), cuda(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the Python layer passes torch's current stream: this one
        got = pk.paged_decode_attention(qd, kd, vd, meta, window_left=64, sink_tokens=4)
    side.synchronize()
    np.testing.assert_allclose(host(got), want, **TOL)
    out = torch.empty_like(qd)
    pk.paged_decode_attention(qd, kd, vd, meta, window_left=64, sink_tokens=4, out=out,
                              stream=side.cuda_stream)
    side.synchronize()
    np.testing.assert_allclose(host(out), want, **TOL)


@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_decode_with_half_activations_matches_the_cpu(act):
    # fp16 / bf16 q and out (an engine's activations): the same as the CPU kernels, which widen
    # q exactly, compute in fp32 and round out once; up to one rounding of out apart.
    m, meta, k, v = batch([54, 4097])
    q = torch.randn(2, H, D, dtype=act)
    want = torch.as_tensor(pk.paged_decode_attention(q, k, v, meta)).float().numpy()
    got = pk.paged_decode_attention(q.cuda(), cuda(k), cuda(v), meta)
    assert got.dtype == act
    np.testing.assert_allclose(host(got.float()), want, rtol=1e-2, atol=1e-3)


def test_prefill_matches_the_cpu():
    new = [5, 1, 40]
    m, meta, k, v = batch([54, 9, 200], new=new)
    q = np.random.default_rng(4).standard_normal((sum(new), H, D), dtype=np.float32)
    want = pk.paged_prefill_attention(q, k, v, meta, scale=0.2)
    got = pk.paged_prefill_attention(cuda(q), cuda(k), cuda(v), meta, scale=0.2)
    np.testing.assert_allclose(host(got), want, **TOL)


def test_kv_pools_over_cuda_tensors_match_the_cpu():
    # KVPools over torch CUDA pools: write_kv, decode (out defaulted to a new CUDA tensor on
    # torch's current stream, a side stream here), prefill and copy_blocks against the same
    # calls on CPU pools.
    new = [1, 1, 6]
    m, meta, k, v = batch([54, 9, 200], new=new)
    kd, vd = cuda(k), cuda(v)
    cpu, dev = pk.KVPools([(k, v)]), pk.KVPools([(kd, vd)])
    assert dev.is_cuda and not cpu.is_cuda
    rng = np.random.default_rng(5)
    key = rng.standard_normal((8, KH, D), dtype=np.float32)
    value = rng.standard_normal((8, KH, D), dtype=np.float32)
    cpu.write_kv(0, key, value, meta.slot_mapping)
    dev.write_kv(0, cuda(key), cuda(value), cuda(meta.slot_mapping))
    torch.cuda.synchronize()
    assert host(kd).tobytes() == k.tobytes() and host(vd).tobytes() == v.tobytes()
    q = rng.standard_normal((8, H, D), dtype=np.float32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = dev.prefill(0, cuda(q), meta)
    side.synchronize()
    assert got.is_cuda
    np.testing.assert_allclose(host(got), cpu.prefill(0, q, meta), **TOL)
    pairs = np.array([[1, 2]], np.int32)
    cpu.copy_blocks(pairs)
    dev.copy_blocks(pairs)
    torch.cuda.synchronize()
    assert host(kd).tobytes() == k.tobytes()
    with pytest.raises(ValueError, match=r"q is on the CPU but pools\[0\] is on cuda:0"):
        dev.decode(0, q[:3], meta)


def layers_of(n, blocks, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((blocks, BS, KH, D), dtype=np.float32),
             rng.standard_normal((blocks, BS, KH, D), dtype=np.float32)) for _ in range(n)]


@pytest.mark.parametrize("pairs", [[[1, 2], [0, 5]],  # independent: one cuda::copy_blocks
                                   [[1, 2], [2, 3], [4, 4]]])  # chained: in order, as the CPU
def test_copy_blocks_copies_the_cpu_bytes(pairs):
    cpu = layers_of(3, 6, 5)
    dev = [(cuda(k), cuda(v)) for k, v in cpu]
    copies = np.array(pairs, np.int32)
    pk.copy_blocks(cpu, copies)
    pk.copy_blocks(dev, copies)
    want = [np.stack(layers_of(1, 6, 7)[0], axis=1)]  # FlashInfer's combined pool
    combined = [cuda(want[0])]
    pk.copy_blocks(want, copies)
    pk.copy_blocks(combined, copies)
    torch.cuda.synchronize()
    for (k, v), (kd, vd) in zip(cpu, dev):
        assert host(kd).tobytes() == k.tobytes() and host(vd).tobytes() == v.tobytes()
    assert host(combined[0]).tobytes() == want[0].tobytes()


@pytest.mark.parametrize("host_layout", ["NHD", "HND"])
def test_swap_out_and_in_copy_the_cpu_bytes(host_layout):
    dev_cpu = layers_of(2, 6, 6)
    dev = [(cuda(k), cuda(v)) for k, v in dev_cpu]
    shape = (4, BS, KH, D) if host_layout == "NHD" else (4, KH, BS, D)
    host_pools = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(2)]
    want = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(2)]
    out_pairs = np.array([[5, 0], [2, 3]], np.int32)
    pk.swap_blocks(dev, host_pools, out_pairs, dst_layout=host_layout)  # device -> host
    pk.swap_blocks(dev_cpu, want, out_pairs, dst_layout=host_layout)
    torch.cuda.synchronize()
    for a, b in zip(host_pools, want):
        assert a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes()
    in_pairs = np.array([[0, 1], [3, 4]], np.int32)
    pk.swap_blocks(host_pools, dev, in_pairs, src_layout=host_layout)  # host -> device
    pk.swap_blocks(want, dev_cpu, in_pairs, src_layout=host_layout)
    other = [(cuda(np.zeros_like(k)), cuda(np.zeros_like(v))) for k, v in dev_cpu]
    pk.swap_blocks(dev, other, np.array([[1, 1], [4, 0]], np.int32))  # device -> device
    torch.cuda.synchronize()
    for (k, v), (kd, vd) in zip(dev_cpu, dev):
        assert host(kd).tobytes() == k.tobytes() and host(vd).tobytes() == v.tobytes()
    for (kd, vd), (ko, vo) in zip(dev, other):
        assert torch.equal(ko[0], kd[4]) and torch.equal(vo[1], vd[1])


def test_hostile_calls_name_the_array_and_the_devices():
    m, meta, k, v = batch([20, 30])
    q = torch.randn(2, H, D)
    kd, vd = cuda(k), cuda(v)
    cases = [
        (lambda: pk.paged_decode_attention(q, kd, vd, meta), r"k_cache is on cuda:0 but q is on "
                                                             r"the CPU"),
        (lambda: pk.paged_decode_attention(q.cuda(), kd, v, meta), "v_cache is on the CPU"),
        (lambda: pk.paged_decode_attention(q.cuda().half(), kd, vd, meta,
                                           out=torch.empty_like(q.cuda())),
         "out: dtype float32 differs from q's float16"),
        (lambda: pk.paged_decode_attention(q.cuda(), kd, vd, meta.block_tables, cuda(meta.seq_lens)),
         "block_tables is on the CPU"),
        (lambda: pk._pagedkv.paged_decode_attention(q.cuda(), kd, vd, meta), "out is required"),
        (lambda: pk.write_kv(q.cuda()[:, :KH], q.cuda()[:, :KH], kd, vd, np.zeros(2, np.int64)),
         "slot_mapping is on the CPU"),
        (lambda: pk.copy_blocks([(kd, vd)], cuda(np.array([[0, 1]], np.int32))),
         "block_copies is on cuda:0: it must be a CPU array"),
        (lambda: pk.copy_blocks([(kd, v)], np.array([[0, 1]], np.int32)),
         r"pools\[0\]\[1\] is on the CPU but pools\[0\]\[0\] is on cuda:0"),
    ]
    if torch.cuda.device_count() > 1:
        cases.append((lambda: pk.paged_decode_attention(q.cuda(), kd, vd.to("cuda:1"), meta),
                      "v_cache is on cuda:1 but q is on cuda:0"))
    for call, named in cases:
        with pytest.raises(ValueError, match=named):
            call()
    with pytest.raises(pk.ContractError, match="head_dim"):  # the CUDA kernels' supported set
        small = torch.zeros(k.shape[0], BS, KH, 8).cuda()
        pk.paged_decode_attention(torch.zeros(2, H, 8).cuda(), small, small, meta)
