"""The sglang adapter against sglang's interface as docs/sglang.md lists it,
driven in sglang's order (in one process; the multi-process harness is
test_sglang_scheduler.py). Each test names the rows of docs/sglang.md it
shows."""

from __future__ import annotations

import contextlib
import enum
import inspect
import json
import logging
import re
import time
import sys
import types
import urllib.request

import numpy as np
import pytest

import kvbridge
from kvbridge import KVPoll, KVTransferError, _kvbridge
from kvbridge import sglang as sg
from sglang_standins import SgPool, server_args, settle, unused_port, wait_until

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
        # the newest base class's order; an older one had token_position_offset
        # third, which no scheduler passed (the adapter takes it by keyword)
        "send": ["kv_indices", "state_indices", "num_kv_tokens"],
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
            "num_kv_tokens", "token_position_offset", "bootstrap_room", "decode_prefix_len"}


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
    # several state types with their own pools: one section per type
    two = [[np.array([7], np.int64)], np.array([1, 2], np.int32)]
    assert sg.sectioned_state_indices(two, 2) == [7, -1, 1, 2]
    assert sg.sectioned_state_indices([None, np.array([4])], 2) == [-1, 4]
    assert sg.sectioned_state_indices([None, None], 2) is None
    assert sg.sectioned_state_indices(None, 2) is None
    assert sg.sectioned_state_indices(np.array([3, 4]), 2) == [3, 4]  # every pool
    with pytest.raises(kvbridge.InvalidArgumentError, match="3 entries.*2 state types"):
        sg.sectioned_state_indices(mixed, 2)
    assert sg.state_types_of(SgPool("prefill", state_types=["mamba", "swa"]).args) == [0, 1]
    assert sg.state_types_of(SgPool("prefill").args) == []


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


def _sglang_parallel(monkeypatch, **fields):
    """sglang.srt.runtime_context.get_parallel() answering `fields`."""
    par = types.SimpleNamespace(attn_tp_size=1, attn_tp_rank=0, **fields)
    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_parallel = lambda: par
    for name, mod in (("sglang", types.ModuleType("sglang")),
                      ("sglang.srt", types.ModuleType("sglang.srt")),
                      ("sglang.srt.runtime_context", rc)):
        monkeypatch.setitem(sys.modules, name, mod)
    return par


def test_context_parallel_places_cp_ranks_and_refuses_what_it_does_not_do(monkeypatch):  # M10
    par = _sglang_parallel(monkeypatch, attn_cp_size=2, attn_cp_rank=1)
    lay = sg.placement(SgPool("prefill").args, server_args(1), "prefill")
    assert (lay.cp_size, lay.cp_rank) == (2, 1)
    # What kvbridge does not do is refused by name, before any rank starts.
    with pytest.raises(kvbridge.UnimplementedError, match="decode server takes no context"):
        sg.placement(SgPool("decode").args, server_args(1), "decode")
    layer_split = server_args(1)
    layer_split.enable_dsa_cache_layer_split = True
    with pytest.raises(kvbridge.UnimplementedError, match="enable-dsa-cache-layer-split splits"):
        sg.placement(SgPool("prefill").args, layer_split, "prefill")
    # Every cp rank sending its share: sglang's variable, or a hybrid MLA
    # backend, on either server (decode then reads every cp rank).
    assert not lay.all_cp_ranks
    monkeypatch.setenv("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER", "1")
    assert sg.placement(SgPool("prefill").args, server_args(1), "prefill").all_cp_ranks
    monkeypatch.delenv("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER")
    hybrid = SgPool("prefill").args
    hybrid.is_hybrid_mla_backend = True
    assert sg.placement(hybrid, server_args(1), "prefill").all_cp_ranks
    par.attn_cp_size, par.attn_cp_rank = 1, 0  # cp 1 is placed as before
    lay = sg.placement(SgPool("prefill").args, server_args(1), "prefill")
    assert (lay.tp_size, lay.cp_size, lay.cp_rank) == (1, 1, 0)


def test_layouts_kvbridge_cannot_place_are_refused_by_name():  # A9
    # Decode context parallelism: decode's KVArgs place the rank in its dcp
    # group (an MLA cache only: the C++ core refuses MHA by name); prefill's
    # KV is never context-parallel in kvbridge, refused before any rank starts.
    dcp = SgPool("decode").args
    dcp.dcp_size, dcp.dcp_rank = 2, 1
    lay = sg.to_kvbridge_args(dcp, server_args(1), "decode").parallel
    assert (lay.dcp_size, lay.dcp_rank, lay.tp_size) == (2, 1, 1)
    with pytest.raises(kvbridge.UnimplementedError, match="dcp_size 2 without MLA"):
        sg.KVBridgeKVManager(dcp, "decode", server_args(1))
    pdcp = SgPool("prefill").args
    pdcp.dcp_size, pdcp.dcp_rank = 2, 0
    with pytest.raises(kvbridge.UnimplementedError, match="dcp_size 2 on the prefill server"):
        sg.KVBridgeKVManager(pdcp, "prefill", server_args(1))
    dcp.dcp_size = 1  # DCP off: placed as before
    lay = sg.to_kvbridge_args(dcp, server_args(1), "decode").parallel
    assert (lay.pp_size, lay.dcp_size, lay.dcp_rank) == (1, 1, 0)
    # Draft (MTP) entries: sglang's count reaches the C++ layout, which
    # bounds it by the kv buffers.
    dcp.num_draft_entries = 1
    assert sg.to_kvbridge_args(dcp, server_args(1), "decode").to_dict()["num_draft_entries"] == 1
    drafted = SgPool("prefill").args  # prefill makes its C++ manager at once
    drafted.num_draft_entries = 99
    with pytest.raises(kvbridge.FailedPreconditionError, match="num_draft_entries 99 out of range"):
        sg.KVBridgeKVManager(drafted, "prefill", server_args(1))
    # Compressed MLA under pp is placed by layer ids since session 29
    # (test_sglang_compressed_mla.py).


