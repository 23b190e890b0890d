"""No reference leaks: nanobind reports every instance, type and function still alive when the
module is torn down. A child interpreter runs every result type through its properties and
must exit with no such report."""

import os
import subprocess
import sys

SCRIPT = r"""
import gc
import pagedkv as pk
ev = pk.EvictionPolicyConfig(pk.EvictionKind.HEAVY_HITTERS, recent=2, heavy=2)
m = pk.KVCacheManager(pk.KVCacheManagerConfig(16, 4, num_host_blocks=8, enable_events=True,
                                              enable_prefix_caching=True))
for i in range(50):
    r = m.add_sequence(i, list(range(9)))
    r.slots, r.copies, r.num_computed_tokens
    m.commit(i, 9)
    m.fork(i, 1000 + i)
    a = m.append_slots(1000 + i, 1)
    a.slots, a.copies
    b = m.batch_metadata([i, 1000 + i], [1, 1])
    b.block_tables, b.seq_lens, b.paged_kv_indices, b.slot_mapping, b.qo_indptr
    s = m.swap_out(i)
    s.copies
    m.swap_in(i).copies
    m.lookup_prefix(list(range(9))).blocks
    m.kept_tokens([i]).slots
    p = m.preempt(i)
    p.tokens
    m.free_sequence(1000 + i)
    [e.tokens for e in m.take_events()]
    m.stats().prefix_hit_rate
    try:
        m.append_slots(-5, 1)
    except pk.ContractError:
        pass
h = pk.KVCacheManager(pk.KVCacheManagerConfig(8, 2, eviction=ev))
h.add_sequence(1, [1, 2, 3])
h.kept_tokens([1]).positions
del m, h, r, a, b, s, p
gc.collect()
"""


def test_no_reference_leaks():
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr
