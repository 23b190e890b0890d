"""Pure-Python helpers over the compiled module: metadata as torch tensors, and the prefix
index a cache-aware router rebuilds from a manager's event stream."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

from ._pagedkv import ROOT_BLOCK_HASH, BatchMetadata, EventKind, KVCacheEvent

_ARRAYS = (
    "block_tables",
    "seq_lens",
    "paged_kv_indptr",
    "paged_kv_indices",
    "paged_kv_last_page_len",
    "slot_mapping",
    "query_start_loc",
)


def batch_metadata_to_torch(meta: BatchMetadata, device: Optional[Any] = None) -> Dict[str, Any]:
    """The arrays of ``meta`` as torch tensors, keyed by their vLLM / FlashInfer names.

    On the CPU the tensors share the numpy buffers (``torch.from_numpy``, no copy); with a
    ``device`` (e.g. ``"cuda"``) each is copied there once. ``qo_indptr`` is the same tensor as
    ``query_start_loc``. Dtypes: int32, except ``slot_mapping`` (int64).
    Raises ImportError when torch is not installed.
    """
    import torch  # an optional dependency: only this helper needs it

    out = {}
    for name in _ARRAYS:
        t = torch.from_numpy(getattr(meta, name))
        out[name] = t if device is None else t.to(device)
    out["qo_indptr"] = out["query_start_loc"]
    return out


def replay_prefix_index(events: Iterable[KVCacheEvent], index: Optional[dict] = None) -> dict:
    """Applies an event stream to a router's view of a worker's prefix cache.

    ``index`` maps a block hash to ``(parent_hash, tokens)``; STORED adds an entry (its parent
    is ROOT_BLOCK_HASH or an entry already in the index, which the manager guarantees),
    REMOVED and EVICTED drop one, ALL_CLEARED (a reset of the worker's prefix cache, after
    its REMOVED events) empties the index. Returns the (updated) index. Worked use: hash a prompt's
    full blocks with :func:`block_hash` chained from ROOT_BLOCK_HASH; the leading run of those
    hashes found in the index is the hit :meth:`KVCacheManager.lookup_prefix` reports.
    """
    index = {} if index is None else index
    for e in events:
        if e.kind == EventKind.STORED:
            if e.parent_hash != ROOT_BLOCK_HASH and e.parent_hash not in index:
                raise ValueError(f"stored block {e.block}: parent hash {e.parent_hash} unknown")
            index[e.hash] = (e.parent_hash, tuple(e.tokens))
        elif e.kind == EventKind.ALL_CLEARED:
            index.clear()
        else:
            index.pop(e.hash, None)
    return index
