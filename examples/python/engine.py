"""A continuous-batching engine over pagedkv: requests of different lengths join and leave the
running batch every step, under a budget of KV blocks and of tokens per step.

Each step (vLLM v1's scheduler, in small):
1. The running requests, oldest first, each get their next tokens (one when decoding, a chunk
   of the prompt when prefilling) if the step's token budget allows. Their slots come from
   ``KVCacheManager.append_tokens``; when it answers None (out of blocks) the newest running
   request is preempted by recompute (``preempt``: its blocks freed, it goes back to the front
   of the queue with its prompt plus what it generated so far) and the append is retried.
2. With no preemption this step, waiting requests are admitted in arrival order while
   ``can_add_sequence`` answers OK: ``add_sequence`` shares the cached prefix (prefix caching)
   and allocates the first chunk; LATER stops admission until blocks free up; NEVER rejects the
   request (it could never fit).
3. One forward pass over every scheduled token (model.Llama.forward) with one BatchMetadata
   for the step (decoding requests first: the scheduler's order), then ``commit`` publishes
   the written blocks to the prefix cache and each request whose tokens are all computed
   samples its next token greedily (argmax, first maximum, as run.c).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

import pagedkv as pk

from model import Llama

BOS = 1


@dataclasses.dataclass
class Request:
    """A generation request: ``prompt`` token ids (BOS first), at most ``max_new_tokens``
    sampled tokens in ``output``; it also stops when it samples BOS (as run.c; the BOS is not
    kept) or reaches seq_len positions."""
    rid: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = dataclasses.field(default_factory=list)
    status: str = "waiting"          # waiting, running, finished, rejected
    num_computed: int = 0            # positions whose K/V are in the cache
    prefix_hit_tokens: int = 0       # summed over admissions (a recompute is admitted again)
    num_preemptions: int = 0
    logits: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    tokens: list[int] = dataclasses.field(init=False)  # prompt + output, kept up to date

    def __post_init__(self):
        self.tokens = self.prompt + self.output

    def append(self, token: int) -> None:
        """A sampled token joins output and tokens."""
        self.output.append(token)
        self.tokens.append(token)


class Engine:
    """Serves requests with the model; the whole KV cache is in the manager and its pools."""

    def __init__(self, model: Llama, *, num_blocks: int, block_size: int = 16,
                 max_num_batched_tokens: int = 256, max_num_seqs: int = 64,
                 enable_prefix_caching: bool = True, keep_logits: bool = False):
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError(f"max_num_batched_tokens = {max_num_batched_tokens}, "
                             f"max_num_seqs = {max_num_seqs}: both must be >= 1")
        self.model = model
        # Longest sequence: the model's context, or what the pool can hold if that is less.
        max_len = min(model.cfg.seq_len, num_blocks * block_size) if num_blocks > 0 else 0
        self.mgr = pk.KVCacheManager(pk.KVCacheManagerConfig(
            num_blocks, block_size, enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_len))
        self.pools = model.new_pools(num_blocks, block_size)  # owned here, torch or numpy
        self.kpools = model.kernel_pools(self.pools)
        self.max_tokens, self.max_seqs = max_num_batched_tokens, max_num_seqs
        self.keep_logits = keep_logits
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.done: list[Request] = []
        self.num_steps = 0
        self.num_preemptions = 0

    def submit(self, rid: int, prompt: list[int], max_new_tokens: int) -> Request:
        if not prompt or max_new_tokens < 1:
            raise ValueError(f"request {rid}: prompt of {len(prompt)} tokens, max_new_tokens = "
                             f"{max_new_tokens}: need a prompt and max_new_tokens >= 1")
        req = Request(rid, list(prompt), max_new_tokens)
        self.waiting.append(req)
        return req

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def run(self) -> list[Request]:
        """Steps until every request finished or was rejected; returns them in finish order."""
        while self.has_work():
            self.step()
        return self.done

    # --- scheduling -------------------------------------------------------------------------
    def _preempt_newest(self) -> Request:
        victim = self.running.pop()
        self.mgr.preempt(victim.rid)  # recompute: prompt + output are prefilled again
        victim.status, victim.num_computed = "waiting", 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _grow(self, req: Request, n: int) -> bool:
        """Gives req the slots of its next n tokens, preempting the newest running requests
        while out of blocks; False when req itself was preempted."""
        have = self.mgr.num_tokens(req.rid)
        want = req.tokens[have:req.num_computed + n]
        while want:
            res = self.mgr.append_tokens(req.rid, want)
            if res is not None:
                if res.num_copies:  # reading res.copies makes an array: only when there are some
                    self.kpools.copy_blocks(res.copies)
                return True
            if self._preempt_newest() is req:
                return False
        return True

    def _admit(self, req: Request, budget: int) -> int:
        """Admits req with a first chunk of at most budget tokens: the chunk's length, 0 when
        it must wait (LATER), -1 when it was rejected (NEVER)."""
        tokens = req.tokens
        hits = self.mgr.lookup_prefix(tokens).num_computed_tokens
        chunk = min(budget, len(tokens) - hits)
        # The last sampled token is never fed, so the cache holds at most
        # prompt + max_new_tokens - 1 positions.
        remaining = req.max_new_tokens - len(req.output) - 1
        opts = pk.AddOptions(max_new_tokens=max(remaining, 0), first_chunk_tokens=chunk)
        verdict = self.mgr.can_add_sequence(tokens, opts)
        if verdict == pk.Admission.NEVER:
            req.status = "rejected"
            self.done.append(req)
            return -1
        if verdict == pk.Admission.LATER:
            return 0
        res = self.mgr.add_sequence(req.rid, tokens, opts)
        req.num_computed = res.num_computed_tokens
        req.prefix_hit_tokens += res.num_computed_tokens
        req.status = "running"
        self.running.append(req)
        return chunk

    def schedule(self) -> list[tuple[Request, int]]:
        """The step's (request, new tokens) pairs, slots allocated for all of them."""
        budget, plan = self.max_tokens, []
        preempted = False
        for req in list(self.running):
            if budget == 0:
                break
            if req.status != "running":  # preempted earlier in this loop
                continue
            n = min(len(req.tokens) - req.num_computed, budget)
            before = self.num_preemptions
            if self._grow(req, n):
                plan.append((req, n))
                budget -= n
            preempted |= self.num_preemptions != before
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_seqs:
            n = self._admit(self.waiting[0], budget)
            if n == 0:
                break
            req = self.waiting.popleft()
            if n > 0:
                plan.append((req, n))
                budget -= n
        return plan

    # --- the step ---------------------------------------------------------------------------
    def step(self) -> None:
        """One scheduled forward pass; a RuntimeError when nothing can run although requests
        wait (a block budget below one request's first chunk)."""
        plan = self.schedule()
        if not plan:
            if self.running or self.waiting:
                raise RuntimeError("no request can make progress: the block budget is too "
                                   "small for the oldest request")
            return
        tokens, positions, counts, ends = self._inputs(plan)
        meta = self.mgr.batch_metadata([r.rid for r, _ in plan], counts)
        rows = np.arange(ends[-1]) if self.keep_logits else ends - 1
        logits = self.model.forward(self.kpools, tokens, positions, meta, rows)
        # Each request's last row (all rows with keep_logits), argmax'ed at once.
        greedy = (logits[ends - 1] if self.keep_logits else logits).argmax(1).tolist()
        for i, (req, n) in enumerate(plan):
            if self.keep_logits:
                for p in range(n):
                    req.logits[req.num_computed + p] = logits[ends[i] - n + p]
            req.num_computed += n
            self.mgr.commit(req.rid, req.num_computed)
            if req.num_computed == len(req.tokens):
                self._sample(req, greedy[i])
        self.num_steps += 1

    @staticmethod
    def _inputs(plan):
        """tokens, positions [T] int64 of the scheduled rows in order, each request's count of
        rows, and the end of each request's rows (cumulative counts, int64)."""
        tokens, positions, counts, ends, end = [], [], [], [], 0
        for r, n in plan:
            c = r.num_computed
            if n == 1:
                tokens.append(r.tokens[c])
                positions.append(c)
            else:
                tokens.extend(r.tokens[c:c + n])
                positions.extend(range(c, c + n))
            counts.append(n)
            end += n
            ends.append(end)
        return (np.array(tokens, dtype=np.int64), np.array(positions, dtype=np.int64), counts,
                np.array(ends, dtype=np.int64))

    def _sample(self, req: Request, token: int) -> None:
        """Greedy: token is the argmax of the request's last logits (the first maximum). BOS
        ends the request and is not kept (run.c); so do max_new_tokens and the model's seq_len
        positions."""
        if token != BOS:
            req.append(token)
        if (token == BOS or len(req.output) >= req.max_new_tokens
                or len(req.tokens) > self.model.cfg.seq_len):
            req.status = "finished"
            self.running.remove(req)
            self.mgr.free_sequence(req.rid)
            self.done.append(req)
