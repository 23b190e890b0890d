"""Each binding of KVCacheManager against the C++ behaviour, on hand-worked examples (block ids,
slots, copies, tables, stats)."""

import numpy as np
import pytest
from conftest import make, snapshot

import pagedkv as pk


def test_worked_example_of_the_header(manager):
    # kv_cache_manager.hpp's worked example: block_size 4, 8 blocks, fresh pool.
    m = manager
    m.add_sequence(7)
    r = m.append_slots(7, 6)
    assert r.slots.dtype == np.int64 and r.slots.tolist() == [0, 1, 2, 3, 4, 5]
    assert r.copies.dtype == np.int32 and r.copies.shape == (0, 2)
    assert r.num_copies == 0
    assert m.append_slots(7, 1).slots.tolist() == [6]
    m.fork(7, 8)
    r = m.append_slots(8, 1)
    # Copy-on-write of the shared, partially filled block 1 into the next free block, 2.
    assert r.copies.tolist() == [[1, 2]]
    assert r.num_copies == 1
    assert r.slots.tolist() == [2 * 4 + 3]
    assert m.block_table(8).tolist() == [0, 2]
    assert m.block_table(7).tolist() == [0, 1]
    assert m.num_tokens(8) == 8 and m.num_tokens(7) == 7
    assert m.sequences() == [7, 8] and m.num_sequences() == 2 and 8 in m and 9 not in m
    m.check_invariants()


def test_batch_metadata_both_formats_and_slot_mapping(manager):
    m = manager
    # Sequence 1: prefill of 6 tokens (blocks 0, 1); sequence 2: 3 tokens then a decode token.
    added = m.add_sequence(1, [5] * 6)
    assert added.slots.tolist() == [0, 1, 2, 3, 4, 5] and added.num_copies == 0
    assert m.add_sequence(2, [6] * 3).slots.tolist() == [8, 9, 10]
    assert m.append_slots(2, 1).slots.tolist() == [11]
    assert m.append_slots(2, 1).slots.tolist() == [12]  # 5th token: a new block, 3
    meta = m.batch_metadata([1, pk.PADDING_SEQ, 2], [6, 0, 1])
    assert (meta.block_size, meta.num_seqs, meta.max_blocks_per_seq) == (4, 3, 2)
    assert meta.block_tables.dtype == np.int32
    assert meta.block_tables.tolist() == [[0, 1], [-1, -1], [2, 3]]
    assert meta.seq_lens.tolist() == [6, 0, 5]
    assert np.shares_memory(meta.context_lens, meta.seq_lens)
    assert meta.paged_kv_indptr.tolist() == [0, 2, 2, 4]
    assert meta.paged_kv_indices.tolist() == [0, 1, 2, 3]
    assert meta.paged_kv_last_page_len.tolist() == [2, 0, 1]
    assert meta.slot_mapping.dtype == np.int64
    assert meta.slot_mapping.tolist() == [0, 1, 2, 3, 4, 5, 12]
    assert meta.query_start_loc.tolist() == [0, 6, 6, 7]
    assert np.shares_memory(meta.qo_indptr, meta.query_start_loc)
    for name in ("seq_lens", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len",
                 "query_start_loc"):
        assert getattr(meta, name).dtype == np.int32, name
    # The arrays are views of the result's own buffers (made when read, so every read of a
    # field sees the same memory): a later call or a write to one leaves the other intact.
    assert np.shares_memory(meta.block_tables, meta.block_tables)
    meta.block_tables[0, 0] = 99
    assert meta.block_tables[0, 0] == 99
    again = m.batch_metadata([1], [0])
    assert again.block_tables.tolist() == [[0, 1]] and again.slot_mapping.shape == (0,)
    assert meta.block_tables.flags.c_contiguous and meta.block_tables.flags.owndata is False


