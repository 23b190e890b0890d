"""Calls that release the GIL stay safe when Python threads share one manager: the binding
serializes them (a mutex per manager), so the C++ manager, which is not synchronized, never
sees two callers at once."""

import threading
import time

from conftest import make



def test_threads_sharing_a_manager_keep_it_consistent():
    # Long prompts keep add_sequence in C++ (hashing, GIL released) while the other threads
    # run: without the binding's mutex this run corrupted the manager or crashed in about half
    # of the tries (docs/reliability.md).
    m = make(num_blocks=1024, block_size=16, enable_prefix_caching=True)
    errors = []

    def worker(t):
        try:
            for i in range(1000):
                seq = t * 10000 + i
                prompt = [t] * 1600 + [i % 7] * 400  # 125 full blocks, 100 shared
                if m.add_sequence(seq, prompt) is None:
                    continue
                m.commit(seq, 2000)
                m.append_slots(seq, 3)
                m.batch_metadata([seq], [3])
                m.free_sequence(seq)
        except Exception as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert m.num_sequences() == 0
    s = m.stats()
    assert s.used_blocks == 0 and s.free_blocks + s.cached_blocks == 1024
    assert s.prefix_hits > 0
    m.check_invariants()


def test_gil_is_released_during_long_calls():
    # check_invariants over a pool of 4M blocks runs for tens of ms in C++. A Python thread
    # that stamps the clock in a loop meanwhile leaves no gap as long as the call: holding the
    # GIL, the call would stop it for the whole call.
    m = make(num_blocks=1 << 22, block_size=1)
    for s in range(4):
        m.add_sequence(s)
        m.append_slots(s, 1 << 20)
    alone = []
    for _ in range(2):
        t0 = time.perf_counter()
        m.check_invariants()
        alone.append(time.perf_counter() - t0)
    d = min(alone)
    stamps, done = [], threading.Event()

    def ticker():
        while not done.is_set():
            stamps.append(time.perf_counter())

    th = threading.Thread(target=ticker)
    th.start()
    try:
        time.sleep(0.01)
        t0 = time.perf_counter()
        m.check_invariants()
        t1 = time.perf_counter()
    finally:
        done.set()
        th.join()
    during = [t0] + [t for t in stamps if t0 < t < t1] + [t1]
    gap = max(b - a for a, b in zip(during, during[1:]))
    assert d > 0.02, "the call is too short to tell"
    assert gap < d / 2, f"the ticker stopped for {gap:.3f} s of a {d:.3f} s call"
