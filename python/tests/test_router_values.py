"""Values a request brings from sglang's router: a room id or a prefill dp
rank that is none fails that request only. sglang builds its sender, and
calls the receiver's init, outside any try: before, a room of 2**64 or a dp
rank of 2**31 raised TypeError out of the adapter (stopping the scheduler),
a room of 1.5 or "7" was truncated to another request's room, one bad room
emptied a whole dp-rank query, and a second spelling of a prefill address
made a second decode manager that got the first one fenced (hostile-input
audit 2)."""

import enum
import http.server
import json
import threading

import pytest

import kvbridge
import kvbridge.sglang as ks
from kvbridge import KVPoll, KVTransferError, _kvbridge
from test_sglang_adapter import move_request, pools, server_args_for, sglang_args, wait_for

NOT_ROOMS = [-1, None, 2**64, 1.5, "7", float("nan")]


class Mode(enum.Enum):  # shaped like sglang's DisaggregationMode
    PREFILL = "prefill"
    DECODE = "decode"


@pytest.fixture
def managers(bootstrap):
    server_args = server_args_for(bootstrap, 30021)
    pkv, paux = pools()
    dkv, daux = pools()
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL, server_args, False)
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE, server_args, False)
    yield pm, dm
    dm.close()
    pm.close()


@pytest.mark.parametrize("room", NOT_ROOMS)
def test_a_sender_for_a_room_id_that_is_none_is_failed_not_raised(managers, bootstrap, room):
    pm, _ = managers
    sender = ks.KVBridgeKVSender(pm, bootstrap, room, [0], 0)
    assert sender.poll() == KVPoll.Failed
    assert isinstance(sender.failure(), KVTransferError)
    assert "is not a room id" in str(sender.failure())
    with pytest.raises(KVTransferError):
        sender.failure_exception()
    # What the scheduler calls next does nothing and raises nothing.
    sender.init(2, 0)
    sender.send([1, 2])
    assert sender.pop_decode_prefix_len() == 0
    assert sender.get_transfer_metric().transfer_latency_s is None
    sender.clear()


@pytest.mark.parametrize("room", NOT_ROOMS)
def test_a_receiver_for_a_room_id_that_is_none_fails_at_init(managers, bootstrap, room):
    _, dm = managers
    assert dm.try_ensure_parallel_info(bootstrap)
    recv = ks.KVBridgeKVReceiver(dm, bootstrap, room)
    recv.init(0)
    assert recv.poll() == KVPoll.Failed
    with pytest.raises(KVTransferError):
        recv.failure_exception()


@pytest.mark.parametrize("dp_rank", [2**31, 2**63, -1, 1.5])
def test_a_dp_rank_that_is_none_fails_that_request(managers, bootstrap, dp_rank):
    _, dm = managers
    assert dm.try_ensure_parallel_info(bootstrap)
    recv = ks.KVBridgeKVReceiver(dm, bootstrap, 41)
    recv.init(dp_rank)
    wait_for("the request's failure", lambda: recv.poll() == KVPoll.Failed)
    with pytest.raises(KVTransferError) as raised:
        recv.failure_exception()
    assert "dp rank" in str(raised.value), str(raised.value)


def test_one_room_id_that_is_none_leaves_the_others_their_dp_ranks(bootstrap):
    _kvbridge.register_dp_rank(bootstrap, 5, 1, 5.0)
    for batch in ([5, -1], [5, 2**64], [5, "x", None]):
        assert ks.KVBridgeKVReceiver.query_prefill_dp_ranks(bootstrap, batch) == {"5": 1}, batch


def test_a_dp_rank_answer_out_of_range_is_a_malformed_answer_not_truncated():
    answer = json.dumps({"5": 4294967297}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(KVTransferError) as raised:
            _kvbridge.query_dp_ranks(address, [5], 5.0)
        assert "dp rank 4294967297 is out of range" in str(raised.value), str(raised.value)
        # sglang's caller gets no rank for the room (it waits), never rank 1.
        assert ks.KVBridgeKVReceiver.query_prefill_dp_ranks(address, [5]) == {}
    finally:
        server.shutdown()
        server.server_close()


def test_spellings_of_one_prefill_address_share_one_manager(bootstrap):
    port = bootstrap.rsplit(":", 1)[1]
    spellings = [f"127.1:0{port}", f"http://LOCALHOST:{port}/x", f"0x7f.0.0.1:00{port}"]
    server_args = server_args_for(bootstrap, 30021)
    pkv, paux = pools(fill=True)
    dkv, daux = pools()
    pm = ks.KVBridgeKVManager(sglang_args(pkv, paux), Mode.PREFILL, server_args, False)
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE, server_args, False)
    try:
        assert dm.try_ensure_parallel_info(bootstrap)
        first = dm.core(bootstrap)
        for addr in spellings:
            assert dm.try_ensure_parallel_info(addr), addr
            assert dm.core(addr) is first, addr
        assert len(dm._cores) == 1, list(dm._cores)
        # Requests under either spelling go through the one decode manager.
        move_request(pm, dm, bootstrap, 51, dkv)
        move_request(pm, dm, spellings[0], 52, dkv)
    finally:
        dm.close()
        pm.close()
