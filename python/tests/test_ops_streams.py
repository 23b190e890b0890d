"""The pure-Python layer over the ops (pagedkv/_ops.py), with a fake torch: torch's current
stream of the first torch CUDA tensor's device is passed unless the caller gives a stream, the
attention ops get out = torch.empty_like(q) for a torch CUDA q, and nothing else changes. Also:
``import pagedkv`` imports no torch, and a stream is ignored for CPU arrays."""

import subprocess
import sys
import types

import numpy as np
import pytest

import pagedkv as pk
from pagedkv import _ops


class FakeTensor:
    def __init__(self, device):
        self.device = device
        self.is_cuda = device.startswith("cuda")


@pytest.fixture
def fake_torch(monkeypatch):
    streams = {"cuda:0": 1000, "cuda:1": 1001}
    made = []

    def empty_like(t):
        made.append(FakeTensor(t.device))
        return made[-1]

    torch = types.SimpleNamespace(
        Tensor=FakeTensor,
        cuda=types.SimpleNamespace(
            current_stream=lambda dev: types.SimpleNamespace(cuda_stream=streams[dev])),
        empty_like=empty_like)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return made


def recorder():
    calls = []

    def op(*args, **kwargs):
        calls.append((args, kwargs))
        return "done"

    return op, calls


def test_the_current_stream_of_the_first_cuda_tensor(fake_torch):
    op, calls = recorder()
    wrapped = _ops.on_stream(op)
    cpu, dev1 = FakeTensor("cpu"), FakeTensor("cuda:1")
    assert wrapped([(cpu, cpu), (dev1, FakeTensor("cuda:0"))], np.zeros(2)) == "done"
    assert calls[-1][1] == {"stream": 1001}  # found inside the pools' list of tuples
    wrapped(FakeTensor("cuda:0"), layout="HND")
    assert calls[-1][1] == {"layout": "HND", "stream": 1000}
    wrapped(cpu, k_scale=dev1)  # keyword arguments count too
    assert calls[-1][1]["stream"] == 1001
    wrapped(FakeTensor("cuda:0"), stream=7)  # the caller's stream wins
    assert calls[-1][1] == {"stream": 7}
    wrapped(cpu, np.zeros(3))  # no CUDA tensor: the compiled op's default
    assert calls[-1][1] == {"stream": None}


def test_attention_gets_out_for_a_torch_cuda_q(fake_torch):
    op, calls = recorder()
    wrapped = _ops.on_stream(op, makes_out=True)
    q = FakeTensor("cuda:1")
    wrapped(q, "k", "v", "meta")
    assert calls[-1][1]["out"] is fake_torch[-1] and fake_torch[-1].device == "cuda:1"
    mine = FakeTensor("cuda:1")
    wrapped(q, "k", "v", "meta", out=mine)
    assert calls[-1][1]["out"] is mine and len(fake_torch) == 1
    wrapped(q=FakeTensor("cuda:0"), k_cache="k", v_cache="v", meta="m")
    assert len(fake_torch) == 2 and calls[-1][1]["stream"] == 1000
    wrapped(FakeTensor("cpu"), FakeTensor("cuda:0"), "v", "meta")  # a CPU q: the op refuses
    assert "out" not in calls[-1][1] and calls[-1][1]["stream"] == 1000


def test_without_torch_nothing_is_looked_up(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    op, calls = recorder()
    _ops.on_stream(op, makes_out=True)(object(), out=None)
    assert calls[-1][1] == {"out": None, "stream": None}


def test_the_package_wraps_every_op_and_imports_no_torch():
    for name in ["write_kv", "copy_blocks", "swap_blocks", "paged_decode_attention",
                 "paged_prefill_attention"]:
        assert getattr(pk, name).__wrapped__ is getattr(pk._pagedkv, name)
    code = "import sys, pagedkv; print('torch' in sys.modules, pagedkv.WITH_CUDA in (0, 1))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_a_stream_is_ignored_for_cpu_arrays():
    k = np.zeros((2, 8, 1, 4), np.float32)
    v = np.zeros_like(k)
    key = np.ones((1, 1, 4), np.float32)
    pk.write_kv(key, key, k, v, np.array([9]), stream=12345)
    assert k[1, 1, 0].tolist() == [1.0] * 4
    pk.copy_blocks([(k, v)], np.array([[1, 0]], np.int32), stream=1)
    assert k[0, 1, 0].tolist() == [1.0] * 4
