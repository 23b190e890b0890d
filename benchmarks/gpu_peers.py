#!/usr/bin/env python3
"""The peers of pagedkv's CUDA decode, measured in the same run (issue 22, item 8).

For the decode shapes of bench_cuda_decode (8 kv heads, head_dim 128, GQA 4 and 8, fp16 / bf16,
page size 16 and the page-size series) and the prefill shapes of the issue, times on the device:

  copy        the device-to-device copy rate (bytes read + written per second, 1 GiB buffers),
              the same convention as bench_cuda_decode's denominator;
  sdpa        torch.nn.functional.scaled_dot_product_attention on contiguous K/V
              [batch, kv_heads, context, head_dim] (enable_gqa; decode: query length 1);
  gather      a paged baseline: K/V pools [num_blocks, kv_heads, page, head_dim] (HND, pagedkv's
              and FlashInfer's layout) with scattered block tables, gathered by torch indexing
              into contiguous tensors, then sdpa (the time includes the gather);
  flashinfer  FlashInfer's BatchDecodeWithPagedKVCacheWrapper on the same pools and page table
              (plan once, run timed), when `import flashinfer` works; otherwise left out with the
              reason printed.
Prefill (torch's SDPA, flash backend where it takes the shape): causal batch 8 x 4096 tokens, 32
query / 8 kv heads, head_dim 128, bf16, and a 512-token chunk on a 3584-token cached prefix
(bottom-right causal). TFLOP/s count 4 * head_dim FLOPs per (query head, visible key) pair.

Every peer's output is checked against the others on each shape (sdpa vs gather exactly the same
math; FlashInfer within 2e-2 in fp16/bf16), so a table never shows the time of a wrong answer.

  --ours FILE   Google Benchmark JSON of bench_cuda_decode (--benchmark_out=FILE
                --benchmark_out_format=json): adds pagedkv's paged time and the ratios
                ours / peer per shape (goal: <= 1 against FlashInfer on the decode region).
  --device cpu --small   a smoke run on the CPU with small shapes (CI; torch without CUDA).
Prints Markdown (one decode table, one prefill table); --json FILE also writes the rows.
Timing: CUDA events around `reps` back-to-back calls after a warm-up, median of 5 such windows.
"""
import argparse
import json
import math
import re
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"gpu_peers: skipped: torch is not importable by {sys.executable} ({e})")
    sys.exit(77)  # ctest's skip code (tests/peers.cmake)

KV_HEADS = 8
HEAD_DIM = 128
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# bench_cuda_decode's dtype arguments: BM_Decode's "bf16" is 0 fp16 / 1 bf16; the other series'
# "dtype" indexes kBenchDTypes.
BENCH_DTYPES = ["fp16", "bf16", "fp8_e4m3", "int8"]


def has_native_sdpa():
    """torch >= 2.5: SDPA with enable_gqa."""
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    return hasattr(F, "scaled_dot_product_attention") and (major, minor) >= (2, 5)


def attention(q, k, v, causal_offset=None):
    """softmax(q k^T / sqrt(d)) v with GQA. q [B, Hq, Lq, D]; k, v [B, Hkv, Lk, D].
    causal_offset: None (no mask) or the position of query 0 (bottom-right causal: query i sees
    keys 0 .. causal_offset + i)."""
    lq, lk = q.shape[2], k.shape[2]
    if has_native_sdpa():
        mask = None
        if causal_offset is not None and causal_offset == 0 and lq == lk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if causal_offset is not None:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(lq, lk)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    # torch < 2.5 (Debian's on a CI machine): the same math, written out.
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    s = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal_offset is not None:
        qi = torch.arange(lq, device=q.device)[:, None] + causal_offset
        s = s.masked_fill(torch.arange(lk, device=q.device)[None, :] > qi, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).to(q.dtype)


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def seconds(self, fn, reps):
        """Median over 5 windows of the mean time of one of `reps` back-to-back calls."""
        fn()
        self.sync()
        windows = []
        for _ in range(5):
            if self.cuda:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    fn()
                stop.record()
                stop.synchronize()
                windows.append(start.elapsed_time(stop) * 1e-3 / reps)
            else:
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                windows.append((time.perf_counter() - t0) / reps)
        return statistics.median(windows)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def copy_rate(device, timer, nbytes):
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2.0 * nbytes / timer.seconds(lambda: dst.copy_(src), 5)


