"""Unit-level tests of the Python layer: enums, the exception table, bad
input, the GIL, buffers and indices, and one in-process transfer."""

import threading
import time

import numpy as np
import pytest

import kvbridge
from kvbridge import (STATUS_EXCEPTIONS, KVPoll, KVTransferError, StatusCode, _kvbridge,
                      exception_class)


def test_kvpoll_has_sglang_values_and_min_order():
    assert {p.name: int(p) for p in KVPoll} == {
        "Failed": 0, "Bootstrapping": 1, "WaitingForInput": 2, "Transferring": 3, "Success": 4}
    assert min(KVPoll.Success, KVPoll.Transferring, KVPoll.Failed) is KVPoll.Failed
    assert KVPoll.WaitingForInput == 2  # int-compatible, as sglang compares


def test_status_codes_match_the_cpp_names():
    for code in StatusCode:
        assert _kvbridge.status_code_name(int(code)) == code.name


@pytest.mark.parametrize("code", [c for c in StatusCode if c != StatusCode.OK])
def test_every_cpp_status_code_raises_the_class_of_the_table(code):
    with pytest.raises(KVTransferError) as info:
        _kvbridge._raise_status(int(code), f"message for {code.name}")
    assert type(info.value) is STATUS_EXCEPTIONS[code]
    assert info.value.code == code
    assert info.value.failure_reason == f"message for {code.name}"
    assert info.value.is_from_another_rank is False


def test_table_covers_every_code_and_builtins_are_compatible():
    assert set(STATUS_EXCEPTIONS) == set(StatusCode) - {StatusCode.OK}
    assert issubclass(STATUS_EXCEPTIONS[StatusCode.INVALID_ARGUMENT], ValueError)
    assert issubclass(STATUS_EXCEPTIONS[StatusCode.NOT_FOUND], LookupError)
    assert all(issubclass(c, KVTransferError) and issubclass(c, Exception)
               for c in STATUS_EXCEPTIONS.values())
    assert exception_class("UNAVAILABLE") is kvbridge.UnavailableError
    assert exception_class(99) is STATUS_EXCEPTIONS[StatusCode.UNKNOWN]


def test_every_failure_cause_maps_to_a_code_of_the_table():
    causes = _kvbridge.failure_causes()
    assert {"peer_exited", "peer_unreachable", "invalid_request"} <= {c for c, _ in causes}
    for cause, code in causes:
        assert StatusCode(code) in STATUS_EXCEPTIONS, cause
        assert _kvbridge.failure_hint(cause)


def test_kvtransfererror_keeps_sglangs_signature():
    e = KVTransferError(42, "peer gone", True)
    assert (e.bootstrap_room, e.failure_reason, e.is_from_another_rank) == (42, "peer gone", True)
    assert str(e) == "KVTransferError(bootstrap_room=42): peer gone"
    assert e.origin_tp is None and e.cause is None
    assert KVTransferError(1, "x").is_from_another_rank is False


def test_record_becomes_attributes():
    record = {"room": 7, "code": "UNAVAILABLE", "cause": "peer_exited", "phase": "transferring",
              "origin": {"role": "prefill", "tp": 1, "dp": 0, "pp": 0, "cp": 0, "host": "a",
                         "pid": 1234, "name": "prefill tp1"},
              "detected_by": {"name": "decode tp0", "host": "b", "pid": 5},
              "mechanism": "transport error", "hint": "look at dmesg", "message": "room 7: ...",
              "is_from_another_rank": True, "detected_at_us": 2_000_000}
    e = kvbridge._errors.from_record(record)
    assert type(e) is kvbridge.UnavailableError and e.bootstrap_room == 7
    assert (e.origin_role, e.origin_tp, e.origin_pid, e.origin_host) == ("prefill", 1, 1234, "a")
    assert (e.cause, e.phase, e.mechanism, e.hint) == (
        "peer_exited", "transferring", "transport error", "look at dmesg")
    assert e.detected_by == "decode tp0 (host b, pid 5)" and e.detected_at == 2.0
    assert e.is_from_another_rank and e.failure_reason == "room 7: ..."


