"""The sglang adapter against sglang's interface as docs/sglang.md lists it,
driven in sglang's order (in one process; the multi-process harness is
test_sglang_scheduler.py). Each test names the rows of docs/sglang.md it
shows."""

from __future__ import annotations

import inspect
import json
import logging
import socket
import sys
import types
import urllib.request

import numpy as np
import pytest

import kvbridge
from kvbridge import KVPoll, KVTransferError, _kvbridge
from kvbridge import sglang as sg
from sglang_standins import SgPool, server_args, wait_until

# Rows M1, M2, M5, M7, S1-S5, R1-R3, H9: method -> parameter names (after
# self), in order, as sglang's base/common classes declare them.
INTERFACE = {
    sg.KVBridgeKVManager: {
        "__init__": ["args", "disaggregation_mode", "server_args", "is_mla_backend"],
        "register_to_bootstrap": [],
        "try_ensure_parallel_info": ["bootstrap_addr"],
        "submit_prefill_recompute": ["kv_receiver", "payload"],
    },
    sg.KVBridgeKVSender: {
        "__init__": ["mgr", "bootstrap_addr", "bootstrap_room", "dest_tp_ranks", "pp_rank",
                     "req_has_disagg_prefill_dp_rank"],
        "init": ["num_kv_indices", "aux_index"],
        "send": ["kv_indices", "state_indices", "token_position_offset"],
        "pop_decode_prefix_len": [],
        "should_send_kv_chunk": ["num_pages", "last_chunk"],
        "get_transfer_metric": [],
        "poll": [],
        "failure_exception": [],
        "clear": [],
        "abort": [],
    },
    sg.KVBridgeKVReceiver: {
        "__init__": ["mgr", "bootstrap_addr", "bootstrap_room"],
        "init": ["prefill_dp_rank"],
        "send_metadata": ["kv_indices", "aux_index", "state_indices", "decode_prefix_len"],
        "poll": [],
        "failure_exception": [],
        "clear": [],
        "abort": [],
    },
    sg.KVBridgeKVBootstrapServer: {"__init__": ["host", "port"]},
}
# Parameters sglang gives a default, so callers may leave them out.
OPTIONAL = {"is_mla_backend", "req_has_disagg_prefill_dp_rank", "aux_index", "state_indices",
            "token_position_offset", "bootstrap_room", "decode_prefix_len"}


def test_abstract_interface():
    for cls, methods in INTERFACE.items():
        for name, params in methods.items():
            fn = getattr(cls, name, None)
            assert callable(fn), f"{cls.__name__}.{name} missing"
            sig = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
            got = [p.name for p in sig][:len(params)]
            assert got == params, f"{cls.__name__}.{name}{got} != {params}"
            for p in sig[:len(params)]:
                if p.name in OPTIONAL and not (p.name == "bootstrap_room" and
                                               cls is sg.KVBridgeKVSender):
                    assert p.default is not inspect.Parameter.empty, f"{cls.__name__}.{name}.{p}"
    try:  # with sglang importable: its base classes and no abstract method left
        from sglang.srt.disaggregation.base import conn as base
    except Exception:  # noqa: BLE001
        return
    for ours, theirs in ((sg.KVBridgeKVManager, base.BaseKVManager),
                         (sg.KVBridgeKVSender, base.BaseKVSender),
                         (sg.KVBridgeKVReceiver, base.BaseKVReceiver),
                         (sg.KVBridgeKVBootstrapServer, base.BaseKVBootstrapServer)):
        assert issubclass(ours, theirs)
        assert not getattr(ours, "__abstractmethods__", None)


def test_state_indices_forms():  # R4
    assert sg.flat_state_indices(None) is None
    assert sg.flat_state_indices([]) is None
    assert sg.flat_state_indices(np.array([3, 4], np.int32)) == [3, 4]
    # one entry per state type: mamba (list of arrays), swa (array), none
    mixed = [[np.array([7], np.int64)], np.array([1, 2], np.int32), None]
    assert sg.flat_state_indices(mixed) == [7, 1, 2]
    assert sg.flat_state_indices([None, None]) is None
    assert sg.flat_state_indices([[np.array(5)]]) == [5]  # a 0-d array


