"""Shared helpers of the pagedkv pytest suite (run by ctest as python_pytest, against the build
tree's package: PYTHONPATH=build/python)."""

import pytest

import pagedkv as pk


def make(num_blocks=8, block_size=4, **kw):
    """A manager over a fresh pool."""
    return pk.KVCacheManager(pk.KVCacheManagerConfig(num_blocks, block_size, **kw))


def snapshot(m):
    """Everything observable about a manager, for "a failed call changed nothing" checks."""
    s = m.stats()
    stats = {k: getattr(s, k) for k in dir(s) if not k.startswith("_")}
    seqs = m.sequences()
    return (
        stats,
        seqs,
        {q: (m.num_tokens(q), m.block_table(q).tolist(), m.is_swapped(q)) for q in seqs},
    )


@pytest.fixture
def manager():
    return make()
