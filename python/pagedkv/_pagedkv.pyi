"""Type stubs of the compiled module pagedkv._pagedkv (python/src). Shapes use named dims;
units are tokens unless named blocks. A result's array fields are numpy views of the result's
own buffers, made when read; each keeps its result alive. Every call raises ValueError for an
argument wrong on its own and ContractError for one the manager's state forbids; None means
out of blocks."""

import enum
from typing import Any, List, Optional, Sequence, overload

import numpy as np
import numpy.typing as npt

ROOT_BLOCK_HASH: int
"""Parent key of the first block of every sequence."""
PADDING_SEQ: int
"""Sequence id of a padding row in batch_metadata (-1)."""
NO_BLOCK: int
"""block_table entry of a block released by token eviction (-1)."""
MAX_TOKENS_PER_CALL: int
"""Most tokens one append takes (2**24)."""
WITH_CUDA: bool
"""True when this pagedkv was built with CUDA: the ops below then take CUDA arrays too."""

class Error(Exception):
    """Base of pagedkv's errors."""

class ContractError(Error):
    """A contract violation (C++ pagedkv::Error); the message names the value."""

class Admission(enum.Enum):
    OK = ...
    LATER = ...
    NEVER = ...

class EvictionKind(enum.Enum):
    NONE = ...
    SLIDING_WINDOW = ...
    ATTENTION_SINKS = ...
    HEAVY_HITTERS = ...

class EventKind(enum.Enum):
    STORED = ...
    REMOVED = ...
    EVICTED = ...
    ALL_CLEARED = ...

class EvictionPolicyConfig:
    """Token eviction parameters (tokens): window (SLIDING_WINDOW, ATTENTION_SINKS), sinks
    (ATTENTION_SINKS), recent and heavy (HEAVY_HITTERS)."""
    kind: EvictionKind
    window: int
    sinks: int
    recent: int
    heavy: int
    def __init__(self, kind: EvictionKind = ..., window: int = 0, sinks: int = 0,
                 recent: int = 0, heavy: int = 0) -> None: ...

class KVCacheManagerConfig:
    """Configuration of a KVCacheManager; KVCacheManager(config) checks it (ValueError)."""
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool
    num_host_blocks: int
    watermark: float
    max_model_len: int
    eviction: EvictionPolicyConfig
    enable_events: bool
    def __init__(self, num_blocks: int, block_size: int = 16, *,
                 enable_prefix_caching: bool = False, num_host_blocks: int = 0,
                 watermark: float = 0.0, max_model_len: int = 0,
                 eviction: EvictionPolicyConfig = ..., enable_events: bool = False) -> None: ...

class AddOptions:
    """extra_key: prefix-cache salt; max_new_tokens (>= 0): for admission only;
    first_chunk_tokens (>= -1): chunked prefill, -1 = the whole prompt."""
    extra_key: int
    max_new_tokens: int
    first_chunk_tokens: int
    def __init__(self, *, extra_key: int = 0, max_new_tokens: int = 0,
                 first_chunk_tokens: int = -1) -> None: ...

class AppendResult:
    slots: npt.NDArray[np.int64]
    """[n] slot (block * block_size + offset) of each new token."""
    copies: npt.NDArray[np.int32]
    """[k, 2] (src, dst) blocks to copy, all layers, before writing the slots (k <= 1)."""
    num_copies: int
    """k, without making the copies array (about 0.1 us against 1.7 us)."""

class AddResult:
    num_computed_tokens: int
    """Leading prompt tokens already cached (a multiple of block_size, <= len - 1)."""
    slots: npt.NDArray[np.int64]
    """[len - num_computed_tokens] slots the prefill writes."""
    copies: npt.NDArray[np.int32]
    """[0, 2]."""
    num_copies: int
    """0 (as AppendResult.num_copies)."""

class PrefixLookup:
    num_computed_tokens: int
    blocks: npt.NDArray[np.int32]
    """[num_computed_tokens / block_size] the blocks that would be shared."""

class SwapResult:
    copies: npt.NDArray[np.int32]
    """[live blocks, 2] (src, dst): device -> host for swap_out, host -> device for swap_in."""