def test_placement_dp_attention(monkeypatch):  # A1, A8, A11, M8
    sa = server_args(1, tp_size=4, dp_size=2, enable_dp_attention=True)
    pre = SgPool("prefill", engine_rank=3).args  # prefill: the full tp rank
    lay = sg.placement(pre, sa, "prefill")
    assert (lay.tp_size, lay.tp_rank, lay.dp_size, lay.dp_rank) == (2, 1, 2, 1)
    dec = SgPool("decode", engine_rank=1, system_dp_rank=1).args  # tp_rank % attn_tp
    lay = sg.placement(dec, sa, "decode")
    assert (lay.tp_size, lay.tp_rank, lay.dp_size, lay.dp_rank) == (2, 1, 2, 1)
    # Inside sglang its dp_attention functions decide.
    dpa = types.ModuleType("sglang.srt.layers.dp_attention")
    dpa.get_attention_dp_size = lambda: 2
    dpa.get_attention_dp_rank = lambda: 1
    dpa.get_attention_tp_size = lambda: 2
    dpa.get_attention_tp_rank = lambda: 0
    layers = types.ModuleType("sglang.srt.layers")
    layers.dp_attention = dpa
    for name, mod in (("sglang", types.ModuleType("sglang")),
                      ("sglang.srt", types.ModuleType("sglang.srt")),
                      ("sglang.srt.layers", layers), ("sglang.srt.layers.dp_attention", dpa)):
        monkeypatch.setitem(sys.modules, name, mod)
    dec0 = SgPool("decode", engine_rank=0, system_dp_rank=0).args
    lay = sg.placement(dec0, sa, "decode")
    assert (lay.tp_size, lay.tp_rank, lay.dp_size, lay.dp_rank) == (2, 0, 2, 1)


def test_placement_system_dp():  # A11
    sa = server_args(1, tp_size=2, dp_size=2, enable_dp_attention=False)
    lay = sg.placement(SgPool("prefill", engine_rank=1, system_dp_rank=1).args, sa, "prefill")
    assert (lay.tp_size, lay.tp_rank, lay.dp_size, lay.dp_rank) == (2, 1, 2, 1)
    lay = sg.placement(SgPool("decode", engine_rank=0).args, server_args(1), "decode")
    assert (lay.tp_size, lay.tp_rank, lay.dp_size, lay.dp_rank) == (1, 0, 1, 0)


class Pair:
    """A prefill and a decode rank through the adapter, sglang-style args."""

    def __init__(self, bootstrap: str, state_types=None, decode_port: int = 30001):
        port = int(bootstrap.rsplit(":", 1)[1])
        self.addr = bootstrap
        self.p = SgPool("prefill", state_types=state_types)
        self.d = SgPool("decode", state_types=state_types)
        self.pm = sg.KVBridgeKVManager(self.p.args, "prefill", server_args(port, port=30000))
        self.dm = sg.KVBridgeKVManager(self.d.args, "decode",
                                       server_args(port, port=decode_port))

    def close(self):
        self.dm.close()
        self.pm.close()


@pytest.fixture
def pair(bootstrap):
    p = Pair(bootstrap)
    yield p
    p.close()


def run_sglang_order(pair: Pair, room: int, src: np.ndarray, dst: np.ndarray, aux: int = 1,
                     prefix_pages: int = 0, chunks=(2,), prefill_state=None,
                     decode_state=None):
    """One request in sglang's order; returns (sender, receiver) at Success."""
    rx = sg.KVBridgeKVReceiver(pair.dm, pair.addr, room)  # R1: before the prefill is known
    assert rx.poll() == KVPoll.Bootstrapping and rx.conclude_state is None
    tx = sg.KVBridgeKVSender(pair.pm, pair.addr, room, [0], 0)
    assert pair.dm.try_ensure_parallel_info(pair.addr)
    rx.init(0)
    wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="decode handshake")
    assert rx.poll() == KVPoll.WaitingForInput, rx.failure()  # O1
    assert tx.poll() == KVPoll.Bootstrapping  # nothing was sent to prefill yet
    # decode pre-allocates only now
    page_size = pair.d.args.page_size
    rx.send_metadata(dst.astype(np.int32), aux, decode_state,
                     decode_prefix_len=prefix_pages * page_size)
    assert rx.poll() == KVPoll.WaitingForInput  # O2
    wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
    assert tx.poll() == KVPoll.WaitingForInput, tx.failure()  # O4
    assert tx.pop_decode_prefix_len() == prefix_pages * page_size  # S4
    pair.p.fill(room, src)
    tx.init(len(src), aux)  # S2: the pages prefill sends
    pos = 0
    for i, n in enumerate(chunks):
        last = i == len(chunks) - 1
        if tx.should_send_kv_chunk(n, last):
            tx.send(src[pos:pos + n], prefill_state if last else None)
        pos += n
    wait_until(lambda: rx.poll() in (KVPoll.Success, KVPoll.Failed) and
               tx.poll() in (KVPoll.Success, KVPoll.Failed), what="transfer")
    assert rx.poll() == KVPoll.Success, rx.failure()
    assert tx.poll() == KVPoll.Success, tx.failure()
    for b in range(len(pair.p.kv)):
        assert np.array_equal(pair.d.kv[b][dst], pair.p.kv[b][src]), f"buffer {b}"
    return tx, rx


