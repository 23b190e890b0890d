"""Prefix-caching behaviours of the kind vLLM v1's prefix-caching tests check, written for this
API: the order blocks leave the free queue, referenced blocks never evicted, a reused block's
registration dropped, and hits reproducible from the event stream."""

import random

import pytest
from conftest import make

import pagedkv as pk


def cached_manager(num_blocks=6, block_size=4):
    return make(num_blocks, block_size, enable_prefix_caching=True, enable_events=True)


def chain_hashes(tokens, block_size, extra_key=0):
    """Keys of the full blocks of `tokens`, each chained over its parent's."""
    keys, parent = [], pk.ROOT_BLOCK_HASH
    for i in range(len(tokens) // block_size):
        parent = pk.block_hash(parent, tokens[i * block_size:(i + 1) * block_size], extra_key)
        keys.append(parent)
    return keys


def test_free_queue_order_after_frees():
    m = cached_manager()
    a = list(range(100, 113))  # 13 tokens: 3 full blocks + 1 token, blocks 0..3
    assert m.add_sequence(1, a).slots.tolist() == list(range(13))
    assert m.commit(1, 13) == 3  # blocks 0, 1, 2 published
    stored = m.take_events()
    assert [(e.kind, e.block) for e in stored] == [(pk.EventKind.STORED, b) for b in (0, 1, 2)]
    assert [e.hash for e in stored] == chain_hashes(a, 4)
    assert [e.parent_hash for e in stored] == [pk.ROOT_BLOCK_HASH] + chain_hashes(a, 4)[:2]
    assert [e.tokens for e in stored] == [a[0:4], a[4:8], a[8:12]]
    # free_sequence releases tail first: 3 (unpublished) joins the free queue after 4, 5; the
    # cached 2, 1, 0 enter the LRU in that order, so the oldest-released is the tail block.
    m.free_sequence(1)
    s = m.stats()
    assert (s.free_blocks, s.cached_blocks, s.prefix_cached_entries) == (3, 3, 3)
    r = m.add_sequence(2, list(range(24)))  # 6 fresh blocks: every block of the pool
    assert r.num_computed_tokens == 0
    assert m.block_table(2).tolist() == [4, 5, 3, 2, 1, 0]
    ev = m.take_events()
    assert [(e.kind, e.block) for e in ev] == [(pk.EventKind.EVICTED, b) for b in (2, 1, 0)]
    assert [e.hash for e in ev] == [stored[2].hash, stored[1].hash, stored[0].hash]
    assert m.stats().prefix_evictions == 3


def test_hit_moves_block_out_of_the_lru_and_reorders_it():
    m = cached_manager(num_blocks=6)
    a, b = [1] * 4 + [2] * 4 + [0], [3] * 4 + [4] * 4 + [0]
    m.add_sequence(1, a)  # blocks 0, 1, 2
    m.commit(1, 9)
    m.free_sequence(1)  # LRU: 1, 0; free: 3, 4, 5, 2
    m.add_sequence(2, b)  # blocks 3, 4, 5
    m.commit(2, 9)
    r = m.add_sequence(3, a[:8] + [7])  # hits blocks 0, 1; one fresh block: 2
    assert r.num_computed_tokens == 8 and m.block_table(3).tolist() == [0, 1, 2]
    assert r.slots.tolist() == [2 * 4]
    m.free_sequence(2)  # LRU now: 4, 3 (5 was never full)
    m.free_sequence(3)  # then 1, 0
    m.take_events()
    m.add_sequence(4, list(range(50, 74)))  # 6 blocks: free 5, 2 then LRU 4, 3, 1, 0
    assert m.block_table(4).tolist() == [5, 2, 4, 3, 1, 0]
    assert [e.block for e in m.take_events()] == [4, 3, 1, 0]


def test_referenced_computed_blocks_are_never_evicted():
    m = cached_manager(num_blocks=4)
    a = list(range(9))  # blocks 0, 1, 2
    m.add_sequence(1, a)
    m.commit(1, 9)
    m.take_events()
    # One block is free; a 2-block prompt cannot take the held (published) ones.
    assert m.can_add_sequence(list(range(50, 58))) == pk.Admission.LATER
    assert m.add_sequence(2, list(range(50, 58))) is None
    assert m.add_sequence(2, list(range(50, 54))).slots.tolist() == [12, 13, 14, 15]
    assert m.append_slots(2, 1) is None
    assert m.take_events() == [] and m.stats().prefix_evictions == 0
    assert m.lookup_prefix(a).num_computed_tokens == 8
    assert m.lookup_prefix(a).blocks.tolist() == [0, 1]


def test_reused_block_loses_its_hash_and_gets_the_new_one():
    m = cached_manager(num_blocks=2, block_size=4)
    a, b = [1, 2, 3, 4, 5], [9, 9, 9, 9, 9]
    m.add_sequence(1, a)  # blocks 0, 1
    m.commit(1, 5)
    m.free_sequence(1)
    assert m.lookup_prefix(a).num_computed_tokens == 4
    m.add_sequence(2, b)  # free 1 first, then evicts 0
    assert m.block_table(2).tolist() == [1, 0]
    assert m.lookup_prefix(a).num_computed_tokens == 0  # the old content is gone
    m.commit(2, 5)
    ev = m.take_events()
    assert [(e.kind, e.block) for e in ev] == [(pk.EventKind.STORED, 0), (pk.EventKind.EVICTED, 0),
                                               (pk.EventKind.STORED, 1)]
    old, evicted, new = ev
    assert evicted.hash == old.hash and new.hash == chain_hashes(b, 4)[0] != old.hash
    assert new.tokens == b[:4]
    m.free_sequence(2)
    assert m.lookup_prefix(b).blocks.tolist() == [1]


def test_extra_key_separates_caches():
    m = cached_manager(num_blocks=8)
    a = list(range(9))
    m.add_sequence(1, a, pk.AddOptions(extra_key=5))
    m.commit(1, 9)
    assert m.lookup_prefix(a).num_computed_tokens == 0
    assert m.lookup_prefix(a, extra_key=5).num_computed_tokens == 8
    ev = m.take_events()
    assert all(e.extra_key == 5 for e in ev)
    assert [e.hash for e in ev] == chain_hashes(a, 4, extra_key=5)


def test_reset_prefix_cache_removes_every_entry():
    m = cached_manager(num_blocks=8)
    m.add_sequence(1, list(range(13)))
    m.commit(1, 13)
    m.take_events()
    assert m.reset_prefix_cache() == 3
    ev = m.take_events()
    # One REMOVED per entry in block order with its chained hash, then ALL_CLEARED (vLLM's
    # AllBlocksCleared), which names no block.
    assert [(e.kind, e.block, e.hash) for e in ev] == [
        (pk.EventKind.REMOVED, b, h) for b, h in zip([0, 1, 2], chain_hashes(list(range(13)), 4))
    ] + [(pk.EventKind.ALL_CLEARED, -1, 0)]
    assert m.lookup_prefix(list(range(13))).num_computed_tokens == 0
    # An empty cache's reset is the one event; a router's stale mirror empties on it.
    assert m.reset_prefix_cache() == 0
    ev = m.take_events()
    assert [e.kind for e in ev] == [pk.EventKind.ALL_CLEARED]
    stale = {123: (pk.ROOT_BLOCK_HASH, (1, 2, 3, 4))}
    assert pk.replay_prefix_index(ev, stale) == {}
    assert repr(ev[0]) == "KVCacheEvent(all_cleared, block=-1, hash=0)"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_hits_are_reproducible_from_the_event_stream(seed):
    """A router that saw only the events predicts every lookup: the leading run of a prompt's
    chained block hashes present in its index is the hit, block for block."""
    rng = random.Random(seed)
    bs = 4
    m = cached_manager(num_blocks=24, block_size=bs)
    index, block_of = {}, {}
    prefixes = [[rng.randrange(8) for _ in range(12)] for _ in range(4)]
    live, hits = [], 0
    for step in range(120):
        if rng.random() < 0.03:  # REMOVED events, then ALL_CLEARED: the router follows
            m.reset_prefix_cache()
        elif live and (rng.random() < 0.4 or m.num_free_blocks() < 8):
            m.free_sequence(live.pop(rng.randrange(len(live))))
        else:
            prompt = rng.choice(prefixes)[: rng.randrange(1, 13)] + [
                rng.randrange(8) for _ in range(rng.randrange(0, 9))]
            if m.add_sequence(step, prompt) is not None:
                m.commit(step, rng.randrange(0, len(prompt) + 1))
                live.append(step)
        events = m.take_events()
        pk.replay_prefix_index(events, index)
        for e in events:
            if e.kind == pk.EventKind.STORED:
                assert e.hash == pk.block_hash(e.parent_hash, e.tokens, e.extra_key)
                block_of[e.hash] = e.block
        probe = rng.choice(prefixes) + [1]
        predicted = []
        for h in chain_hashes(probe, bs)[: (len(probe) - 1) // bs]:
            if h not in index:
                break
            predicted.append(block_of[h])
        hit = m.lookup_prefix(probe)
        assert hit.blocks.tolist() == predicted
        assert hit.num_computed_tokens == bs * len(predicted)
        hits += len(predicted)
    assert hits > 20  # the workload does share prefixes
    m.check_invariants()
