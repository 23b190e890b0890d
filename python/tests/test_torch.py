"""Batch metadata as torch tensors (batch_metadata_to_torch). Skips with the reason printed when
torch is not installed (Debian: python3-torch, visible in the venv of scripts/python-setup.sh)."""

import numpy as np
import pytest
from conftest import make

import pagedkv as pk

torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests skip")


def test_tensors_share_the_numpy_buffers_and_keep_dtypes():
    m = make(num_blocks=8, block_size=4)
    m.add_sequence(1, list(range(6)))
    m.add_sequence(2, list(range(3)))
    meta = m.batch_metadata([1, 2], [1, 3])
    t = pk.batch_metadata_to_torch(meta)
    assert t["block_tables"].dtype == torch.int32 and t["slot_mapping"].dtype == torch.int64
    assert t["block_tables"].tolist() == [[0, 1], [2, -1]]
    assert t["seq_lens"].tolist() == [6, 3]
    assert t["slot_mapping"].tolist() == [5, 8, 9, 10]
    assert t["qo_indptr"] is t["query_start_loc"] and t["qo_indptr"].tolist() == [0, 1, 4]
    assert t["paged_kv_indptr"].tolist() == [0, 2, 3]
    assert t["paged_kv_indices"].tolist() == [0, 1, 2]
    assert t["paged_kv_last_page_len"].tolist() == [2, 3]
    # Zero copy on the CPU: the tensor is a view of the array the manager built.
    assert t["slot_mapping"].data_ptr() == meta.slot_mapping.ctypes.data
    meta.slot_mapping[0] = 42
    assert int(t["slot_mapping"][0]) == 42


def test_device_copy():
    m = make()
    m.add_sequence(1, [1, 2, 3])
    t = pk.batch_metadata_to_torch(m.batch_metadata([1], [3]), device="cpu")
    assert t["slot_mapping"].device.type == "cpu"
    assert np.array_equal(t["slot_mapping"].numpy(), [0, 1, 2])
