"""kvbridge as an sglang transfer backend.

Classes with the names and constructor signatures of sglang's
``sglang.srt.disaggregation.base.conn`` (written against sglang main at
commit 0094505d, after v0.5.3: ``KVReceiver.init(prefill_dp_rank)`` plus
``send_metadata(...)``, ``KVSender.send(..., token_position_offset)``,
``get_transfer_metric()``, ``register_to_bootstrap()``). When sglang is
importable they subclass its base classes, so sglang's isinstance checks
hold. ``install()`` makes sglang's ``get_kv_class`` hand out these classes
for one ``--disaggregation-transfer-backend`` value; see docs/python.md.

Errors surface the sglang way: ``send``/``init``/``send_metadata`` on a
request that failed (bad input included) log and return, ``poll()`` turns
Failed and ``failure_exception()`` raises the KVTransferError with the
record.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
from typing import Any, List, Optional

import kvbridge
from kvbridge._api import KVManager as _Manager, KVPoll, KVReceiver as _Receiver
from kvbridge._api import KVSender as _Sender
from kvbridge._args import KVArgs, KVConfig, ParallelLayout

log = logging.getLogger("kvbridge.sglang")

try:  # subclass sglang's bases when present; stand-ins otherwise
    from sglang.srt.disaggregation.base.conn import (BaseKVBootstrapServer, BaseKVManager,
                                                     BaseKVReceiver, BaseKVSender)
except Exception:  # noqa: BLE001 -- sglang absent or incompatible
    class BaseKVManager:  # type: ignore[no-redef]
        pass

    class BaseKVSender:  # type: ignore[no-redef]
        pass

    class BaseKVReceiver:  # type: ignore[no-redef]
        pass

    class BaseKVBootstrapServer:  # type: ignore[no-redef]
        pass

try:
    from sglang.srt.disaggregation.base.conn import KVTransferMetric
except Exception:  # noqa: BLE001
    @dataclasses.dataclass
    class KVTransferMetric:  # type: ignore[no-redef]
        transfer_latency_s: Optional[float] = None
        alloc_latency_s: Optional[float] = None
        transfer_total_bytes: Optional[int] = None


def _flat(values: Any) -> List[int]:
    out: List[int] = []
    for v in values or []:
        out.extend(_flat(v) if isinstance(v, (list, tuple)) else [int(v)])
    return out


def to_kvbridge_args(args: Any, server_args: Any) -> KVArgs:
    """Our KVArgs from sglang's (state lists of lists are flattened)."""
    ours = KVArgs()
    for name in KVArgs._LIST_FIELDS:
        setattr(ours, name, _flat(getattr(args, name, [])))
    for name in ("engine_rank", "page_size", "kv_head_num", "total_kv_head_num",
                 "prefill_start_layer", "prefill_end_layer"):
        if getattr(args, name, None) is not None:
            setattr(ours, name, getattr(args, name))
    ours.dtype = str(getattr(server_args, "kv_cache_dtype", "auto"))
    ours.memory_kind = "vram" if str(getattr(server_args, "device", "cuda")) == "cuda" else "dram"
    layout = getattr(args, "parallel", None)
    if isinstance(layout, ParallelLayout):
        ours.parallel = layout
    else:  # attention tp = tp / dp under dp-attention
        tp = int(getattr(server_args, "tp_size", 1) or 1)
        dp = int(getattr(server_args, "dp_size", 1) or 1)
        attn_tp = tp // dp if getattr(server_args, "enable_dp_attention", False) else tp
        rank = int(ours.engine_rank)
        ours.parallel = ParallelLayout(tp_size=attn_tp, tp_rank=rank % attn_tp,
                                       dp_size=dp if attn_tp != tp else 1,
                                       dp_rank=rank // attn_tp if attn_tp != tp else 0,
                                       pp_size=int(getattr(server_args, "pp_size", 1) or 1),
                                       pp_rank=int(getattr(args, "pp_rank", 0) or 0))
    return ours


class KVBridgeKVManager(BaseKVManager):
    """sglang's KVManager(args, disaggregation_mode, server_args, is_mla_backend)."""

    def __init__(self, args: Any, disaggregation_mode: Any, server_args: Any,
                 is_mla_backend: Optional[bool] = False):
        self.kv_args = args
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.is_mla_backend = bool(is_mla_backend)
        self._args = to_kvbridge_args(args, server_args)
        self._mode = str(getattr(disaggregation_mode, "value", disaggregation_mode)).lower()
        self._core: Optional[_Manager] = None
        if self._mode == "prefill":
            port = getattr(server_args, "disaggregation_bootstrap_port", 8998)
            host = getattr(server_args, "host", None) or "127.0.0.1"
            self.register_to_bootstrap(f"{host}:{port}")

    def _config(self, bootstrap_addr: str) -> KVConfig:
        host = getattr(self.server_args, "host", None) or "127.0.0.1"
        return KVConfig(bootstrap_addr=bootstrap_addr, start_bootstrap_server=False,
                        advertise_host="127.0.0.1" if host in ("0.0.0.0", "::") else host,
                        instance_id=self._instance_id(host))

    def _instance_id(self, host: str) -> str:
        """Decode: the server's own address, the same on all its ranks and
        different for every decode server sharing a prefill instance."""
        if self._mode != "decode":
            return ""
        port = getattr(self.server_args, "port", None)
        ident = f"{host}:{port}" if port is not None else host
        return re.sub(r"[^A-Za-z0-9._:-]", "_", ident)[:64]

    def register_to_bootstrap(self, bootstrap_addr: Optional[str] = None) -> None:
        """Creates the rank's manager; prefill registers with bootstrap here."""
        if self._core is None and bootstrap_addr:
            self._core = _Manager(self._args, self._mode, self._config(bootstrap_addr),
                                  self.is_mla_backend)

    def core(self, bootstrap_addr: Optional[str] = None) -> _Manager:
        """The kvbridge manager; decode makes it at its first request's address."""
        self.register_to_bootstrap(bootstrap_addr)
        if self._core is None:
            raise kvbridge.FailedPreconditionError(None, "no bootstrap address known yet")
        return self._core


