"""Shared fixtures. Run with Debian's python3 and the build tree on the path:
PYTHONPATH=build/python /usr/bin/python3 -m pytest python/tests
"""

import os
import secrets
import socket

import numpy as np
import pytest

import kvbridge

# The tests are one deployment: every server, manager and worker process
# they start shares this secret, as sglang's ranks share theirs.
if not (os.environ.get("KVBRIDGE_AUTH_TOKEN")
        or os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN")):
    os.environ["KVBRIDGE_AUTH_TOKEN"] = secrets.token_hex(32)


@pytest.fixture
def bootstrap():
    """A bootstrap server on a free port; yields its "host:port"."""
    server = kvbridge.BootstrapServer("127.0.0.1", 0)
    yield f"127.0.0.1:{server.port}"
    server.close()


@pytest.fixture
def sglang_bootstrap():
    """A stand-in of sglang's own bootstrap server (no kvbridge routes);
    yields the stand-in (its .address is "host:port")."""
    from sglang_bootstrap_standin import SglangBootstrapStandin
    token = (os.environ.get("KVBRIDGE_AUTH_TOKEN")
             or os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"))
    server = SglangBootstrapStandin(token)
    yield server
    server.close()


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


class Rank:
    """A small single-rank pool and its manager, for in-process tests."""

    def __init__(self, role, bootstrap_addr, pages=64, tp_size=1, tp_rank=0, **config):
        heads = 2 // tp_size
        self.kv = [np.zeros((pages, 4, heads, 8), np.uint16) for _ in range(4)]
        self.aux = np.zeros((8, 32), np.uint8)
        args = kvbridge.KVArgs(page_size=4, kv_head_num=heads, total_kv_head_num=2,
                               tp_size=tp_size, tp_rank=tp_rank)
        for buf in self.kv:
            args.add_kv_buffer(buf, buf[0].nbytes)
        args.add_aux_buffer(self.aux, 32)
        cfg = kvbridge.KVConfig(bootstrap_addr=bootstrap_addr, start_bootstrap_server=False,
                                **config)
        self.mgr = kvbridge.KVManager(args, role, cfg)


@pytest.fixture
def make_rank():
    made = []

    def make(role, bootstrap_addr, **kw):
        r = Rank(role, bootstrap_addr, **kw)
        made.append(r)
        return r

    yield make
    for r in reversed(made):
        r.mgr.close()
