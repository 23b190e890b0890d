#!/usr/bin/env python3
"""Writes the bad-input corpus (tests/data/bad/) and the fuzz seed corpora (tests/fuzz/<target>/).

Every file is synthesized here from first principles (formats as documented in
src/model/checkpoint.hpp, src/model/tokenizer.hpp, src/sim/trace.hpp): nothing is copied from
real models or traces. Deterministic; the outputs are committed so CI needs no Python, and
re-running this script must leave `git status` clean. Each file stays far below 10 KB.

Usage: python3 tests/data/bad/make_bad_inputs.py
"""

import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))
FUZZ = os.path.join(TESTS, "fuzz")

written = []


def write(path, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    assert len(data) < 10 * 1024, path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    written.append(path)


# ---- llama2.c checkpoints ---------------------------------------------------------------------

def header(dim, hidden, layers, heads, kv_heads, vocab, seq_len):
    return struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len)


def weights_floats(dim, hidden, layers, heads, kv_heads, vocab, seq_len):
    head = dim // heads
    kv_dim = head * kv_heads
    n = abs(vocab) * dim                     # token embedding
    n += layers * dim                        # rms_att
    n += layers * dim * dim                  # wq
    n += 2 * layers * kv_dim * dim           # wk, wv
    n += layers * dim * dim                  # wo
    n += layers * dim                        # rms_ffn
    n += 3 * layers * hidden * dim           # w1, w2, w3
    n += dim                                 # rms_final
    n += seq_len * head                      # legacy RoPE tables (real + imag, head/2 each)
    if vocab < 0:
        n += -vocab * dim                    # separate classifier
    return n


def model(dim, hidden, layers, heads, kv_heads, vocab, seq_len, seed=1):
    rng = random.Random(seed)
    n = weights_floats(dim, hidden, layers, heads, kv_heads, vocab, seq_len)
    # Small values keep activations finite; norms would be 1 in a real model, any value works.
    floats = [rng.uniform(-0.5, 0.5) for _ in range(n)]
    return header(dim, hidden, layers, heads, kv_heads, vocab, seq_len) + struct.pack(
        "<%df" % n, *floats)


OK_DIMS = (8, 16, 1, 2, 1, 16, 32)  # head_size 4, GQA group 2, vocab 16, 32 positions
ok_model = model(*OK_DIMS)


def tokenizer(pieces, max_len=None, scores=None):
    if max_len is None:
        max_len = max(1, max(len(p) for p in pieces))
    out = struct.pack("<i", max_len)
    for i, p in enumerate(pieces):
        s = scores[i] if scores else -float(i)
        out += struct.pack("<fi", s, len(p)) + p
    return out


OK_PIECES = [b"<unk>", b"\n<s>\n", b"\n</s>\n", b" ", b"a", b"b", b"c", b"d", b"e", b"o",
             b"n", b"ce", b" o", b"on", b"once", b"."]
assert len(OK_PIECES) == OK_DIMS[5]
ok_tokenizer = tokenizer(OK_PIECES)

bad = os.path.join(HERE)
write(os.path.join(bad, "ok", "model.bin"), ok_model)
write(os.path.join(bad, "ok", "tokenizer.bin"), ok_tokenizer)