def test_sglang_order_in_process(pair):  # O1, O2, O4, S2, S3, S6, S10, R8, M2, M5
    src, dst = np.array([5, 6, 9], np.int32), np.array([11, 3, 40], np.int32)
    pair.p.aux[1] = 77
    tx, rx = run_sglang_order(pair, 21, src, dst, chunks=(2, 1))
    assert np.all(pair.d.aux[1] == 77)
    assert tx.conclude_state == KVPoll.Success and rx.conclude_state == KVPoll.Success
    metric = tx.get_transfer_metric()  # S6: common's formula
    assert metric.transfer_total_bytes == 3 * sum(pair.p.args.kv_item_lens)
    assert rx.failure() is None and tx.failure() is None  # E4
    tx.clear()
    rx.clear()


def test_decode_kvargs_without_heads_take_them_from_prefill(pair):  # A5
    assert not hasattr(pair.d.args, "total_kv_head_num")
    src, dst = np.array([1, 2], np.int32), np.array([7, 8], np.int32)
    tx, rx = run_sglang_order(pair, 22, src, dst)
    core = pair.dm._cores[sg._norm_addr(pair.addr)]
    assert (core.kv_args.total_kv_head_num, core.kv_args.kv_head_num) == (2, 2)
    tx.clear()
    rx.clear()


def test_decode_prefix_len_is_skipped(pair):  # O5, S4
    # decode holds 3 pages already: it sends the 2 new ones, prefill's init
    # counts 2 and its chunk holds 2 (run_sglang_order checks every byte).
    src, dst = np.array([30, 31], np.int32), np.array([50, 51], np.int32)
    tx, rx = run_sglang_order(pair, 23, src, dst, prefix_pages=3)
    assert tx.get_transfer_metric().transfer_total_bytes == 2 * sum(pair.p.args.kv_item_lens)
    tx.clear()
    rx.clear()


def test_hybrid_state_indices_transfer(bootstrap):  # A4, R4
    p = Pair(bootstrap, state_types=["mamba", "swa"])
    try:
        p.p.states[0][7] = 41
        p.p.states[1][7] = 42
        p.p.states[0][2] = 43
        p.p.states[1][2] = 44
        src, dst = np.array([4, 5], np.int32), np.array([9, 10], np.int32)
        # per state type: mamba a list of arrays, swa one array, a third none
        tx, rx = run_sglang_order(
            p, 24, src, dst, prefill_state=[[np.array([7])], np.array([2], np.int32), None],
            decode_state=[[np.array([3])], np.array([6], np.int64), None])
        assert np.all(p.d.states[0][3] == 41) and np.all(p.d.states[1][3] == 42)
        assert np.all(p.d.states[0][6] == 43) and np.all(p.d.states[1][6] == 44)
        tx.clear()
        rx.clear()
    finally:
        p.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_try_ensure_parallel_info(bootstrap):  # M4, M5, A6
    port = int(bootstrap.rsplit(":", 1)[1])
    d = SgPool("decode")
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30002))
    assert not dm.try_ensure_parallel_info(f"127.0.0.1:{_closed_port()}")  # unreachable
    assert not dm.try_ensure_parallel_info(bootstrap)  # no prefill rank registered yet
    assert dm.prefill_info_table == {}
    p = SgPool("prefill")
    pm = sg.KVBridgeKVManager(p.args, "prefill", server_args(port))
    try:
        assert dm.try_ensure_parallel_info(bootstrap)
        info = dm.prefill_info_table[bootstrap]
        assert (info.dp_size, info.attn_tp_size, info.pp_size, info.page_size) == (1, 1, 1, 4)
        assert info.follow_bootstrap_room is True
        wrong = SgPool("decode", page_size=8)
        wm = sg.KVBridgeKVManager(wrong.args, "decode", server_args(port, port=30003))
        with pytest.raises(RuntimeError, match="page_size=4.*page_size=8"):
            wm.try_ensure_parallel_info(bootstrap)
        wm.close()
    finally:
        dm.close()
        pm.close()


