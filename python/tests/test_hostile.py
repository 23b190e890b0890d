"""Hostile inputs: each raises an exception naming the value and leaves the manager as it was.
ValueError: an argument wrong on its own; pagedkv.ContractError (a pagedkv.Error): a call the
manager's state forbids."""

import gc

import numpy as np
import pytest
from conftest import make, snapshot

import pagedkv as pk


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(num_blocks=0), "num_blocks"),
        (dict(num_blocks=-3), "num_blocks"),
        (dict(num_blocks=4, block_size=0), "block_size"),
        (dict(num_blocks=4, watermark=1.0), "watermark"),
        (dict(num_blocks=4, watermark=-0.1), "watermark"),
        (dict(num_blocks=4, num_host_blocks=-1), "num_host_blocks"),
        (dict(num_blocks=4, max_model_len=-1), "max_model_len"),
        (dict(num_blocks=2, block_size=4, max_model_len=9), "max_model_len"),
        # A window of 0 tokens (the config object is made in the test: a nanobind object kept
        # in pytest's parameters until exit would be reported as a leak by nanobind).
        (dict(num_blocks=4, eviction=("SLIDING_WINDOW", 0)), "window"),
    ],
)
def test_bad_config_is_value_error_naming_the_field(kwargs, named):
    if "eviction" in kwargs:
        kind, window = kwargs["eviction"]
        kwargs = dict(kwargs, eviction=pk.EvictionPolicyConfig(pk.EvictionKind[kind], window))
    with pytest.raises(ValueError, match=named) as info:
        pk.KVCacheManager(pk.KVCacheManagerConfig(**kwargs))
    assert not isinstance(info.value, pk.Error)


def test_bad_arguments_are_value_errors():
    m = make()
    m.add_sequence(1, [1, 2])
    before = snapshot(m)
    cases = [
        (lambda: m.append_slots(1, -1), "n = -1"),
        (lambda: m.append_slots(1, pk.MAX_TOKENS_PER_CALL + 1), "16777217"),
        (lambda: m.append_slots(1, 2**62), str(2**62)),
        (lambda: m.can_append(1, 1, -2), "num_lookahead_slots = -2"),
        (lambda: m.add_sequence(2, [1, 2**31]), r"prompt\[1\] = 2147483648"),
        (lambda: m.add_sequence(2, [-(2**31) - 1]), "-2147483649"),
        (lambda: m.append_tokens(1, [7, 2**40]), r"tokens\[1\]"),
        (lambda: m.lookup_prefix([2**33]), "prompt"),
        (lambda: m.commit(1, -1), "num_tokens = -1"),
        (lambda: m.truncate(1, -5), "num_tokens = -5"),
        (lambda: m.batch_metadata([1], [1, 1]), "len\\(seqs\\) = 1"),
        (lambda: m.batch_metadata([1], [-1]), r"num_new_tokens\[0\] = -1"),
        (lambda: m.swap_in(1, -1), "num_lookahead_slots"),
        (lambda: m.min_blocks_held(-1), "num_tokens"),
        (lambda: pk.AddOptions(max_new_tokens=-1), "max_new_tokens"),
        (lambda: pk.AddOptions(first_chunk_tokens=-2), "first_chunk_tokens"),
    ]
    for call, named in cases:
        with pytest.raises(ValueError, match=named):
            call()
    assert snapshot(m) == before


def test_contract_violations_are_contract_errors():
    m = make(num_blocks=8, block_size=4, num_host_blocks=4)
    m.add_sequence(1, [1, 2, 3])
    m.add_sequence(2, [4])
    m.swap_out(2)
    before = snapshot(m)
    cases = [
        (lambda: m.append_slots(99, 1), "99"),
        (lambda: m.free_sequence(99), "99"),
        (lambda: m.add_sequence(1, [1]), "1"),
        (lambda: m.add_sequence(pk.PADDING_SEQ), "-1"),
        (lambda: m.fork(1, 2), "2"),
        (lambda: m.fork(2, 5), "2"),  # swapped parent
        (lambda: m.append_slots(2, 1), "swapped"),
        (lambda: m.swap_out(2), "2"),
        (lambda: m.swap_in(1), "1"),
        (lambda: m.commit(1, 4), "4"),  # past num_tokens (3)
        (lambda: m.truncate(1, 4), "4"),
        (lambda: m.batch_metadata([1], [4]), "4"),
        (lambda: m.batch_metadata([2], [0]), "2"),  # swapped
        (lambda: m.batch_metadata([pk.PADDING_SEQ], [1]), "1"),
        (lambda: m.accumulate_attention(1, [1.0, 1.0, 1.0]), "heavy"),
        (lambda: m.num_tokens(42), "42"),
        (lambda: m.block_table(42), "42"),
        (lambda: m.preempt(2), "2"),
    ]
    for call, named in cases:
        with pytest.raises(pk.ContractError, match=named) as info:
            call()
        assert isinstance(info.value, pk.Error) and not isinstance(info.value, ValueError)
    assert snapshot(m) == before
    m.check_invariants()


def test_double_free_and_use_after_free():
    m = make()
    m.add_sequence(1, [1, 2, 3])
    m.free_sequence(1)
    with pytest.raises(pk.ContractError, match="1"):
        m.free_sequence(1)
    with pytest.raises(pk.ContractError):
        m.append_slots(1, 1)
    assert m.num_free_blocks() == 8


def test_values_outside_int64_are_type_errors():
    # nanobind's int64 conversion refuses them before any pagedkv code runs.
    m = make()
    with pytest.raises(TypeError):
        m.append_slots(2**63, 1)
    with pytest.raises(TypeError):
        m.add_sequence(1, [2**64])
    with pytest.raises(TypeError):
        m.add_sequence(1, ["a"])
    assert m.num_sequences() == 0


def test_arrays_outlive_their_result_and_the_manager():
    # An array keeps the result object that holds its buffer alive, whatever dies first.
    m = make(num_blocks=64)
    m.add_sequence(1, list(range(9)))
    table = m.batch_metadata([1], [9]).block_tables
    slots = m.append_slots(1, 1).slots
    m.fork(1, 2)
    copies = m.append_slots(2, 1).copies
    del m
    gc.collect()
    junk = [np.arange(1000) for _ in range(100)]  # reuse of freed memory would show
    assert table.tolist() == [[0, 1, 2]] and slots.tolist() == [9]
    assert copies.tolist() == [[2, 3]]
    assert len(junk) == 100
