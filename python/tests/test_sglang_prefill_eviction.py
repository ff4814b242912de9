"""A dead prefill instance's parallel info is evicted, as sglang's decode
manager evicts it (common/conn.py's _handle_node_failure, called by its
heartbeat checker; parallel_info_epoch counts the evictions): kvbridge
learns of the death from the failure record of a request (the instance's
registry lost, or a prefill rank exited; a rank unreachable or unresponsive
evicts nothing), so the next try_ensure_parallel_info asks the instance
again and a prefill restarted at the same address with another shape is
seen with it (docs/sglang.md, M5)."""

from __future__ import annotations

import contextlib

import os
import select
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import kvbridge
from kvbridge import KVPoll, KVTransferError
from kvbridge import sglang as sg
from sglang_standins import SgPool, server_args, unused_port, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))



class PrefillInstance:
    """sglang_prefill_instance.py in a process of its own."""

    def __init__(self, port: int, dp: int, method: str, timeout: float = 30.0):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "sglang_prefill_instance.py"), str(port),
             str(dp), method], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.kill()
            raise AssertionError(f"prefill instance (dp {dp}) did not start: {line!r}, "
                                 f"exit code {self.proc.poll()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


def _ready(state) -> bool:
    """try_ensure_parallel_info's answer as a bool, explicitly: True for True
    or ParallelInfoState.READY, False for False or FAILED (where sglang's
    enum is importable FAILED is truthy, so `not answer` would misread it)."""
    if state is True or state is False:
        return state
    enum = sg.ParallelInfoState
    assert enum is not None and state in (enum.READY, enum.FAILED), f"answer {state!r}"
    return state == enum.READY


def _closed(manager) -> bool:
    """Whether a kvbridge manager's handle was closed (its calls then raise
    FailedPreconditionError "KVManager is closed")."""
    try:
        manager.stats()
    except kvbridge.FailedPreconditionError:
        return True
    return False


def _raised(rx) -> KVTransferError:
    with pytest.raises(KVTransferError) as e:
        rx.failure_exception()
    return e.value


def test_a_killed_prefill_is_evicted_and_its_restart_is_fetched_anew():
    port = unused_port()
    addr = f"127.0.0.1:{port}"
    first = PrefillInstance(port, dp=1, method="round_robin")  # follows the room
    restarted = None
    d = SgPool("decode")
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30061))
    try:
        wait_until(lambda: _ready(dm.try_ensure_parallel_info(addr)), what="prefill info")
        info = dm.prefill_info_table[addr]
        assert (info.dp_size, info.follow_bootstrap_room) == (1, True)
        assert dm.has_parallel_info(addr) and dm.parallel_info_epoch(addr) == 0
        met = sg.KVBridgeKVReceiver(dm, addr, 5)  # handshake done with the prefill rank
        met.init(0)
        wait_until(lambda: met.poll() != KVPoll.Bootstrapping, what="handshake")
        assert met.poll() == KVPoll.WaitingForInput, met.failure()
        queued = sg.KVBridgeKVReceiver(dm, addr, 6)  # arrived, not initialized yet
        old_core = dm._cores[sg._norm_addr(addr)]

        victim = first.proc.pid
        first.kill()
        wait_until(lambda: met.poll() == KVPoll.Failed, timeout=30, what="the death noticed")
        e = _raised(met)  # sglang reads why; the adapter learns the prefill is gone
        assert (e.origin_role, e.origin_pid, e.cause) == ("prefill", victim, "peer_exited")
        assert dm.parallel_info_epoch(addr) == 1
        assert not dm.has_parallel_info(addr) and addr not in dm.prefill_info_table
        # sglang fails the requests it tracked for that address
        assert queued.poll() == KVPoll.Failed
        assert "Lost connection with prefill instance" in queued.failure().failure_reason
        wait_until(lambda: _closed(old_core), timeout=10, what="the evicted manager closed")
        queued.init(0)
        assert queued.poll() == KVPoll.Failed
        _raised(met)  # read again: the same death evicts once
        assert dm.parallel_info_epoch(addr) == 1
        assert not _ready(dm.try_ensure_parallel_info(addr))  # nothing listens there now
        assert dm.parallel_info_epoch(addr) == 1

        # Restarted at the same address: two dp ranks, free routing.
        restarted = PrefillInstance(port, dp=2, method="total_requests")
        wait_until(lambda: _ready(dm.try_ensure_parallel_info(addr)), what="the restart's info")
        info = dm.prefill_info_table[addr]
        assert (info.dp_size, info.follow_bootstrap_room) == (2, False)
        # The restart's dp rank 1 is met (the info kept would say dp 1:
        # "prefill dp rank 1 out of range [0, 1)").
        new = sg.KVBridgeKVReceiver(dm, addr, 7)
        new.init(1)
        wait_until(lambda: new.poll() != KVPoll.Bootstrapping, what="handshake with dp rank 1")
        assert new.poll() == KVPoll.WaitingForInput, new.failure()
        # A late read of an old request's death evicts nothing of the restart.
        _raised(met)
        assert dm.parallel_info_epoch(addr) == 1 and dm.has_parallel_info(addr)
        for rx in (met, queued, new):
            rx.clear()
    finally:
        dm.close()
        first.kill()
        if restarted is not None:
            restarted.kill()