def test_two_prefill_instances_behind_one_decode(bootstrap):  # M6
    other = kvbridge.BootstrapServer("127.0.0.1", 0)
    try:
        port_a, port_b = int(bootstrap.rsplit(":", 1)[1]), other.port
        addr_b = f"127.0.0.1:{port_b}"
        pa, pb, d = SgPool("prefill"), SgPool("prefill"), SgPool("decode")
        ma = sg.KVBridgeKVManager(pa.args, "prefill", server_args(port_a, port=30010))
        mb = sg.KVBridgeKVManager(pb.args, "prefill", server_args(port_b, port=30011))
        dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port_a, port=30012))
        for room, (pool, mgr, addr, dst) in enumerate(
                ((pa, ma, bootstrap, [1, 2]), (pb, mb, addr_b, [3, 4])), start=31):
            pair = Pair.__new__(Pair)
            pair.addr, pair.p, pair.d, pair.pm, pair.dm = addr, pool, d, mgr, dm
            src = np.array([10 + room, 20 + room], np.int32)
            tx, rx = run_sglang_order(pair, room, src, np.array(dst, np.int32))
            tx.clear()
            rx.clear()
        assert set(dm.prefill_info_table) == {bootstrap, addr_b}
        dm.close()
        ma.close()
        mb.close()
    finally:
        other.close()


def test_receiver_for_an_unknown_prefill_fails_cleanly(bootstrap):  # R2, R7
    port = int(bootstrap.rsplit(":", 1)[1])
    d = SgPool("decode")
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30004))
    try:
        rx = sg.KVBridgeKVReceiver(dm, f"127.0.0.1:{_closed_port()}", 41)
        rx.init(0)
        assert rx.poll() == KVPoll.Failed and rx.conclude_state == KVPoll.Failed
        with pytest.raises(KVTransferError) as e:
            rx.failure_exception()
        assert e.value.bootstrap_room == 41
        rx.clear()
        early = sg.KVBridgeKVReceiver(dm, bootstrap, 42)  # sglang gives up before init
        early.abort()
        assert early.poll() == KVPoll.Failed
        assert isinstance(early.failure(), KVTransferError)
    finally:
        dm.close()


def test_submit_prefill_recompute_fails_the_request(pair):  # M7
    rx = sg.KVBridgeKVReceiver(pair.dm, pair.addr, 43)
    assert pair.dm.try_ensure_parallel_info(pair.addr)
    rx.init(0)
    wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="handshake")
    pair.dm.submit_prefill_recompute(rx, {"rid": "x"})
    wait_until(lambda: rx.poll() == KVPoll.Failed, what="Failed")
    assert rx.failure().cause == "aborted"
    rx.clear()


def test_conclude_state(pair):  # S10, R8
    tx = sg.KVBridgeKVSender(pair.pm, pair.addr, 44, [0], 0)
    assert tx.conclude_state is None
    tx.abort()
    assert tx.conclude_state == KVPoll.Failed
    tx.clear()


