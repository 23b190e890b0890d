"""pagedkv: paged KV-cache management for Python serving engines.

The control plane of a paged KV cache (vLLM's PagedAttention block manager): a
:class:`KVCacheManager` hands out fixed-size blocks to sequences, shares full blocks of equal
prompt prefixes (prefix caching), preempts by swap or recompute, and builds the per-step
metadata attention kernels read (:meth:`KVCacheManager.batch_metadata`) as numpy arrays.

Errors: ``ValueError`` for an argument that is wrong on its own (negative count, token id
outside int32, bad configuration); :class:`ContractError` (a :class:`Error`) for a call the
manager's state forbids (unknown or swapped sequence, commit past the end, ...). Running out of
blocks is not an error: the call returns ``None`` and changes nothing.

The ops on the engine's pools (``write_kv``, the attention ops, ``copy_blocks``,
``swap_blocks``) take CPU arrays and, in a build with CUDA (:data:`WITH_CUDA`), CUDA arrays;
for torch CUDA tensors they run on torch's current stream unless ``stream`` is given.
:class:`KVPools` holds the pools of every layer, imported once, for per-layer calls that
import only their activations (the cheapest path per call).

See docs/python.md for the install, a quick start and the mapping to vLLM / FlashInfer names.
"""

from ._pagedkv import (
    MAX_TOKENS_PER_CALL,
    NO_BLOCK,
    PADDING_SEQ,
    ROOT_BLOCK_HASH,
    AddOptions,
    AddResult,
    Admission,
    AppendResult,
    BatchMetadata,
    ContractError,
    Error,
    EventKind,
    EvictionKind,
    EvictionPolicyConfig,
    KeptTokens,
    KVCacheEvent,
    KVCacheManager,
    KVCacheManagerConfig,
    KVCacheStats,
    KVPools,
    PreemptedSequence,
    PrefixLookup,
    SwapResult,
    WITH_CUDA,
    block_hash,
)
from ._ops import (
    copy_blocks,
    paged_decode_attention,
    paged_prefill_attention,
    swap_blocks,
    write_kv,
)
from ._metadata import batch_metadata_to_torch, replay_prefix_index

__version__ = "0.1.0"

__all__ = [
    "MAX_TOKENS_PER_CALL",
    "NO_BLOCK",
    "PADDING_SEQ",
    "ROOT_BLOCK_HASH",
    "AddOptions",
    "AddResult",
    "Admission",
    "AppendResult",
    "BatchMetadata",
    "ContractError",
    "Error",
    "EventKind",
    "EvictionKind",
    "EvictionPolicyConfig",
    "KeptTokens",
    "KVCacheEvent",
    "KVCacheManager",
    "KVCacheManagerConfig",
    "KVCacheStats",
    "KVPools",
    "PreemptedSequence",
    "PrefixLookup",
    "SwapResult",
    "WITH_CUDA",
    "batch_metadata_to_torch",
    "block_hash",
    "copy_blocks",
    "paged_decode_attention",
    "paged_prefill_attention",
    "replay_prefix_index",
    "swap_blocks",
    "write_kv",
]
