"""kvbridge.sglang without sglang: the adapter classes driven the way
sglang's scheduler drives a backend, and install() patching get_kv_class."""

import enum
import sys
import time
import types

import numpy as np

import kvbridge
import kvbridge.sglang as ks
from kvbridge import KVPoll


class Mode(enum.Enum):  # shaped like sglang's DisaggregationMode
    PREFILL = "prefill"
    DECODE = "decode"


def sglang_args(kv, aux, engine_rank=0):
    a = types.SimpleNamespace(engine_rank=engine_rank, page_size=4, kv_head_num=2,
                              total_kv_head_num=2, prefill_start_layer=0, gpu_id=0, ib_device=None,
                              kv_data_ptrs=[b.ctypes.data for b in kv],
                              kv_data_lens=[b.nbytes for b in kv],
                              kv_item_lens=[b[0].nbytes for b in kv],
                              aux_data_ptrs=[aux.ctypes.data], aux_data_lens=[aux.nbytes],
                              aux_item_lens=[aux[0].nbytes], state_data_ptrs=[],
                              state_data_lens=[], state_item_lens=[])
    return a


def server_args_for(bootstrap, http_port, **extra):
    """sglang's ServerArgs as the adapter reads them, for a server whose
    HTTP port is `http_port` (a decode server's instance name)."""
    host, port = bootstrap.split(":")
    return types.SimpleNamespace(disaggregation_bootstrap_port=int(port), host=host,
                                 port=http_port, tp_size=1, dp_size=1, kv_cache_dtype="auto",
                                 device="cpu", **extra)


def pools(fill=False):
    """Two kv buffers of 16 pages (buffer i filled with i + 1 with `fill`) and an aux buffer."""
    kv = [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)]
    if fill:
        for i, b in enumerate(kv):
            b[:] = i + 1
    return kv, np.zeros((4, 16), np.uint8)


def wait_for(what, condition, timeout=20):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.002)


def move_request(pm, dm, bootstrap, room, dkv, **metadata_kwargs):
    """One request of two pages into decode pages 3 and 4 in sglang's order
    (decode waits for its handshake before send_metadata); checks they hold
    prefill's pages 9 and 10 (buffer i filled with i + 1)."""
    recv = ks.KVBridgeKVReceiver(dm, bootstrap, room)
    recv.init(0)
    wait_for("decode's handshake", lambda: recv.poll() == KVPoll.WaitingForInput)
    recv.send_metadata(np.array([3, 4], np.int32), 1, None, 0, **metadata_kwargs)
    send = ks.KVBridgeKVSender(pm, bootstrap, room, [0], 0)
    wait_for("prefill's metadata", lambda: send.poll() == KVPoll.WaitingForInput)
    send.init(2, 0)
    send.send(np.array([9, 10], np.int32))

    def done():
        assert KVPoll.Failed not in (send.poll(), recv.poll()), (recv.failure(), send.failure())
        return min(send.poll(), recv.poll()) == KVPoll.Success

    wait_for("the transfer", done)
    assert all((d[[3, 4]] == i + 1).all() for i, d in enumerate(dkv))
    return send, recv


def test_adapter_moves_a_request_like_sglang(bootstrap):
    host = bootstrap.split(":")[0]
    server_args = server_args_for(bootstrap, 30001)
    pkv, paux = pools(fill=True)
    dkv, daux = pools()
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL, server_args, False)
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE, server_args, False)
    recv = ks.KVBridgeKVReceiver(dm, bootstrap, 77)
    # A decode server is its own instance (several may share the prefill).
    assert dm.core(bootstrap).rank["instance"] == f"{host}:30001"
    assert pm.core().rank["instance"] == ""
    recv.init(0)
    recv.send_metadata(np.array([3, 4], np.int32), 1, None, 0)
    send = ks.KVBridgeKVSender(pm, bootstrap, 77, [0], 0)
    deadline = time.monotonic() + 20
    while send.poll() != KVPoll.WaitingForInput:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    send.init(2, 0)
    send.send(np.array([9, 10], np.int32))
    while min(send.poll(), recv.poll()) != KVPoll.Success:
        assert time.monotonic() < deadline and KVPoll.Failed not in (send.poll(), recv.poll())
        time.sleep(0.002)
    assert all((d[[3, 4]] == i + 1).all() for i, d in enumerate(dkv))
    bad = ks.KVBridgeKVSender(pm, bootstrap, 78, [0], 0)
    bad.init(2, aux_index=99)  # sglang style: no raise, the room fails
    assert bad.poll() == KVPoll.Failed
    try:
        bad.failure_exception()
        raise AssertionError("failure_exception() returned")
    except kvbridge.InvalidArgumentError as e:
        assert "99" in e.failure_reason and e.bootstrap_room == 78
    for x in (send, recv, bad):
        x.clear()


def test_install_routes_one_backend_to_kvbridge(monkeypatch):
    utils = types.ModuleType("sglang.srt.disaggregation.utils")

    def get_kv_class(backend, class_type):
        return ("original", backend, class_type)

    utils.get_kv_class = get_kv_class
    user = types.ModuleType("sglang.srt.managers.user")
    user.get_kv_class = get_kv_class  # imported by name elsewhere
    pkg = types.ModuleType("sglang.srt.disaggregation")
    pkg.utils = utils
    for name, mod in (("sglang", types.ModuleType("sglang")),
                      ("sglang.srt", types.ModuleType("sglang.srt")),
                      ("sglang.srt.disaggregation", pkg),
                      ("sglang.srt.disaggregation.utils", utils),
                      ("sglang.srt.managers.user", user)):
        monkeypatch.setitem(sys.modules, name, mod)
    Backend = enum.Enum("TransferBackend", {"MOONCAKE": "mooncake", "NIXL": "nixl"})
    Kind = enum.Enum("KVClassType", {"KVARGS": "kvargs", "MANAGER": "manager",
                                     "SENDER": "sender", "RECEIVER": "receiver",
                                     "BOOTSTRAP_SERVER": "bootstrap_server"})
    ks.install("mooncake")
    for get in (utils.get_kv_class, user.get_kv_class):
        assert get(Backend.MOONCAKE, Kind.MANAGER) is ks.KVBridgeKVManager
        assert get(Backend.MOONCAKE, Kind.SENDER) is ks.KVBridgeKVSender
        assert get(Backend.MOONCAKE, Kind.RECEIVER) is ks.KVBridgeKVReceiver
        assert get(Backend.MOONCAKE, Kind.BOOTSTRAP_SERVER) is ks.KVBridgeKVBootstrapServer
        assert get(Backend.MOONCAKE, Kind.KVARGS)[0] == "original"
        assert get(Backend.NIXL, Kind.MANAGER)[0] == "original"
    ks.install("mooncake")  # idempotent: still one layer over the original
    assert utils.get_kv_class(Backend.NIXL, Kind.SENDER)[0] == "original"


def test_phase_timeouts_are_sglangs(monkeypatch):
    # sglang's environ.py: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT and
    # SGLANG_DISAGGREGATION_WAITING_TIMEOUT, both 300 s by default.
    monkeypatch.delenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", raising=False)
    monkeypatch.delenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", raising=False)
    assert ks.phase_timeouts("prefill") == (300.0, 300.0)
    assert ks.phase_timeouts("decode") == (300.0, 300.0)
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "120")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "45")
    # Prefill's sender waits for decode's metadata under sglang's bootstrap timeout.
    assert ks.phase_timeouts("prefill") == (120.0, 120.0)
    assert ks.phase_timeouts("decode") == (120.0, 45.0)
    for bad in ("0", "-5", "ten", "1.5", "9" * 5000):  # never 0, never a typo at its word
        monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", bad)
        assert ks.phase_timeouts("decode") == (120.0, 300.0), bad[:20]
    # "Off" spelt as a huge number: capped far below what overflows a
    # deadline in nanoseconds.
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "99999999999")
    assert ks.phase_timeouts("decode") == (120.0, 10_000_000.0)