class PagedShape:
    """Pools, a scattered page table and the same K/V as contiguous tensors."""

    def __init__(self, dtype, gqa, batch, ctx, page, device, seed=0):
        g = torch.Generator(device=device).manual_seed(seed)  # values made on the device
        self.dtype, self.gqa, self.batch, self.ctx, self.page = dtype, gqa, batch, ctx, page
        self.pages_per_seq = -(-ctx // page)
        n = batch * self.pages_per_seq
        t = DTYPES[dtype]
        shape = (n, KV_HEADS, page, HEAD_DIM)
        rand = lambda *dims: (torch.rand(dims, generator=g, device=device) * 2 - 1).to(t)
        self.k_pool = rand(*shape)
        self.v_pool = rand(*shape)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
        self.table = perm.view(batch, self.pages_per_seq).to(device)
        self.q = rand(batch, KV_HEADS * gqa, HEAD_DIM)
        self.k = self.gather(self.k_pool).contiguous()  # the contiguous peer's own tensors
        self.v = self.gather(self.v_pool).contiguous()
        self.kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * self.k_pool.element_size()

    def gather(self, pool):
        # [B, pages, Hkv, page, D] -> [B, Hkv, pages * page, D], the first ctx positions
        x = pool[self.table.long()].transpose(1, 2)
        return x.reshape(self.batch, KV_HEADS, self.pages_per_seq * self.page, HEAD_DIM)[:, :, : self.ctx]

    def sdpa(self):
        return attention(self.q[:, :, None, :], self.k, self.v)[:, :, 0, :]

    def gathered(self):
        return attention(self.q[:, :, None, :], self.gather(self.k_pool), self.gather(self.v_pool))[:, :, 0, :]


def flashinfer_decode(s, device):
    """A callable running FlashInfer's paged decode on s, or (None, reason)."""
    try:
        import flashinfer
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return None, f"import flashinfer failed: {e}"
    try:
        workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "HND")
        indptr = torch.arange(0, s.batch + 1, dtype=torch.int32, device=device) * s.pages_per_seq
        indices = s.table.reshape(-1).contiguous()
        last = torch.full((s.batch,), s.ctx - (s.pages_per_seq - 1) * s.page, dtype=torch.int32, device=device)
        t = DTYPES[s.dtype]
        w.plan(indptr, indices, last, KV_HEADS * s.gqa, KV_HEADS, HEAD_DIM, s.page,
               q_data_type=t, kv_data_type=t)
        return (lambda: w.run(s.q, (s.k_pool, s.v_pool))), None
    except Exception as e:  # noqa: BLE001 - report and go on without this peer
        return None, f"flashinfer plan failed: {type(e).__name__}: {e}"


def ours_from_json(path):
    """{(dtype, gqa, batch, ctx, page): {"ours_us": CUDA-core paged us, "ours_tc_us": tensor-core
    paged us}} from bench_cuda_decode's JSON (each where measured)."""
    rows = {}
    with open(path) as f:
        for b in json.load(f).get("benchmarks", []):
            args = dict(re.findall(r"(\w+):(\d+)", b.get("name", "")))
            if "paged_us" not in b or not {"gqa", "batch", "ctx"} <= args.keys():
                continue
            if "bf16" in args:
                dtype = ["fp16", "bf16"][int(args["bf16"])]
            elif "dtype" in args:
                dtype = BENCH_DTYPES[int(args["dtype"])]
            else:
                continue
            key = (dtype, int(args["gqa"]), int(args["batch"]), int(args["ctx"]), int(args.get("bs", 16)))
            kernel = "ours_tc_us" if int(args.get("tc", 0)) else "ours_us"
            rows.setdefault(key, {})[kernel] = b["paged_us"]
    return rows


def decode_shapes(small):
    if small:
        return [("bf16", 4, 2, 100, 16), ("fp16", 8, 3, 64, 1), ("bf16", 4, 2, 300, 128)]
    shapes = [(d, g, b, c, 16) for d in ("fp16", "bf16") for g in (4, 8) for b in (1, 32, 128)
              for c in (4096, 32768)]
    shapes += [("bf16", 4, 32, c, p) for c in (4096, 32768) for p in (1, 8, 32, 64, 128)]
    return shapes