@contextlib.contextmanager
def _paired(bootstrap: str, decode_port: int):
    """A prefill and a decode manager of the adapter at `bootstrap`, with
    their pools; both closed on the way out."""
    port = int(bootstrap.rsplit(":", 1)[1])
    p, d = SgPool("prefill"), SgPool("decode")
    pm = sg.KVBridgeKVManager(p.args, "prefill", server_args(port))
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=decode_port))
    try:
        yield p, d, pm, dm
    finally:
        dm.close()
        pm.close()


def _transfer(pm, dm, p, d, addr: str, room: int) -> None:
    """One request in sglang's order, which must succeed."""
    rx = sg.KVBridgeKVReceiver(dm, addr, room)
    tx = sg.KVBridgeKVSender(pm, addr, room, [0], 0)
    assert _ready(dm.try_ensure_parallel_info(addr))
    rx.init(0)
    wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="handshake")
    assert rx.poll() == KVPoll.WaitingForInput, rx.failure()
    dst, src = np.array([room, room + 1], np.int32), np.array([room + 2, room + 3], np.int32)
    rx.send_metadata(dst, 1, None)
    wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="metadata")
    p.fill(room, src)
    tx.init(2, 1)
    tx.send(src, None)
    wait_until(lambda: rx.poll() in (KVPoll.Success, KVPoll.Failed), what="transfer")
    assert rx.poll() == KVPoll.Success, rx.failure()
    assert all(np.array_equal(d.kv[b][dst], p.kv[b][src]) for b in range(len(p.kv)))
    wait_until(lambda: tx.poll() == KVPoll.Success, what="prefill success")
    tx.clear()
    rx.clear()


def test_eviction_fails_requests_not_yet_initialized_and_the_next_fetch_serves_again(
        bootstrap):
    # sglang's heartbeat calls _handle_node_failure(addr); so may a caller.
    with _paired(bootstrap, 30062) as (p, d, pm, dm):
        _transfer(pm, dm, p, d, bootstrap, 11)
        old_core = dm._cores[sg._norm_addr(bootstrap)]
        queued = sg.KVBridgeKVReceiver(dm, bootstrap, 12)  # arrived, not initialized
        inflight = sg.KVBridgeKVReceiver(dm, bootstrap, 13)
        inflight.init(0)
        wait_until(lambda: inflight.poll() == KVPoll.WaitingForInput, what="handshake")
        assert dm._handle_node_failure(bootstrap)
        assert dm.parallel_info_epoch(bootstrap) == 1 and not dm.has_parallel_info(bootstrap)
        assert queued.poll() == KVPoll.Failed
        assert "Lost connection with prefill instance" in _raised(queued).failure_reason
        queued.clear()
        # The evicted manager's handle is closed at once, off this thread.
        wait_until(lambda: _closed(old_core), timeout=10, what="the evicted manager closed")
        # A request already handed to kvbridge is the evicted manager's to
        # finish (here it can: the prefill lives, and no new manager was
        # made yet); the C++ manager lives while a room made from it does.
        assert inflight.poll() == KVPoll.WaitingForInput
        tx = sg.KVBridgeKVSender(pm, bootstrap, 13, [0], 0)
        inflight.send_metadata(np.array([20, 21], np.int32), 2, None)
        wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="metadata")
        tx.init(2, 2)
        tx.send(np.array([22, 23], np.int32), None)
        wait_until(lambda: inflight.poll() in (KVPoll.Success, KVPoll.Failed), what="transfer")
        assert inflight.poll() == KVPoll.Success, inflight.failure()
        wait_until(lambda: tx.poll() == KVPoll.Success, what="prefill success")
        tx.clear()
        inflight.clear()
        # Only that epoch's: a stale epoch evicts nothing.
        assert not dm._handle_node_failure(bootstrap, epoch=0)
        assert dm.parallel_info_epoch(bootstrap) == 1
        _transfer(pm, dm, p, d, bootstrap, 14)  # fetched anew, a new kvbridge manager
        new_core = dm._cores[sg._norm_addr(bootstrap)]
        assert new_core is not old_core and not _closed(new_core)
        assert dm.parallel_info_epoch(bootstrap) == 1
        # A second eviction: close() closes at once what is still pending.
        assert dm._handle_node_failure(bootstrap)
        dm.close()
        assert _closed(new_core)


