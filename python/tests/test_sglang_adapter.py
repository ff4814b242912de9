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


def test_adapter_moves_a_request_like_sglang(bootstrap):
    host, port = bootstrap.split(":")
    server_args = types.SimpleNamespace(disaggregation_bootstrap_port=int(port), host=host,
                                        port=30001, tp_size=1, dp_size=1, kv_cache_dtype="auto",
                                        device="cpu")
    pkv = [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)]
    dkv = [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)]
    paux, daux = np.zeros((4, 16), np.uint8), np.zeros((4, 16), np.uint8)
    for i, b in enumerate(pkv):
        b[:] = i + 1
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
    for bad in ("0", "-5", "ten", "1.5"):  # never 0 (no deadline) or a typo taken at its word
        monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", bad)
        assert ks.phase_timeouts("decode") == (120.0, 300.0), bad


def test_a_decode_waits_as_long_as_sglangs_waiting_timeout_says(bootstrap, monkeypatch):
    # Two decode servers on one prefill, their waiting timeouts 2 s and
    # sglang's default. Each receiver completes its handshake and gets no
    # metadata: the first fails at its 2 s deadline, naming the application;
    # at that moment the second still waits (before: 30 s whatever sglang said).
    host, port = bootstrap.split(":")

    def server_args(http_port):
        return types.SimpleNamespace(disaggregation_bootstrap_port=int(port), host=host,
                                     port=http_port, tp_size=1, dp_size=1,
                                     kv_cache_dtype="auto", device="cpu")

    def pools():
        return [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)], np.zeros((4, 16), np.uint8)

    pkv, paux = pools()
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL, server_args(30011), False)
    managers = [pm]
    try:
        receivers = []
        for http_port, waiting in ((30012, "2"), (30013, None)):
            if waiting is None:
                monkeypatch.delenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", raising=False)
            else:
                monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", waiting)
            dkv, daux = pools()
            dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE, server_args(http_port),
                                      False)
            managers.append(dm)
            assert dm.try_ensure_parallel_info(bootstrap)  # its manager, with its timeouts
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
    host, port = bootstrap.split(":")
    server_args = types.SimpleNamespace(disaggregation_bootstrap_port=int(port), host=host,
                                        port=30021, tp_size=1, dp_size=1, kv_cache_dtype="auto",
                                        device="cpu")
    pkv = [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)]
    dkv = [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)]
    paux, daux = np.zeros((4, 16), np.uint8), np.zeros((4, 16), np.uint8)
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
        deadline = time.monotonic() + 20
        while recv.poll() != KVPoll.WaitingForInput:
            assert recv.poll() != KVPoll.Failed, recv.failure()
            assert time.monotonic() < deadline
            time.sleep(0.005)
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
    host, port = bootstrap.split(":")
    server_args = types.SimpleNamespace(disaggregation_bootstrap_port=int(port), host=host,
                                        port=30031, tp_size=1, dp_size=1, kv_cache_dtype="auto",
                                        device="cpu")
    pkv = [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)]
    dkv = [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)]
    paux, daux = np.zeros((4, 16), np.uint8), np.zeros((4, 16), np.uint8)
    for i, b in enumerate(pkv):
        b[:] = i + 1
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL, server_args, False)
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE, server_args, False)
    try:
        assert pm.req_to_dspark_hidden_meta.get(5) is None
        assert dm.supports_dspark_hidden_streaming() is False
        # spec_metadata=None: the request moves as any other.
        recv = ks.KVBridgeKVReceiver(dm, bootstrap, 5)
        recv.init(0)
        deadline = time.monotonic() + 20
        while recv.poll() != KVPoll.WaitingForInput:
            assert time.monotonic() < deadline and recv.poll() != KVPoll.Failed
            time.sleep(0.002)
        recv.send_metadata(np.array([3, 4], np.int32), 1, None, 0, spec_metadata=None)
        send = ks.KVBridgeKVSender(pm, bootstrap, 5, [0], 0)
        while send.poll() != KVPoll.WaitingForInput:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        send.init(2, 0)
        send.send(np.array([9, 10], np.int32))
        while min(send.poll(), recv.poll()) != KVPoll.Success:
            assert time.monotonic() < deadline and KVPoll.Failed not in (send.poll(), recv.poll())
            time.sleep(0.002)
        assert all((d[[3, 4]] == i + 1).all() for i, d in enumerate(dkv))
        # spec_metadata given: not carried, the request fails saying so.
        spec = ks.KVBridgeKVReceiver(dm, bootstrap, 6)
        spec.init(0)
        spec.send_metadata(np.array([5], np.int32), 2, None, 0, spec_metadata={"hidden": 1})
        while spec.poll() != KVPoll.Failed:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        assert "DSpark" in str(spec.failure()), spec.failure()
        # The scheduler's own verdict, set as an attribute.
        doomed = ks.KVBridgeKVSender(pm, bootstrap, 7, [0], 0)
        doomed.conclude_state = KVPoll.Failed
        assert doomed.poll() == KVPoll.Failed and doomed.conclude_state == KVPoll.Failed
        for x in (send, recv, spec, doomed):
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
    host, port = bootstrap.split(":")
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
    server_args = types.SimpleNamespace(disaggregation_bootstrap_port=1, host=host,
                                        dist_init_addr=f"{host}:5000", nnodes=2, node_rank=1,
                                        port=30041, tp_size=1, dp_size=1, kv_cache_dtype="auto",
                                        device="cpu")
    pkv = [np.zeros((16, 4, 2, 8), np.uint16) for _ in range(2)]
    paux = np.zeros((4, 16), np.uint8)
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
