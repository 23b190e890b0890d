"""The Llama forward pass of llama2.c's ``run.c`` over a batch of token rows, its KV cache in
pagedkv pools.

One call runs a whole engine step: every scheduled sequence's new tokens as rows of one matrix
(the matrix products batched over all of them), then per layer the cache write
(``KVPools.write_kv``, vLLM's reshape_and_cache) at the manager's slots and one attention call,
``KVPools.prefill`` (chunked causal prefill after the cached prefix; a decoding sequence is a
row of one token). The pools of every layer are imported into one ``pagedkv.KVPools`` when the
engine starts, so a per-layer call hands pagedkv only its activations. Activations in numpy
(torch tensors with the torch backend); matrix products by numpy's BLAS, or torch's.

Formulas (run.c): rmsnorm(x) = w * x / sqrt(mean(x^2) + 1e-5); RoPE rotates adjacent pairs
(2j, 2j + 1) of each head by pos * 10000^(-2j / head_dim); attention scale 1 / sqrt(head_dim),
GQA head h reads KV head h // (n_heads / n_kv_heads); FFN w2(silu(w1 x) * w3 x); logits wcls x.
"""

from __future__ import annotations

import operator

import numpy as np

import pagedkv as pk

try:
    import torch
except ImportError:  # numpy fallback
    torch = None

from checkpoint import Config