def test_a_fetch_an_eviction_overtakes_is_not_published(bootstrap, monkeypatch):
    with _paired(bootstrap, 30063) as (p, d, pm, dm):
        real = sg._kvbridge.prefill_info
        evict = [True]

        def prefill_info(address, timeout_s):
            answer = real(address, timeout_s)
            if evict[0]:  # the heartbeat's thread evicts while this one asks
                evict[0] = False
                t = threading.Thread(target=dm._handle_node_failure, args=(bootstrap,))
                t.start()
                t.join(10)
            return answer

        monkeypatch.setattr(sg._kvbridge, "prefill_info", prefill_info)
        assert not _ready(dm.try_ensure_parallel_info(bootstrap))  # sglang: FAILED, retried
        assert not dm.has_parallel_info(bootstrap) and dm._cores == {}
        assert dm.parallel_info_epoch(bootstrap) == 1
        assert _ready(dm.try_ensure_parallel_info(bootstrap))  # the next attempt publishes
        _transfer(pm, dm, p, d, bootstrap, 21)


def test_only_a_prefill_gone_evicts(bootstrap):
    with _paired(bootstrap, 30064) as (p, d, pm, dm):
        assert _ready(dm.try_ensure_parallel_info(bootstrap))
        rx = sg.KVBridgeKVReceiver(dm, bootstrap, 31)
        rx.init(0)
        rx.abort()  # decode's own abort
        wait_until(lambda: rx.poll() == KVPoll.Failed, what="abort")
        assert _raised(rx).cause == "aborted"
        rx.clear()
        assert dm.parallel_info_epoch(bootstrap) == 0 and dm.has_parallel_info(bootstrap)

        def record(cause, role):
            return kvbridge.UnavailableError(31, "x", record={
                "cause": cause, "origin": {"role": role, "name": f"{role} tp0", "pid": 1}})

        core = dm._cores[sg._norm_addr(bootstrap)]
        # A decode sibling's death, a layout mismatch, and a prefill rank
        # unreachable or unresponsive (a partition, a stall, a relayed
        # record: the core fences and meets it again by incarnation).
        for cause, role in (("peer_exited", "decode"), ("layout_mismatch", "prefill"),
                            ("peer_unresponsive", "prefill"),
                            ("peer_unreachable", "prefill")):
            dm._note_failure(bootstrap, 0, record(cause, role))
            assert dm.parallel_info_epoch(bootstrap) == 0, cause
            assert dm.has_parallel_info(bootstrap), cause
            assert dm._cores[sg._norm_addr(bootstrap)] is core and not _closed(core), cause
        # A prefill rank's process known dead; the registry lost (sglang's
        # /health stopping).
        for n, (cause, role) in enumerate((("peer_exited", "prefill"),
                                           ("registry_lost", "bootstrap"))):
            assert _ready(dm.try_ensure_parallel_info(bootstrap))
            dm._note_failure(bootstrap, n, record(cause, role))
            assert dm.parallel_info_epoch(bootstrap) == n + 1, cause
            assert not dm.has_parallel_info(bootstrap), cause


def test_a_retraction_after_an_eviction_says_the_instance_was_lost(bootstrap):
    # sglang's PD retraction asks prefill's /generate at the port its info
    # gave; evicted, that info is gone, and the failure says why.
    with _paired(bootstrap, 30065) as (p, d, pm, dm):
        assert _ready(dm.try_ensure_parallel_info(bootstrap))
        rx = sg.KVBridgeKVReceiver(dm, bootstrap, 41)
        rx.init(0)
        wait_until(lambda: rx.poll() == KVPoll.WaitingForInput, what="handshake")
        assert dm._handle_node_failure(bootstrap)
        dm.submit_prefill_recompute(rx, {"rid": "r41", "bootstrap_room": 41})
        wait_until(lambda: rx.poll() == KVPoll.Failed, what="Failed")
        reason = rx.failure().failure_reason
        assert "was lost (its parallel info evicted)" in reason, reason
        assert "registered no HTTP port" not in reason
        rx.clear()
