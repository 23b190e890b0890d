"""The ops on the engine's pools with torch's CUDA conventions: for torch CUDA tensors they run
on torch's current stream of the tensors' device unless ``stream`` is given, and the attention
ops allocate ``out`` with ``torch.empty_like(q)`` unless it is given (the compiled module
allocates nothing on a device). For CPU arrays, and CUDA arrays of other frameworks, the call
goes to the compiled op unchanged.

torch is never imported here: a torch tensor among the arguments means torch is already in
``sys.modules``, so ``import pagedkv`` stays free of torch and of any CUDA call.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Iterable, Optional

from . import _pagedkv


def _torch_cuda_tensor(values: Iterable[Any]) -> Optional[Any]:
    """The first torch CUDA tensor among ``values``, looking into lists and tuples (the pools
    of copy_blocks / swap_blocks); None without one or when torch is not imported. Called on
    every op: a plain loop (no copies of the arguments) keeps it under a microsecond."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    for v in values:
        if isinstance(v, tensor):
            if v.is_cuda:
                return v
        elif isinstance(v, (list, tuple)):
            found = _torch_cuda_tensor(v)
            if found is not None:
                return found
    return None


def current_stream(values: Iterable[Any]) -> Optional[int]:
    """The ``cudaStream_t`` (an int) of torch's current stream on the device of the first torch
    CUDA tensor among ``values``; None (the compiled op's default: the legacy default stream)
    without one."""
    tensor = _torch_cuda_tensor(values)
    if tensor is None:
        return None
    return sys.modules["torch"].cuda.current_stream(tensor.device).cuda_stream


def empty_like_pool(pool: Any, shape: tuple, dtype: str) -> Optional[Any]:
    """For KVPools over torch CUDA pools, the ``out`` of an attention call: a new torch tensor
    of ``shape`` and ``dtype`` (q's: "float32", "float16" or "bfloat16", torch's names too) on
    ``pool``'s device; None when ``pool`` is not a torch CUDA tensor (out is then required)."""
    if _torch_cuda_tensor((pool,)) is None:
        return None
    torch = sys.modules["torch"]
    return torch.empty(shape, dtype=getattr(torch, dtype), device=pool.device)


def on_stream(op: Callable[..., Any], *, makes_out: bool = False) -> Callable[..., Any]:
    """``op`` with ``stream`` defaulted to :func:`current_stream` of its arguments and, with
    ``makes_out``, ``out`` to ``torch.empty_like(q)`` when q (the first argument) is a torch
    CUDA tensor."""

    @functools.wraps(op)
    def call(*args: Any, stream: Optional[int] = None, **kwargs: Any) -> Any:
        if stream is None:
            tensor = _torch_cuda_tensor(args)
            if tensor is None and kwargs:
                tensor = _torch_cuda_tensor(kwargs.values())
            if tensor is not None:
                stream = sys.modules["torch"].cuda.current_stream(tensor.device).cuda_stream
        if makes_out and kwargs.get("out") is None:
            q = args[0] if args else kwargs.get("q")
            if _torch_cuda_tensor((q,)) is not None:
                kwargs["out"] = sys.modules["torch"].empty_like(q)
        return op(*args, stream=stream, **kwargs)

    return call


copy_blocks = on_stream(_pagedkv.copy_blocks)
swap_blocks = on_stream(_pagedkv.swap_blocks)
write_kv = on_stream(_pagedkv.write_kv)
paged_decode_attention = on_stream(_pagedkv.paged_decode_attention, makes_out=True)
paged_prefill_attention = on_stream(_pagedkv.paged_prefill_attention, makes_out=True)
