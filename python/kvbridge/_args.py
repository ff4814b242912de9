"""KVArgs, ParallelLayout and KVConfig: what a KVManager is built from.

Buffers are integer addresses and byte lengths, as sglang passes them
(``tensor.data_ptr()``). ``buffer_address`` and the ``add_*_buffer`` helpers
accept numpy arrays, any object with the buffer protocol, or objects with
``data_ptr()`` (torch tensors) and keep the object alive with the args.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Tuple

import numpy as np

from kvbridge._errors import invalid_argument


def buffer_address(obj: Any) -> Tuple[int, int]:
    """(address, length in bytes) of a contiguous buffer."""
    if hasattr(obj, "data_ptr"):
        nbytes = getattr(obj, "nbytes", None)
        if nbytes is None:
            nbytes = obj.numel() * obj.element_size()
        contiguous = getattr(obj, "is_contiguous", lambda: True)()
        if not contiguous:
            raise invalid_argument(f"buffer {type(obj).__name__} is not contiguous")
        return int(obj.data_ptr()), int(nbytes)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise invalid_argument(f"numpy buffer of shape {obj.shape} is not C-contiguous")
        return int(obj.ctypes.data), int(obj.nbytes)
    try:
        view = np.frombuffer(obj, dtype=np.uint8)
    except (TypeError, ValueError) as e:
        raise invalid_argument(f"{type(obj).__name__} is not a buffer: {e}") from None
    return int(view.ctypes.data), int(view.nbytes)


@dataclasses.dataclass
class ParallelLayout:
    """Where a rank sits in its instance (tp is sglang's attention tp)."""

    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    cp_size: int = 1
    cp_rank: int = 0
    # sglang's every-cp-rank transfer: each prefill cp rank sends its share
    # of the pages and decode reads every cp rank (set alike on both servers).
    all_cp_ranks: bool = False
    # Decode context parallelism (decode only, MLA only): this rank holds
    # the tokens at positions p with p % dcp_size == dcp_rank.
    dcp_size: int = 1
    dcp_rank: int = 0


class KVArgs:
    """sglang's KVArgs plus dtype and the rank's ParallelLayout.

    ``KVArgs(tp_size=2, tp_rank=1, page_size=16)`` sets fields and layout
    ranks by keyword; sglang-style attribute assignment works as well.
    """

    _LIST_FIELDS = ("kv_data_ptrs", "kv_data_lens", "kv_item_lens", "aux_data_ptrs",
                    "aux_data_lens", "aux_item_lens", "state_data_ptrs", "state_data_lens",
                    "state_item_lens", "state_buffer_types", "state_slice_dims",
                    "state_slice_outer", "kv_layer_ids", "state_layer_ids",
                    "mla_compression_ratios")

    def __init__(self, **kwargs: Any):
        self.engine_rank = 0
        for name in self._LIST_FIELDS:
            setattr(self, name, [])
        # Per state buffer: the full sizes of its sliced axis's sub-blocks
        # (C++ KVArgs::state_slice_groups); empty: none.
        self.state_slice_groups: List[List[int]] = []
        # The name of each state type (C++ KVArgs::state_type_names); empty: none.
        self.state_type_names: List[str] = []
        self.page_size = 1
        self.kv_head_num = 1
        self.total_kv_head_num = 1
        self.prefill_start_layer = 0
        self.prefill_end_layer: Optional[int] = None
        # sglang's num_draft_entries: the last N kv buffers are a draft
        # (MTP) model's (C++ KVArgs::num_draft_entries).
        self.num_draft_entries = 0
        self.dtype = "bfloat16"
        self.memory_kind = "dram"
        self.gpu_id = 0
        self.ib_device: Optional[str] = None
        self.parallel = ParallelLayout()
        self._keepalive: List[Any] = []
        layout_names = {f.name for f in dataclasses.fields(ParallelLayout)}
        for key, value in kwargs.items():
            if key in layout_names:
                setattr(self.parallel, key, value)
            elif hasattr(self, key) and not key.startswith("_"):
                setattr(self, key, value)
            else:
                raise invalid_argument(f"KVArgs: unknown field '{key}'")

    def _add(self, kind: str, buffer: Any, item_len: int) -> None:
        addr, nbytes = buffer_address(buffer)
        getattr(self, kind + "_data_ptrs").append(addr)
        getattr(self, kind + "_data_lens").append(nbytes)
        getattr(self, kind + "_item_lens").append(int(item_len))
        self._keepalive.append(buffer)

    def add_kv_buffer(self, buffer: Any, item_len: int) -> None:
        """Appends a KV buffer of ``item_len``-byte page slots."""
        self._add("kv", buffer, item_len)

    def add_aux_buffer(self, buffer: Any, item_len: int) -> None:
        self._add("aux", buffer, item_len)

    def add_state_buffer(self, buffer: Any, item_len: int) -> None:
        self._add("state", buffer, item_len)

    def to_dict(self) -> dict:
        d = {name: [int(v) for v in getattr(self, name)] for name in self._LIST_FIELDS}
        d["state_slice_groups"] = [[int(g) for g in groups or []]
                                   for groups in self.state_slice_groups]
        d["state_type_names"] = [str(n) for n in self.state_type_names]
        end = self.prefill_end_layer
        d.update(engine_rank=int(self.engine_rank), page_size=int(self.page_size),
                 kv_head_num=int(self.kv_head_num), total_kv_head_num=int(self.total_kv_head_num),
                 prefill_start_layer=int(self.prefill_start_layer),
                 prefill_end_layer=-1 if end is None else int(end),
                 num_draft_entries=int(self.num_draft_entries), dtype=str(self.dtype),
                 memory_kind=str(self.memory_kind))
        return d


@dataclasses.dataclass
class KVConfig:
    """What sglang's ServerArgs carries for the transfer layer, and our knobs."""

    bootstrap_addr: str = "127.0.0.1:8998"
    # Prefill rank 0 starts a bootstrap server there when none answers.
    start_bootstrap_server: bool = True
    advertise_host: str = "127.0.0.1"
    ucx_tls: str = ""
    same_host_path: str = "auto"  # or "ucx"
    heartbeat_interval_ms: int = 100
    heartbeat_misses: int = 5
    bootstrap_timeout_s: float = 30.0
    waiting_timeout_s: float = 30.0
    transfer_timeout_s: float = 10.0
    metrics_port: int = 0
    # Several decode instances against one prefill: each decode instance's
    # ranks pass the same id, distinct per instance (e.g. the server's
    # dist-init address). Empty: one instance per role.
    instance_id: str = ""
    # Prefill: requests reach dp rank room % dp_size (sglang's
    # load_balance_method "follow_bootstrap_room"); registered for decode.
    follow_bootstrap_room: bool = True
    # Prefill: the server's HTTP API port (sglang's prefill_http_port; 0 =
    # none), for decode's retraction recompute.
    prefill_http_port: int = 0
    # The cluster registry: "" (the bootstrap server at bootstrap_addr) or
    # "etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE]" (docs/registry.md).
    registry: str = ""
    # Keep the list of rooms whose poll() answer changed, for
    # KVManager.take_changed_rooms() (many requests in flight).
    list_room_changes: bool = False

    def to_dict(self) -> dict:
        # "http://host:port/..." as sglang writes URLs: the host:port part.
        addr = str(self.bootstrap_addr).split("://", 1)[-1].split("/", 1)[0]
        return dict(bootstrap_addr=addr,
                    start_bootstrap_server=bool(self.start_bootstrap_server),
                    advertise_host=self.advertise_host, ucx_tls=self.ucx_tls,
                    same_host_path=self.same_host_path,
                    heartbeat_interval_ms=int(self.heartbeat_interval_ms),
                    heartbeat_misses=int(self.heartbeat_misses),
                    bootstrap_timeout_ms=int(self.bootstrap_timeout_s * 1000),
                    waiting_timeout_ms=int(self.waiting_timeout_s * 1000),
                    transfer_timeout_ms=int(self.transfer_timeout_s * 1000),
                    metrics_port=int(self.metrics_port),
                    instance_id=str(self.instance_id),
                    follow_bootstrap_room=bool(self.follow_bootstrap_room),
                    prefill_http_port=int(self.prefill_http_port or 0),
                    registry=str(self.registry),
                    list_room_changes=bool(self.list_room_changes))


_EMPTY = np.zeros(0, dtype=np.int32)


def as_indices(values: Any, what: str, room: Optional[int] = None) -> np.ndarray:
    """An int32 C-contiguous array; a contiguous int32 array passes untouched.

    Other integer arrays and lists are copied after a range check, so no
    index is silently truncated; anything else is InvalidArgumentError
    naming the value.
    """
    if values is None:
        return _EMPTY
    if isinstance(values, np.ndarray) and values.dtype == np.int32 and values.flags.c_contiguous:
        return values if values.ndim == 1 else values.reshape(-1)
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as e:
        raise invalid_argument(f"{what}: {e}", room) from None
    if arr.size == 0:
        return _EMPTY
    if arr.dtype.kind not in "iu":
        raise invalid_argument(f"{what}: {arr.dtype} values such as {arr.flat[0]!r} are not "
                               f"page indices (need integers)", room)
    arr = arr.reshape(-1)
    lo, hi = arr.min(), arr.max()
    if lo < -2**31 or hi >= 2**31:
        bad = lo if lo < -2**31 else hi
        raise invalid_argument(f"{what}: index {int(bad)} does not fit in int32", room)
    return np.ascontiguousarray(arr, dtype=np.int32)