def test_a_decode_waits_as_long_as_sglangs_waiting_timeout_says(bootstrap, monkeypatch):
    # Two decode servers on one prefill, their waiting timeouts 2 s and
    # sglang's default. Each receiver completes its handshake and gets no
    # metadata: the first fails at its 2 s deadline, naming the application;
    # at that moment the second still waits (before: 30 s whatever sglang said).
    pkv, paux = pools()
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL,
                              server_args_for(bootstrap, 30011), False)
    managers = [pm]
    try:
        receivers = []
        for http_port, waiting in ((30012, "2"), (30013, None)):
            if waiting is None:
                monkeypatch.delenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", raising=False)
            else:
                monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", waiting)
            dkv, daux = pools()
            dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE,
                                      server_args_for(bootstrap, http_port), False)
            managers.append(dm)
            dm.try_ensure_parallel_info(bootstrap)  # its manager, with its timeouts
            assert dm.has_parallel_info(bootstrap)
            recv = ks.KVBridgeKVReceiver(dm, bootstrap, 500 + http_port)
            recv.init(0)
            receivers.append(recv)
        short, default = receivers
        deadline = time.monotonic() + 15
        while short.poll() != KVPoll.Failed:
            assert time.monotonic() < deadline, f"still {short.poll()} after 15 s"
            assert default.poll() != KVPoll.Failed
            time.sleep(0.01)
        assert "did not call SendMetadata" in str(short.failure()), short.failure()
        assert default.poll() == KVPoll.WaitingForInput  # after the barrier above
        for r in receivers:
            r.clear()
    finally:
        for m in managers:
            m.close()


def test_newer_sglangs_parallel_info_api(bootstrap, monkeypatch):
    # Newer sglang's decode (its test_decode_*: ParallelInfoState,
    # has_parallel_info, parallel_info_epoch, submit_dp_rank_query): the
    # answers it takes, with its enum present; receivers still work.
    class ParallelInfoState(enum.Enum):  # shaped like sglang's common/conn.py
        PENDING = "pending"
        READY = "ready"
        FAILED = "failed"

    monkeypatch.setattr(ks, "ParallelInfoState", ParallelInfoState)
    server_args = server_args_for(bootstrap, 30021)
    pkv, paux = pools()
    dkv, daux = pools()
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL, server_args, False)
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE, server_args, False)
    try:
        assert dm.requires_transfer_drain is False  # Failed already means quiesced
        assert dm.has_parallel_info(bootstrap) is False
        assert dm.try_ensure_parallel_info(bootstrap) is ParallelInfoState.READY
        assert dm.has_parallel_info(bootstrap) is True
        assert dm.parallel_info_epoch(bootstrap) == 0
        # Nothing listens on port 1: an attempt that failed, which sglang counts.
        assert dm.try_ensure_parallel_info("127.0.0.1:1") is ParallelInfoState.FAILED
        assert dm.has_parallel_info("127.0.0.1:1") is False
        answer = dm.submit_dp_rank_query(bootstrap_addr=bootstrap, bootstrap_rooms=[7, 8])
        assert isinstance(answer.result(timeout=10), dict)
        # The enum is never taken for a truth value inside (an enum member is truthy).
        recv = ks.KVBridgeKVReceiver(dm, bootstrap, 91)
        recv.init(0)

        def handshake_done():
            assert recv.poll() != KVPoll.Failed, recv.failure()
            return recv.poll() == KVPoll.WaitingForInput

        wait_for("decode's handshake", handshake_done)
        unreachable = ks.KVBridgeKVReceiver(dm, "127.0.0.1:1", 92)
        unreachable.init(0)
        assert unreachable.poll() == KVPoll.Failed  # not taken for known
        for r in (recv, unreachable):
            r.clear()
    finally:
        dm.close()
        pm.close()