@contextlib.contextmanager
def _prefill_cp2_and_decode(bootstrap, monkeypatch):
    """Prefill cp ranks 0 and 1 (attn_cp_size 2) and a decode server (cp 1)
    through the adapter, on `bootstrap`: (pools p0, p1, d, managers pm0, pm1,
    dm), closed on the way out."""
    port = int(bootstrap.rsplit(":", 1)[1])
    par = _sglang_parallel(monkeypatch, attn_cp_size=2, attn_cp_rank=0)
    p0, p1, d = SgPool("prefill"), SgPool("prefill"), SgPool("decode")
    pm0 = sg.KVBridgeKVManager(p0.args, "prefill", server_args(port, port=30000))
    par.attn_cp_rank = 1
    pm1 = sg.KVBridgeKVManager(p1.args, "prefill", server_args(port, port=30000))
    par.attn_cp_size, par.attn_cp_rank = 1, 0  # the decode server has no cp
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30001))
    try:
        yield p0, p1, d, pm0, pm1, dm
    finally:
        dm.close()
        pm1.close()
        pm0.close()


def test_prefill_cp_rank_zero_sends_the_others_are_dummies(bootstrap, monkeypatch):  # M10
    # sglang's default cp transfer: decode reads the request from prefill cp
    # rank 0; cp rank 1's sender says WaitingForInput at once and Success on
    # its last chunk, and sends nothing.
    with _prefill_cp2_and_decode(bootstrap, monkeypatch) as (p0, p1, d, pm0, pm1, dm):
        assert (pm0.is_dummy_cp_rank, pm1.is_dummy_cp_rank) == (False, True)
        room, src, dst = 31, np.array([4, 5, 6], np.int32), np.array([9, 10, 11], np.int32)
        dummy = sg.KVBridgeKVSender(pm1, bootstrap, room, [0], 0)
        assert dummy.poll() == KVPoll.WaitingForInput  # before any decode rank exists
        p1.fill(room + 100, src)  # another pattern: none of it may reach decode
        rx = sg.KVBridgeKVReceiver(dm, bootstrap, room)
        tx = sg.KVBridgeKVSender(pm0, bootstrap, room, [0], 0)
        wait_until(lambda: dm.try_ensure_parallel_info(bootstrap), what="both cp ranks listed")
        rx.init(0)
        wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="decode handshake")
        rx.send_metadata(dst, 1, None)
        wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
        p0.fill(room, src)
        for sender in (tx, dummy):
            sender.init(len(src), 1)
            sender.send(src[:2], None)
        assert dummy.poll() == KVPoll.WaitingForInput
        for sender in (tx, dummy):
            sender.send(src[2:], None)
        assert dummy.poll() == KVPoll.Success and dummy.failure() is None
        wait_until(lambda: rx.poll() in (KVPoll.Success, KVPoll.Failed) and
                   tx.poll() in (KVPoll.Success, KVPoll.Failed), what="transfer")
        assert rx.poll() == KVPoll.Success, rx.failure()
        for b in range(len(p0.kv)):
            assert np.array_equal(d.kv[b][dst], p0.kv[b][src]), f"buffer {b}"
        for x in (tx, dummy, rx):
            x.clear()


def test_every_cp_rank_sends_its_share_of_the_pages(bootstrap, monkeypatch):  # M10
    # SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER on both servers: prefill cp
    # rank 0 sends the first 3 of 5 pages, cp rank 1 the last 2 (sglang's
    # split); decode reads both. Each prefill pool holds garbage where the
    # other's share is, so decode holds the request only if each sent its own.
    monkeypatch.setenv("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER", "1")
    ref = SgPool("prefill")
    with _prefill_cp2_and_decode(bootstrap, monkeypatch) as (p0, p1, d, pm0, pm1, dm):
        assert (pm0.is_dummy_cp_rank, pm1.is_dummy_cp_rank) == (False, False)
        assert dm.enable_all_cp_ranks_for_transfer
        room = 41
        src, dst = np.array([4, 5, 6, 7, 8], np.int32), np.array([9, 10, 11, 12, 13], np.int32)
        for pool in (p0, p1, ref):
            pool.fill(room, src)
        for b in range(len(p0.kv)):
            p0.kv[b][src[3:]] = 0xA5A5  # cp rank 1's share
            p1.kv[b][src[:3]] = 0x5A5A  # cp rank 0's share
        rx = sg.KVBridgeKVReceiver(dm, bootstrap, room)
        tx0 = sg.KVBridgeKVSender(pm0, bootstrap, room, [0], 0)
        tx1 = sg.KVBridgeKVSender(pm1, bootstrap, room, [0], 0)
        wait_until(lambda: dm.try_ensure_parallel_info(bootstrap), what="both cp ranks listed")
        rx.init(0)
        wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="decode handshake")
        rx.send_metadata(dst, 1, None)
        for tx in (tx0, tx1):
            wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
            tx.init(len(src), 1)
            tx.send(src[:2], None)
            tx.send(src[2:], None)
        wait_until(lambda: all(x.poll() in (KVPoll.Success, KVPoll.Failed) for x in (rx, tx0, tx1)),
                   what="transfer")
        assert rx.poll() == KVPoll.Success, rx.failure()
        for b in range(len(d.kv)):
            assert np.array_equal(d.kv[b][dst], ref.kv[b][src]), f"buffer {b}"
        for x in (tx0, tx1, rx):
            x.clear()


def test_placement_system_dp():  # A11
    sa = server_args(1, tp_size=2, dp_size=2, enable_dp_attention=False)
    lay = sg.placement(SgPool("prefill", engine_rank=1, system_dp_rank=1).args, sa, "prefill")
    assert (lay.tp_size, lay.tp_rank, lay.dp_size, lay.dp_rank) == (2, 1, 2, 1)
    lay = sg.placement(SgPool("decode", engine_rank=0).args, server_args(1), "decode")
    assert (lay.tp_size, lay.tp_rank, lay.dp_size, lay.dp_rank) == (1, 0, 1, 0)