def test_is_from_another_rank_only_for_a_sibling(bootstrap, caplog):  # E2, E3, O6
    port = int(bootstrap.rsplit(":", 1)[1])
    p = SgPool("prefill", heads=2)
    pm = sg.KVBridgeKVManager(p.args, "prefill", server_args(port))
    ds = [SgPool("decode", tp_size=2, tp_rank=r) for r in range(2)]
    dms = [sg.KVBridgeKVManager(d.args, "decode", server_args(port, tp_size=2, port=30020))
           for d in ds]
    try:
        room = 45
        tx = sg.KVBridgeKVSender(pm, bootstrap, room, [0], 0)
        rxs = [sg.KVBridgeKVReceiver(m, bootstrap, room) for m in dms]
        for m, rx in zip(dms, rxs):
            assert m.try_ensure_parallel_info(bootstrap)
            rx.init(0)
        wait_until(lambda: all(rx.poll() == KVPoll.WaitingForInput for rx in rxs), what="ready")
        for rx in rxs:
            rx.send_metadata(np.array([1, 2], np.int32), 1, None, 0)
        wait_until(lambda: tx.poll() == KVPoll.WaitingForInput, what="metadata")
        rxs[1].abort()  # decode tp1's own failure
        wait_until(lambda: all(x.poll() == KVPoll.Failed for x in (tx, *rxs)), what="Failed")
        caplog.set_level(logging.WARNING, logger="kvbridge.sglang")
        errors = []
        for x in (tx, *rxs):
            with pytest.raises(KVTransferError) as e:
                x.failure_exception()
            errors.append(e.value)
        assert [e.origin_role for e in errors] == ["decode"] * 3
        assert [e.origin_tp for e in errors] == [1] * 3
        # prefill: the other side, False; decode tp0: its sibling, True; tp1: its own, False
        assert [e.is_from_another_rank for e in errors] == [False, True, False]
        assert all(e.bootstrap_room == room and f"room {room}:" in e.message for e in errors)
        own = [r for r in caplog.records if r.levelno == logging.WARNING and
               f"room {room} failed" in r.getMessage()]
        assert len(own) == 2 and all('"cause": "aborted"' in r.getMessage() for r in own)
        for x in (tx, *rxs):
            x.clear()
    finally:
        for m in dms:
            m.close()
        pm.close()


def test_kvconfig_accepts_a_url():  # papercut
    cfg = kvbridge.KVConfig(bootstrap_addr="http://127.0.0.1:1/x")
    assert cfg.to_dict()["bootstrap_addr"] == "127.0.0.1:1"


def test_errors_name_the_room(pair):  # papercut: bootstrap_room on a duplicate
    assert pair.dm.try_ensure_parallel_info(pair.addr)
    core = pair.dm.core(pair.addr)
    first = kvbridge.KVReceiver(core, pair.addr, 46)
    with pytest.raises(KVTransferError) as e:
        kvbridge.KVReceiver(core, pair.addr, 46)
    assert e.value.bootstrap_room == 46
    first.clear()
    tx = kvbridge.KVSender(pair.pm.core(), pair.addr, 47)
    with pytest.raises(KVTransferError) as e:
        kvbridge.KVSender(pair.pm.core(), pair.addr, 47)
    assert e.value.bootstrap_room == 47
    tx.clear()


def test_multi_node_prefill_registers_where_peers_reach_it(monkeypatch):  # M11
    sa = server_args(8998)
    sa.host = "0.0.0.0"
    assert sg.bootstrap_target(sa) == "127.0.0.1:8998"
    assert sg.advertise_host(sa) == "127.0.0.1"
    sa.dist_init_addr, sa.nnodes = "10.1.2.3:5000", 2  # multi-node: rank 0's host
    assert sg.bootstrap_target(sa) == "10.1.2.3:8998"
    # inside sglang: the address sglang itself registers as rank_ip
    net = types.ModuleType("sglang.srt.utils.network")
    net.get_local_ip_auto = lambda: "10.9.9.9"
    for name, mod in (("sglang", types.ModuleType("sglang")),
                      ("sglang.srt", types.ModuleType("sglang.srt")),
                      ("sglang.srt.utils", types.ModuleType("sglang.srt.utils")),
                      ("sglang.srt.utils.network", net)):
        monkeypatch.setitem(sys.modules, name, mod)
    assert sg.advertise_host(sa) == "10.9.9.9"


def test_hostile_inputs_get_a_clear_error(pair):
    from kvbridge import _kvbridge
    for bad in (0, -1, float("nan"), 1e300):
        with pytest.raises(kvbridge.InvalidArgumentError, match="timeout_s"):
            _kvbridge.prefill_info(pair.addr, bad)
    with pytest.raises(kvbridge.InvalidArgumentError):
        _kvbridge.prefill_info("no-port-here", 1.0)
    for bad in (["x"], [[1.5j]], [{"a": 1}], np.array(["a"])):
        with pytest.raises(kvbridge.InvalidArgumentError, match="state_indices"):
            sg.flat_state_indices(bad)
    nested = []
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(kvbridge.InvalidArgumentError):
        sg.flat_state_indices(nested)
    # a room's wait bounded whatever the caller asks
    assert pair.dm.try_ensure_parallel_info(pair.addr)
    rx = kvbridge.KVReceiver(pair.dm.core(pair.addr), pair.addr, 48)
    import time
    t0 = time.monotonic()
    assert rx._impl.wait_quiesced(float("nan")) is False  # not failed: not quiesced
    assert rx._impl.wait_quiesced(-5) is False
    assert time.monotonic() - t0 < 1.0
    rx.clear()


