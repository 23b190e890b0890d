"""Readers for the llama2.c files: the checkpoint (``run.c``'s ``.bin``) and the tokenizer.

Checkpoint layout (llama2.c ``run.c``): a header of 7 little-endian int32, ``dim, hidden_dim,
n_layers, n_heads, n_kv_heads, vocab_size, seq_len`` (a negative vocab_size means the classifier
is stored separately, after the other weights), then float32 tensors, each row-major [out, in]:
token embedding [vocab, dim]; per layer stacked: rms_att [L, dim], wq [L, H*hd, dim],
wk [L, KV*hd, dim], wv [L, KV*hd, dim], wo [L, dim, H*hd], rms_ffn [L, dim],
w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim]; rms_final [dim]; two legacy
RoPE tables of seq_len * hd / 2 floats each (skipped: RoPE is recomputed); wcls [vocab, dim]
when unshared.

Tokenizer layout (llama2.c ``tokenizer.bin``): int32 max_token_length, then per token id:
float32 score, int32 byte length, the piece's bytes.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np


@dataclasses.dataclass(frozen=True)
class Config:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def read_checkpoint(path: str) -> tuple[Config, dict[str, np.ndarray]]:
    """Reads a llama2.c checkpoint: (config, weights by name as float32 numpy arrays, each
    [n_layers, out, in] for the per-layer matrices). Raises ValueError naming the path when
    the header is implausible or the file is shorter than the header says."""
    raw = np.fromfile(path, dtype="<u1")
    if raw.size < 28:
        raise ValueError(f"{path}: {raw.size} bytes is too short for a llama2.c header (28)")
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28].tobytes())
    if min(dim, hidden, layers, heads, kv_heads, seq_len) <= 0 or vocab == 0 \
            or dim % heads or heads % kv_heads:
        raise ValueError(f"{path}: implausible header dim={dim} hidden_dim={hidden} "
                         f"n_layers={layers} n_heads={heads} n_kv_heads={kv_heads} "
                         f"vocab_size={vocab} seq_len={seq_len}")
    cfg = Config(dim, hidden, layers, heads, kv_heads, abs(vocab), seq_len, vocab > 0)
    hd = cfg.head_dim
    floats = raw[28:28 + (raw.size - 28) // 4 * 4].view("<f4")
    shapes = [
        ("tok_embeddings", (cfg.vocab_size, dim)),
        ("rms_att", (layers, dim)),
        ("wq", (layers, heads * hd, dim)),
        ("wk", (layers, kv_heads * hd, dim)),
        ("wv", (layers, kv_heads * hd, dim)),
        ("wo", (layers, dim, heads * hd)),
        ("rms_ffn", (layers, dim)),
        ("w1", (layers, hidden, dim)),
        ("w2", (layers, dim, hidden)),
        ("w3", (layers, hidden, dim)),
        ("rms_final", (dim,)),
        ("_rope_tables", (2, seq_len * hd // 2)),
    ]
    if not cfg.shared_classifier:
        shapes.append(("wcls", (cfg.vocab_size, dim)))
    weights: dict[str, np.ndarray] = {}
    at = 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        if at + n > floats.size:
            raise ValueError(f"{path}: ends at float {floats.size}, tensor {name} {shape} "
                             f"needs floats [{at}, {at + n})")
        weights[name] = floats[at:at + n].reshape(shape).astype(np.float32)
        at += n
    del weights["_rope_tables"]
    if cfg.shared_classifier:
        weights["wcls"] = weights["tok_embeddings"]
    return cfg, weights


class Tokenizer:
    """llama2.c's BPE tokenizer: encode (BOS, a dummy-prefix space, UTF-8 code points with byte
    fallback to ids 3 + byte, then greedy merges of the best-scoring adjacent pair) and decode
    (a leading space dropped after BOS, ``<0xNN>`` pieces as raw bytes)."""

    BOS = 1

    def __init__(self, path: str, vocab_size: int):
        data = open(path, "rb").read()
        self.pieces: list[bytes] = []
        self.scores: list[float] = []
        at = 4
        for i in range(vocab_size):
            if at + 8 > len(data):
                raise ValueError(f"{path}: ends at byte {at} before token {i} of {vocab_size}")
            score, n = struct.unpack_from("<fi", data, at)
            at += 8
            self.pieces.append(data[at:at + n])
            self.scores.append(score)
            at += n
        self.ids = {p: i for i, p in enumerate(self.pieces)}

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = [self.BOS] if bos else []
        if not text:
            return ids
        ids.append(self.ids[b" "])
        for ch in text:
            b = ch.encode("utf-8")
            if b in self.ids:
                ids.append(self.ids[b])
            else:
                ids.extend(3 + x for x in b)
        body = ids[1 if bos else 0:]
        while True:
            best, best_at = None, -1
            for i in range(len(body) - 1):
                merged = self.ids.get(self.pieces[body[i]] + self.pieces[body[i + 1]])
                if merged is not None and (best is None or self.scores[merged] > self.scores[best]):
                    best, best_at = merged, i
            if best is None:
                break
            body[best_at:best_at + 2] = [best]
        return ([self.BOS] if bos else []) + body

    def decode_piece(self, prev: int, token: int) -> bytes:
        piece = self.pieces[token]
        if prev == self.BOS and piece.startswith(b" "):
            piece = piece[1:]
        if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            return bytes([int(piece[3:5], 16)])
        return piece

    def decode(self, ids: list[int]) -> str:
        out = b"".join(self.decode_piece(p, t) for p, t in zip(ids, ids[1:]))
        return out.decode("utf-8", errors="replace")