class PreemptedSequence:
    seq: int
    num_tokens: int
    tokens: npt.NDArray[np.int32]
    """[num_tokens] the ids to prefill again, or [0] when some were unknown."""
    extra_key: int

class KeptTokens:
    indptr: npt.NDArray[np.int32]
    """[num_seqs + 1]"""
    slots: npt.NDArray[np.int64]
    """[indptr[-1]]"""
    positions: npt.NDArray[np.int64]
    """[indptr[-1]]"""

class BatchMetadata:
    """One batch step's metadata; row i is seqs[i] (a PADDING_SEQ row: length 0, no blocks)."""
    block_size: int
    num_seqs: int
    max_blocks_per_seq: int
    num_blocks: int
    block_tables: npt.NDArray[np.int32]
    """[num_seqs, max_blocks_per_seq] physical blocks, -1 padded (vLLM block_tables)."""
    seq_lens: npt.NDArray[np.int32]
    """[num_seqs] tokens per sequence (vLLM seq_lens; the C++ context_lens)."""
    context_lens: npt.NDArray[np.int32]
    """The same array as seq_lens."""
    paged_kv_indptr: npt.NDArray[np.int32]
    """[num_seqs + 1] CSR offsets into paged_kv_indices (FlashInfer)."""
    paged_kv_indices: npt.NDArray[np.int32]
    """[paged_kv_indptr[-1]] each sequence's blocks in logical order (FlashInfer)."""
    paged_kv_last_page_len: npt.NDArray[np.int32]
    """[num_seqs] tokens in each last block, in [1, block_size]; 0 for an empty row."""
    slot_mapping: npt.NDArray[np.int64]
    """[sum(num_new_tokens)] slot of each token written this step (vLLM slot_mapping)."""
    query_start_loc: npt.NDArray[np.int32]
    """[num_seqs + 1] prefix sum of num_new_tokens (vLLM query_start_loc)."""
    qo_indptr: npt.NDArray[np.int32]
    """The same array as query_start_loc (FlashInfer qo_indptr)."""

class KVCacheStats:
    """Counters (blocks unless named _tokens)."""
    total_blocks: int
    free_blocks: int
    used_blocks: int
    cached_blocks: int
    usage: float
    num_sequences: int
    num_swapped_sequences: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    prefix_hits: int
    prefix_misses: int
    prefix_evictions: int
    prefix_cached_entries: int
    preemptions: int
    swapped_out_blocks: int
    swapped_in_blocks: int
    host_total_blocks: int
    host_used_blocks: int
    released_blocks: int
    evicted_tokens: int
    @property
    def prefix_hit_rate(self) -> float: ...

class KVCacheEvent:
    """A prefix-cache event. STORED: block registered (hash, parent_hash, extra_key, tokens
    [block_size]); REMOVED: unregistered without reuse; EVICTED: cached block taken for reuse;
    ALL_CLEARED: reset_prefix_cache emptied the prefix cache (vLLM's AllBlocksCleared; after
    its REMOVED events; block -1, hash 0)."""
    kind: EventKind
    block: int
    hash: int
    parent_hash: int
    extra_key: int
    tokens: List[int]

def block_hash(parent: int, tokens: Sequence[int], extra_key: int = 0) -> int:
    """Content key of a full block: XXH3-64 of (parent key, extra key, token ids)."""