MODELS = {
    "empty.bin": b"",
    "truncated_header.bin": header(*OK_DIMS)[:12],
    "zero_dim.bin": header(0, 16, 1, 2, 1, 16, 32) + b"\0" * 64,
    "negative_layers.bin": header(8, 16, -3, 2, 1, 16, 32) + b"\0" * 64,
    "heads_not_multiple.bin": header(12, 16, 1, 3, 2, 16, 32) + b"\0" * 64,
    "odd_head_size.bin": header(6, 16, 1, 2, 1, 16, 32) + b"\0" * 64,
    # A header claiming a model of ~10^18 parameters: must be rejected from the header and the
    # file length alone, never by trying to allocate it.
    "huge_dims.bin": header(1 << 30, 1 << 30, 1 << 20, 1 << 10, 1 << 10, (1 << 31) - 1,
                            1 << 30) + b"\0" * 64,
    # Plausible except for the vocabulary: 2^31-1 tokens x dim 4096 = 35 TB of embeddings.
    "huge_vocab.bin": header(4096, 11008, 32, 32, 32, (1 << 31) - 1, 4096) + b"\0" * 64,
    "int_min_vocab.bin": header(8, 16, 1, 2, 1, -(1 << 31), 32) + b"\0" * 64,
    "truncated_weights.bin": ok_model[: 28 + (len(ok_model) - 28) // 2],
    "trailing_bytes.bin": ok_model + b"\0\0\0\0",
    "text_file.bin": b"this is not a llama2.c checkpoint\n" * 4,
}
for name, data in MODELS.items():
    write(os.path.join(bad, "model", name), data)
# A consistent model + tokenizer pair whose vocabulary (1 token) cannot hold BOS (1) and EOS (2):
# found by fuzz_tokenizer (encode read past the piece table). Must be refused, not run.
write(os.path.join(bad, "vocab1", "model.bin"), model(8, 16, 1, 2, 1, 1, 32))
write(os.path.join(bad, "vocab1", "tokenizer.bin"), tokenizer([b"<unk>"]))

TOKENIZERS = {
    "empty.bin": b"",
    "truncated_header.bin": b"\x05\x00",
    "zero_max_len.bin": struct.pack("<i", 0) + ok_tokenizer[4:],
    "negative_length.bin": tokenizer(OK_PIECES[:3]) + struct.pack("<fi", 0.0, -7),
    "length_over_max.bin": struct.pack("<i", 6) + struct.pack("<fi", 0.0, 9) + b"x" * 9,
    # max_token_length and a piece length of 2^31-1 with no bytes behind them: the reader must
    # see that the file cannot hold the piece before allocating 2 GiB for it.
    "huge_piece_length.bin": struct.pack("<i", (1 << 31) - 1) + struct.pack("<fi", 0.0,
                                                                            (1 << 31) - 1),
    "truncated_mid_token.bin": ok_tokenizer[:-3],
    "too_few_tokens.bin": tokenizer(OK_PIECES[:8], max_len=6),
    "trailing_bytes.bin": ok_tokenizer + b"\x01\x02\x03",
}
for name, data in TOKENIZERS.items():
    write(os.path.join(bad, "tokenizer", name), data)

# ---- request traces ---------------------------------------------------------------------------

AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_OK_ROWS = [
    "2023-11-16 18:15:46.6805900,374,44\n",
    "2023-11-16 18:15:50.9951690,396,109\n",
    "2023-11-16 18:15:51.2440000,879,1\n",
]
GOOD_TRACES = {
    "azure.csv": AZ_HEADER + "".join(AZ_OK_ROWS),
    "mooncake.jsonl": "".join(
        '{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}\n'
        % (t, n, o, ", ".join(str(h) for h in hs))
        for t, n, o, hs in [(0, 600, 10, [0, 1]), (27, 1100, 5, [0, 1, 2]), (40, 20, 3, [9])]),
}
TRACES = {
    "azure_empty.csv": "",
    "azure_missing_column.csv": "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n",
    "azure_wrong_field_count.csv": AZ_HEADER + AZ_OK_ROWS[0] + "2023-11-16 18:15:47.0,12\n",
    "azure_non_numeric.csv": AZ_HEADER + AZ_OK_ROWS[0] + "2023-11-16 18:15:47.0,abc,10\n",
    "azure_negative_tokens.csv": AZ_HEADER + AZ_OK_ROWS[0] + "2023-11-16 18:15:47.0,100,-5\n",
    "azure_zero_prompt.csv": AZ_HEADER + AZ_OK_ROWS[0] + "2023-11-16 18:15:47.0,0,5\n",
    "azure_time_backwards.csv": AZ_HEADER + AZ_OK_ROWS[1] + AZ_OK_ROWS[0],
    "azure_huge_tokens.csv": AZ_HEADER + "2023-11-16 18:15:47.0,99999999999999999999999,5\n",
    "azure_bad_timestamp.csv": AZ_HEADER + "yesterday at noon,100,5\n",
    # Found by fuzz_trace: a well-formed date far from 1970 overflowed int64 nanoseconds (UB).
    "azure_year_1011.csv": AZ_HEADER + "1011-11-16 18:15:47.0,100,5\n",
    # Every row broken: even the lenient reader is left with no request at all.
    "azure_all_rows_bad.csv": AZ_HEADER + "x,y,z\n,,\n1,2\n",
    "mooncake_invalid_json.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": 1}\n'
                                   '{"timestamp": 5, "input_length": 10,\n',
    "mooncake_hash_ids_wrong_length.jsonl":
        '{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1]}\n',
    "mooncake_negative_output.jsonl":
        '{"timestamp": 0, "input_length": 10, "output_length": -1}\n',
    "mooncake_wrong_types.jsonl":
        '{"timestamp": "soon", "input_length": [10], "output_length": null}\n',
    "mooncake_binary_garbage.jsonl": bytes(range(256)) * 2,
}
for name, data in TRACES.items():
    write(os.path.join(bad, "trace", name), data)