class Pair:
    """A prefill and a decode rank through the adapter, sglang-style args."""

    def __init__(self, bootstrap: str, state_types=None, decode_port: int = 30001,
                 state_rows=16):
        port = int(bootstrap.rsplit(":", 1)[1])
        self.addr = bootstrap
        self.p = SgPool("prefill", state_types=state_types, state_rows=state_rows)
        self.d = SgPool("decode", state_types=state_types, state_rows=state_rows)
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
                     decode_state=None, offsets: bool = False, kv_pairs=None,
                     last_tokens=None):
    """One request in sglang's order; returns (sender, receiver) at Success.
    kv_pairs[b]: the decode buffer prefill buffer b lands in (default b).
    Each chunk goes as the newest sglang sends it (num_kv_tokens by keyword:
    whole pages, the last chunk `last_tokens` if given), or with `offsets` as
    an older base class declared it (token_position_offset, no count)."""
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
        # The newest sglang asks before each chunk how many tokens one send
        # may carry, and cuts the chunk into segments of that many (None:
        # one send).
        limit = tx.get_max_transfer_tokens()
        step = n if limit is None else max(int(limit) // page_size, 1)
        for at in range(pos, pos + max(n, 1), step):  # an empty last chunk is sent too
            k = min(step, pos + n - at)
            seg_last = last and at + k == pos + n
            if not tx.should_send_kv_chunk(k, seg_last):
                continue
            state = prefill_state if seg_last else None
            if offsets:  # token_position_offset: the chunk's first token in the request
                tx.send(src[at:at + k], state,
                        token_position_offset=(prefix_pages + at) * page_size)
            else:
                tokens = last_tokens if seg_last and last_tokens is not None else k * page_size
                tx.send(src[at:at + k], state, num_kv_tokens=tokens)
        pos += n
    wait_until(lambda: rx.poll() in (KVPoll.Success, KVPoll.Failed) and
               tx.poll() in (KVPoll.Success, KVPoll.Failed), what="transfer")
    assert rx.poll() == KVPoll.Success, rx.failure()
    assert tx.poll() == KVPoll.Success, tx.failure()
    for b in range(len(pair.p.kv)):
        into = b if kv_pairs is None else kv_pairs[b]
        assert np.array_equal(pair.d.kv[into][dst], pair.p.kv[b][src]), f"buffer {b}"
    return tx, rx


def test_sglang_order_in_process(pair):  # O1, O2, O4, S2, S3, S6, S10, R8, M2, M5
    src, dst = np.array([5, 6, 9], np.int32), np.array([11, 3, 40], np.int32)
    pair.p.aux[1] = 77
    started = time.monotonic()
    tx, rx = run_sglang_order(pair, 21, src, dst, chunks=(2, 1))
    elapsed = time.monotonic() - started
    assert np.all(pair.d.aux[1] == 77)
    assert tx.conclude_state == KVPoll.Success and rx.conclude_state == KVPoll.Success
    assert rx.failure() is None and tx.failure() is None  # E4
    tx.clear()
    rx.clear()
    metric = tx.get_transfer_metric()  # S6, read after clear() as sglang does
    assert metric.transfer_total_bytes == 3 * sum(pair.p.args.kv_item_lens)  # common's formula
    # measured by C++: both spans lie inside this request's life
    assert metric.transfer_latency_s is not None and metric.alloc_latency_s is not None
    assert 0.0 <= metric.transfer_latency_s <= elapsed
    assert 0.0 <= metric.alloc_latency_s <= elapsed


def test_decode_kvargs_without_heads_take_them_from_prefill(pair):  # A5
    assert not hasattr(pair.d.args, "total_kv_head_num")
    src, dst = np.array([1, 2], np.int32), np.array([7, 8], np.int32)
    tx, rx = run_sglang_order(pair, 22, src, dst)
    core = pair.dm._cores[sg._norm_addr(pair.addr)]
    assert (core.kv_args.total_kv_head_num, core.kv_args.kv_head_num) == (2, 2)
    tx.clear()
    rx.clear()


def test_the_runners_kv_cache_dtype_is_the_one_compared(bootstrap):  # A10
    # The newest sglang puts its model runner's dtype in KVArgs
    # (kv_cache_dtype_str); the server argument may still say "auto".
    p = Pair(bootstrap)
    try:
        p.pm.close()
        p.p.args.kv_cache_dtype_str = "fp8_e4m3"
        sa = server_args(int(bootstrap.rsplit(":", 1)[1]), port=30000)
        sa.kv_cache_dtype = "fp8_e4m3"  # the same dtype, said by the server argument
        p.pm = sg.KVBridgeKVManager(p.p.args, "prefill", sa)
        p.dm.close()
        p.d.args.kv_cache_dtype_str = "fp8_e4m3"
        p.dm = sg.KVBridgeKVManager(p.d.args, "decode",
                                    server_args(int(bootstrap.rsplit(":", 1)[1]), port=30001))
        assert sg.to_kvbridge_args(p.d.args, server_args(1), "decode").dtype == "fp8_e4m3"
        tx, rx = run_sglang_order(p, 24, np.array([1, 2], np.int32), np.array([5, 6], np.int32))
        tx.clear()
        rx.clear()
        # A decode whose runner holds another dtype: the request fails by name.
        other = SgPool("decode")
        other.args.kv_cache_dtype_str = "bfloat16"
        om = sg.KVBridgeKVManager(other.args, "decode",
                                  server_args(int(bootstrap.rsplit(":", 1)[1]), port=30002))
        try:
            rx = sg.KVBridgeKVReceiver(om, bootstrap, 25)
            om.try_ensure_parallel_info(bootstrap)
            rx.init(0)
            wait_until(lambda: rx.poll() == KVPoll.Failed, what="the dtype mismatch")
            assert "dtype" in str(rx.failure()) and "'fp8_e4m3'" in str(rx.failure())
            assert "'bfloat16'" in str(rx.failure())
            rx.clear()
        finally:
            om.close()
    finally:
        p.close()


def test_token_position_offset_places_each_chunk(pair):  # S3
    # sglang's offset is the chunk's first token in the request (decode's
    # prefix included); kvbridge accepts it where the chunk starts.
    src, dst = np.array([30, 31, 32], np.int32), np.array([50, 51, 52], np.int32)
    tx, rx = run_sglang_order(pair, 27, src, dst, prefix_pages=2, chunks=(2, 1), offsets=True)
    tx.clear()
    rx.clear()


def second_chunk_refused(pair, room, first: dict, second: dict) -> str:
    """Sends two one-page chunks with the keyword arguments given; the
    second must fail the request on both sides. Returns prefill's reason,
    after checking that decode was told the same."""
    src, dst = np.array([30, 31], np.int32), np.array([50, 51], np.int32)
    rx = sg.KVBridgeKVReceiver(pair.dm, pair.addr, room)
    tx = sg.KVBridgeKVSender(pair.pm, pair.addr, room, [0], 0)
    assert pair.dm.try_ensure_parallel_info(pair.addr)
    rx.init(0)
    wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="decode handshake")
    rx.send_metadata(dst, 1, None)
    wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
    tx.init(2, 1)
    tx.send(src[:1], None, **first)
    assert tx.poll() != KVPoll.Failed, tx.failure()
    tx.send(src[1:], None, **second)
    assert tx.poll() == KVPoll.Failed
    reason = tx.failure().failure_reason
    wait_until(lambda: rx.poll() == KVPoll.Failed, what="decode told")
    assert rx.failure().failure_reason == reason
    tx.clear()
    rx.clear()
    return reason