# Paged attention on pools the engine owns (CPU kernels; any __dlpack__ array: numpy, torch CPU
# tensors), read in place through their own strides. Pools: vLLM-style separate k_cache and
# v_cache, each [num_blocks, block_size, kv_heads, head_dim] (layout "NHD") or
# [num_blocks, kv_heads, block_size, head_dim] ("HND"), head_dim contiguous; or FlashInfer's
# combined pool as k_cache with v_cache None: [num_pages, 2, page_size, kv_heads, head_dim]
# ("NHD") or [num_pages, 2, kv_heads, page_size, head_dim] ("HND"), V at index 1.
# Pool dtypes: float32 / float16 / bfloat16; int8 (kv_dtype None or "int8"); uint8 holding fp8
# bytes, with kv_dtype "fp8_e4m3" or "fp8_e5m2" (required: uint8 does not say which). 8-bit
# pools take k_scale and v_scale, float32 [1] (per tensor) or [kv_heads] (per head), finite and
# > 0: x = stored * scale (vLLM's k_scale / v_scale). q and out float32, float16 or bfloat16
# (torch), C-contiguous, out of q's dtype; computed in fp32, out rounded to nearest even.
# ValueError names a wrong shape, dtype, device, stride, kv_dtype or scale; ContractError comes
# from the kernel (head_dim or block_size mismatch, a block id out of range). GIL released while
# the kernel runs.
#
# CUDA arrays (WITH_CUDA builds; DLPack device CUDA, e.g. torch CUDA tensors): every array of a
# call on one device (ValueError naming the array and both devices, a CPU array among CUDA ones
# included; without CUDA: "this pagedkv was built without CUDA"), run with that device current
# on `stream` (a cudaStream_t int; None: torch's current stream for torch tensors, pagedkv's
# Python layer passes it, else the legacy default stream), asynchronously. CUDA attention takes
# float32 q and out only (ValueError naming the dtype), needs out (the Python layer passes
# torch.empty_like(q) for torch q), and head_dim 64 / 128 / 256, block_size 8 / 16 / 32
# (ContractError otherwise). Decode from block_tables / seq_lens reads them on the device,
# unchecked (ids and lengths must be in range); from meta and for prefill the host tables are
# checked and copied per call. Split-K workspace and metadata copies: cudaMallocAsync /
# cudaFreeAsync on the stream. 8-bit pools' CUDA scales are read back (one stream sync).
# block_copies is always a CPU array (the manager's). `stream` is ignored for CPU arrays.

@overload
def paged_decode_attention(q: Any, k_cache: Any, v_cache: Optional[Any], meta: BatchMetadata,
                           *, layout: str = "NHD", scale: float = 0.0, window_left: int = -1,
                           sink_tokens: int = 0, chunk_size: int = 0, out: Optional[Any] = None,
                           kv_dtype: Optional[str] = None, k_scale: Optional[Any] = None,
                           v_scale: Optional[Any] = None, stream: Optional[int] = None) -> Any:
    """Decode: q [num_seqs, heads, dim], one query per sequence over its whole context;
    returns out [num_seqs, heads, dim] of q's dtype (unless out is given, a new numpy array;
    a torch tensor for bfloat16). The tables' block_size (meta.block_size) must equal the
    pool's."""
@overload
def paged_decode_attention(q: Any, k_cache: Any, v_cache: Optional[Any], block_tables: Any,
                           seq_lens: Any, *, layout: str = "NHD", scale: float = 0.0,
                           window_left: int = -1, sink_tokens: int = 0, chunk_size: int = 0,
                           out: Optional[Any] = None, kv_dtype: Optional[str] = None,
                           k_scale: Optional[Any] = None, v_scale: Optional[Any] = None,
                           stream: Optional[int] = None) -> Any:
    """Decode over block_tables [num_seqs, max_blocks] int32 and seq_lens [num_seqs] int32,
    built for the pool's block size."""
def paged_prefill_attention(q: Any, k_cache: Any, v_cache: Optional[Any], meta: BatchMetadata,
                            *, layout: str = "NHD", scale: float = 0.0, window_left: int = -1,
                            sink_tokens: int = 0, chunk_size: int = 0, out: Optional[Any] = None,
                            kv_dtype: Optional[str] = None, k_scale: Optional[Any] = None,
                            v_scale: Optional[Any] = None, stream: Optional[int] = None) -> Any:
    """Chunked causal prefill: q [meta.query_start_loc[-1], heads, dim], sequence i's rows at
    its last query_start_loc[i + 1] - query_start_loc[i] positions (their K/V written), after
    its cached prefix."""

def write_kv(key: Any, value: Any, k_cache: Any, v_cache: Optional[Any], slot_mapping: Any, *,
             layout: str = "NHD", kv_dtype: Optional[str] = None, k_scale: Optional[Any] = None,
             v_scale: Optional[Any] = None, stream: Optional[int] = None) -> None:
    """reshape_and_cache: key, value [num_tokens, kv_heads, head_dim] float32, float16 or
    bfloat16 (both the same dtype, else ValueError naming both) go to their slot_mapping
    [num_tokens] int64 slots of the pools (either form above); fp16 / bf16 are widened exactly to
    float32, then converted to the pools' dtype as float32 values are (round to nearest even;
    8-bit: x / scale, saturated); negative slots are padding. Every slot and scale is checked
    before anything is written (ContractError naming the slot, ValueError naming the scale)."""