def _dp2_prefill(port: int, method: str):
    """Two prefill ranks of one instance, system dp 2 (sglang: two schedulers
    with system_dp_rank 0 and 1), load_balance_method `method`."""
    ranks = []
    for dp in (0, 1):
        pool = SgPool("prefill", system_dp_rank=dp)
        sa = server_args(port, dp_size=2, port=30100 + dp)
        sa.load_balance_method = method
        ranks.append((pool, sg.KVBridgeKVManager(pool.args, "prefill", sa)))
    return ranks


def _sglang_query_dp_ranks(addr: str, rooms):
    """What sglang's decode sends: POST /query_dp_ranks {"bootstrap_rooms": [...]}
    with no token (the route is open), and the JSON it reads back."""
    req = urllib.request.Request(f"http://{addr}/query_dp_ranks", method="POST",
                                 data=json.dumps({"bootstrap_rooms": rooms}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def test_sender_registers_its_dp_rank_when_requests_do_not_follow_the_room(bootstrap):  # S11
    port = int(bootstrap.rsplit(":", 1)[1])
    ranks = _dp2_prefill(port, "total_requests")
    try:
        # decode's parallel info says the rooms are not followed
        info = _kvbridge.prefill_info(bootstrap, 5.0)
        assert info["complete"] and info["dp_size"] == 2
        assert info["follow_bootstrap_room"] is False
        assert _sglang_query_dp_ranks(bootstrap, [10, 11]) == {}
        # room 10 implies dp 0; the router sent it to dp 1, which registers it
        tx = sg.KVBridgeKVSender(ranks[1][1], bootstrap, 10, [0], 0)
        assert tx.poll() == KVPoll.Bootstrapping, tx.failure()
        assert _sglang_query_dp_ranks(bootstrap, [10, 11]) == {"10": 1}
        # sglang's decode calls the receiver class's static method too
        assert sg.KVBridgeKVReceiver.query_prefill_dp_ranks(bootstrap, [10, 11]) == {"10": 1}
        # a request that already carries its dp rank registers nothing
        sg.KVBridgeKVSender(ranks[0][1], bootstrap, 12, [0], 0,
                            req_has_disagg_prefill_dp_rank=True)
        assert _sglang_query_dp_ranks(bootstrap, [12]) == {}
    finally:
        for _, mgr in ranks:
            mgr.close()


def test_follow_bootstrap_room_conflict_fails_the_request_naming_both_ranks(bootstrap,
                                                                          monkeypatch):  # S11
    port = int(bootstrap.rsplit(":", 1)[1])
    monkeypatch.delenv("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", raising=False)
    ranks = _dp2_prefill(port, "follow_bootstrap_room")
    try:
        assert _kvbridge.prefill_info(bootstrap, 5.0)["follow_bootstrap_room"] is True
        ok = sg.KVBridgeKVSender(ranks[1][1], bootstrap, 11, [0], 0)  # 11 % 2 == 1: its own
        assert ok.poll() == KVPoll.Bootstrapping, ok.failure()
        bad = sg.KVBridgeKVSender(ranks[1][1], bootstrap, 10, [0], 0)  # 10 % 2 == 0
        assert bad.poll() == KVPoll.Failed
        with pytest.raises(KVTransferError) as e:
            bad.failure_exception()
        assert "follow_bootstrap_room conflict" in str(e.value)
        assert "dp rank 1" in str(e.value) and "implies dp rank 0" in str(e.value)
        assert e.value.record["cause"] == "invalid_request"
        assert _sglang_query_dp_ranks(bootstrap, [10, 11]) == {}
        # sglang's escape hatch: the sender registers instead of failing
        monkeypatch.setenv("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "1")
        forced = sg.KVBridgeKVSender(ranks[1][1], bootstrap, 20, [0], 0)
        assert forced.poll() == KVPoll.Bootstrapping, forced.failure()
        assert _sglang_query_dp_ranks(bootstrap, [20]) == {"20": 1}
    finally:
        for _, mgr in ranks:
            mgr.close()