# ---- `pagedkv ops` scripts ----------------------------------------------------------------------

OPS_OK = """# copy-on-write, prefix hits, swap, preemption and resume on a small pool
manager blocks=8 block_size=4 host_blocks=4 prefix=on events=on
add 1 1 2 3 4 5 6 7 8 9
append 1 10 11
fork 1 2
append 2 10
can_append 2 4
add 3 1 2 3 4 5 6 7 8 9 extra=0
swap_out 1
swap_in 1
preempt 2
resume 2
stats
dump
events
free 1
free 2
free 3
reset_prefix_cache
stats
"""
OPS_SEEDS = {
    "ok": OPS_OK,
    "h2o": "manager blocks=6 block_size=2 policy=h2o recent=2 heavy=1\nadd 1\n"
           "append 1 n=3\nscore 1 0.5 0.1 0.4\nappend 1 n=2\ndump\nfree 1\nstats\n",
    "sinks": "manager blocks=6 block_size=2 policy=sinks sinks=1 window=3 watermark=0.2\n"
             "add 1 5 6 7\nappend 1 n=4\ncan_add 1 2 3\ndump\npreempt 1\nstats\n",
    "window_max_len": "manager blocks=4 block_size=2 policy=window window=2 max_model_len=9\n"
                      "add 1\nappend 1 n=5\ncan_append 1 4\nappend 1 n=4\nfree 1\n",
    # Issue 16's ops (the worked examples of docs/ops-script.md, comments dropped).
    "publish_after_write": "manager blocks=8 block_size=4 prefix=on\nadd 1 1 2 3 4 5 6 7 8 9\nfree 1\nadd 2 1 2 3 4 5 6 7 8 9\ncommit 2 4\nfree 2\nlookup 3 1 2 3 4 5 6 7 8 9\nadd 3 1 2 3 4 5 6 7 8 9\n",
    "no_orphans": "manager blocks=8 block_size=2 prefix=on events=on\nadd 1 1 2 3\ncommit 1 3\nreset_prefix_cache\nappend 1 4\ncommit 1 4\nfree 1\nadd 2 1 2 3 4 5\ncommit 2 5\nfree 2\nadd 3 1 2 3 4 5\nevents\n",
    "never_or_later": "manager blocks=4 block_size=2\nadd 1 1 2 3\nadd 2 4 5 6\ncan_append 1 2\nappend 1 n=6\ncan_add 1 2 3 max_new=6\ncan_add 1 2 3 max_new=5\nswap_out 1\ncan_swap_out 1\n",
    "lookahead": "manager blocks=4 block_size=2 host_blocks=4\nadd 1 1 2 3 4\nswap_out 1\nadd 2 5 6 7\ncan_swap_in 1\ncan_swap_in 1 lookahead=1\nswap_in 1 lookahead=1\nfree 2\nswap_in 1 lookahead=1\ncan_append 1 1\ncan_append 1 1 lookahead=4\n",
    "rollback": "manager blocks=8 block_size=4 prefix=on\nadd 1 1 2 3 4 5 6\ncommit 1 6\nappend 1 7 8 9 10 11\ntruncate 1 7\nfork 1 2\ntruncate 2 5\nappend 2 20\nexpect_error truncate 1 9\ndump\n",
    "chunked_batch_metadata": "manager blocks=8 block_size=4 prefix=on\nadd 1 1 2 3 4 5 6 7 8 9 10\ncommit 1 10\nadd 2 1 2 3 4 5 6 7 8 9 10 11 12 13 chunk=2\ncommit 2 10\nappend 2 11 12 13\ncommit 2 13\nbatch_metadata 1:1 2:3 -1\n",
    "expect_error": "manager blocks=4 block_size=2\nadd 1 1 2 3\nexpect_error add 1 4 5\nexpect_error append 1 n=70000\nexpect_error manager blocks=0\ndump\n",
}
OPS_BAD = {
    # Parse errors: nothing runs, nothing is printed.
    "unknown_op.txt": "manager blocks=4\nadd 1\nallocate 1\n",
    "binary_garbage.txt": b"manager blocks=4\n\x00\x01\xfe\xff garbage\n",
    "malformed_option.txt": "manager blocks=\n",
    "duplicate_option.txt": "manager blocks=4 blocks=8\n",
    "positional_after_option.txt": "manager blocks=4\nappend n=2 1\n",
    # Run-time errors: the lines before ran (their JSON is printed), the bad line stops the run.
    "wrong_arity_fork.txt": "manager blocks=4\nadd 1\nfork 1\n",
    "wrong_arity_free.txt": "manager blocks=4\nadd 1\nadd 2\nfree 1 2\n",
    "wrong_arity_manager.txt": "manager 4\n",
    "unknown_sequence_name.txt": "manager blocks=4\nadd alice\n",
    "unknown_sequence.txt": "manager blocks=4\nadd 1\nfree 7\n",
    "negative_count.txt": "manager blocks=4\nadd 1\nappend 1 n=-3\n",
    "negative_blocks.txt": "manager blocks=-4\n",
    "negative_sequence.txt": "manager blocks=4\nadd -1\n",
    "negative_token.txt": "manager blocks=4\nadd 1 5 -6\n",
    "op_before_manager.txt": "# no manager line\nadd 1\n",
    "unknown_policy.txt": "manager blocks=4 policy=lru\n",
    "unknown_option.txt": "manager blocks=4 colour=blue\n",
    "double_free.txt": "manager blocks=4\nadd 1\nfree 1\nfree 1\n",
    "fork_existing_child.txt": "manager blocks=4\nadd 1\nadd 2\nfork 1 2\n",
    "resume_not_preempted.txt": "manager blocks=4\nadd 1\nresume 1\n",
    "score_without_h2o.txt": "manager blocks=4\nadd 1\nappend 1 n=1\nscore 1 0.5\n",
    "huge_count.txt": "manager blocks=4\nadd 1\nappend 1 n=99999999999999999999\n",
    # Issue 16, hostile scripts: every one is refused by a documented limit before it allocates.
    "append_2_pow_31.txt": "manager blocks=262144 block_size=65536\nadd 1\n"
                           "append 1 n=2147483647\n",
    "lookahead_over_limit.txt": "manager blocks=4\nadd 1 1 2\ncan_append 1 1 lookahead=1000000\n",
    "chunk_over_limit.txt": "manager blocks=4\nadd 1 1 2 chunk=65537\n",
    "batch_over_limit.txt": "manager blocks=4\nadd 1 1\nbatch_metadata 1:65537\n",
    # 16 copies of a 65536-token sequence hold 2^20 tokens; the 17th is refused.
    "fork_over_total.txt": "manager blocks=4096 block_size=16\nadd 1\nappend 1 n=65536\n"
                           + "".join("fork 1 %d\n" % c for c in range(2, 18)),
    # Preempted token ids stay held for resume: 17 preempted copies are refused too.
    "preempt_over_total.txt": "manager blocks=4096 block_size=16\nadd 1 1\nappend 1 n=65535\n"
                              + "".join("fork 1 %d\npreempt %d\n" % (c, c) for c in range(2, 18)),
    # Each `manager` line of the largest pools costs 2^19 work units: the 33rd exceeds the budget.
    "work_budget_managers.txt": "manager blocks=262144 host_blocks=262144\n" * 33,
    "control_bytes.txt": b"manager blocks=4\n\x1b[31mred\x07 1\n",
    "control_bytes_in_value.txt": b"manager blocks=4\x1b[2J\n",
    "expect_error_succeeds.txt": "manager blocks=4\nadd 1 1 2\nexpect_error free 1\n",
}
write(os.path.join(bad, "ok", "ops.txt"), OPS_OK)
for name, data in OPS_BAD.items():
    write(os.path.join(bad, "ops", name), data)