def copy_blocks(pools: List[Any], block_copies: Any, *, layout: str = "NHD",
                stream: Optional[int] = None) -> None:
    """Copy-on-write in every layer at once: pools [num_layers] of (k_cache, v_cache) tuples or
    combined pools; block_copies [n, 2] int32 (src, dst), applied in order (an AppendResult's
    copies). Ids checked against each pool first (ContractError). 8-bit pools need neither
    kv_dtype nor scales: bytes are copied as they are. CUDA pools: one cuda::copy_blocks launch
    when the pairs are independent and the pools unpadded, else one cudaMemcpyAsync per block
    in order."""

def swap_blocks(src_pools: List[Any], dst_pools: List[Any], block_copies: Any, *,
                src_layout: str = "NHD", dst_layout: str = "NHD",
                stream: Optional[int] = None) -> None:
    """Block copies from src_pools to dst_pools, every layer (a SwapResult's copies): the pools
    may differ in layout and strides, not in dtype or geometry (ContractError naming both).
    With a CUDA side: cudaMemcpyAsync per block (device <-> device on one device, device <->
    host), queued on the stream; synchronize it before reading a host pool."""

class KVPools:
    """The engine's pools of every layer, imported once (FlashInfer's wrappers keep their fixed
    arguments the same way): each per-layer call then imports only its activations, the
    cheapest call per layer (docs/python.md, "KVPools"). pools: [num_layers] of (k_cache,
    v_cache) tuples (vLLM's separate pools) or combined [num_blocks, 2, ...] pools
    (FlashInfer's), checked as the free ops check them (ValueError naming pools[i]); every layer
    of one dtype and geometry; all on one device (the CPU or one CUDA device). The object keeps
    the tensors' memory alive. 8-bit pools: kv_dtype, and k_scale / v_scale either one float32
    [1] or [kv_heads] array for every layer or a list of one per layer; CPU pools' scales are
    read (and checked) here, once."""
    def __init__(self, pools: List[Any], *, layout: str = "NHD", kv_dtype: Optional[str] = None,
                 k_scale: Optional[Any] = None, v_scale: Optional[Any] = None) -> None: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def layout(self) -> str: ...
    @property
    def is_cuda(self) -> bool: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    def write_kv(self, layer: int, key: Any, value: Any, slot_mapping: Any, *,
                 stream: Optional[int] = None) -> None:
        """write_kv into layer's pools: key, value [num_tokens, kv_heads, head_dim] float32,
        float16 or bfloat16, slot_mapping [num_tokens] int64 (meta.slot_mapping). ValueError
        naming layer outside [0, num_layers)."""
    def decode(self, layer: int, q: Any, meta: BatchMetadata, *, out: Optional[Any] = None,
               scale: float = 0.0, window_left: int = -1, sink_tokens: int = 0,
               chunk_size: int = 0, stream: Optional[int] = None) -> Any:
        """paged_decode_attention over layer's pools: q [num_seqs, heads, dim]; returns out
        (the object given, or a new array as the free op makes it)."""
    def prefill(self, layer: int, q: Any, meta: BatchMetadata, *, out: Optional[Any] = None,
                scale: float = 0.0, window_left: int = -1, sink_tokens: int = 0,
                chunk_size: int = 0, stream: Optional[int] = None) -> Any:
        """paged_prefill_attention over layer's pools: q [meta.query_start_loc[-1], heads,
        dim] (a row of one token is a decode row); returns out as decode does."""
    def copy_blocks(self, block_copies: Any, *, stream: Optional[int] = None) -> None:
        """copy_blocks for every layer: block_copies [n, 2] int32 (src, dst), in order."""

