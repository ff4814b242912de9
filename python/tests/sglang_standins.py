"""What sglang hands a transfer backend, written from docs/sglang.md (not
sglang's code): a KVArgs filled by attribute assignment the way its prefill
and decode schedulers fill it (decode leaves the kv head counts unset), and
the ServerArgs fields the backend reads. Used by the conformance tests and
the sglang-order scheduler harness."""

from __future__ import annotations

import socket
import time
import types
from typing import List, Optional

import numpy as np


class SgKVArgs:
    """Like sglang's KVArgs: a bare class whose fields are assigned."""


def server_args(bootstrap_port: int, tp_size: int = 1, dp_size: int = 1,
                enable_dp_attention: bool = False, port: int = 30000) -> types.SimpleNamespace:
    return types.SimpleNamespace(host="127.0.0.1", disaggregation_bootstrap_port=bootstrap_port,
                                 tp_size=tp_size, dp_size=dp_size, pp_size=1,
                                 enable_dp_attention=enable_dp_attention, kv_cache_dtype="auto",
                                 device="cpu", port=port, load_balance_method="round_robin")


class SgPool:
    """One rank's KV buffers (K then V per layer), metadata rows, state rows."""

    def __init__(self, mode: str, tp_size: int = 1, tp_rank: int = 0, engine_rank: Optional[int]
                 = None, pages: int = 64, heads: int = 2, page_size: int = 4, layers: int = 2,
                 state_types: Optional[List[str]] = None, state_rows=16,
                 system_dp_rank: int = 0):
        local = max(heads // tp_size, 1)
        self.kv = [np.zeros((pages, page_size, local, 8), np.uint16) for _ in range(2 * layers)]
        self.aux = np.zeros((8, 32), np.uint8)
        rows = state_rows if isinstance(state_rows, list) else [state_rows] * len(state_types or [])
        self.states = [np.zeros((n, 16), np.uint8) for n in rows]  # one pool per state type
        a = SgKVArgs()
        a.engine_rank = tp_rank if engine_rank is None else engine_rank
        a.kv_data_ptrs = [int(b.ctypes.data) for b in self.kv]
        a.kv_data_lens = [int(b.nbytes) for b in self.kv]
        a.kv_item_lens = [int(b[0].nbytes) for b in self.kv]
        a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = (
            [int(self.aux.ctypes.data)], [int(self.aux.nbytes)], [int(self.aux[0].nbytes)])
        a.state_types = list(state_types or [])
        # one list per state type, as setup_state_kv_args builds them
        a.state_data_ptrs = [[int(s.ctypes.data)] for s in self.states]
        a.state_data_lens = [[int(s.nbytes)] for s in self.states]
        a.state_item_lens = [[int(s[0].nbytes)] for s in self.states]
        a.page_size = page_size
        a.pp_rank = 0
        a.system_dp_rank = system_dp_rank
        a.gpu_id = 0
        a.ib_device = None
        if mode == "prefill":  # decode leaves them unset (sglang, non-staging)
            a.kv_head_num = local
            a.total_kv_head_num = heads
            a.prefill_start_layer = 0
            a.prefill_end_layer = layers
        self.args = a

    def fill(self, room: int, pages: np.ndarray) -> None:
        for b, buf in enumerate(self.kv):
            buf[pages] = ((room * 7919 + b * 131 + np.arange(buf[pages].size)) & 0xFFFF
                          ).astype(np.uint16).reshape(buf[pages].shape)


def unused_port() -> int:
    """A loopback TCP port nothing listens on now (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(cond, timeout: float = 20.0, what: str = "condition") -> None:
    """Polls `cond` until it holds (the test fails after `timeout`)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)



def settle(txs, rx) -> None:
    """The senders of a request that succeeded reach Success and are
    cleared, then its receiver."""
    from kvbridge import KVPoll  # the stand-ins themselves need no kvbridge
    for tx in txs:
        wait_until(lambda: tx.poll() == KVPoll.Success, what="prefill success")
        tx.clear()
    rx.clear()