def test_indices_int32_pass_without_copy_and_others_are_checked():
    a = np.arange(5, dtype=np.int32)
    assert kvbridge.as_indices(a, "kv") is a
    assert kvbridge.as_indices([1, 2], "kv").dtype == np.int32
    assert kvbridge.as_indices(np.array([3], np.int64), "kv").tolist() == [3]
    assert kvbridge.as_indices(None, "kv").size == 0
    with pytest.raises(ValueError, match="1099511627776"):
        kvbridge.as_indices(np.array([2**40]), "kv_indices")
    with pytest.raises(kvbridge.InvalidArgumentError, match="float64.*1.5"):
        kvbridge.as_indices([1.5], "kv_indices")


def test_buffer_address_accepts_numpy_buffers_and_data_ptr():
    arr = np.zeros(16, np.uint8)
    assert kvbridge.buffer_address(arr) == (arr.ctypes.data, 16)
    ba = bytearray(8)
    assert kvbridge.buffer_address(ba)[1] == 8

    class Tensor:
        nbytes = 64

        def data_ptr(self):
            return 0x1000

    assert kvbridge.buffer_address(Tensor()) == (0x1000, 64)
    with pytest.raises(ValueError, match="not C-contiguous"):
        kvbridge.buffer_address(np.zeros((4, 4))[:, 1])
    with pytest.raises(ValueError, match="int is not a buffer"):
        kvbridge.buffer_address(3)


def test_bad_arguments_raise_the_mapped_error_naming_the_value(bootstrap, make_rank):
    with pytest.raises(ValueError, match="'train'"):
        kvbridge.KVManager(kvbridge.KVArgs(), "train")
    with pytest.raises(ValueError, match="no_such_field"):
        kvbridge.KVArgs(no_such_field=1)
    args = kvbridge.KVArgs(page_size=0)
    args.add_kv_buffer(np.zeros(64, np.uint8), 16)
    with pytest.raises(kvbridge.InvalidArgumentError, match="page_size 0"):
        kvbridge.KVManager(args, "prefill", kvbridge.KVConfig(bootstrap_addr=bootstrap))
    p = make_rank("prefill", bootstrap)
    s = kvbridge.KVSender(p.mgr, bootstrap, 11)
    with pytest.raises(kvbridge.InvalidArgumentError, match="999") as info:
        s.init(4, aux_index=999)
    assert info.value.bootstrap_room == 11 and info.value.cause == "invalid_request"
    assert s.poll() == KVPoll.Failed
    with pytest.raises(kvbridge.FailedPreconditionError, match="room 11 already has"):
        kvbridge.KVSender(p.mgr, bootstrap, 11)
    for _ in range(2):  # raise-only, also after clear()
        with pytest.raises(kvbridge.InvalidArgumentError) as info:
            s.failure_exception()
        assert info.value.origin_role == "prefill" and info.value.origin_tp == 0
        assert info.value.is_from_another_rank is False and "999" in info.value.failure_reason
        s.clear()
    assert s.poll() == KVPoll.Failed
    with pytest.raises(kvbridge.FailedPreconditionError, match="cleared"):
        s.send([1])


def test_blocking_call_releases_the_gil(silent_port):
    ticks, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    args = kvbridge.KVArgs()
    for _ in range(2):  # K and V of one layer
        args.add_kv_buffer(np.zeros(64, np.uint8), 16)
    cfg = kvbridge.KVConfig(bootstrap_addr=f"127.0.0.1:{silent_port}",
                            start_bootstrap_server=False)
    t0 = time.monotonic()
    try:
        with pytest.raises(kvbridge.UnavailableError, match=str(silent_port)):
            kvbridge.KVManager(args, "prefill", cfg)  # registering waits for a reply
        before, blocked = ticks[0], time.monotonic() - t0
    finally:
        stop.set()
        t.join()
    assert blocked > 0.5, "the call did not block; the test proves nothing"
    assert before > 10000, f"the other thread ran {before} times in {blocked:.1f} s"