def test_token_position_offset_elsewhere_fails_naming_both(pair):  # S3
    page_size = pair.p.args.page_size
    reason = second_chunk_refused(pair, 28, {"token_position_offset": 0},  # 0: not given
                                  {"token_position_offset": 3 * page_size})
    # the second chunk starts at token page_size
    assert f"token_position_offset {3 * page_size}" in reason and f"token {page_size}" in reason


def test_num_kv_tokens_with_a_partial_last_page_succeeds(pair):  # S3
    # The newest sglang passes each chunk's token count by keyword; the last
    # page of a request is usually partial. Every page lands whole.
    src, dst = np.array([12, 13, 14], np.int32), np.array([60, 61, 62], np.int32)
    tx, rx = run_sglang_order(pair, 29, src, dst, chunks=(2, 1), last_tokens=1)
    tx.clear()
    rx.clear()


def test_num_kv_tokens_beyond_the_chunks_pages_fails_naming_it(pair):  # S3
    page_size = pair.p.args.page_size
    reason = second_chunk_refused(pair, 30, {"num_kv_tokens": page_size},  # a whole page
                                  {"num_kv_tokens": page_size + 1})  # one page cannot hold it
    assert f"num_kv_tokens {page_size + 1}" in reason and "1 pages" in reason


@pytest.mark.parametrize("room,bad,says", [
    (31, "4", "is not an integer"), (32, 1.5, "is not an integer"),
    (33, True, "is not an integer"), (34, [4], "is not an integer"),
    (35, -1, "does not fit"), (36, 2 ** 70, "does not fit")])
def test_num_kv_tokens_of_a_wrong_type_or_size_fails_naming_it(pair, room, bad, says):  # S3
    page_size = pair.p.args.page_size
    reason = second_chunk_refused(pair, room, {"num_kv_tokens": np.int32(page_size)},
                                  {"num_kv_tokens": bad})
    assert f"num_kv_tokens {bad!r}" in reason or f"num_kv_tokens {bad}" in reason, reason
    assert says in reason, reason


def test_decode_prefix_len_is_skipped(pair):  # O5, S4
    # decode holds 3 pages already: it sends the 2 new ones, prefill's init
    # counts 2 and its chunk holds 2 (run_sglang_order checks every byte).
    src, dst = np.array([30, 31], np.int32), np.array([50, 51], np.int32)
    tx, rx = run_sglang_order(pair, 23, src, dst, prefix_pages=3)
    assert tx.get_transfer_metric().transfer_total_bytes == 2 * sum(pair.p.args.kv_item_lens)
    tx.clear()
    rx.clear()


def test_hybrid_state_indices_transfer(bootstrap):  # A4, R4
    # Two state types, each with its own pool of a different size (mamba
    # slots, SWA pages): each type's indices address its own pool only.
    p = Pair(bootstrap, state_types=["mamba", "swa"], state_rows=[4, 16])
    try:
        p.p.states[0][1] = 41
        p.p.states[1][9] = 44  # beyond the mamba pool's 4 rows
        p.p.states[1][10] = 45
        src, dst = np.array([4, 5], np.int32), np.array([9, 10], np.int32)
        # per state type: mamba a list of arrays, swa one array
        tx, rx = run_sglang_order(
            p, 24, src, dst, prefill_state=[[np.array([1])], np.array([9, 10], np.int32)],
            decode_state=[[np.array([3])], np.array([12, 13], np.int64)])
        mamba, swa = p.d.states
        assert np.all(mamba[3] == 41) and np.all(swa[12] == 44) and np.all(swa[13] == 45)
        # nothing else of either pool was written
        assert not mamba[[0, 1, 2]].any()
        assert not np.delete(swa, [12, 13], axis=0).any()
        # common's byte formula: three state slots
        assert tx.get_transfer_metric().transfer_total_bytes == (
            len(src) * p.pm.kv_item_lens_sum + 3 * p.pm.state_item_lens_sum)
        tx.clear()
        rx.clear()
    finally:
        p.close()


def test_state_indices_of_the_wrong_shape_fail_the_request(bootstrap):  # A4, R4
    p = Pair(bootstrap, state_types=["mamba", "swa"], state_rows=[4, 16])
    try:
        rx = sg.KVBridgeKVReceiver(p.dm, p.addr, 25)
        assert p.dm.try_ensure_parallel_info(p.addr)
        rx.init(0)
        wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="decode handshake")
        # three entries for two state types: refused, the request fails (no raise)
        rx.send_metadata(np.array([1, 2], np.int32), 1, [[np.array([1])], None, None])
        wait_until(lambda: rx.poll() == KVPoll.Failed, what="the refusal")
        # an SWA index inside its own pool but outside the mamba pool is fine,
        # a mamba index outside the mamba pool is not
        rx2 = sg.KVBridgeKVReceiver(p.dm, p.addr, 26)
        rx2.init(0)
        wait_until(lambda: rx2.poll() != KVPoll.Bootstrapping, what="decode handshake")
        rx2.send_metadata(np.array([1, 2], np.int32), 1, [[np.array([9])], np.array([9])])
        wait_until(lambda: rx2.poll() == KVPoll.Failed, what="the refusal")
        assert "state type 0" in rx2.failure().failure_reason
        assert "9" in rx2.failure().failure_reason
        rx.clear()
        rx2.clear()
    finally:
        p.close()



def test_try_ensure_parallel_info(bootstrap):  # M4, M5, A6
    port = int(bootstrap.rsplit(":", 1)[1])
    d = SgPool("decode")
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30002))
    assert not dm.try_ensure_parallel_info(f"127.0.0.1:{unused_port()}")  # unreachable
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
        rx = sg.KVBridgeKVReceiver(dm, f"127.0.0.1:{unused_port()}", 41)
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