# ---- fuzz seed corpora ------------------------------------------------------------------------
# Each target decodes its input as documented at the top of tests/fuzz/<target>.cpp.

for name, data in [("ok", ok_model)] + sorted(MODELS.items()):
    stem = name.replace(".bin", "")
    write(os.path.join(FUZZ, "fuzz_checkpoint", stem), b"\x00" + data)
# Header-only seeds the fuzzer pads to the implied length (flag bit 0): accepted models of
# several shapes (separate classifier, MHA, MQA).
for i, dims in enumerate([OK_DIMS, (8, 8, 2, 2, 2, -16, 8), (16, 24, 1, 4, 1, 10, 4)]):
    write(os.path.join(FUZZ, "fuzz_checkpoint", "pad_%d" % i), b"\x01" + header(*dims))


def tokenizer_seed(vocab, text, file_bytes):
    v = vocab + 1  # the target reads vocab_size as (2 bytes mod 1024) - 1
    return struct.pack(">H", v) + bytes([len(text)]) + text + file_bytes


write(os.path.join(FUZZ, "fuzz_tokenizer", "ok"), tokenizer_seed(16, b"once a cat.", ok_tokenizer))
for name, data in sorted(TOKENIZERS.items()):
    write(os.path.join(FUZZ, "fuzz_tokenizer", name.replace(".bin", "")),
          tokenizer_seed(16, b"once", data))
