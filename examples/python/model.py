"""The Llama forward pass of llama2.c's ``run.c`` over a batch of token rows, its KV cache in
pagedkv pools.

One call runs a whole engine step: every scheduled sequence's new tokens as rows of one matrix
(the matrix products batched over all of them), the cache write (``pagedkv.write_kv``, vLLM's
reshape_and_cache) at the manager's slots, then per layer two attention calls on the pools:
``pagedkv.paged_decode_attention`` for the sequences with one new token and
``pagedkv.paged_prefill_attention`` (chunked causal prefill after the cached prefix) for the
others. Matrix products run in torch when it is importable, else in numpy.

Formulas (run.c): rmsnorm(x) = w * x / sqrt(mean(x^2) + 1e-5); RoPE rotates adjacent pairs
(2j, 2j + 1) of each head by pos * 10000^(-2j / head_dim); attention scale 1 / sqrt(head_dim),
GQA head h reads KV head h // (n_heads / n_kv_heads); FFN w2(silu(w1 x) * w3 x); logits wcls x.
"""

from __future__ import annotations

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


class Llama:
    """The model's weights on one device, in torch tensors (``backend="torch"``, on ``device``)
    or numpy arrays (``backend="numpy"``, CPU only)."""

    def __init__(self, cfg: Config, weights: dict[str, np.ndarray], *, backend: str = "auto",
                 device: str = "cpu"):
        if backend == "auto":
            backend = "torch" if torch is not None else "numpy"
        if backend not in ("torch", "numpy"):
            raise ValueError(f"backend = {backend!r}: expected 'torch', 'numpy' or 'auto'")
        if backend == "torch" and torch is None:
            raise ValueError("backend = 'torch' but torch is not importable")
        if backend == "numpy" and device != "cpu":
            raise ValueError(f"device = {device!r}: the numpy backend runs on the CPU only")
        self.cfg, self.backend, self.device = cfg, backend, device
        cos, sin = rope_tables(cfg)
        tensors = dict(weights, rope_cos=cos, rope_sin=sin)
        # Transposed once, so every product is x @ W with W [in, out].
        for name in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
            tensors[name] = np.ascontiguousarray(np.swapaxes(weights[name], 1, 2))
        tensors["wcls"] = np.ascontiguousarray(weights["wcls"].T)
        self.w = {k: self.array(v) for k, v in tensors.items()}

    # --- the two backends -------------------------------------------------------------------
    def array(self, a: np.ndarray):
        """numpy -> this backend's array on its device (a copy only off the CPU)."""
        if self.backend == "numpy":
            return a
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

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

    def _rmsnorm(self, x, weight):
        ms = (x * x).sum(-1)[:, None] / self.cfg.dim + 1e-5
        lib = np if self.backend == "numpy" else torch
        return weight * (x / lib.sqrt(ms))

    def _silu(self, x):
        lib = np if self.backend == "numpy" else torch
        return x / (1.0 + lib.exp(-x))

    def _rope(self, x, cos, sin):
        """x [T, heads, hd] rotated in adjacent pairs; cos, sin [T, 1, hd / 2]."""
        pairs = x.reshape(x.shape[0], x.shape[1], -1, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        out = self.empty(*pairs.shape)
        out[..., 0] = a * cos - b * sin
        out[..., 1] = a * sin + b * cos
        return out.reshape(x.shape)

    # --- the step ---------------------------------------------------------------------------
    def new_pools(self, num_blocks: int, block_size: int) -> list[tuple]:
        """Per layer (k_cache, v_cache), vLLM's separate NHD pools
        [num_blocks, block_size, n_kv_heads, head_dim] float32, filled with NaN: a slot the
        engine never wrote that reached attention would turn the logits into NaN."""
        shape = (num_blocks, block_size, self.cfg.n_kv_heads, self.cfg.head_dim)
        return [(self.full(shape, float("nan")), self.full(shape, float("nan")))
                for _ in range(self.cfg.n_layers)]

    def forward(self, pools, tokens: np.ndarray, positions: np.ndarray, decode_meta,
                prefill_meta, logit_rows: np.ndarray) -> np.ndarray:
        """One step. tokens, positions [T] int64: the decode rows (decode_meta's sequences, one
        each) first, then the prefill rows (prefill_meta's, by its query_start_loc); either
        meta may be None when it has no rows. Writes the rows' K/V at the metas' slot_mapping,
        returns logits [len(logit_rows), vocab] float32 of the rows logit_rows."""
        cfg, w = self.cfg, self.w
        T, hd = len(tokens), cfg.head_dim
        n_dec = 0 if decode_meta is None else len(decode_meta.seq_lens)
        slots = [m.slot_mapping for m in (decode_meta, prefill_meta) if m is not None]
        slot_mapping = self.array(np.concatenate(slots).astype(np.int64))
        cos = w["rope_cos"][self.array(positions)][:, None, :]
        sin = w["rope_sin"][self.array(positions)][:, None, :]
        x = w["tok_embeddings"][self.array(tokens)]
        for layer in range(cfg.n_layers):
            k_cache, v_cache = pools[layer]
            h = self._rmsnorm(x, w["rms_att"][layer])
            q = self._rope((h @ w["wq"][layer]).reshape(T, cfg.n_heads, hd), cos, sin)
            k = self._rope((h @ w["wk"][layer]).reshape(T, cfg.n_kv_heads, hd), cos, sin)
            v = (h @ w["wv"][layer]).reshape(T, cfg.n_kv_heads, hd)
            pk.write_kv(k, v, k_cache, v_cache, slot_mapping)
            att = self.empty(T, cfg.n_heads, hd)
            if n_dec:
                pk.paged_decode_attention(q[:n_dec], k_cache, v_cache, decode_meta,
                                          out=att[:n_dec])
            if n_dec < T:
                pk.paged_prefill_attention(q[n_dec:], k_cache, v_cache, prefill_meta,
                                           out=att[n_dec:])
            x = x + att.reshape(T, cfg.dim) @ w["wo"][layer]
            h = self._rmsnorm(x, w["rms_ffn"][layer])
            x = x + (self._silu(h @ w["w1"][layer]) * (h @ w["w3"][layer])) @ w["w2"][layer]
        x = self._rmsnorm(x[self.array(logit_rows)], w["rms_final"])
        return self.to_numpy(x @ w["wcls"])