def test_in_process_transfer_and_poll_rate(bootstrap, make_rank):
    p = make_rank("prefill", bootstrap)
    d = make_rank("decode", bootstrap)
    pages_p, pages_d = np.array([5, 6, 9], np.int32), np.array([40, 2, 3], np.int32)
    for i, buf in enumerate(p.kv):
        buf[pages_p] = np.arange(buf[pages_p].size, dtype=np.uint16).reshape(3, 4, 2, 8) + i
    p.aux[1] = 7
    r = kvbridge.KVReceiver(d.mgr, bootstrap, 3)
    r.init(0)
    r.send_metadata(pages_d, aux_index=2)
    s = kvbridge.KVSender(p.mgr, bootstrap, 3)
    deadline = time.monotonic() + 20
    while s.poll() != KVPoll.WaitingForInput and time.monotonic() < deadline:
        time.sleep(0.002)
    assert s.poll() == KVPoll.WaitingForInput
    n, t0 = 200000, time.perf_counter()
    for _ in range(n):
        s.poll()
    rate = n / (time.perf_counter() - t0)
    print(f"\nKVSender.poll(): {rate:,.0f} calls/s")
    assert rate > 50000
    s.init(3, aux_index=1)
    s.send(pages_p[:2])
    s.send(pages_p[2:].tolist())
    while KVPoll.Success not in (s.poll(),) or r.poll() != KVPoll.Success:
        assert time.monotonic() < deadline and KVPoll.Failed not in (s.poll(), r.poll())
        time.sleep(0.002)
    for pb, db in zip(p.kv, d.kv):
        assert np.array_equal(pb[pages_p], db[pages_d])
    assert (d.aux[2] == 7).all() and r.quiesced()
    s.clear()
    r.clear()


def test_take_changed_rooms_lists_each_changed_room_once_and_needs_the_option(bootstrap,
                                                                              make_rank):
    p = make_rank("prefill", bootstrap, list_room_changes=True)
    d = make_rank("decode", bootstrap, list_room_changes=True)
    assert p.mgr.take_changed_rooms() == [] and d.mgr.take_changed_rooms() == []
    r = kvbridge.KVReceiver(d.mgr, bootstrap, 11)
    r.init(0)
    r.send_metadata(np.array([1, 2], np.int32), aux_index=0)
    s = kvbridge.KVSender(p.mgr, bootstrap, 11)
    deadline = time.monotonic() + 20
    while (s.poll(), r.poll()) != (KVPoll.WaitingForInput, KVPoll.WaitingForInput):
        assert time.monotonic() < deadline, (s.poll(), r.poll())
        time.sleep(0.002)
    # Each side changed at least once since it was created: listed once.
    assert p.mgr.take_changed_rooms() == [11] and d.mgr.take_changed_rooms() == [11]
    assert p.mgr.take_changed_rooms() == [] and d.mgr.take_changed_rooms() == []
    s.init(2, aux_index=0)
    s.send(np.array([3, 4], np.int32))
    while (s.poll(), r.poll()) != (KVPoll.Success, KVPoll.Success):
        assert time.monotonic() < deadline, (s.poll(), r.poll())
        time.sleep(0.002)
    assert p.mgr.take_changed_rooms() == [11] and d.mgr.take_changed_rooms() == [11]
    s.clear()
    r.clear()
    other = make_rank("decode", bootstrap, instance_id="other")  # the option left off
    with pytest.raises(kvbridge.FailedPreconditionError, match="list_room_changes"):
        other.mgr.take_changed_rooms()
    # A value of another type is refused by name, not taken as true.
    with pytest.raises(kvbridge.InvalidArgumentError, match="list_room_changes"):
        kvbridge._kvbridge.Manager({"role": "decode", "bootstrap_addr": bootstrap,
                                    "list_room_changes": "yes"})


def test_a_sibling_names_why_its_group_failed_without_waiting_in_python(bootstrap, make_rank):
    """decode tp1 aborts; decode tp0 (no record of its own) raises tp1's record."""
    p = make_rank("prefill", bootstrap)
    d = [make_rank("decode", bootstrap, tp_size=2, tp_rank=i) for i in range(2)]
    rx = [kvbridge.KVReceiver(r.mgr, bootstrap, 8) for r in d]
    for r in rx:
        r.init(0)
        r.send_metadata(np.array([1, 2], np.int32), aux_index=0)
    rx[1].abort()
    assert rx[1].poll() == KVPoll.Failed
    group = min(r.poll() for r in rx)  # sglang's MIN over the group
    assert group == KVPoll.Failed
    for r in rx:  # every rank of the group raises the same record
        with pytest.raises(kvbridge.KVTransferError) as info:
            r.failure_exception()
        e = info.value
        assert (e.origin_role, e.origin_tp, e.cause) == ("decode", 1, "aborted"), e
        assert e.bootstrap_room == 8
        assert e.is_from_another_rank is (r is rx[0])
    for r in rx:
        r.clear()