byte_pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % b for b in range(256)] + [b" t", b"he"]
write(os.path.join(FUZZ, "fuzz_tokenizer", "byte_fallback"),
      tokenizer_seed(len(byte_pieces), "the \u00e9t\u00e9 \x01".encode("utf-8"),
                     tokenizer(byte_pieces)))

for name, data in sorted(list(GOOD_TRACES.items()) + list(TRACES.items())):
    if isinstance(data, str):
        data = data.encode("utf-8")
    jsonl = name.endswith(".jsonl")
    stem = name.rsplit(".", 1)[0]
    write(os.path.join(FUZZ, "fuzz_trace", stem), bytes([1 if jsonl else 0]) + data)
    if name in GOOD_TRACES:  # strict mode too
        write(os.path.join(FUZZ, "fuzz_trace", stem + "_strict"), bytes([3 if jsonl else 2]) + data)
for name, data in sorted(GOOD_TRACES.items()):
    write(os.path.join(bad, "ok", name), data)

for name, data in sorted(list(OPS_SEEDS.items()) + list(OPS_BAD.items())):
    write(os.path.join(FUZZ, "fuzz_ops", name.replace(".txt", "")), data)

# Manager programs: config bytes (block_size, num_blocks, flags, host blocks, watermark,
# max_model_len, eviction kind and its parameters) then operations (see fuzz_manager.cpp).
rng = random.Random(8)
manager_seeds = {
    # bs 4, 8 blocks, prefix caching + events + host pool of 6; add, appends, fork, swap, free.
    "cow_swap_prefix": bytes([3, 7, 0x07, 6, 0, 0]) + bytes([
        1, 1, 12, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0,  # add seq 0 with a 12-token prompt
        2, 1, 3,                                           # append 3 slots to seq 0
        4, 1, 2,                                           # fork 0 -> 1
        2, 2, 1,                                           # append to the child: copy-on-write
        6, 1, 7, 1,                                        # swap out / in seq 0
        1, 3, 12, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 1,   # same prompt: prefix hits
        9, 2, 1, 0, 2, 1,                                  # batch metadata
        8, 2, 5, 3, 12, 13, 14, 15, 1, 3]),
    "sliding_window": bytes([1, 15, 0x00, 0, 1, 5]) + bytes(
        [0, 1] + [2, 1, 7] * 10 + [10, 1, 1] + [5, 1]),
    "heavy_hitters": bytes([3, 20, 0x01, 0, 3, 2, 1]) + bytes(
        [0, 1] + [2, 1, 5, 11, 1] * 8 + [10, 1, 1, 9, 1, 1, 0]),
    "tiny_pool_errors": bytes([0, 0, 0x0C, 1, 0, 0, 3]) + bytes(
        [0, 0, 0, 0, 2, 0, 255, 2, 1, 9, 4, 0, 0, 5, 0, 5, 0, 7, 1, 8, 1]),
}
for i in range(4):
    manager_seeds["random_%d" % i] = bytes(rng.randrange(256) for _ in range(300))
for name, data in manager_seeds.items():
    write(os.path.join(FUZZ, "fuzz_manager", name), data)

print("wrote %d files" % len(written))
