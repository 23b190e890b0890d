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


def rotation_matrices(cfg: Config) -> np.ndarray:
    """R [seq_len, hd, hd] float32 with row-vector convention (x @ R[pos]): for each pair
    (2j, 2j + 1), out[2j] = x[2j] cos - x[2j+1] sin, out[2j+1] = x[2j] sin + x[2j+1] cos."""
    cos, sin = rope_tables(cfg)
    hd = cfg.head_dim
    r = np.zeros((cfg.seq_len, hd, hd), dtype=np.float32)
    e, o = np.arange(0, hd, 2), np.arange(1, hd, 2)
    r[:, e, e], r[:, o, e] = cos, -sin
    r[:, e, o], r[:, o, o] = sin, cos
    return r


BACKENDS = ("torch", "numpy+torch", "numpy")


class Llama:
    """The model's weights and the step's arithmetic on one of three backends:
    ``"torch"``: everything in torch tensors on ``device`` (the one for CUDA);
    ``"numpy+torch"``: activations in numpy, the matrix products by torch (CPU; the fastest
    for a model this small: numpy's per-operation cost is lower than torch 1.13's, its
    reference BLAS slower); ``"numpy"``: numpy only (no torch needed). ``"auto"``: torch on a
    GPU, numpy+torch on the CPU, numpy without torch.
    Stored for few operations per layer: every matrix transposed once (x @ W), w1|w3 fused into
    one [dim, 2 hidden], and RoPE as one batched product with a block-diagonal rotation per
    position (the pairs' 2x2 rotations, zeros elsewhere: the same two products and sum per
    element as run.c)."""

    def __init__(self, cfg: Config, weights: dict[str, np.ndarray], *, backend: str = "auto",
                 device: str = "cpu", numpy_views: bool = True):
        if backend == "auto":
            backend = "numpy" if torch is None else "torch" if device != "cpu" else "numpy+torch"
        if backend not in BACKENDS:
            raise ValueError(f"backend = {backend!r}: expected one of {BACKENDS} or 'auto'")
        if backend != "numpy" and torch is None:
            raise ValueError(f"backend = {backend!r} but torch is not importable")
        if backend != "torch" and device != "cpu":
            raise ValueError(f"device = {device!r}: the {backend} backend runs on the CPU only")
        self.cfg, self.device = cfg, device
        self.backend = "torch" if backend == "torch" else "numpy"  # the activations' library
        self.torch_products = backend != "numpy"
        # CPU torch tensors reach pagedkv as numpy views of their memory (Tensor.numpy(), no
        # copy): torch 1.13's __dlpack__ is Python code costing ~7 us a tensor, numpy's is C.
        self.numpy_views = numpy_views and backend == "torch" and device == "cpu"
        self.lib = np if self.backend == "numpy" else torch
        t = lambda name: np.swapaxes(weights[name], 1, 2)  # noqa: E731  [L, in, out]
        vectors = {
            "tok_embeddings": weights["tok_embeddings"], "rope": rotation_matrices(cfg),
            "rms_att": weights["rms_att"], "rms_ffn": weights["rms_ffn"],
            "rms_final": weights["rms_final"],
        }
        matrices = {"wq": t("wq"), "wk": t("wk"), "wv": t("wv"), "wo": t("wo"),
                    "w13": np.concatenate([t("w1"), t("w3")], axis=2), "w2": t("w2"),
                    "wcls": weights["wcls"].T}
        self.w = {k: self.array(v) for k, v in vectors.items()}
        self.w.update({k: self._matrix(v) for k, v in matrices.items()})

    def _matrix(self, a: np.ndarray):
        a = np.ascontiguousarray(a)
        return torch.from_numpy(a).to(self.device) if self.torch_products else a

    def mm(self, x, w):
        """x @ w: by torch for numpy activations under numpy+torch (zero-copy both ways)."""
        if self.torch_products and self.backend == "numpy":
            return (torch.from_numpy(x) @ w).numpy()
        return x @ w

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

    def kernel_arg(self, t):
        """What a pagedkv op is given for tensor t: t itself (DLPack), or its numpy view."""
        return t.numpy() if self.numpy_views else t

    def _rmsnorm(self, x, weight):
        if self.backend == "torch":
            return x * torch.rsqrt(torch.mean(x * x, -1, keepdim=True).add_(1e-5)) * weight
        return weight * (x / np.sqrt((x * x).sum(-1)[:, None] / self.cfg.dim + 1e-5))

    def _silu_mul(self, gate_up):
        a, b = gate_up[:, :self.cfg.hidden_dim], gate_up[:, self.cfg.hidden_dim:]
        if self.backend == "torch":
            return torch.nn.functional.silu(a) * b
        return a / (1.0 + np.exp(-a)) * b

    # --- the step ---------------------------------------------------------------------------
    def new_pools(self, num_blocks: int, block_size: int) -> list[tuple]:
        """Per layer (k_cache, v_cache), vLLM's separate NHD pools
        [num_blocks, block_size, n_kv_heads, head_dim] float32, filled with NaN: a slot the
        engine never wrote that reached attention would turn the logits into NaN."""
        shape = (num_blocks, block_size, self.cfg.n_kv_heads, self.cfg.head_dim)
        return [(self.full(shape, float("nan")), self.full(shape, float("nan")))
                for _ in range(self.cfg.n_layers)]

    def kernel_pools(self, pools: list[tuple]) -> list[tuple]:
        """The pools as the pagedkv ops are given them (see kernel_arg); same memory."""
        return [(self.kernel_arg(k), self.kernel_arg(v)) for k, v in pools]

    def forward(self, kpools, tokens: np.ndarray, positions: np.ndarray, decode_meta,
                prefill_meta, logit_rows: np.ndarray) -> np.ndarray:
        """One step. tokens, positions [T] int64: the decode rows (decode_meta's sequences, one
        each) first, then the prefill rows (prefill_meta's, by its query_start_loc); either
        meta may be None when it has no rows. Writes the rows' K/V at the metas' slot_mapping,
        returns logits [len(logit_rows), vocab] float32 of the rows logit_rows. kpools: the
        pools from kernel_pools."""
        cfg, w = self.cfg, self.w
        T, hd, H, KV = len(tokens), cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        n_dec = 0 if decode_meta is None else len(decode_meta.seq_lens)
        slots = [m.slot_mapping for m in (decode_meta, prefill_meta) if m is not None]
        slot_mapping = np.concatenate(slots).astype(np.int64)
        if not self.numpy_views:
            slot_mapping = self.array(slot_mapping)
        arg = self.kernel_arg
        rope = w["rope"][self.array(positions)]  # [T, hd, hd]
        x = w["tok_embeddings"][self.array(tokens)]
        for layer in range(cfg.n_layers):
            k_cache, v_cache = kpools[layer]
            h = self._rmsnorm(x, w["rms_att"][layer])
            # Separate products: write_kv and attention take C-contiguous q, k, v.
            q = self.lib.matmul(self.mm(h, w["wq"][layer]).reshape(T, H, hd), rope)
            k = self.lib.matmul(self.mm(h, w["wk"][layer]).reshape(T, KV, hd), rope)
            v = self.mm(h, w["wv"][layer]).reshape(T, KV, hd)
            pk.write_kv(arg(k), arg(v), k_cache, v_cache, slot_mapping)
            att = self.empty(T, H, hd)
            if n_dec:
                pk.paged_decode_attention(arg(q[:n_dec]), k_cache, v_cache, decode_meta,
                                          out=arg(att[:n_dec]))
            if n_dec < T:
                pk.paged_prefill_attention(arg(q[n_dec:]), k_cache, v_cache, prefill_meta,
                                           out=arg(att[n_dec:]))
            x = x + self.mm(att.reshape(T, cfg.dim), w["wo"][layer])
            h = self._rmsnorm(x, w["rms_ffn"][layer])
            x = x + self.mm(self._silu_mul(self.mm(h, w["w13"][layer])), w["w2"][layer])
        x = self._rmsnorm(x[self.array(logit_rows)], w["rms_final"])
        return self.to_numpy(self.mm(x, w["wcls"]))