def rope_tables(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [seq_len, head_dim / 2] float32, computed in float32 as run.c does."""
    hd = cfg.head_dim
    j = np.arange(0, hd, 2, dtype=np.float32)
    freq = np.float32(1.0) / np.power(np.float32(10000.0), j / np.float32(hd))
    angle = np.arange(cfg.seq_len, dtype=np.float32)[:, None] * freq[None, :]
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


BACKENDS = ("torch", "numpy+torch", "numpy")


def rotation_matrices(cfg: Config) -> np.ndarray:
    """R [seq_len, hd, hd] float32 with row-vector convention (x @ R[pos]): for each pair
    (2j, 2j + 1), out[2j] = x[2j] cos - x[2j+1] sin, out[2j+1] = x[2j] sin + x[2j+1] cos (the
    same products and sum per element as run.c; the other terms are exact zeros)."""
    cos, sin = rope_tables(cfg)
    hd = cfg.head_dim
    r = np.zeros((cfg.seq_len, hd, hd), dtype=np.float32)
    e, o = np.arange(0, hd, 2), np.arange(1, hd, 2)
    r[:, e, e], r[:, o, e] = cos, -sin
    r[:, e, o], r[:, o, o] = sin, cos
    return r


class Llama:
    """The model's weights and the step's arithmetic on one of three backends:
    ``"torch"``: everything in torch tensors on ``device`` (the one for CUDA);
    ``"numpy+torch"``: activations in numpy, the matrix products by torch (for a numpy whose
    BLAS is slow: Debian's reference BLAS); ``"numpy"``: numpy only (no torch needed; the
    fastest on the CPU with an optimized BLAS behind numpy, whose per-operation cost is a
    fraction of torch 1.13's). ``"auto"``: torch on a GPU, numpy on the CPU.
    Stored for few operations per layer (each costs 0.5 to 3 us of dispatch at this model's
    size, more than its arithmetic): every matrix transposed once (x @ W), wq|wk|wv fused into
    one [dim, (n_heads + 2 n_kv_heads) head_dim] and w1|w3 into one [dim, 2 hidden], rmsnorm's
    weights folded into the matrix after each norm, one list entry per layer, and RoPE as one
    batched product of q's and k's heads together with a block-diagonal rotation per position
    (rotation_matrices; a stack of small products is 2 to 6 times faster in numpy than the
    elementwise form at 1 to 64 rows)."""

    def __init__(self, cfg: Config, weights: dict[str, np.ndarray], *, backend: str = "auto",
                 device: str = "cpu"):
        if backend == "auto":
            backend = "numpy" if torch is None or device == "cpu" else "torch"
        if backend not in BACKENDS:
            raise ValueError(f"backend = {backend!r}: expected one of {BACKENDS} or 'auto'")
        if backend != "numpy" and torch is None:
            raise ValueError(f"backend = {backend!r} but torch is not importable")
        if backend != "torch" and device != "cpu":
            raise ValueError(f"device = {device!r}: the {backend} backend runs on the CPU only")
        self.cfg, self.device = cfg, device
        self.backend = "torch" if backend == "torch" else "numpy"  # the activations' library
        self.torch_products = backend == "numpy+torch"
        self.lib = np if self.backend == "numpy" else torch
        t = lambda name: np.swapaxes(weights[name], 1, 2)  # noqa: E731  [L, in, out]
        # rmsnorm is folded into the matrix after it: (w * x / sqrt(sum(x^2) / dim + eps)) @ W
        # = (x / sqrt(sum(x^2) + dim eps)) @ (sqrt(dim) diag(w) W), so a norm is 4 or 5 numpy
        # calls (_normalized); the products round differently from run.c's (about 1e-7).
        fold = np.float32(np.sqrt(cfg.dim))
        att = weights["rms_att"][:, :, None] * fold
        ffn = weights["rms_ffn"][:, :, None] * fold
        wqkv = np.concatenate([t("wq"), t("wk"), t("wv")], axis=2) * att
        w13 = np.concatenate([t("w1"), t("w3")], axis=2) * ffn
        L = cfg.n_layers
        self.wqkv = [self._matrix(wqkv[i]) for i in range(L)]
        self.wo = [self._matrix(t("wo")[i]) for i in range(L)]
        self.w13 = [self._matrix(w13[i]) for i in range(L)]
        self.w2 = [self._matrix(t("w2")[i]) for i in range(L)]
        self.wcls = self._matrix(weights["wcls"].T * (weights["rms_final"][:, None] * fold))
        self.ones_col = self.array(np.ones((cfg.dim, 1), dtype=np.float32))  # sum(x^2) = x^2 @ 1
        self.norm_eps = np.float32(cfg.dim * 1e-5)
        self.tok_embeddings = self.array(weights["tok_embeddings"])
        self.rope = self.array(rotation_matrices(cfg))

    def _matrix(self, a: np.ndarray):
        a = np.ascontiguousarray(a)
        return torch.from_numpy(a) if self.torch_products else self.array(a)

    def mm(self, x, w):
        """x @ w: by torch for numpy activations under numpy+torch (zero-copy both ways).
        forward calls ``operator.matmul`` itself for the other backends."""
        return (torch.from_numpy(x) @ w).numpy()

    # --- the two backends -------------------------------------------------------------------
    def array(self, a: np.ndarray):
        """numpy -> this backend's array on its device (contiguous float32 or int64)."""
        a = np.ascontiguousarray(a)
        return a if self.backend == "numpy" else torch.from_numpy(a).to(self.device)

    def empty(self, *shape):
        if self.backend == "numpy":
            return np.empty(shape, dtype=np.float32)
        return torch.empty(shape, dtype=torch.float32, device=self.device)

    def full(self, shape, value: float):
        if self.backend == "numpy":
            return np.full(shape, value, dtype=np.float32)
        return torch.full(shape, value, dtype=torch.float32, device=self.device)

    def to_numpy(self, a) -> np.ndarray:
        return a if self.backend == "numpy" else a.cpu().numpy()

    def contiguous(self, a):
        return np.ascontiguousarray(a) if self.backend == "numpy" else a.contiguous()

    def _normalized(self, x):
        """x / sqrt(sum(x^2) + dim 1e-5): rmsnorm up to the factor and weight folded into the
        next matrix. A single row's sum(x^2) is x @ x.T, one call."""
        if self.backend == "torch":
            return x * torch.rsqrt((x * x).sum(-1, keepdim=True).add_(self.norm_eps))
        if len(x) == 1:
            return x / np.sqrt(x @ x.T + self.norm_eps)
        return x / np.sqrt((x * x) @ self.ones_col + self.norm_eps)

    def _silu_mul(self, gate_up):
        a, b = gate_up[:, :self.cfg.hidden_dim], gate_up[:, self.cfg.hidden_dim:]
        if self.backend == "torch":
            return torch.nn.functional.silu(a) * b
        return a * b / (1.0 + np.exp(-a))

    # --- the step ---------------------------------------------------------------------------
    def new_pools(self, num_blocks: int, block_size: int) -> list[tuple]:
        """Per layer (k_cache, v_cache), vLLM's separate NHD pools
        [num_blocks, block_size, n_kv_heads, head_dim] float32, filled with NaN: a slot the
        engine never wrote that reached attention would turn the logits into NaN."""
        shape = (num_blocks, block_size, self.cfg.n_kv_heads, self.cfg.head_dim)
        return [(self.full(shape, float("nan")), self.full(shape, float("nan")))
                for _ in range(self.cfg.n_layers)]

    def kernel_pools(self, pools: list[tuple]) -> pk.KVPools:
        """The pools of every layer imported once into a pagedkv.KVPools: the per-layer calls
        of forward then hand pagedkv only the step's activations (same memory, no copy)."""
        return pk.KVPools(pools, layout="NHD")

    def forward(self, kpools: pk.KVPools, tokens: np.ndarray, positions: np.ndarray, meta,
                logit_rows: np.ndarray) -> np.ndarray:
        """One step. tokens, positions [T] int64: the rows of meta's sequences in its order
        (sequence i's new tokens are rows query_start_loc[i] to query_start_loc[i + 1]).
        Writes the rows' K/V at meta.slot_mapping, and attends with one
        ``KVPools.prefill`` call per layer over every row: a decoding sequence is a row of
        one new token (vLLM v1 schedules decode and chunked prefill alike). Returns logits
        [len(logit_rows), vocab] float32 of the rows logit_rows."""
        cfg = self.cfg
        T, hd, H, KV = len(tokens), cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        qk_width = (H + KV) * hd
        slots = meta.slot_mapping
        if self.backend == "torch":
            slots = slots if self.device == "cpu" else torch.from_numpy(slots).to(self.device)
            positions, tokens = self.array(positions), self.array(tokens)
            logit_rows = self.array(logit_rows)
        # Every call below costs its dispatch (0.2 to 3 us), more than its arithmetic at this
        # model's size: no method indirection for the products, no copy a single row needs not.
        mm = self.mm if self.torch_products else operator.matmul
        norm, wqkv, wo, w13, w2 = self._normalized, self.wqkv, self.wo, self.w13, self.w2
        write_kv, attend, silu_mul, matmul = (kpools.write_kv, kpools.prefill, self._silu_mul,
                                              self.lib.matmul)
        contiguous = self.contiguous if T > 1 else lambda a: a  # one row: already C-contiguous
        rope = self.rope[positions]  # [T, hd, hd]
        x = self.tok_embeddings[tokens]
        att = self.empty(T, H, hd)
        att_rows = att.reshape(T, cfg.dim)
        for layer in range(cfg.n_layers):
            qkv = mm(norm(x), wqkv[layer])
            qk = matmul(qkv[:, :qk_width].reshape(T, H + KV, hd), rope)
            write_kv(layer, contiguous(qk[:, H:]), contiguous(qkv[:, qk_width:].reshape(T, KV, hd)),
                     slots)
            attend(layer, contiguous(qk[:, :H]), meta, out=att)
            x = x + mm(att_rows, wo[layer])
            x = x + mm(silu_mul(mm(norm(x), w13[layer])), w2[layer])
        if len(logit_rows) != T:
            x = x[logit_rows]
        return self.to_numpy(mm(norm(x), self.wcls))