def run_decode(args, device, timer, copy_bps, ours):
    rows = []
    fi_reason = None
    for dtype, gqa, batch, ctx, page in decode_shapes(args.small):
        # Pools, the contiguous copy and the gather's two temporaries: 4x the K/V bytes.
        need = 4 * 2 * batch * ctx * KV_HEADS * HEAD_DIM * torch.empty(0, dtype=DTYPES[dtype]).element_size()
        if device.type == "cuda" and need > 0.8 * torch.cuda.get_device_properties(device).total_memory:
            print(f"gpu_peers: {dtype} gqa{gqa} b{batch} ctx{ctx} page{page} left out: needs {need >> 30} GiB")
            continue
        s = PagedShape(dtype, gqa, batch, ctx, page, device)
        reps = max(1, min(100, int(2e9 / s.kv_bytes))) if not args.small else 2
        ref = s.sdpa()
        got = s.gathered()
        # The same values through the same math: equal but for the kernel's summation order.
        err = (got.float() - ref.float()).abs().max().item()
        if not err <= 1e-2:
            sys.exit(f"gpu_peers: gather + sdpa differs from sdpa by {err} on {dtype} gqa{gqa} "
                     f"b{batch} ctx{ctx} page{page}")
        row = {"dtype": dtype, "gqa": gqa, "batch": batch, "ctx": ctx, "page": page,
               "kv_bytes": s.kv_bytes,
               "sdpa_us": timer.seconds(s.sdpa, reps) * 1e6,
               "gather_us": timer.seconds(s.gathered, reps) * 1e6}
        fi, reason = flashinfer_decode(s, device) if device.type == "cuda" else (None, "no CUDA device")
        if fi is not None:
            err = (fi().float() - ref.float()).abs().max().item()
            if not err <= 2e-2:
                sys.exit(f"gpu_peers: FlashInfer differs from sdpa by {err} on {dtype} gqa{gqa} b{batch} ctx{ctx}")
            row["flashinfer_us"] = timer.seconds(fi, reps) * 1e6
        fi_reason = fi_reason or reason
        row.update(ours.get((dtype, gqa, batch, ctx, page), {}))
        rows.append(row)
        del s
    print(f"\n### Decode peers ({device_name(device)}; copy {copy_bps / 1e9:.0f} GB/s read + write)\n")
    if fi_reason:
        print(f"FlashInfer not measured: {fi_reason}.\n")
    cols = ["sdpa_us", "gather_us", "flashinfer_us", "ours_us", "ours_tc_us"]
    print("| dtype | GQA | batch | context | page | " + " | ".join(c[:-3] + " us" for c in cols) +
          " | ours / flashinfer | ours tc / flashinfer | ours / sdpa | ours % of copy |")
    print("|---" * (5 + len(cols) + 4) + "|")
    for r in rows:
        cells = [f"{r[c]:.1f}" if c in r else "-" for c in cols]
        ratio = lambda ours, peer: f"{r[ours] / r[peer]:.3f}" if ours in r and peer in r else "-"
        pct = f"{100 * r['kv_bytes'] / (r['ours_us'] * 1e-6) / copy_bps:.1f}" if "ours_us" in r else "-"
        print(f"| {r['dtype']} | {r['gqa']} | {r['batch']} | {r['ctx']} | {r['page']} | " + " | ".join(cells) +
              f" | {ratio('ours_us', 'flashinfer_us')} | {ratio('ours_tc_us', 'flashinfer_us')}"
              f" | {ratio('ours_us', 'sdpa_us')} | {pct} |")
    return rows


def run_prefill(args, device, timer):
    if args.small:
        cases = [("causal", 2, 128, 0), ("chunk", 2, 32, 96)]
    else:
        cases = [("causal", 8, 4096, 0), ("chunk 512 on 3584", 8, 512, 3584)]
    rows = []
    print("\n### Prefill peers (torch SDPA, contiguous K/V, 32 query / 8 kv heads, head_dim 128, bf16)\n")
    print("| case | batch | query tokens | cached prefix | ms | TFLOP/s | backend |")
    print("|---|---|---|---|---|---|---|")
    g = torch.Generator(device=device).manual_seed(1)
    rand = lambda *dims: (torch.rand(dims, generator=g, device=device) - 0.5).to(torch.bfloat16)
    for name, batch, lq, prefix in cases:
        lk = prefix + lq
        q = rand(batch, 32, lq, HEAD_DIM)
        k = rand(batch, KV_HEADS, lk, HEAD_DIM)
        v = rand(batch, KV_HEADS, lk, HEAD_DIM)
        backend = "default"
        fn = lambda: attention(q, k, v, causal_offset=prefix)
        if device.type == "cuda" and has_native_sdpa():
            from torch.nn.attention import SDPBackend, sdpa_kernel
            def flash():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return attention(q, k, v, causal_offset=prefix)
            try:
                flash()
                fn, backend = flash, "flash"
            except RuntimeError as e:
                backend = f"default (flash refused: {str(e).splitlines()[0][:60]})"
        visible = lq * prefix + lq * (lq + 1) // 2  # per (batch, head)
        flops = 4.0 * HEAD_DIM * visible * 32 * batch
        sec = timer.seconds(fn, 2 if args.small else 10)
        rows.append({"case": name, "batch": batch, "lq": lq, "prefix": prefix, "ms": sec * 1e3,
                     "tflops": flops / sec / 1e12, "backend": backend})
        print(f"| {name} | {batch} | {lq} | {prefix} | {sec * 1e3:.2f} | {flops / sec / 1e12:.1f} | {backend} |")
    return rows


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="small shapes (a smoke run)")
    ap.add_argument("--ours", help="bench_cuda_decode's Google Benchmark JSON")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_peers: no CUDA device visible to torch, nothing to measure")
        return 0
    timer = Timer(device)
    print(f"gpu_peers: torch {torch.__version__}, {device_name(device)}, "
          f"SDPA {'native (enable_gqa)' if has_native_sdpa() else 'written out (torch < 2.5)'}")
    copy_bps = copy_rate(device, timer, (1 << 20) if args.small else (1 << 30))
    ours = ours_from_json(args.ours) if args.ours else {}
    decode = run_decode(args, device, timer, copy_bps, ours)
    if args.ours and not any("ours_us" in r or "ours_tc_us" in r for r in decode):
        print(f"gpu_peers: --ours {args.ours} has no row for any measured shape", file=sys.stderr)
        return 1
    prefill = run_prefill(args, device, timer)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": device_name(device), "copy_Bps": copy_bps,
                       "decode": decode, "prefill": prefill}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
