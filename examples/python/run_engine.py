"""Command line of the example engine: generate for several prompts as one continuously
batched run and print the texts (or JSON with the ids and counters).

    PYTHONPATH=build/python python examples/python/run_engine.py \
        --prompt "Once upon a time" --prompt "One day, a big bear" --steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checkpoint import Tokenizer, read_checkpoint  # noqa: E402
from engine import Engine  # noqa: E402
from model import Llama  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(model_path: str, tokenizer_path: str, backend: str = "auto", device: str = "cpu"):
    """(model, tokenizer) from llama2.c files."""
    cfg, weights = read_checkpoint(model_path)
    return Llama(cfg, weights, backend=backend, device=device), Tokenizer(tokenizer_path,
                                                                         cfg.vocab_size)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.path.join(REPO, "models", "stories260K.bin"))
    p.add_argument("--tokenizer", default=os.path.join(REPO, "models", "tok512.bin"))
    p.add_argument("--prompt", action="append", help="repeatable; default 'Once upon a time'")
    p.add_argument("--steps", type=int, default=256,
                   help="positions per request, prompt included (run.c's -n)")
    p.add_argument("--num-blocks", type=int, default=256, help="the KV block budget")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--backend", choices=["auto", "torch", "numpy+torch", "numpy"], default="auto")
    p.add_argument("--device", default="cpu", help="cpu, or cuda with torch on a GPU")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    model, tok = load(a.model, a.tokenizer, a.backend, a.device)
    eng = Engine(model, num_blocks=a.num_blocks, block_size=a.block_size,
                 max_num_batched_tokens=a.max_num_batched_tokens,
                 enable_prefix_caching=not a.no_prefix_caching)
    reqs = []
    for i, text in enumerate(a.prompt or ["Once upon a time"]):
        ids = tok.encode(text)
        reqs.append(eng.submit(i, ids, max(a.steps - len(ids) + 1, 1)))
    t0 = time.perf_counter()
    eng.run()
    secs = time.perf_counter() - t0
    generated = sum(len(r.output) for r in reqs)
    summary = {"requests": len(reqs), "generated_tokens": generated, "seconds": secs,
               "tokens_per_s": generated / secs, "steps": eng.num_steps,
               "preemptions": eng.num_preemptions,
               "prefix_hit_rate": eng.mgr.stats().prefix_hit_rate}
    if a.json:
        summary["results"] = [{"prompt_ids": r.prompt, "generated_ids": r.output,
                               "status": r.status, "prefix_hit_tokens": r.prefix_hit_tokens,
                               "preemptions": r.num_preemptions} for r in reqs]
        print(json.dumps(summary))
        return 0
    for r in reqs:
        print(f"[{r.rid}] {r.status}: {tok.decode(r.tokens)}\n")
    print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                   for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