class _Quiet:
    """sglang reports errors through poll()/failure_exception(), not raises."""

    def _quiet(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except kvbridge.KVTransferError as e:
            log.warning("%s", e)  # the room is Failed now; failure_exception() says why


class KVBridgeKVSender(_Quiet, BaseKVSender):
    def __init__(self, mgr: KVBridgeKVManager, bootstrap_addr: str, bootstrap_room: int,
                 dest_tp_ranks: Optional[List[int]] = None, pp_rank: Optional[int] = None,
                 req_has_disagg_prefill_dp_rank: bool = False):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self._s = _Sender(mgr.core(), bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank)
        self.poll = self._s.poll  # the C++ method itself: no Python frame per poll

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        self._quiet(self._s.init, num_kv_indices, aux_index)

    def send(self, kv_indices: Any, state_indices: Optional[List] = None,
             token_position_offset: int = 0) -> None:
        state = _flat(state_indices) if state_indices is not None else None
        self._quiet(self._s.send, kv_indices, state)

    def pop_decode_prefix_len(self) -> int:
        return 0

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk  # an empty last chunk still sends aux/state

    def get_transfer_metric(self) -> KVTransferMetric:
        return KVTransferMetric()

    def poll(self) -> KVPoll:  # replaced per instance in __init__
        return self._s.poll()

    def failure_exception(self) -> None:
        self._s.failure_exception()

    def clear(self) -> None:
        self._s.clear()

    def abort(self) -> None:
        self._s.abort()


class KVBridgeKVReceiver(_Quiet, BaseKVReceiver):
    def __init__(self, mgr: KVBridgeKVManager, bootstrap_addr: str,
                 bootstrap_room: Optional[int] = None):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self._r = _Receiver(mgr.core(bootstrap_addr), bootstrap_addr, bootstrap_room)
        self.poll = self._r.poll

    def init(self, prefill_dp_rank: int = 0) -> None:
        self._quiet(self._r.init, prefill_dp_rank)

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None,
                      state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None) -> None:
        state = _flat(state_indices) if state_indices is not None else None
        self._quiet(self._r.send_metadata, kv_indices, aux_index, state, decode_prefix_len or 0)

    def poll(self) -> KVPoll:  # replaced per instance in __init__
        return self._r.poll()

    def failure_exception(self) -> None:
        self._r.failure_exception()

    def clear(self) -> None:
        self._r.clear()

    def abort(self) -> None:
        self._r.abort()

    def quiesced(self) -> bool:
        return self._r.quiesced()


class KVBridgeKVBootstrapServer(BaseKVBootstrapServer):
    def __init__(self, host: str, port: int, *args: Any, **kwargs: Any):
        self._server = kvbridge.BootstrapServer(host, port)

    def close(self) -> None:
        self._server.close()


CLASSES = {"manager": KVBridgeKVManager, "sender": KVBridgeKVSender,
           "receiver": KVBridgeKVReceiver, "bootstrap_server": KVBridgeKVBootstrapServer}


def install(backend: str = "mooncake") -> None:
    """Makes sglang's get_kv_class return kvbridge's classes for `backend`.

    Patches sglang.srt.disaggregation.utils.get_kv_class and every loaded
    sglang module that imported it by name. Run it in every sglang process
    (e.g. from a sitecustomize.py), before the scheduler creates KV classes.
    """
    from sglang.srt.disaggregation import utils

    original = getattr(utils.get_kv_class, "_kvbridge_original", utils.get_kv_class)

    def get_kv_class(transfer_backend: Any, class_type: Any) -> Any:
        if str(getattr(transfer_backend, "value", transfer_backend)) == backend:
            ours = CLASSES.get(str(getattr(class_type, "value", class_type)))
            if ours is not None:
                return ours
        return original(transfer_backend, class_type)

    get_kv_class._kvbridge_original = original  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):
        fn = getattr(module, "get_kv_class", None) if name.startswith("sglang") else None
        if fn is not None and (fn is original or
                               getattr(fn, "_kvbridge_original", None) is original):
            module.get_kv_class = get_kv_class