class _PrefillHttp:
    """The prefill server's /generate as sglang's decode reaches it for a
    retraction: each POST becomes a new prefill request for the payload's
    room, run in sglang's prefill order on `pm` (answer `status`)."""

    def __init__(self, status: int = 200):
        import http.server
        import threading
        outer = self
        self.status, self.payloads, self.pm, self.pool, self.src = status, [], None, None, None
        self.errors = []

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.payloads.append((self.path, body))
                if outer.status == 200:
                    try:
                        outer.recompute(int(body["bootstrap_room"]))
                    except Exception as e:  # noqa: BLE001 -- reported by the test
                        outer.errors.append(repr(e))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def recompute(self, room: int) -> None:
        tx = sg.KVBridgeKVSender(self.pm, self.addr, room, [0], 0)
        wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="recompute metadata")
        self.pool.fill(room + 1000, self.src)  # the recomputed KV differs
        tx.init(len(self.src), 1)
        tx.send(self.src, None)
        wait_until(lambda: tx.poll() in (KVPoll.Success, KVPoll.Failed), what="recompute sent")
        tx.clear()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _retraction_setup(bootstrap, status=200):
    port = int(bootstrap.rsplit(":", 1)[1])
    web = _PrefillHttp(status)
    p, d = SgPool("prefill"), SgPool("decode")
    pm = sg.KVBridgeKVManager(p.args, "prefill", server_args(port, port=web.port))
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30031))
    web.pm, web.pool, web.addr, web.src = pm, p, bootstrap, np.array([6, 7], np.int32)
    return web, p, d, pm, dm


def _rebootstrapped_receiver(dm, addr, room, dst):
    rx = sg.KVBridgeKVReceiver(dm, addr, room)  # sglang: a new receiver, same room
    assert dm.try_ensure_parallel_info(addr)
    rx.init(0)
    wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="handshake")
    rx.send_metadata(dst, 1, None)
    return rx


def test_submit_prefill_recompute_asks_prefill_to_recompute(bootstrap):  # M7
    web, p, d, pm, dm = _retraction_setup(bootstrap)
    try:
        assert dm.prefill_info_table == {} and dm.try_ensure_parallel_info(bootstrap)
        assert dm.prefill_info_table[bootstrap].prefill_http_port == web.port
        dst = np.array([40, 41], np.int32)
        rx = _rebootstrapped_receiver(dm, bootstrap, 45, dst)
        payload = {"rid": "r45", "bootstrap_room": 45, "input_ids": [1, 2, 3]}
        dm.submit_prefill_recompute(rx, payload)
        wait_until(lambda: rx.poll() in (KVPoll.Success, KVPoll.Failed), what="recomputed KV")
        assert rx.poll() == KVPoll.Success, rx.failure()
        assert web.payloads == [("/generate", payload)] and not web.errors
        for b in range(len(p.kv)):
            assert np.array_equal(d.kv[b][dst], p.kv[b][web.src]), f"buffer {b}"
        rx.clear()
        # Only the group's leader asks: another rank's call posts nothing.
        dm.attn_tp_rank = 1
        dm.submit_prefill_recompute(rx, payload)
        assert len(web.payloads) == 1
    finally:
        dm.close()
        pm.close()
        web.close()


def test_submit_prefill_recompute_that_fails_fails_the_request(bootstrap):  # M7
    web, p, d, pm, dm = _retraction_setup(bootstrap, status=503)
    try:
        rx = _rebootstrapped_receiver(dm, bootstrap, 46, np.array([40, 41], np.int32))
        dm.submit_prefill_recompute(rx, {"rid": "r46", "bootstrap_room": 46})
        wait_until(lambda: rx.poll() == KVPoll.Failed, what="Failed")
        assert "status=503" in rx.failure().failure_reason
        with pytest.raises(KVTransferError, match="rid=r46 .status=503"):
            rx.failure_exception()
        rx.clear()
        # A prefill server that registered no HTTP port: failed at once, saying so.
        dm.prefill_info_table[bootstrap].prefill_http_port = None
        rx = _rebootstrapped_receiver(dm, bootstrap, 47, np.array([42, 43], np.int32))
        dm.submit_prefill_recompute(rx, {"rid": "r47"})
        wait_until(lambda: rx.poll() == KVPoll.Failed, what="Failed")
        assert "registered no HTTP port" in rx.failure().failure_reason
        rx.clear()
    finally:
        dm.close()
        pm.close()
        web.close()


def test_deferred_release_is_declined(pair):  # R11
    # A newer decode holds a failed request's pages only when the backend
    # enables deferred release and the receiver says it told prefill of an
    # abort; kvbridge declines both (its Failed already means quiesced).
    assert pair.dm.enable_deferred_decode_kv_release is False
    assert pair.dm.supports_deferred_decode_kv_release is False
    rx = sg.KVBridgeKVReceiver(pair.dm, pair.addr, 45)
    assert rx.abort_notified is False  # sglang's immediate-release path (pages safe: R5)
    rx.clear()


def test_staging_is_off_and_heads_of_another_tp_land_in_place(bootstrap):  # R9, A5
    # sglang's common manager leaves staging off (enable_staging False, each
    # receiver's require_staging False); kvbridge's too: prefill tp 1 writes
    # each decode rank's head slice straight into decode tp 2's pages.
    port = int(bootstrap.rsplit(":", 1)[1])
    p = SgPool("prefill", heads=2)
    pm = sg.KVBridgeKVManager(p.args, "prefill", server_args(port, port=30960))
    ds = [SgPool("decode", tp_size=2, tp_rank=r, heads=2) for r in range(2)]
    dms = [sg.KVBridgeKVManager(d.args, "decode", server_args(port, tp_size=2, port=30961))
           for d in ds]
    try:
        assert all(dm.enable_staging is False for dm in dms)
        src, dst = np.array([3, 8], np.int32), np.array([12, 5], np.int32)
        rxs = [sg.KVBridgeKVReceiver(dm, bootstrap, 46) for dm in dms]
        assert all(rx.require_staging is False for rx in rxs)
        tx = sg.KVBridgeKVSender(pm, bootstrap, 46, [0, 1], 0)
        for dm, rx in zip(dms, rxs):
            assert dm.try_ensure_parallel_info(bootstrap)
            rx.init(0)
        wait_until(lambda: all(rx.poll() != KVPoll.Bootstrapping for rx in rxs),
                   what="decode handshakes")
        for rx in rxs:
            assert rx.poll() == KVPoll.WaitingForInput, rx.failure()
            rx.send_metadata(dst, 1, None)
        wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
        p.fill(46, src)
        tx.init(len(src), 1)
        tx.send(src, None, num_kv_tokens=len(src) * p.args.page_size)
        wait_until(lambda: all(rx.poll() in (KVPoll.Success, KVPoll.Failed) for rx in rxs),
                   what="transfer")
        for r, (d, rx) in enumerate(zip(ds, rxs)):
            assert rx.poll() == KVPoll.Success, rx.failure()
            for b in range(len(p.kv)):  # decode rank r holds head r of every page
                assert np.array_equal(d.kv[b][dst][:, :, 0], p.kv[b][src][:, :, r]), (r, b)
            rx.clear()
        wait_until(lambda: tx.poll() == KVPoll.Success, what="prefill success")
        tx.clear()
    finally:
        for m in dms + [pm]:
            m.close()


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
    # an address this manager does not serve: the error names the room too
    with pytest.raises(KVTransferError, match="127.0.0.1:1") as e:
        kvbridge.KVReceiver(core, "127.0.0.1:1", 48)
    assert e.value.bootstrap_room == 48
    # the URL form sglang writes is the same address
    kvbridge.KVReceiver(core, f"http://{pair.addr}/route", 49).clear()


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