def test_out_of_blocks_is_none_and_changes_nothing():
    m = make(num_blocks=2, block_size=4)
    m.add_sequence(1, list(range(8)))
    before = snapshot(m)
    assert m.append_slots(1, 1) is None
    assert m.append_tokens(1, [3]) is None
    assert m.add_sequence(2, [1, 2]) is None
    assert not m.can_append(1, 1)
    assert snapshot(m) == before


def test_admission_ok_later_never():
    m = make(num_blocks=4, block_size=4, max_model_len=16)
    assert m.can_add_sequence(list(range(16))) == pk.Admission.OK
    assert m.can_add_sequence(list(range(17))) == pk.Admission.NEVER  # past max_model_len
    opts = pk.AddOptions(max_new_tokens=1)
    assert m.can_add_sequence(list(range(16)), opts) == pk.Admission.NEVER
    assert m.add_sequence(1, list(range(12))) is not None  # 3 of the 4 blocks
    assert m.can_add_sequence(list(range(8))) == pk.Admission.LATER
    assert m.can_add_sequence(list(range(4))) == pk.Admission.OK
    assert m.append_admission(1, 4) == pk.Admission.OK
    assert m.append_admission(1, 5) == pk.Admission.NEVER  # 17 tokens > max_model_len
    assert m.blocks_needed_to_append(1, 5 - 1) == 1


def test_watermark_keeps_blocks_for_running_sequences():
    m = make(num_blocks=10, block_size=4, watermark=0.2)
    assert m.watermark_blocks() == 2
    # 8 blocks leave exactly the 2 of the watermark: OK; 9 never fit above it: NEVER.
    assert m.can_add_sequence(list(range(32))) == pk.Admission.OK
    assert m.can_add_sequence(list(range(33))) == pk.Admission.NEVER
    # With 1 block held, 8 more would leave 1 < 2 free: LATER (admission waits).
    m.add_sequence(1, [0])
    assert m.can_add_sequence(list(range(32))) == pk.Admission.LATER
    assert m.add_sequence(2, list(range(32))) is None
    assert m.can_add_sequence(list(range(28))) == pk.Admission.OK


def test_chunked_prefill_with_add_options():
    m = make(num_blocks=8, block_size=4)
    prompt = list(range(16))
    r = m.add_sequence(3, prompt, pk.AddOptions(first_chunk_tokens=4))
    assert r.num_computed_tokens == 0 and r.slots.tolist() == [0, 1, 2, 3]
    assert m.num_tokens(3) == 4
    assert m.append_tokens(3, prompt[4:8]).slots.tolist() == [4, 5, 6, 7]
    assert m.commit(3, 8) == 0  # prefix caching off: nothing is published
    assert m.num_committed_tokens(3) == 8


def test_truncate_then_append_reuses_the_tail():
    m = make(num_blocks=8, block_size=4)
    m.add_sequence(1, list(range(10)))  # blocks 0, 1, 2
    m.truncate(1, 5)
    assert m.num_tokens(1) == 5 and m.block_table(1).tolist() == [0, 1]
    assert m.append_slots(1, 1).slots.tolist() == [5]
    # Block 2 went back to the tail of the free queue: the next allocations take 3..7 first.
    m.add_sequence(2, list(range(20)))
    assert m.block_table(2).tolist() == [3, 4, 5, 6, 7]


def test_swap_out_and_in_copy_pairs():
    m = make(num_blocks=8, block_size=4, num_host_blocks=3)
    m.add_sequence(1, list(range(9)))  # device blocks 0, 1, 2
    m.add_sequence(2, list(range(4)))  # device block 3
    assert m.can_swap_out(1) and m.swap_out_admission(1) == pk.Admission.OK
    out = m.swap_out(1)
    assert out.copies.tolist() == [[0, 0], [1, 1], [2, 2]]  # device -> host
    assert m.is_swapped(1) and m.block_table(1).tolist() == [0, 1, 2]  # host ids
    assert m.stats().host_used_blocks == 3 and m.stats().num_swapped_sequences == 1
    assert not m.can_swap_out(2) and m.swap_out(2) is None  # host pool full
    assert m.swap_out_admission(2) == pk.Admission.LATER
    m.add_sequence(3, list(range(4)))  # takes device block 4 (the free queue's head)
    assert m.can_swap_in(1) and m.swap_in_admission(1) == pk.Admission.OK
    back = m.swap_in(1)
    # Freed device blocks 0, 1, 2 joined the free queue's tail after 5, 6, 7.
    assert back.copies.tolist() == [[0, 5], [1, 6], [2, 7]]
    assert m.block_table(1).tolist() == [5, 6, 7] and not m.is_swapped(1)
    s = m.stats()
    assert (s.preemptions, s.swapped_out_blocks, s.swapped_in_blocks) == (1, 3, 3)
    m.check_invariants()


