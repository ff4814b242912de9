"""What the newest sglang versions the index holds ask of a transfer backend
beyond docs/sglang.md's first table (its "Session 33's audit"): the prefill
send segments, decode's shared executor for dp-rank queries, the role-switch
and host-receive flags, send_metadata's destination and HiSparse device
pages, and the renamed and new StateType members."""

from __future__ import annotations

import enum

import numpy as np
import pytest

import kvbridge
from kvbridge import KVPoll
from kvbridge import sglang as sg
from sglang_standins import SgPool, server_args, wait_until
from test_sglang_conformance import (  # noqa: F401 -- pair is a fixture
    _dp2_prefill, pair, run_sglang_order, typed_pair)


class KVTransferDestination(enum.Enum):  # the members sglang's decode passes
    DEVICE = "device"
    HOST = "host"


def _handshaken(pair, room):
    """A receiver at WaitingForInput (sglang's order) and its sender."""
    rx = sg.KVBridgeKVReceiver(pair.dm, pair.addr, room)
    tx = sg.KVBridgeKVSender(pair.pm, pair.addr, room, [0], 0)
    assert pair.dm.try_ensure_parallel_info(pair.addr)
    rx.init(0)
    wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="decode handshake")
    assert rx.poll() == KVPoll.WaitingForInput, rx.failure()
    return tx, rx


def test_flags_the_newest_sglang_reads_unguarded(pair):
    # prefill: _send_kv_chunk segments by it; None is one send per chunk
    tx, rx = run_sglang_order(pair, 60, np.array([1, 2, 3], np.int32),
                              np.array([9, 8, 7], np.int32), chunks=(2, 1))
    assert tx.get_max_transfer_tokens() is None
    # role_switch.py's _reject_reason: a backend that cannot switch says so
    assert pair.pm.supports_role_switch is False and pair.dm.supports_role_switch is False
    # decode host receive: _init_kv_manager and pop_preallocated ask
    assert pair.dm.supports_host_destination is False
    assert rx.supports_host_destination is False
    tx.clear()
    rx.clear()


def test_dp_rank_queries_run_on_the_managers_shared_executor(bootstrap):
    port = int(bootstrap.rsplit(":", 1)[1])
    ranks = _dp2_prefill(port, "total_requests")
    d = sg.KVBridgeKVManager(SgPool("decode").args, "decode",
                             server_args(port, port=30001))
    try:
        executor = d._ensure_prefill_recompute_executor()
        assert d._ensure_prefill_recompute_executor() is executor  # one per manager
        sg.KVBridgeKVSender(ranks[1][1], bootstrap, 10, [0], 0)  # dp 1 registers room 10
        # decode's prefetch_prefill_dp_rank_queries, as the newest sglang has it
        future = executor.submit(sg.KVBridgeKVReceiver.query_prefill_dp_ranks, bootstrap,
                                 [10, 11])
        assert future.result(timeout=10) == {"10": 1}
    finally:
        d.close()
        for _, mgr in ranks:
            mgr.close()
    with pytest.raises(RuntimeError):  # closed with its manager
        executor.submit(print)
    # sglang's loop may still ask after close(): an answer, and no new pool
    late = d._ensure_prefill_recompute_executor()
    assert late is not executor
    ran = []
    assert late.submit(ran.append, 1).result(timeout=5) == {}
    assert ran == []


def test_a_chunk_cut_into_sends_of_the_tokens_a_backend_allows(pair, monkeypatch):
    # what the newest prefill does with an integer limit: one page per send
    page = pair.p.args.page_size
    monkeypatch.setattr(sg.KVBridgeKVSender, "get_max_transfer_tokens", lambda self: page)
    sends = []
    original = sg.KVBridgeKVSender.send
    monkeypatch.setattr(sg.KVBridgeKVSender, "send",
                        lambda self, kv, *a, **k: sends.append(len(kv)) or original(self, kv, *a,
                                                                                    **k))
    tx, rx = run_sglang_order(pair, 64, np.array([3, 1, 8], np.int32),
                              np.array([12, 40, 5], np.int32), chunks=(2, 1))
    assert sends == [1, 1, 1]
    tx.clear()
    rx.clear()


def test_a_host_destination_is_refused_and_device_is_the_default(pair):
    tx, rx = _handshaken(pair, 61)
    src, dst = np.array([4, 5], np.int32), np.array([20, 21], np.int32)
    with pytest.raises(NotImplementedError, match="Host KV destination"):
        rx.send_metadata(dst, 1, destination=KVTransferDestination.HOST)
    assert rx.poll() == KVPoll.WaitingForInput, rx.failure()
    # the same request, to the device: as if no destination were given
    rx.send_metadata(dst, 1, destination=KVTransferDestination.DEVICE)
    wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
    assert tx.poll() == KVPoll.WaitingForInput, tx.failure()
    pair.p.fill(61, src)
    tx.init(len(src), 1)
    tx.send(src, None, num_kv_tokens=len(src) * pair.p.args.page_size)
    wait_until(lambda: rx.poll() == KVPoll.Success, what="transfer")
    for b in range(len(pair.p.kv)):
        assert np.array_equal(pair.d.kv[b][dst], pair.p.kv[b][src]), f"buffer {b}"
    tx.clear()
    rx.clear()