def test_prefill_pp2_to_decode_pp1_through_the_adapter(bootstrap):  # A7
    # Prefill pipeline stages 0 and 1 each hold one of the model's two
    # layers (prefill_start_layer/prefill_end_layer as sglang's pool sets
    # them); decode pp1 holds both: each stage writes its own layer.
    port = int(bootstrap.rsplit(":", 1)[1])
    stages = []
    for s in range(2):
        pool = SgPool("prefill", layers=1)
        pool.args.pp_rank = s
        pool.args.prefill_start_layer, pool.args.prefill_end_layer = s, s + 1
        sa = server_args(port, port=30900)
        sa.pp_size = 2
        stages.append((pool, sg.KVBridgeKVManager(pool.args, "prefill", sa)))
    d = SgPool("decode", layers=2)
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30901))
    try:
        assert stages[1][1].pp_rank == 1
        src, dst = np.array([3, 4, 5], np.int32), np.array([20, 21, 22], np.int32)
        rx = sg.KVBridgeKVReceiver(dm, bootstrap, 31)
        txs = [sg.KVBridgeKVSender(m, bootstrap, 31, [0], s) for s, (_, m) in enumerate(stages)]
        assert dm.try_ensure_parallel_info(bootstrap)
        assert dm.prefill_info_table[bootstrap].pp_size == 2
        rx.init(0)
        wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="handshake with both stages")
        assert rx.poll() == KVPoll.WaitingForInput, rx.failure()
        rx.send_metadata(dst, 2, None)
        for (pool, _), tx in zip(stages, txs):
            wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
            pool.fill(31 + 100 * pool.args.pp_rank, src)
            tx.init(len(src), 2)
            tx.send(src, None)
        wait_until(lambda: rx.poll() in (KVPoll.Success, KVPoll.Failed), what="transfer")
        assert rx.poll() == KVPoll.Success, rx.failure()
        # decode's buffers: K of layers 0, 1, then V of layers 0, 1
        for s, (pool, _) in enumerate(stages):
            k, v = pool.kv
            assert np.array_equal(d.kv[s][dst], k[src]), f"K of layer {s}"
            assert np.array_equal(d.kv[2 + s][dst], v[src]), f"V of layer {s}"
        settle(txs, rx)
    finally:
        dm.close()
        for _, m in stages:
            m.close()


def test_every_decode_stage_gets_its_metadata_row_and_state_from_its_stage(bootstrap):  # A7
    # Prefill pp 2 into decode pp 2, stage to stage, with the layer ids the
    # newest sglang gives both sides (build_kv_layer_ids). sglang's decode
    # runs its metadata gate on every stage: a request counts as transferred
    # only once that stage's metadata row holds the room
    # (_poll_with_metadata_gate), so each decode stage needs its row. Each
    # stage's mamba state (no state_layer_ids, as older sglang) can come
    # from its own stage only.
    port = int(bootstrap.rsplit(":", 1)[1])
    room, aux = 33, 2
    src, dst = np.array([3, 4, 5], np.int32), np.array([20, 21, 22], np.int32)
    managers, prefill, decode = [], [], []
    for s in range(2):
        for mode, pools in (("prefill", prefill), ("decode", decode)):
            pool = SgPool(mode, layers=1, state_types=["mamba"])
            pool.args.pp_rank = s
            pool.args.kv_layer_ids = [s, s]  # K, V of model layer s
            if mode == "prefill":
                pool.args.prefill_start_layer, pool.args.prefill_end_layer = s, s + 1
            sa = server_args(port, port=30910 + (mode == "decode"))
            sa.pp_size = 2
            pools.append(pool)
            managers.append(sg.KVBridgeKVManager(pool.args, mode, sa))
    pms, dms = managers[0::2], managers[1::2]
    try:
        rxs = [sg.KVBridgeKVReceiver(dm, bootstrap, room) for dm in dms]
        txs = [sg.KVBridgeKVSender(pm, bootstrap, room, [0], 0) for pm in pms]
        for rx, dm in zip(rxs, dms):
            assert dm.try_ensure_parallel_info(bootstrap)
            rx.init(0)
            wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="decode handshake")
            assert rx.poll() == KVPoll.WaitingForInput, rx.failure()
            rx.send_metadata(dst, aux, [np.array([9], np.int32)])
        for pool, tx in zip(prefill, txs):
            wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
            pool.fill(room + 100 * pool.args.pp_rank, src)
            pool.aux[aux][:8] = np.frombuffer(np.int64(room).tobytes(), np.uint8)  # set_buf
            pool.states[0][4] = 70 + pool.args.pp_rank
            tx.init(len(src), aux)
            tx.send(src, [np.array([4], np.int32)])
        for rx in rxs:
            wait_until(lambda: rx.poll() in (KVPoll.Success, KVPoll.Failed), what="transfer")
            assert rx.poll() == KVPoll.Success, rx.failure()
        for s in range(2):
            row_room = int(np.frombuffer(decode[s].aux[aux][:8].tobytes(), np.int64)[0])
            assert row_room == room, f"decode stage {s}: sglang's gate would wait forever"
            assert np.all(decode[s].states[0][9] == 70 + s), f"stage {s}'s mamba state"
            assert not np.delete(decode[s].states[0], [9], axis=0).any(), "a row beside slot 9"
            k, v = prefill[s].kv
            assert np.array_equal(decode[s].kv[0][dst], k[src]), f"K of stage {s}"
            assert np.array_equal(decode[s].kv[1][dst], v[src]), f"V of stage {s}"
        for tx in txs:
            wait_until(lambda: tx.poll() == KVPoll.Success, what="prefill success")
            tx.clear()
        for rx in rxs:
            rx.clear()
    finally:
        for m in managers:
            m.close()


