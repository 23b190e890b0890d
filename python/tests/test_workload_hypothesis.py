"""A hypothesis-driven random workload on a prefix-caching manager with a host pool: after every
step the C++ invariants hold (check_invariants) and what Python sees agrees with a model kept in
this test (token counts, table lengths, distinct used blocks, batch metadata rebuilt from the
tables)."""

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import pagedkv as pk

BS, BLOCKS, HOST = 4, 16, 8
tokens = st.lists(st.integers(0, 5), min_size=0, max_size=20)


class Workload(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.m = pk.KVCacheManager(pk.KVCacheManagerConfig(
            BLOCKS, BS, enable_prefix_caching=True, num_host_blocks=HOST, enable_events=True))
        self.model = {}  # seq -> [num_tokens, swapped]
        self.next_id = 0

    def running(self):
        return sorted(s for s, (_, swapped) in self.model.items() if not swapped)

    @rule(prompt=tokens)
    def add(self, prompt):
        seq, self.next_id = self.next_id, self.next_id + 1
        ok = self.m.can_add_sequence(prompt) == pk.Admission.OK
        r = self.m.add_sequence(seq, prompt)
        assert (r is not None) == ok
        if r is not None:
            assert r.num_computed_tokens % BS == 0
            assert len(r.slots) == len(prompt) - r.num_computed_tokens
            self.model[seq] = [len(prompt), False]

    @precondition(lambda self: self.running())
    @rule(data=st.data(), n=st.integers(0, 9), with_ids=st.booleans())
    def append(self, data, n, with_ids):
        seq = data.draw(st.sampled_from(self.running()))
        can = self.m.can_append(seq, n)
        r = self.m.append_tokens(seq, [1] * n) if with_ids else self.m.append_slots(seq, n)
        assert (r is not None) == can
        if r is not None:
            before = self.model[seq][0]
            table = self.m.block_table(seq)
            want = [table[p // BS] * BS + p % BS for p in range(before, before + n)]
            assert r.slots.tolist() == want
            self.model[seq][0] += n

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def commit(self, data):
        seq = data.draw(st.sampled_from(self.running()))
        self.m.commit(seq, data.draw(st.integers(0, self.model[seq][0])))

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.running()))
        child, self.next_id = self.next_id, self.next_id + 1
        self.m.fork(parent, child)
        assert self.m.block_table(child).tolist() == self.m.block_table(parent).tolist()
        self.model[child] = [self.model[parent][0], False]

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def truncate(self, data):
        seq = data.draw(st.sampled_from(self.running()))
        n = data.draw(st.integers(0, self.model[seq][0]))
        self.m.truncate(seq, n)
        self.model[seq][0] = n

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.model)))
        self.m.free_sequence(seq)
        del self.model[seq]

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def preempt(self, data):
        seq = data.draw(st.sampled_from(self.running()))
        p = self.m.preempt(seq)
        assert p.seq == seq and p.num_tokens == self.model.pop(seq)[0]

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def swap_out(self, data):
        seq = data.draw(st.sampled_from(self.running()))
        can = self.m.can_swap_out(seq)
        r = self.m.swap_out(seq)
        assert (r is not None) == can
        if r is not None:
            assert r.copies.shape == (len(self.m.block_table(seq)), 2)
            self.model[seq][1] = True

    @precondition(lambda self: any(swapped for _, swapped in self.model.values()))
    @rule(data=st.data())
    def swap_in(self, data):
        seq = data.draw(st.sampled_from(sorted(s for s, v in self.model.items() if v[1])))
        can = self.m.can_swap_in(seq)
        r = self.m.swap_in(seq)
        assert (r is not None) == can
        if r is not None:
            assert r.copies[:, 1].tolist() == self.m.block_table(seq).tolist()
            self.model[seq][1] = False

    @invariant()
    def agrees_with_the_model(self):
        m = self.m
        m.check_invariants()
        assert m.sequences() == sorted(self.model)
        used = set()
        for seq, (n, swapped) in self.model.items():
            assert m.num_tokens(seq) == n and m.is_swapped(seq) == swapped
            assert len(m.block_table(seq)) == -(-n // BS)
            if not swapped:
                used.update(m.block_table(seq).tolist())
        s = m.stats()
        assert s.used_blocks == len(used)
        assert s.free_blocks + s.used_blocks + s.cached_blocks == BLOCKS
        self.check_batch(self.running())

    def check_batch(self, seqs):
        new = [min(self.model[s][0], 2) for s in seqs]
        meta = self.m.batch_metadata(seqs, new)
        tables = [self.m.block_table(s).tolist() for s in seqs]
        width = max([len(t) for t in tables] + [1]) if seqs else 0
        padded = [t + [-1] * (width - len(t)) for t in tables]
        assert meta.block_tables.shape == (len(seqs), width)
        assert meta.block_tables.tolist() == padded
        assert meta.seq_lens.tolist() == [self.model[s][0] for s in seqs]
        assert meta.paged_kv_indptr.tolist() == np.cumsum([0] + [len(t) for t in tables]).tolist()
        assert meta.paged_kv_indices.tolist() == [b for t in tables for b in t]
        last = [(n - 1) % BS + 1 if n else 0 for n in meta.seq_lens.tolist()]
        assert meta.paged_kv_last_page_len.tolist() == last
        assert meta.query_start_loc.tolist() == np.cumsum([0] + new).tolist()
        slots = [t[p // BS] * BS + p % BS
                 for s, t, k in zip(seqs, tables, new)
                 for p in range(self.model[s][0] - k, self.model[s][0])]
        assert meta.slot_mapping.tolist() == slots


Workload.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
TestWorkload = Workload.TestCase