def test_calls_of_sglang_versions_with_dspark_are_answered(bootstrap):
    # A stored sglang version with DSpark hidden-state streaming passes
    # send_metadata(..., spec_metadata=None) always, reads
    # kv_manager.req_to_dspark_hidden_meta.get(room) and
    # supports_dspark_hidden_streaming(), and sets conclude_state = Failed on
    # its error paths: none of them may raise; what kvbridge cannot carry
    # fails the request by name.
    pkv, paux = pools(fill=True)
    dkv, daux = pools()
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL,
                              server_args_for(bootstrap, 30031), False)
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE,
                              server_args_for(bootstrap, 30031), False)
    try:
        assert pm.req_to_dspark_hidden_meta.get(5) is None
        assert dm.supports_dspark_hidden_streaming() is False
        # spec_metadata=None: the request moves as any other.
        send, recv = move_request(pm, dm, bootstrap, 5, dkv, spec_metadata=None)
        # spec_metadata given: not carried, the request fails saying so.
        spec = ks.KVBridgeKVReceiver(dm, bootstrap, 6)
        spec.init(0)
        spec.send_metadata(np.array([5], np.int32), 2, None, 0, spec_metadata={"hidden": 1})
        wait_for("the refused request", lambda: spec.poll() == KVPoll.Failed)
        assert "DSpark" in str(spec.failure()), spec.failure()
        # The scheduler's own verdict, set as an attribute: it fails a room
        # not yet concluded; a concluded one keeps its state and record.
        doomed = ks.KVBridgeKVSender(pm, bootstrap, 7, [0], 0)
        doomed.conclude_state = KVPoll.Failed
        assert doomed.poll() == KVPoll.Failed and doomed.conclude_state == KVPoll.Failed
        send.conclude_state = KVPoll.Failed
        recv.conclude_state = KVPoll.Failed
        assert send.poll() == KVPoll.Success and recv.poll() == KVPoll.Success
        spec.conclude_state = KVPoll.Failed
        assert "DSpark" in str(spec.failure()), spec.failure()
        # Its error path's record_failure then update_status(room, Failed).
        marked = ks.KVBridgeKVSender(pm, bootstrap, 8, [0], 0)
        pm.record_failure(8, "DSpark hidden-state bootstrap failed")
        pm.update_status(8, KVPoll.Failed)
        assert marked.poll() == KVPoll.Failed
        assert "DSpark hidden-state bootstrap failed" in str(marked.failure()), marked.failure()
        pm.update_status(9, KVPoll.Failed)  # a room it holds no sender for: nothing
        # A flood of reasons for rooms never failed stays bounded.
        for room in range(100_000, 110_000):
            pm.record_failure(room, "x" * 64)
        assert len(pm._recorded) <= 4096
        for x in (send, recv, spec, doomed, marked):
            x.clear()
    finally:
        dm.close()
        pm.close()


def test_a_multi_node_prefill_registers_at_world_rank_zeros_port(bootstrap, monkeypatch):
    # sglang's _sync_bootstrap_port_across_nodes: under multi-node prefill
    # (dist_init_addr, nnodes > 1) every prefill rank takes world rank 0's
    # bootstrap port, broadcast over sglang's world group, because a
    # launcher may have reserved another port on each host. Here this
    # rank's own port is one nothing listens on; world rank 0's is the
    # bootstrap server's.
    port = bootstrap.split(":")[1]
    calls = []

    class WorldGroup:  # shaped like sglang's GroupCoordinator
        def broadcast_object(self, obj, src=0):
            calls.append((obj, src))
            return int(port)  # what world rank 0 holds

    distributed = types.ModuleType("sglang.srt.distributed")
    distributed.get_world_group = lambda: WorldGroup()
    for name, module in (("sglang", types.ModuleType("sglang")),
                         ("sglang.srt", types.ModuleType("sglang.srt")),
                         ("sglang.srt.distributed", distributed)):
        monkeypatch.setitem(sys.modules, name, module)
    server_args = server_args_for(bootstrap, 30041, nnodes=2, node_rank=1)
    server_args.dist_init_addr = f"{server_args.host}:5000"
    server_args.disaggregation_bootstrap_port = 1  # this host's: nothing listens there
    pkv, paux = pools()
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL, server_args, False)
    try:
        assert calls == [(1, 0)], calls
        assert pm.bootstrap_port == int(port)
        info = kvbridge._kvbridge.prefill_info(bootstrap, 5.0)
        assert info["complete"], info  # registered where decode looks
    finally:
        pm.close()
    # A single node: no collective, its own port.
    server_args.nnodes = 1
    assert ks.synced_bootstrap_port(server_args) == 1 and len(calls) == 1
