"""Mamba state between prefill and decode of different attention tp sizes
(docs/sglang.md, A9): KVArgs as sglang's setup_state_kv_args fills them
(state_dim_per_tensor and state_conv_shard_groups, one list per state type),
through the adapter, and every decode rank's slot checked against its shard
by the definition (rank r of T holds [r * g / T, (r + 1) * g / T) of each
sub-block g of the whole state, in sub-block order)."""

from __future__ import annotations

import numpy as np
import pytest

import kvbridge
from kvbridge import KVPoll
from kvbridge import sglang as sg
from kvbridge._sglang_state import state_sharding
from sglang_standins import SgPool, server_args, wait_until

GROUPS = [4, 4, 8]  # a GDN conv state: [q | k | v], uint16 elements
FULL = sum(GROUPS)
WHOLE = (np.arange(FULL, dtype=np.uint16) * 37 + 5).astype(np.uint16)


def shard(rank: int, tp: int) -> np.ndarray:
    parts, first = [], 0
    for g in GROUPS:
        parts.append(WHOLE[first + rank * g // tp:first + (rank + 1) * g // tp])
        first += g
    return np.concatenate(parts)


def mamba_pool(mode: str, tp: int, rank: int) -> SgPool:
    """A rank with one mamba state tensor of 8 slots, sharded as sglang's
    HybridLinearKVPool describes it."""
    pool = SgPool(mode, tp_size=tp, tp_rank=rank, state_types=["mamba"], state_rows=8)
    conv = np.zeros((8, FULL // tp), np.uint16)
    pool.states = [conv]
    a = pool.args
    a.state_data_ptrs = [[int(conv.ctypes.data)]]
    a.state_data_lens = [[int(conv.nbytes)]]
    a.state_item_lens = [[int(conv[0].nbytes)]]
    a.state_dim_per_tensor = [[FULL // tp]]
    a.state_conv_shard_groups = [[list(GROUPS)]]
    return pool


@pytest.mark.parametrize("prefill_tp,decode_tp", [(2, 1), (1, 2)])
def test_mamba_state_is_sliced_across_tp_sizes(bootstrap, prefill_tp, decode_tp):  # A9
    port = int(bootstrap.rsplit(":", 1)[1])
    ps = [mamba_pool("prefill", prefill_tp, r) for r in range(prefill_tp)]
    ds = [mamba_pool("decode", decode_tp, r) for r in range(decode_tp)]
    pms = [sg.KVBridgeKVManager(p.args, "prefill", server_args(port, tp_size=prefill_tp))
           for p in ps]
    dms = [sg.KVBridgeKVManager(d.args, "decode",
                                server_args(port, tp_size=decode_tp, port=30030)) for d in ds]
    try:
        room, src, dst = 51, np.array([3, 4], np.int32), np.array([7, 9], np.int32)
        for r, p in enumerate(ps):
            p.fill(room, src)
            p.states[0][2] = shard(r, prefill_tp)
        for d in ds:
            d.states[0][:] = 0xEEEE
        txs = [sg.KVBridgeKVSender(m, bootstrap, room, [0], 0) for m in pms]
        rxs = [sg.KVBridgeKVReceiver(m, bootstrap, room) for m in dms]
        for m, rx in zip(dms, rxs):
            assert m.try_ensure_parallel_info(bootstrap)
            rx.init(0)
        wait_until(lambda: all(rx.poll() == KVPoll.WaitingForInput for rx in rxs), what="handshake")
        for rx in rxs:
            rx.send_metadata(dst, 1, [[np.array([5])]])
        wait_until(lambda: all(tx.poll() == KVPoll.WaitingForInput for tx in txs), what="metadata")
        for tx in txs:
            tx.init(len(src), 0)
            tx.send(src, [[np.array([2])]])
        wait_until(lambda: all(x.poll() == KVPoll.Success for x in (*txs, *rxs)),
                   what="Success")
        for r, d in enumerate(ds):
            np.testing.assert_array_equal(d.states[0][5], shard(r, decode_tp))
            untouched = np.delete(d.states[0], 5, axis=0)
            assert np.all(untouched == 0xEEEE), f"decode rank {r}: other slots written"
        for x in (*txs, *rxs):
            x.clear()
    finally:
        for m in (*pms, *dms):
            m.close()


def test_sglang_sharding_forms_become_kvbridge_fields():  # A9
    class Args:  # two state types: mamba (conv sharded in [q|k|v], temporal) and SWA
        state_data_ptrs = [[1, 2], [3]]
        state_dim_per_tensor = [[16, 4], []]
        state_conv_shard_groups = [[[8, 8, 16], None], []]

    assert state_sharding(Args(), 2) == ([16, 4, 0], [1, 1, 1], [[8, 8, 16], [], []])
    # sglang uses the sub-blocks only when they make up the whole axis
    assert state_sharding(Args(), 4)[2] == [[], [], []]

    class Flat:  # a version that passes one per-tensor list, and outer counts
        state_data_ptrs = [1, 2]
        state_dim_per_tensor = [np.int64(6), 6]  # sizes from tensor shapes or numpy
        state_conv_shard_groups = [[4, 4, 4], None]
        state_slice_outer_counts = [1, 3]

    assert state_sharding(Flat(), 2) == ([6, 6], [1, 3], [[4, 4, 4], []])

    class Unsharded:
        state_data_ptrs = [[1]]
        state_dim_per_tensor = [[]]

    assert state_sharding(Unsharded(), 2) == ([], [], [])

    class Miscounted:
        state_data_ptrs = [[1, 2]]
        state_dim_per_tensor = [[16]]

    with pytest.raises(kvbridge.InvalidArgumentError, match=r"state_dim_per_tensor\[0\] has 1"):
        state_sharding(Miscounted(), 2)

    class Negative:
        state_data_ptrs = [1]
        state_dim_per_tensor = [-3]

    with pytest.raises(kvbridge.InvalidArgumentError, match="is not a size"):
        state_sharding(Negative(), 2)