class KVCacheManager:
    """Block manager of one paged KV cache (all layers share its block ids). Calls are
    serialized per manager; those that grow with their input release the GIL."""
    def __init__(self, config: KVCacheManagerConfig) -> None: ...
    @property
    def config(self) -> KVCacheManagerConfig: ...
    def add_sequence(self, seq: int, prompt: Sequence[int] = ...,
                     options: AddOptions = ...) -> Optional[AddResult]:
        """Registers seq with its prompt, sharing its longest cached prefix; None when
        can_add_sequence is not OK (nothing changed)."""
    def can_add_sequence(self, prompt: Sequence[int], options: AddOptions = ...) -> Admission:
        """OK exactly when add_sequence would succeed now; NEVER when it never can."""
    def lookup_prefix(self, prompt: Sequence[int], extra_key: int = 0) -> PrefixLookup:
        """What add_sequence would share now, changing nothing."""
    def commit(self, seq: int, num_tokens: int) -> int:
        """The first num_tokens positions have their K/V written: publishes the full blocks
        among them (prefix caching); returns how many."""
    def num_committed_tokens(self, seq: int) -> int: ...
    def truncate(self, seq: int, num_tokens: int) -> None:
        """Keeps the first num_tokens tokens (speculative decoding rollback)."""
    def free_sequence(self, seq: int) -> None:
        """Releases every block of seq (tail first) and forgets it."""
    def fork(self, parent: int, child: int) -> None:
        """child shares every block of parent (copy-on-write on its next append)."""
    def append_slots(self, seq: int, n: int) -> Optional[AppendResult]:
        """Appends n tokens of unknown ids; None when the pool cannot cover them."""
    def append_tokens(self, seq: int, tokens: Sequence[int]) -> Optional[AppendResult]:
        """append_slots that records the ids, so full blocks can be published."""
    def can_append(self, seq: int, n: int, num_lookahead_slots: int = 0) -> bool: ...
    def append_admission(self, seq: int, n: int, num_lookahead_slots: int = 0) -> Admission: ...
    def blocks_needed_to_append(self, seq: int, n: int,
                                num_lookahead_slots: int = 0) -> int: ...
    def batch_metadata(self, seqs: Sequence[int],
                       num_new_tokens: Sequence[int]) -> BatchMetadata:
        """Tables of seqs in both formats and the slots of each one's last num_new_tokens[i]
        positions; GIL released."""
    def kept_tokens(self, seqs: Sequence[int]) -> KeptTokens: ...
    def accumulate_attention(self, seq: int, weights: Sequence[float]) -> None:
        """Heavy hitters: adds weights [kept count] to the kept tokens' scores."""
    def can_swap_out(self, seq: int) -> bool: ...
    def swap_out(self, seq: int) -> Optional[SwapResult]: ...
    def swap_out_admission(self, seq: int) -> Admission: ...
    def can_swap_in(self, seq: int, num_lookahead_slots: int = 0) -> bool: ...
    def swap_in_admission(self, seq: int, num_lookahead_slots: int = 0) -> Admission: ...
    def swap_in(self, seq: int, num_lookahead_slots: int = 0) -> Optional[SwapResult]: ...
    def is_swapped(self, seq: int) -> bool: ...
    def preempt(self, seq: int) -> PreemptedSequence:
        """Recompute preemption: frees seq's blocks and forgets it."""
    def reset_prefix_cache(self) -> int:
        """Drops every prefix-cache registration; returns how many. Events: one REMOVED per
        registration (block order), then one ALL_CLEARED (even when it was empty)."""
    def num_tokens(self, seq: int) -> int: ...
    def block_table(self, seq: int) -> npt.NDArray[np.int32]:
        """[ceil(num_tokens / block_size)] a copy of seq's blocks in logical order."""
    def has_sequence(self, seq: int) -> bool: ...
    def __contains__(self, seq: int) -> bool: ...
    def sequences(self) -> List[int]: ...
    def num_sequences(self) -> int: ...
    def num_free_blocks(self) -> int: ...
    def num_total_blocks(self) -> int: ...
    def watermark_blocks(self) -> int: ...
    def min_blocks_held(self, num_tokens: int) -> int: ...
    def usage(self) -> float: ...
    def stats(self) -> KVCacheStats: ...
    def take_events(self) -> List[KVCacheEvent]:
        """Returns and clears the event log (empty unless enable_events)."""
    def check_invariants(self) -> None:
        """Raises ContractError describing the first broken invariant; GIL released."""