# sglang's draft-model layers are numbered from here (utils.py).
DRAFT_LAYER = 1_000_000


def layer_id_pair(bootstrap, decode_ids):
    """Prefill holds a hybrid model's full-attention layers 3 and 5 (K, V);
    decode's buffers carry `decode_ids` (sglang's kv_layer_ids)."""
    pair = Pair.__new__(Pair)
    port = int(bootstrap.rsplit(":", 1)[1])
    pair.addr = bootstrap
    pair.p = SgPool("prefill", layers=2)
    pair.p.args.kv_layer_ids = [3, 5, 3, 5]
    pair.d = SgPool("decode", layers=len(decode_ids) // 2)
    pair.d.args.kv_layer_ids = list(decode_ids)
    pair.pm = sg.KVBridgeKVManager(pair.p.args, "prefill", server_args(port, port=30000))
    pair.dm = sg.KVBridgeKVManager(pair.d.args, "decode", server_args(port, port=30001))
    return pair


def test_kv_layer_ids_pair_buffers_by_model_layer(bootstrap):  # A9
    # Decode holds layers 1, 3, 5 and a draft layer, K then V then draft.
    pair = layer_id_pair(bootstrap, [1, 3, 5, 1, 3, 5, DRAFT_LAYER, DRAFT_LAYER])
    try:
        src, dst = np.array([2, 7], np.int32), np.array([30, 12], np.int32)
        tx, rx = run_sglang_order(pair, 41, src, dst, kv_pairs=[1, 2, 4, 5])
        for b in (0, 3, 6, 7):  # layer 1 and the draft layer: not prefill's to write
            assert not pair.d.kv[b].any(), f"decode buffer {b} was written"
        tx.clear()
        rx.clear()
    finally:
        pair.close()


def test_kv_layer_ids_decode_lacks_fail_the_request_naming_the_layer(bootstrap):  # A9
    expect_both_fail_naming(layer_id_pair(bootstrap, [3, 3]), 42,  # no layer 5
                            "decode holds no kv buffer for model layer 5")


def expect_both_fail_naming(pair, room: int, words: str) -> None:
    """A request between `pair`'s ranks fails on decode with `words`, and
    prefill's sender of the room hears it naming model layer 5."""
    try:
        rx = sg.KVBridgeKVReceiver(pair.dm, pair.addr, room)
        tx = sg.KVBridgeKVSender(pair.pm, pair.addr, room, [0], 0)
        rx.init(0)
        wait_until(lambda: rx.poll() == KVPoll.Failed, what="decode's verdict")
        reason = rx.failure().failure_reason
        assert words in reason, reason
        with pytest.raises(KVTransferError):
            rx.failure_exception()
        wait_until(lambda: tx.poll() == KVPoll.Failed, what="prefill's verdict")
        assert "model layer 5" in tx.failure().failure_reason, tx.failure()
        rx.clear()
        tx.clear()
    finally:
        pair.close()


def with_state_layers(pool: SgPool, ids) -> SgPool:
    """One SWA state component of one 16-byte x 16-row buffer per layer in
    `ids`, as setup_state_kv_args appends a component with layer ids."""
    pool.states = [np.zeros((16, 16), np.uint8) for _ in ids]
    a = pool.args
    a.state_types = ["swa"]
    a.state_data_ptrs = [[int(s.ctypes.data) for s in pool.states]]
    a.state_data_lens = [[int(s.nbytes) for s in pool.states]]
    a.state_item_lens = [[int(s[0].nbytes) for s in pool.states]]
    a.state_layer_ids = [list(ids)]
    return pool


def state_layer_pair(bootstrap, decode_ids):
    """Prefill holds the state of layers 3 and 5 (a pipeline stage's);
    decode's state buffers carry `decode_ids` (sglang's state_layer_ids)."""
    pair = Pair.__new__(Pair)
    port = int(bootstrap.rsplit(":", 1)[1])
    pair.addr = bootstrap
    pair.p = with_state_layers(SgPool("prefill"), [3, 5])
    for i, s in enumerate(pair.p.states):
        s[:] = (np.arange(s.size, dtype=np.uint32).reshape(s.shape) * 7 + 11 * (i + 1)) % 251 + 1
    pair.d = with_state_layers(SgPool("decode"), decode_ids)
    pair.pm = sg.KVBridgeKVManager(pair.p.args, "prefill", server_args(port, port=30000))
    pair.dm = sg.KVBridgeKVManager(pair.d.args, "decode", server_args(port, port=30001))
    return pair


def test_state_layer_ids_pair_state_buffers_by_model_layer(bootstrap):  # A9
    pair = state_layer_pair(bootstrap, [1, 3, 5])
    try:
        src, dst = np.array([2, 7], np.int32), np.array([30, 12], np.int32)
        tx, rx = run_sglang_order(pair, 44, src, dst, prefill_state=[np.array([4], np.int32)],
                                  decode_state=[np.array([9], np.int32)])
        assert np.array_equal(pair.d.states[1][9], pair.p.states[0][4])  # layer 3
        assert np.array_equal(pair.d.states[2][9], pair.p.states[1][4])  # layer 5
        assert not pair.d.states[0].any(), "decode's layer 1 state was written"
        for b in (1, 2):
            rows = [r for r in range(16) if r != 9]
            assert not pair.d.states[b][rows].any(), f"state buffer {b}: a row beside slot 9"
        tx.clear()
        rx.clear()
    finally:
        pair.close()


def test_state_layer_ids_decode_lacks_fail_the_request_naming_the_layer(bootstrap):  # A9
    expect_both_fail_naming(state_layer_pair(bootstrap, [3, 7]), 45,  # no layer 5
                            "decode holds no state buffer of state type 0 (swa) for model layer 5")


def typed_pair(bootstrap, prefill_types, decode_types, prefill_rows, decode_rows):
    """A pair whose ranks hold the state components `prefill_types` and
    `decode_types` (sglang's state_types), with those row counts."""
    pair = Pair.__new__(Pair)
    port = int(bootstrap.rsplit(":", 1)[1])
    pair.addr = bootstrap
    pair.p = SgPool("prefill", state_types=prefill_types, state_rows=prefill_rows)
    pair.d = SgPool("decode", state_types=decode_types, state_rows=decode_rows)
    pair.pm = sg.KVBridgeKVManager(pair.p.args, "prefill", server_args(port, port=30000))
    pair.dm = sg.KVBridgeKVManager(pair.d.args, "decode", server_args(port, port=30001))
    return pair


def test_state_components_pair_by_state_type_not_position(bootstrap):  # A9
    # sglang leaves a component without buffers out of KVArgs: this prefill
    # holds SWA state only (its first component), decode MAMBA then SWA.
    pair = typed_pair(bootstrap, ["swa"], ["mamba", "swa"], [16], [4, 16])
    try:
        pair.p.states[0][9] = 44
        src, dst = np.array([2, 7], np.int32), np.array([30, 12], np.int32)
        tx, rx = run_sglang_order(pair, 46, src, dst, prefill_state=[np.array([9], np.int32)],
                                  decode_state=[[np.array([3])], np.array([12], np.int32)])
        mamba, swa = pair.d.states
        assert np.all(swa[12] == 44), swa[12]
        assert not mamba.any(), "decode's mamba state was written"
        assert not np.delete(swa, [12], axis=0).any(), "an SWA row beside slot 12"
        tx.clear()
        rx.clear()
    finally:
        pair.close()


def test_a_state_component_decode_lacks_fails_both_sides_naming_it(bootstrap):  # A9
    pair = typed_pair(bootstrap, ["nsa"], ["mamba", "swa"], [16], [4, 16])
    try:
        rx = sg.KVBridgeKVReceiver(pair.dm, pair.addr, 47)
        tx = sg.KVBridgeKVSender(pair.pm, pair.addr, 47, [0], 0)
        rx.init(0)
        wait_until(lambda: rx.poll() == KVPoll.Failed, what="decode's verdict")
        words = "decode holds no state component nsa (occurrence 1)"
        assert words in rx.failure().failure_reason, rx.failure()
        wait_until(lambda: tx.poll() == KVPoll.Failed, what="prefill's verdict")
        assert words in tx.failure().failure_reason, tx.failure()
        rx.clear()
        tx.clear()
    finally:
        pair.close()


def test_sglang_state_types_become_one_name_per_state_type():  # A9
    class StateType(enum.Enum):  # as sglang's base/conn.py declares its members
        MAMBA = "mamba"
        SWA = "swa"

    class Two:
        state_types = [StateType.MAMBA, StateType.SWA]
        state_data_ptrs = [[1, 2], [3]]
    assert sg.state_type_names_of(Two()) == ["MAMBA", "SWA"]

    class Flat:  # one flat list of buffers: one type, no names needed
        state_types = [StateType.MAMBA]
        state_data_ptrs = [1, 2]
    assert sg.state_type_names_of(Flat()) == []

    class Unset:
        state_data_ptrs = [[1], [2]]
    assert sg.state_type_names_of(Unset()) == []

    class Short:
        state_types = [StateType.SWA]
        state_data_ptrs = [[1], [2]]
    with pytest.raises(kvbridge.InvalidArgumentError,
                       match=re.escape("KVArgs.state_types: 1 entries for 2 state components")):
        sg.state_type_names_of(Short())


def test_sglang_state_layer_id_forms_become_one_id_per_state_buffer():  # A9
    class Two:  # mamba without ids, then SWA with one id per buffer
        state_data_ptrs = [[1, 2], [3]]
        state_layer_ids = [[], np.array([6])]
    assert sg.state_layer_ids_of(Two()) == [-1, -1, 6]

    class NoIds:
        state_data_ptrs = [[1], [2]]
        state_layer_ids = [[], []]
    assert sg.state_layer_ids_of(NoIds()) == []

    class Flat:
        state_data_ptrs = [1, 2]
        state_layer_ids = [4, 5]
    assert sg.state_layer_ids_of(Flat()) == [4, 5]
    nested = []
    for _ in range(5000):
        nested = [nested]
    for bad, words in (([[1, 2, 3], []], "entry 0 has 3 ids for 2 state buffers"),
                       ([[1, 2]], "1 entries for 2 state components"),
                       ([["x", 1], []], "KVArgs.state_layer_ids"),
                       ([nested, []], "nested deeper than")):
        class Bad:
            state_data_ptrs = [[1, 2], [3]]
            state_layer_ids = bad
        with pytest.raises(kvbridge.InvalidArgumentError, match=re.escape(words)):
            sg.state_layer_ids_of(Bad())
    # Ids mixed within a component are refused by the manager, naming them.
    pool = with_state_layers(SgPool("prefill"), [3, 5])
    pool.args.state_layer_ids = [[3, -1]]
    with pytest.raises(KVTransferError, match=re.escape("have layer ids all or none")):
        sg.KVBridgeKVManager(pool.args, "prefill", server_args(1, port=30000)).close()
    pool.args.state_layer_ids = [[2**40, 5]]  # past int32
    with pytest.raises(KVTransferError, match=re.escape("state_layer_ids")):
        sg.KVBridgeKVManager(pool.args, "prefill", server_args(1, port=30000)).close()


def test_hostile_kv_layer_ids_get_a_clear_error_naming_the_field(bootstrap):  # A9
    port = int(bootstrap.rsplit(":", 1)[1])
    nested = []
    for _ in range(5000):
        nested = [nested]
    for bad, words in ((["x"], "KVArgs.kv_layer_ids"), ([{"a": 1}], "KVArgs.kv_layer_ids"),
                       (nested, "KVArgs.kv_layer_ids"), ([2**40] * 4, "kv_layer_ids"),
                       ([-1, 0, 1, 2], "kv_layer_ids[0] is -1"),
                       ([0, 1], "kv_layer_ids has 2 entries for 4 kv buffers")):
        pool = SgPool("prefill", layers=2)
        pool.args.kv_layer_ids = bad
        with pytest.raises(KVTransferError, match=re.escape(words)):
            sg.KVBridgeKVManager(pool.args, "prefill", server_args(port, port=30000)).close()
    # Decode builds its manager once prefill is known: the request fails.
    pm = sg.KVBridgeKVManager(SgPool("prefill").args, "prefill", server_args(port, port=30000))
    d = SgPool("decode", layers=2)
    d.args.kv_layer_ids = [3, 5]  # 2 ids for 4 buffers
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30001))
    try:
        rx = sg.KVBridgeKVReceiver(dm, bootstrap, 43)
        rx.init(0)
        wait_until(lambda: rx.poll() == KVPoll.Failed, what="decode's refusal")
        assert "kv_layer_ids has 2 entries for 4 kv buffers" in rx.failure().failure_reason
        rx.clear()
    finally:
        dm.close()
        pm.close()