def test_swap_without_host_pool_is_never():
    m = make()
    m.add_sequence(1, [1])
    assert m.swap_out_admission(1) == pk.Admission.NEVER and m.swap_out(1) is None


def test_preempt_returns_what_to_prefill_again():
    m = make(num_blocks=8, block_size=4)
    m.add_sequence(4, [9, 8, 7], pk.AddOptions(extra_key=77))
    m.append_tokens(4, [6, 5])
    p = m.preempt(4)
    assert (p.seq, p.num_tokens, p.extra_key) == (4, 5, 77)
    assert p.tokens.dtype == np.int32 and p.tokens.tolist() == [9, 8, 7, 6, 5]
    assert 4 not in m and m.stats().preemptions == 1 and m.num_free_blocks() == 8
    m.add_sequence(5, [1])
    m.append_slots(5, 1)  # ids unknown from here on
    assert m.preempt(5).tokens.tolist() == []


def test_stats_and_usage():
    m = make(num_blocks=8, block_size=4, num_host_blocks=2)
    m.add_sequence(1, list(range(9)))
    s = m.stats()
    assert (s.total_blocks, s.used_blocks, s.free_blocks, s.cached_blocks) == (8, 3, 5, 0)
    assert s.usage == pytest.approx(3 / 8) and m.usage() == pytest.approx(3 / 8)
    assert (s.num_sequences, s.host_total_blocks) == (1, 2)
    assert m.num_free_blocks() == 5 and m.num_total_blocks() == 8
    assert m.config.num_blocks == 8 and m.config.num_host_blocks == 2


def test_sliding_window_releases_blocks():
    ev = pk.EvictionPolicyConfig(pk.EvictionKind.SLIDING_WINDOW, window=4)
    m = make(num_blocks=8, block_size=2, eviction=ev)
    m.add_sequence(1, list(range(9)))  # positions 0..8 in blocks 0..4
    # eviction_policy.hpp: before appending position 9, positions < 6 are never seen again,
    # so logical blocks 0, 1, 2 are released.
    assert m.append_slots(1, 1).slots.tolist() == [9]
    assert m.block_table(1).tolist() == [pk.NO_BLOCK] * 3 + [3, 4]
    assert m.stats().released_blocks == 3
    assert m.min_blocks_held(100) == 3


def test_heavy_hitters_kept_tokens_and_scores():
    ev = pk.EvictionPolicyConfig(pk.EvictionKind.HEAVY_HITTERS, recent=2, heavy=2)
    m = make(num_blocks=8, block_size=2, eviction=ev)
    m.add_sequence(1, list(range(5)))
    k = m.kept_tokens([1])
    assert k.indptr.tolist() == [0, 5] and k.positions.tolist() == [0, 1, 2, 3, 4]
    assert k.slots.tolist() == [0, 1, 2, 3, 4]
    # eviction_policy.hpp's example: scores {5, 0.5, 3, 0.5, 1} evict positions 1 and 3.
    m.accumulate_attention(1, [5, 0.5, 3, 0.5, 1])
    m.append_slots(1, 1)
    assert m.kept_tokens([1]).positions.tolist() == [0, 2, 4, 5]
    assert m.stats().evicted_tokens == 2
    with pytest.raises(pk.ContractError, match="kept_tokens"):
        m.batch_metadata([1], [1])