def test_hisparse_device_pages_fail_the_request_by_name(pair):
    tx, rx = _handshaken(pair, 62)
    rx.send_metadata(np.array([3], np.int32), 1, device_kv_indices=np.array([7], np.int32))
    wait_until(lambda: rx.poll() == KVPoll.Failed, what="decode's verdict")
    assert "device_kv_indices" in rx.failure().failure_reason, rx.failure()
    wait_until(lambda: tx.poll() == KVPoll.Failed, what="prefill learns it")
    assert "device_kv_indices" in tx.failure().failure_reason, tx.failure()
    tx.clear()
    rx.clear()


def test_the_renamed_c128_state_pairs_with_its_old_name(bootstrap):
    class StateType(enum.Enum):  # the newest sglang's name, the same wire value
        DSV4_REQUEST_STATE = "c128_state"
        SWA = "swa"

    class Args:
        state_types = [StateType.SWA, StateType.DSV4_REQUEST_STATE]
        state_data_ptrs = [[1], [2]]
    assert sg.state_type_names_of(Args()) == ["SWA", "C128_STATE"]
    # a prefill of the newest sglang, a decode of an older one
    pair = typed_pair(bootstrap, ["dsv4_request_state"], ["c128_state"], [16], [16])
    try:
        pair.p.states[0][5] = 91
        tx, rx = run_sglang_order(pair, 63, np.array([2], np.int32), np.array([6], np.int32), chunks=(1,),
                                  prefill_state=[np.array([5], np.int32)],
                                  decode_state=[np.array([11], np.int32)])
        assert np.all(pair.d.states[0][11] == 91), pair.d.states[0][11]
        assert not np.delete(pair.d.states[0], [11], axis=0).any(), "a row beside slot 11"
        tx.clear()
        rx.clear()
    finally:
        pair.close()


def test_the_newest_row_state_types_pair_by_name(bootstrap):
    # The newest sglang's StateType members whose indices are rows (of pages
    # or request slots): each pairs by name with decode's component of that
    # type, here listed in the opposite order on decode.
    class StateType(enum.Enum):
        QSA_PENDING = "qsa_pending"
        QSA_COMPRESSED = "qsa_compressed"
        MINIMAX_DENSE_KV = "minimax_dense_kv"
        BLOCK_SCALE = "block_scale"
        BLOCK_SCALE_SWA = "block_scale_swa"

    names = [t.name.lower() for t in StateType]
    pair = typed_pair(bootstrap, names, names[::-1], [16] * 5, [16] * 5)
    try:
        assert pair.pm._args.state_type_names == [t.name.lower() for t in StateType]
        for i in range(5):
            pair.p.states[i][4 + i] = 60 + i
        src_slots = [np.array([4 + i], np.int32) for i in range(5)]
        dst_slots = [np.array([10 - i], np.int32) for i in range(5)]  # decode's order
        tx, rx = run_sglang_order(pair, 64, np.array([2], np.int32), np.array([6], np.int32),
                                  chunks=(1,), prefill_state=src_slots,
                                  decode_state=dst_slots[::-1])
        for i in range(5):
            d = pair.d.states[4 - i]  # decode's component of prefill's type i
            assert np.all(d[10 - i] == 60 + i), (names[i], d[10 - i])
            assert not np.delete(d, [10 - i], axis=0).any(), f"a {names[i]} row beside the slot"
        tx.clear()
        rx.clear()
    finally:
        pair.close()


def test_a_dsa_tail_state_component_is_refused_by_name():
    class StateType(enum.Enum):
        DSA = "dsa"
        DSA_TAIL = "dsa_tail"

    class Args:
        state_types = [StateType.DSA, StateType.DSA_TAIL]
        state_data_ptrs = [[1], [2]]
    with pytest.raises(kvbridge.UnimplementedError, match="DSA_TAIL: its indices describe"):
        sg.state_type_names_of(Args())


def test_a_rust_server_rank_is_told_where_it_registers(bootstrap, caplog):
    # The newest sglang under SGLANG_RUST_SERVER with attention dp > 1 gives
    # prefill KVArgs.rust_http_port and registers with each dp leader's Rust
    # server; kvbridge registers with the bootstrap server and says so.
    port = int(bootstrap.rsplit(":", 1)[1])
    managers = []
    try:
        for dp, rust_port in ((0, 8765), (1, None)):
            pool = SgPool("prefill", engine_rank=dp)
            pool.args.rust_http_port = rust_port
            sa = server_args(port, tp_size=2, dp_size=2, enable_dp_attention=True,
                             port=30200 + dp)
            with caplog.at_level("WARNING", logger="kvbridge.sglang"):
                managers.append(sg.KVBridgeKVManager(pool.args, "prefill", sa))
        said = [r.getMessage() for r in caplog.records if "Rust server" in r.getMessage()]
        assert len(said) == 1, said  # only the rank with a Rust port
        assert "rust_http_port 8765" in said[0] and f"127.0.0.1:{port}" in said[0]
    finally:
        for m in managers:
            m.close()
