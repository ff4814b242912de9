"""A bootstrap server that answers with bytes that are not UTF-8.

A request's bootstrap address comes from a client of sglang's router: the
server there is a stranger. Its bytes reach error messages and failure
records. Before, a Python str could not hold them: prefill_info raised an
empty RuntimeError (not KVTransferError) out of try_ensure_parallel_info
into sglang's decode loop, and failure()/failure_exception() raised a JSON
RuntimeError in place of the request's record, so sglang freed the pages
without the quiesce wait (hostile-input audit)."""

import enum
import http.server
import json
import threading

import numpy as np
import pytest

import kvbridge
import kvbridge.sglang as ks
from kvbridge import KVPoll, KVTransferError, _kvbridge
from test_sglang_adapter import pools, server_args_for, sglang_args, wait_for

NOT_UTF8 = b"\xff\xfe bad \xc3"
REPLACEMENT = "\ufffd"
INFO = {"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 4,
        "kv_cache_dtype": "auto", "follow_bootstrap_room": True}


class Mode(enum.Enum):  # shaped like sglang's DisaggregationMode
    PREFILL = "prefill"
    DECODE = "decode"


class HostileServer:
    """Answers GET /route: the parallel info (all -1) with `info_status` and
    `info_body`; a rank's record with 200 and bytes that are not UTF-8."""

    def __init__(self, info_status, info_body, rank_status=200, rank_body=NOT_UTF8):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if "=-1" in self.path:
                    status, body = outer.info_status, outer.info_body
                else:
                    status, body = outer.rank_status, outer.rank_body
                    outer.rank_lookups += 1
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.info_status, self.info_body, self.rank_lookups = info_status, info_body, 0
        self.rank_status, self.rank_body = rank_status, rank_body
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile():
    servers = []

    def make(info_status, info_body, rank_status=200, rank_body=NOT_UTF8):
        servers.append(HostileServer(info_status, info_body, rank_status, rank_body))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.mark.parametrize("status", [503, 200, 500])
def test_an_answer_that_is_not_utf8_is_a_kvtransfererror(hostile, status):
    server = hostile(status, NOT_UTF8)
    with pytest.raises(KVTransferError) as raised:
        _kvbridge.prefill_info(server.address, 5.0)
    assert REPLACEMENT in str(raised.value), str(raised.value)


def test_try_ensure_parallel_info_says_not_ready_and_raises_nothing(hostile, bootstrap):
    server = hostile(503, NOT_UTF8)
    dkv, daux = pools()
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE,
                              server_args_for(bootstrap, 30021), False)
    try:
        assert not dm.try_ensure_parallel_info(server.address)
        assert not dm.has_parallel_info(server.address)
    finally:
        dm.close()


def test_a_rank_record_that_is_not_utf8_fails_the_request_with_its_record(hostile):
    server = hostile(200, json.dumps(INFO).encode())
    dkv, daux = pools()
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE,
                              server_args_for(server.address, 30021), False)
    try:
        assert dm.try_ensure_parallel_info(server.address)
        recv = ks.KVBridgeKVReceiver(dm, server.address, 77)
        recv.init(0)
        wait_for("the request's failure", lambda: recv.poll() == KVPoll.Failed)
        assert server.rank_lookups >= 1
        # About the server that answered, not a caller bug of decode.
        error = recv.failure()
        assert isinstance(error, KVTransferError), error
        record = error.record
        assert isinstance(record, dict), error
        assert record["cause"] == "registry_lost", record
        assert record["origin"]["role"] == "bootstrap", record
        assert record["origin"]["host"] == server.address, record
        assert REPLACEMENT in record["detail"], record
        with pytest.raises(KVTransferError) as raised:
            recv.failure_exception()
        assert f"bootstrap server {server.address}" in str(raised.value), str(raised.value)
    finally:
        dm.close()


def failed_record(server_address):
    """A decode request against the prefill instance at `server_address`
    until it fails; its record."""
    dkv, daux = pools()
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE,
                              server_args_for(server_address, 30021), False)
    try:
        assert dm.try_ensure_parallel_info(server_address)
        recv = ks.KVBridgeKVReceiver(dm, server_address, 78)
        recv.init(0)
        wait_for("the request's failure", lambda: recv.poll() == KVPoll.Failed)
        return recv.failure().record
    finally:
        dm.close()


# Before, every status but 5xx fell to invalid_request of decode itself ("a
# caller bug"); 401 and 409 named a prefill rank "(host ?, pid 0)" that was
# never read, as unauthenticated and layout_mismatch.
@pytest.mark.parametrize("status", [400, 401, 403, 405, 409, 429, 504])
def test_a_registry_that_answers_a_lookup_with_an_error_is_named(hostile, status):
    server = hostile(200, json.dumps(INFO).encode(), status, b"{}")
    record = failed_record(server.address)
    assert record["cause"] == "registry_lost", record
    assert record["origin"]["role"] == "bootstrap", record
    assert record["origin"]["host"] == server.address, record
    assert record["mechanism"] == "bootstrap lookup", record


# With sglang's server the registry lists where a rank is and the rank serves
# its record: when that endpoint answers wrongly, the rank is named, at the
# host the registry listed (before: the healthy server, or decode itself).
@pytest.mark.parametrize("status,body", [(500, b"{}"), (200, b"<html>"), (400, b"{}"),
                                         (401, b"{}")])
def test_a_listed_rank_endpoint_that_answers_wrongly_is_named(hostile, status, body):
    endpoint = hostile(200, b"{}", status, body)
    port = int(endpoint.address.rsplit(":", 1)[1])
    where = json.dumps({"rank_ip": "127.0.0.1", "rank_port": port}).encode()
    server = hostile(200, json.dumps(INFO).encode(), 200, where)
    record = failed_record(server.address)
    assert record["cause"] == "peer_unreachable", record
    assert record["origin"]["role"] == "prefill", record
    assert record["origin"]["host"] == "127.0.0.1", record
    assert record["mechanism"] == "bootstrap lookup", record


# registry_lost about a server that answered (wrongly) is no lost registry:
# sglang's reading of the failure must not evict the instance (eviction
# makes a new decode manager, a new incarnation that gets this one fenced).
def test_a_lookup_answered_with_an_error_evicts_no_instance(hostile):
    server = hostile(200, json.dumps(INFO).encode(), 429, b"{}")
    dkv, daux = pools()
    dm = ks.KVBridgeKVManager(sglang_args(dkv, daux), Mode.DECODE,
                              server_args_for(server.address, 30021), False)
    try:
        assert dm.try_ensure_parallel_info(server.address)
        core = dm.core(server.address)
        recv = ks.KVBridgeKVReceiver(dm, server.address, 79)
        recv.init(0)
        wait_for("the request's failure", lambda: recv.poll() == KVPoll.Failed)
        with pytest.raises(KVTransferError):
            recv.failure_exception()  # where sglang's reading evicts
        assert dm.parallel_info_epoch(server.address) == 0
        assert dm.core(server.address) is core
    finally:
        dm.close()
