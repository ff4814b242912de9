"""kvbridge as an sglang transfer backend.

Classes with the names, constructor signatures and attributes of sglang's
``sglang.srt.disaggregation.base.conn`` / ``common.conn`` (docs/sglang.md
lists every one, with the sglang commit it was read at). When sglang is
importable they subclass its base classes, so its isinstance checks hold.
``install()`` makes sglang's ``get_kv_class`` hand out these classes for one
``--disaggregation-transfer-backend`` value; see docs/python.md.

The order is sglang's. Decode: receiver, ``try_ensure_parallel_info`` /
``init(prefill_dp_rank)``, ``poll()`` until WaitingForInput (the handshake
with the prefill ranks is done), pages, ``send_metadata``, ``poll()``.
Prefill: sender, ``poll()`` until WaitingForInput (decode's metadata came),
``pop_decode_prefix_len()``, ``init(pages to send)``, ``send`` per chunk.

Errors surface the sglang way: calls on a failed request log and return,
``poll()`` turns Failed and ``failure_exception()`` raises the
KVTransferError with the record. The receiver's ``poll()`` says Failed only
once no write of the request can land any more (sglang frees the pages as
soon as it reads the exception; it never asks ``quiesced()``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import numbers
import operator
import os
import re
import socket
import sys
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import kvbridge
from kvbridge import _kvbridge
from kvbridge._api import KVManager as _Manager, KVPoll, KVReceiver as _Receiver
from kvbridge._api import KVSender as _Sender, _dp_rank, _room_id
from kvbridge._args import KVArgs, KVConfig, ParallelLayout
from kvbridge._errors import from_record
from kvbridge import _sglang_mla
from kvbridge._sglang_state import state_sharding

log = logging.getLogger("kvbridge.sglang")

# How long a prefill instance whose KV this decode cannot place stays
# refused before its parallel info is asked again.
_REFUSAL_RECHECK_S = 30.0

# Failure causes that say a prefill instance is gone, as sglang's heartbeat
# checker decides it (its bootstrap server stopped answering /health several
# times in a row): the instance's registry is lost (kvbridge's own heartbeat
# to it failed for its whole allowance), or a prefill rank's process is known
# dead (the record's origin is that rank). A rank unreachable or unresponsive
# (a partition to that rank, a stall, a relayed record) says nothing of the
# instance: kvbridge's C++ core fences it and meets it again by incarnation.
_RANK_GONE_CAUSES = frozenset({"peer_exited"})
_REGISTRY_GONE_CAUSES = frozenset({"registry_lost"})

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

try:
    from sglang.srt.disaggregation.common.conn import PrefillServerInfo
except Exception:  # noqa: BLE001
    @dataclasses.dataclass
    class PrefillServerInfo:  # type: ignore[no-redef]
        attn_tp_size: int
        attn_cp_size: int
        dp_size: int
        pp_size: int
        page_size: Optional[int]
        kv_cache_dtype: Optional[str]
        follow_bootstrap_room: bool
        enable_dsa_cache_layer_split: bool = False
        prefill_http_port: Optional[int] = None

try:  # newer sglang: try_ensure_parallel_info says PENDING, READY or FAILED
    from sglang.srt.disaggregation.common.conn import ParallelInfoState
except Exception:  # noqa: BLE001 -- older sglang (or none): it takes a bool
    ParallelInfoState = None  # type: ignore[assignment,misc]

# How long a receiver whose group failed elsewhere waits, in
# failure_exception(), for its own writes to stop before sglang frees pages.
QUIESCE_WAIT_S = 10.0


_MAX_DEPTH = 8  # sglang nests at most three deep (types, arrays, values)


def _ints(values: Any, depth: int = 0) -> List[int]:
    """Every integer of a nested list / tuple / numpy array / tensor, in order."""
    if values is None:
        return []
    if depth > _MAX_DEPTH:
        raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # numpy array or torch tensor (also 0-d)
    if isinstance(values, (list, tuple)):
        out: List[int] = []
        for v in values:
            out.extend(_ints(v, depth + 1))
        return out
    if isinstance(values, bool) or not isinstance(values, (int, np.integer)):
        raise TypeError(f"{type(values).__name__} {values!r:.40} is not an integer index")
    return [int(values)]


def flat_state_indices(state_indices: Any) -> Optional[List[int]]:
    """sglang's state_indices in any of its forms as one list.

    None; one array; or one entry per state type, each None, an array or a
    list of arrays (mamba). Entries are concatenated in state-type order on
    both sides, so positions match.
    """
    if state_indices is None:
        return None
    try:
        out = _ints(state_indices)
    except (TypeError, ValueError, OverflowError) as e:
        raise kvbridge.InvalidArgumentError(
            None, f"state_indices ({type(state_indices).__name__}): {e}") from None
    return out or None


def state_types_of(args: Any) -> List[int]:
    """The state type of each state buffer: sglang's state_data_ptrs is one
    list per state type; a flat list (one type) gives []."""
    ptrs = getattr(args, "state_data_ptrs", None) or []
    if not any(isinstance(p, (list, tuple)) or hasattr(p, "__len__") for p in ptrs):
        return []
    return [t for t, comp in enumerate(ptrs) for _ in (comp or [])]


def state_type_names_of(args: Any) -> List[str]:
    """sglang's state_types (one StateType per state component) as names,
    one per kvbridge state type, when state_data_ptrs has one list per
    component; [] otherwise. Both sides name them alike, so components pair
    by (StateType, occurrence) as sglang pairs them."""
    types = getattr(args, "state_types", None)
    if types is None or len(types) == 0 or not state_types_of(args):
        return []
    ptrs = list(getattr(args, "state_data_ptrs", None) or [])
    if len(types) != len(ptrs):
        raise kvbridge.InvalidArgumentError(
            None, f"KVArgs.state_types: {len(types)} entries for {len(ptrs)} state components")
    names = [str(getattr(t, "name", None) or getattr(t, "value", t)) for t in types]
    for name in names:
        if name.upper() in _STATE_TYPES_NOT_ROWS:
            raise kvbridge.UnimplementedError(
                None, f"KVArgs.state_types: {name}: {_STATE_TYPES_NOT_ROWS[name.upper()]}")
    return [_renamed_state_type(n) for n in names]


def _renamed_state_type(name: str) -> str:
    renamed = _STATE_TYPE_RENAMED.get(name.upper())
    if renamed is None:
        return name
    return renamed if name.isupper() else renamed.lower()


# sglang renamed StateType.C128_STATE to DSV4_REQUEST_STATE (the wire value
# "c128_state" kept): both pair as one component, whichever a side runs.
_STATE_TYPE_RENAMED = {"DSV4_REQUEST_STATE": "C128_STATE"}
# State components whose indices are not rows of their buffers: kvbridge
# would copy the wrong bytes, so they are refused by name.
_STATE_TYPES_NOT_ROWS = {
    "DSA_TAIL": "its indices describe the live slots of one ring row (moved as byte "
                "ranges by sglang), not rows; kvbridge moves state rows only",
}


def state_layer_ids_of(args: Any) -> List[int]:
    """sglang's state_layer_ids (one list per state component, [] for one
    without) as one id per state buffer, -1 for the buffers of a component
    without ids; [] when no component has them."""
    ids = getattr(args, "state_layer_ids", None)
    if ids is None or len(ids) == 0:
        return []
    ptrs = list(getattr(args, "state_data_ptrs", None) or [])
    try:
        if not state_types_of(args):  # one flat list of buffers
            flat = _ints(ids)
            if flat and len(flat) != len(ptrs):
                raise ValueError(f"{len(flat)} ids for {len(ptrs)} state buffers")
            return flat
        if len(ids) != len(ptrs):
            raise ValueError(f"{len(ids)} entries for {len(ptrs)} state components")
        out: List[int] = []
        for i, (comp_ptrs, comp_ids) in enumerate(zip(ptrs, ids)):
            n = len(comp_ptrs or [])
            comp = _ints(comp_ids) if comp_ids is not None else []
            if comp and len(comp) != n:
                raise ValueError(f"entry {i} has {len(comp)} ids for {n} state buffers")
            out.extend(comp or [-1] * n)
    except (TypeError, ValueError, OverflowError) as e:
        raise kvbridge.InvalidArgumentError(
            None, f"KVArgs.state_layer_ids ({type(ids).__name__}): {e}") from None
    return out if any(v >= 0 for v in out) else []


def sectioned_state_indices(state_indices: Any, num_types: int) -> Optional[List[int]]:
    """sglang's per-type state_indices for a manager with `num_types` (> 1)
    state types, each with its own buffers: one section per type, separated
    by -1 (kvbridge's KVArgs.state_buffer_types), so each type's indices
    address its own buffers only. A bare array (not one entry per type)
    addresses every buffer, as with one type."""
    if state_indices is None:
        return None
    per_type = isinstance(state_indices, (list, tuple)) and (
        len(state_indices) == 0 or any(
            v is None or isinstance(v, (list, tuple)) or getattr(v, "ndim", 0) >= 1
            for v in state_indices))
    if not per_type:
        return flat_state_indices(state_indices)
    if len(state_indices) != num_types:
        raise kvbridge.InvalidArgumentError(
            None, f"state_indices has {len(state_indices)} entries, the manager has "
            f"{num_types} state types (one entry per type, None for a type without state)")
    sections = [flat_state_indices(entry) or [] for entry in state_indices]
    if not any(sections):
        return None
    out: List[int] = []
    for t, section in enumerate(sections):
        if t:
            out.append(-1)
        out.extend(section)
    return out


def _sglang_placement() -> Optional[tuple]:
    """(attn_tp_size, attn_tp_rank, attn_dp_size, attn_dp_rank) from sglang."""
    try:
        from sglang.srt.layers import dp_attention as dpa
        dp_size, dp_rank = int(dpa.get_attention_dp_size()), int(dpa.get_attention_dp_rank())
    except Exception:  # noqa: BLE001 -- not inside an sglang scheduler
        return None
    try:
        from sglang.srt.runtime_context import get_parallel
        par = get_parallel()
        return int(par.attn_tp_size), int(par.attn_tp_rank), dp_size, dp_rank
    except Exception:  # noqa: BLE001 -- older sglang
        try:
            return (int(dpa.get_attention_tp_size()), int(dpa.get_attention_tp_rank()),
                    dp_size, dp_rank)
        except Exception:  # noqa: BLE001
            return None


def _sglang_attn_cp() -> Tuple[int, int]:
    """sglang's attention context-parallel (size, rank) (get_parallel());
    (1, 0) outside."""
    try:
        from sglang.srt.runtime_context import get_parallel
        par = get_parallel()
        return (int(getattr(par, "attn_cp_size", 1) or 1),
                int(getattr(par, "attn_cp_rank", 0) or 0))
    except Exception:  # noqa: BLE001 -- not inside an sglang scheduler
        return 1, 0


def _env_flag(name: str) -> bool:
    """An sglang bool env var, read as sglang's envs read it."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _all_cp_ranks(args: Any) -> bool:
    """Whether every prefill cp rank transfers (sglang's
    enable_all_cp_ranks_for_transfer): SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER
    or a hybrid MLA backend. Each cp rank then sends its share of the pages."""
    return (_env_flag("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER")
            or bool(getattr(args, "is_hybrid_mla_backend", False)))


def _check_cp(args: Any, server_args: Any, mode: str, cp: int) -> None:
    """sglang's cp modes that kvbridge does not do, refused by name: the DSA
    layer split (each cp rank sends its layers, not its pages) and a decode
    server with cp > 1 (sglang's decode asserts cp 1). The default (prefill
    cp rank 0 sends, the others are dummy ranks) and every cp rank sending
    its share of the pages work."""
    why = None
    if getattr(server_args, "enable_dsa_cache_layer_split", False):
        why = ("--enable-dsa-cache-layer-split splits the cp ranks' KV by layer, which "
               "kvbridge does not do")
    elif mode == "decode":
        why = "a decode server takes no context parallelism: run it with cp 1"
    if why is not None:
        raise kvbridge.UnimplementedError(
            None, f"attention context parallelism (attn_cp_size {cp}) on the {mode} server: {why}")


def placement(args: Any, server_args: Any, mode: str) -> ParallelLayout:
    """Where this rank sits: sglang's attention tp/dp, or system dp.

    Inside sglang its own dp_attention functions say it. Otherwise: under
    dp-attention prefill's engine_rank is the full tp rank (dp = rank //
    attn_tp) and decode's is already the attention tp rank (dp = its
    system_dp_rank); without dp-attention, dp_size > 1 is system dp and the
    rank's dp is system_dp_rank.
    """
    layout = getattr(args, "parallel", None)
    if isinstance(layout, ParallelLayout):
        return layout
    cp, cp_rank = _sglang_attn_cp()
    if cp > 1:
        _check_cp(args, server_args, mode, cp)
    tp = int(getattr(server_args, "tp_size", 1) or 1)
    dp = int(getattr(server_args, "dp_size", 1) or 1)
    pp = int(getattr(server_args, "pp_size", 1) or 1)
    pp_rank = int(getattr(args, "pp_rank", 0) or 0)
    system_dp_rank = int(getattr(args, "system_dp_rank", 0) or 0)
    rank = int(getattr(args, "engine_rank", 0) or 0)
    found = _sglang_placement()
    if getattr(server_args, "enable_dp_attention", False):
        if found is not None:
            attn_tp, attn_tp_rank, attn_dp, attn_dp_rank = found
        else:
            attn_tp, attn_dp = max(tp // dp, 1), dp
            attn_tp_rank = rank % attn_tp
            attn_dp_rank = rank // attn_tp if rank >= attn_tp else (
                system_dp_rank if mode == "decode" else 0)
        return ParallelLayout(tp_size=attn_tp, tp_rank=attn_tp_rank, dp_size=attn_dp,
                              dp_rank=attn_dp_rank, pp_size=pp, pp_rank=pp_rank,
                              cp_size=cp, cp_rank=cp_rank, all_cp_ranks=_all_cp_ranks(args))
    return ParallelLayout(tp_size=tp, tp_rank=rank % tp, dp_size=dp,
                          dp_rank=system_dp_rank if dp > 1 else 0, pp_size=pp, pp_rank=pp_rank,
                          cp_size=cp, cp_rank=cp_rank, all_cp_ranks=_all_cp_ranks(args))


def to_kvbridge_args(args: Any, server_args: Any, mode: str = "prefill") -> KVArgs:
    """Our KVArgs from sglang's (state lists of lists are flattened)."""
    ours = KVArgs()
    for name in KVArgs._LIST_FIELDS:
        value = getattr(args, name, None)
        try:
            setattr(ours, name, _ints(value))
        except (TypeError, ValueError, OverflowError) as e:
            raise kvbridge.InvalidArgumentError(
                None, f"KVArgs.{name} ({type(value).__name__}): {e}") from None
    for name in ("engine_rank", "page_size", "kv_head_num", "total_kv_head_num",
                 "prefill_start_layer", "prefill_end_layer", "num_draft_entries"):
        if getattr(args, name, None) is not None:
            setattr(ours, name, getattr(args, name))
    ours.state_buffer_types = state_types_of(args)
    ours.state_type_names = state_type_names_of(args)
    ours.state_layer_ids = state_layer_ids_of(args)
    # The newest sglang resolves the dtype per model runner (KVArgs), older
    # ones only had the server argument.
    ours.dtype = str(getattr(args, "kv_cache_dtype_str", None)
                     or getattr(server_args, "kv_cache_dtype", "auto"))
    ours.memory_kind = "vram" if str(getattr(server_args, "device", "cuda")) == "cuda" else "dram"
    ours.parallel = placement(args, server_args, mode)
    _check_layouts_it_cannot_place(args, ours.parallel, mode)
    dcp = int(getattr(args, "dcp_size", 1) or 1)
    if dcp > 1:  # sglang's KVArgs say it (decode; the C++ core checks MLA and the rank)
        ours.parallel = dataclasses.replace(ours.parallel, dcp_size=dcp,
                                            dcp_rank=int(getattr(args, "dcp_rank", 0) or 0))
    ours.state_slice_dims, ours.state_slice_outer, ours.state_slice_groups = state_sharding(
        args, ours.parallel.tp_size)
    _compressed_mla_layer_ids(args, ours, mode)
    return ours


def _compressed_mla_layer_ids(args: Any, ours: KVArgs, mode: str) -> None:
    """A compressed-MLA pool's buffers get their model layers where sglang
    gave none (kvbridge/_sglang_mla.py), so that a pipeline stage's pair
    with decode's; the ratios are published only then."""
    if not ours.mla_compression_ratios:
        return
    if ours.kv_layer_ids:  # sglang numbered them: kept, the ratios not published
        ours.mla_compression_ratios = []
        return
    _sglang_mla.number_buffers(args, ours, ours.mla_compression_ratios,
                               ours.parallel.pp_size, mode)


def _check_layouts_it_cannot_place(args: Any, parallel: ParallelLayout, mode: str) -> None:
    """KV layouts kvbridge would copy to the wrong place, refused by name
    before any rank starts (docs/sglang.md, A9): context parallelism on the
    prefill server's KV (kvbridge moves DCP into a decode server only,
    from a prefill server with dcp 1)."""
    dcp = int(getattr(args, "dcp_size", 1) or 1)
    if dcp > 1 and mode != "decode":
        raise kvbridge.UnimplementedError(
            None, f"dcp_size {dcp} on the {mode} server: kvbridge moves decode context "
            "parallelism into a decode server only, from a prefill server with dcp_size 1; "
            "run the prefill server with --dcp-size 1")


def _wildcard_to_loopback(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def synced_bootstrap_port(server_args: Any) -> int:
    """A prefill rank's bootstrap port, as sglang's
    _sync_bootstrap_port_across_nodes makes it: under multi-node prefill
    (dist_init_addr set, nnodes > 1) world rank 0's, broadcast to every
    rank (a launcher may reserve another free port on each host, and the
    other nodes' ranks would register at a port nothing listens on);
    otherwise this rank's own. Every prefill rank calls it once, at
    construction, as sglang's managers do (a collective)."""
    local = int(getattr(server_args, "disaggregation_bootstrap_port", 8998))
    if not getattr(server_args, "dist_init_addr", None) or \
            int(getattr(server_args, "nnodes", 1) or 1) <= 1:
        return local
    try:
        from sglang.srt.distributed import get_world_group
    except Exception:  # noqa: BLE001 -- no sglang: nothing to broadcast with
        log.warning("multi-node prefill without sglang's world group: registering at this "
                    "rank's own bootstrap port %d", local)
        return local
    synced = int(get_world_group().broadcast_object(local, src=0))
    if synced != local:
        log.info("bootstrap port %d of world rank 0 used instead of this rank's %d", synced,
                 local)
    return synced


def bootstrap_target(server_args: Any, port: Optional[int] = None) -> str:
    """Where a prefill rank registers (sglang's register_to_bootstrap): the
    dist-init host under multi-node, else the server's host; and the
    disaggregation bootstrap port (`port`: synced_bootstrap_port's)."""
    if port is None:
        port = getattr(server_args, "disaggregation_bootstrap_port", 8998)
    dist = getattr(server_args, "dist_init_addr", None)
    if dist and int(getattr(server_args, "nnodes", 1) or 1) > 1:
        host = str(dist).rsplit(":", 1)[0].strip("[]")
    else:
        host = _wildcard_to_loopback(str(getattr(server_args, "host", None) or ""))
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def advertise_host(server_args: Any) -> str:
    """The address other ranks reach this one at: sglang's own choice
    (get_local_ip_auto, as its rank_ip) inside sglang, else the server's
    host, with a wildcard bind address made loopback."""
    for module in ("sglang.srt.utils.network", "sglang.srt.utils"):
        try:
            return str(__import__(module, fromlist=["get_local_ip_auto"]).get_local_ip_auto())
        except Exception:  # noqa: BLE001 -- not inside sglang
            continue
    return _wildcard_to_loopback(str(getattr(server_args, "host", None) or ""))


def _norm_addr(addr: Any) -> str:
    """One spelling of a bootstrap address ("host:port", a URL's scheme and
    path dropped): the port without leading zeros, an IP address in its
    standard form (inet_aton's short forms too: 127.1), a host name in lower
    case, localhost and 0.0.0.0 as 127.0.0.1. Decode keeps one kvbridge
    manager per spelling: a second spelling of one prefill instance (from a
    router) made a second manager, a new incarnation of the same decode rank
    that the prefill ranks then fenced the first one for, failing its
    requests in flight (hostile-input audit 2)."""
    addr = ("" if addr is None else str(addr)).split("://", 1)[-1].split("/", 1)[0].strip()
    host, sep, port = addr.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or (":" in host and
                                                               not host.startswith("[")):
        return addr  # no port, or not host:port: refused where it is used
    if host.startswith("["):  # only an IPv6 address goes in brackets
        try:
            ip = ipaddress.ip_address(host[1:-1]) if host.endswith("]") else None
        except ValueError:
            ip = None
        if ip is None or ip.version != 6:
            return addr
    else:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            try:  # inet_aton's short forms (127.1, 0x7f.1), and nothing else
                numeric = re.fullmatch(r"[0-9a-fA-FxX.]+", host) is not None
                ip = ipaddress.ip_address(socket.inet_ntoa(socket.inet_aton(host))) if numeric \
                    else None
            except (OSError, ValueError):
                ip = None
    if ip is None:
        host = host.lower()
        host = "127.0.0.1" if host == "localhost" else host
    elif ip.version == 6:
        host = f"[{ip.compressed}]"
    else:
        host = "127.0.0.1" if ip.compressed == "0.0.0.0" else ip.compressed
    return f"{host}:{int(port)}"


# sglang's defaults for its two phase timeouts (its environ.py: both 300 s).
_SGLANG_PHASE_TIMEOUT_S = 300
# The largest such value taken (about 115 days): far beyond any deadline
# meant, and far below what overflows a deadline in nanoseconds.
_MAX_SGLANG_INT = 10_000_000


def _env_seconds_or(name: str, default: int) -> int:
    """A positive whole-number sglang variable (as its EnvInt reads it);
    `default` where unset, and where unreadable or not positive (logged: a
    typo must not turn a deadline off or make a pool empty)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        log.warning("%s=%r is not a positive whole number: using %d", name, raw[:40], default)
        return default
    if value > _MAX_SGLANG_INT:
        log.warning("%s=%d is above %d: using %d", name, value, _MAX_SGLANG_INT, _MAX_SGLANG_INT)
        return _MAX_SGLANG_INT
    return value


def _env_seconds(name: str) -> int:
    """An sglang phase timeout (whole seconds); 300 where unset or bad."""
    return _env_seconds_or(name, _SGLANG_PHASE_TIMEOUT_S)


def phase_timeouts(mode: str) -> Tuple[float, float]:
    """(bootstrap, waiting) timeouts in seconds for a rank of `mode`, as
    sglang times the same phases: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
    bounds finding the prefill instance and, on prefill, a sender's wait
    for decode's metadata (sglang's sender poll); on decode,
    SGLANG_DISAGGREGATION_WAITING_TIMEOUT bounds the waits after the
    handshake (sglang's receiver). Peer deaths are detected by heartbeats
    in well under a second whatever these say."""
    bootstrap = float(_env_seconds("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"))
    if mode == "prefill":
        return bootstrap, bootstrap
    return bootstrap, float(_env_seconds("SGLANG_DISAGGREGATION_WAITING_TIMEOUT"))


def follows_bootstrap_room(server_args: Any) -> bool:
    """Whether prefill requests reach dp rank room % dp_size: sglang's
    load_balance_method "follow_bootstrap_room", which its ServerArgs also
    makes of "round_robin" and "auto" in prefill mode (backward compatibility);
    any other method (e.g. "total_requests") routes freely."""
    method = getattr(server_args, "load_balance_method", None) or "auto"
    method = str(getattr(method, "value", method))
    return method in ("follow_bootstrap_room", "round_robin", "auto")


def _force_query_prefill_dp_rank() -> bool:
    """sglang's SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK (a bool env)."""
    return _env_flag("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK")


class KVBridgeKVManager(BaseKVManager):
    """sglang's KVManager(args, disaggregation_mode, server_args, is_mla_backend).

    Prefill: one kvbridge manager, registered at construction. Decode: one
    per prefill instance (bootstrap address), made by
    try_ensure_parallel_info, which also fills ``prefill_info_table``; both
    are evicted when a request's failure record says that instance is gone
    (its registry lost, or a prefill rank exited: _handle_node_failure, as
    sglang's heartbeat evicts), and asked again by the next
    try_ensure_parallel_info, which makes a new kvbridge manager (a new
    incarnation of this decode rank; see _handle_node_failure).
    """

    def __init__(self, args: Any, disaggregation_mode: Any, server_args: Any,
                 is_mla_backend: Optional[bool] = False):
        self.kv_args = args
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.is_mla_backend = bool(is_mla_backend)
        self._mode = str(getattr(disaggregation_mode, "value", disaggregation_mode)).lower()
        self._args = to_kvbridge_args(args, server_args, self._mode)
        if self._args.parallel.dcp_size > 1 and not self.is_mla_backend:
            # sglang refuses this topology too ("Unsupported PD DCP topology").
            raise kvbridge.UnimplementedError(
                None, f"dcp_size {self._args.parallel.dcp_size} without MLA on the decode "
                "server: decode context parallelism is moved for an MLA cache only")
        self.kv_item_lens_sum = sum(self._args.kv_item_lens)
        self.state_item_lens_sum = sum(self._args.state_item_lens)
        self.bootstrap_host = getattr(server_args, "host", None) or "127.0.0.1"
        self.bootstrap_port = getattr(server_args, "disaggregation_bootstrap_port", 8998)
        if self._mode == "prefill":
            self.bootstrap_port = synced_bootstrap_port(server_args)
        self.attn_tp_size = self._args.parallel.tp_size
        self.attn_tp_rank = self._args.parallel.tp_rank
        self.attn_dp_size = self._args.parallel.dp_size
        self.attn_dp_rank = self._args.parallel.dp_rank
        self.attn_cp_size = self._args.parallel.cp_size
        self.attn_cp_rank = self._args.parallel.cp_rank
        # sglang's cp attributes (its prefill scheduler skips a dummy cp
        # rank's transfer metrics): by default only cp rank 0 sends.
        self.enable_all_cp_ranks_for_transfer = self._args.parallel.all_cp_ranks
        self.is_dummy_cp_rank = (self._mode == "prefill" and self.attn_cp_rank != 0
                                 and not self.enable_all_cp_ranks_for_transfer)
        # Decode DCP (MLA) is moved token by token; prefill DCP is refused (A9).
        self.supports_dcp_transfer = True
        # Newer sglang decodes may hold a failed request's pages until every
        # prefill rank acknowledges a drain (deferred KV release). kvbridge
        # needs no such hold: a receiver reports Failed only once quiesced.
        self.enable_deferred_decode_kv_release = False
        self.supports_deferred_decode_kv_release = False
        # Staging (mooncake's own buffers for gathering head slices) is off,
        # as in sglang's common manager: kvbridge writes each slice in place.
        self.enable_staging = False
        # Newer sglang holds a failed request's pages until the transfer has
        # drained where a backend asks for it (mooncake does); kvbridge's
        # receiver says Failed only once quiesced (poll_settled), so nothing
        # is left to drain.
        self.requires_transfer_drain = False
        # Newer sglang: a runtime prefill/decode role switch asks the backend
        # (mooncake's says yes); kvbridge does not switch, and sglang then
        # refuses the switch with its reason.
        self.supports_role_switch = False
        # Newer sglang's decode host receive (KV into host memory above a
        # threshold): sglang refuses to start it with a backend saying no.
        self.supports_host_destination = False
        # DSpark (a newer sglang's hidden-state streaming for speculative
        # decoding), read by its prefill per room: kvbridge streams none.
        self.req_to_dspark_hidden_meta: Dict[int, Any] = {}
        self.pp_rank = self._args.parallel.pp_rank
        self.prefill_info_table: Dict[str, Any] = {}
        self._cores: Dict[str, _Manager] = {}
        # sglang's connection_lock: guards prefill_info_table's and _cores'
        # changes, the epochs and the receivers' registration; taken by the
        # scheduler's thread and by any other that evicts or fetches.
        self.connection_lock = threading.Lock()
        # Per prefill instance (normalized address): how many times its
        # parallel info was evicted (sglang's _parallel_info_epochs). A
        # fetch that began under an older epoch is not published, and a
        # failure seen by a receiver of an older epoch evicts nothing.
        self._parallel_info_epochs: Dict[str, int] = {}
        # Closes evicted (or unpublished) kvbridge managers off the
        # scheduler's thread, one at a time (_close_off_thread); close()
        # waits for the ones still pending. Made at the first eviction.
        self._close_pool: Any = None
        # Prefill instances whose KV cannot be placed here (_args_for
        # refused them): (when, why). Asked again only after
        # _REFUSAL_RECHECK_S (a restart there may change its layout); meanwhile
        # try_ensure_parallel_info says False at once and a receiver for
        # that address fails with the reason.
        self._refusals: Dict[str, Tuple[float, kvbridge.KVTransferError]] = {}
        self._core: Optional[_Manager] = None
        # Made at the first retraction or dp-rank query (_ensure_prefill_recompute_executor).
        self._recompute_pool: Any = None
        self._closed = False
        # Rooms by id, for sglang's record_failure/update_status (kept only
        # while sglang holds the sender or receiver), and reasons recorded
        # for rooms not (yet) failed by update_status, at most 4096.
        self._rooms: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self._recorded: Dict[int, str] = {}
        self._recompute_lock = threading.Lock()
        if self._mode == "prefill":
            self.register_to_bootstrap()

    def state_indices(self, state_indices: Any) -> Optional[List[int]]:
        """sglang's state_indices as kvbridge's list: flat with one state
        type; with several, one section per type (sectioned_state_indices)."""
        types = self._args.state_buffer_types
        num_types = max(types) + 1 if types else 1
        if num_types <= 1:
            return flat_state_indices(state_indices)
        try:
            return sectioned_state_indices(state_indices, num_types)
        except kvbridge.KVTransferError as e:
            raise type(e)(None, f"state_indices: {e.failure_reason}") from None

    def _config(self, bootstrap_addr: str) -> KVConfig:
        bootstrap_s, waiting_s = phase_timeouts(self._mode)
        return KVConfig(bootstrap_addr=bootstrap_addr, start_bootstrap_server=False,
                        bootstrap_timeout_s=bootstrap_s, waiting_timeout_s=waiting_s,
                        advertise_host=advertise_host(self.server_args),
                        instance_id=self._instance_id(self.bootstrap_host),
                        follow_bootstrap_room=follows_bootstrap_room(self.server_args),
                        prefill_http_port=int(getattr(self.server_args, "port", 0) or 0)
                        if self._mode == "prefill" else 0)

    def _instance_id(self, host: str) -> str:
        """Decode: the server's own address, the same on all its ranks and
        different for every decode server sharing a prefill instance."""
        if self._mode != "decode":
            return ""
        port = getattr(self.server_args, "port", None)
        ident = f"{host}:{port}" if port is not None else host
        return re.sub(r"[^A-Za-z0-9._:-]", "_", ident)[:64]

    def register_to_bootstrap(self, bootstrap_addr: Optional[str] = None) -> None:
        """Prefill: creates the rank's manager, which registers with bootstrap."""
        if self._core is None:
            addr = bootstrap_addr or bootstrap_target(self.server_args, self.bootstrap_port)
            self._warn_of_rust_routes(addr)
            self._core = _Manager(self._args, self._mode, self._config(_norm_addr(addr)),
                                  self.is_mla_backend)

    def _warn_of_rust_routes(self, addr: str) -> None:
        """The newest sglang under SGLANG_RUST_SERVER with attention dp > 1
        registers every rank with each dp leader's Rust HTTP server
        (KVArgs.rust_http_port) instead of the bootstrap server; kvbridge
        does not (docs/sglang.md): said once per rank, at registration."""
        rust_port = getattr(self.kv_args, "rust_http_port", None)
        attn_dp = bool(getattr(self.server_args, "enable_dp_attention", False))
        if rust_port is not None and attn_dp and self.attn_dp_size > 1:
            log.warning("sglang's Rust server (rust_http_port %s) does not take this rank's "
                        "registration: kvbridge registers it with the bootstrap server at %s "
                        "only; give decode that bootstrap address", rust_port, addr)

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> Any:
        """Decode: one attempt (bounded by a 5 s timeout) to learn the
        prefill instance at `bootstrap_addr` and make its manager. Says so
        as the sglang calling it expects: True/False, or, where sglang has
        ParallelInfoState, READY/FAILED (every unsuccessful attempt is FAILED,
        so sglang's retry budget bounds it; an attempt is never left
        PENDING, as it is done when this returns)."""
        return _info_state(self._ensure_parallel_info(bootstrap_addr))

    def record_failure(self, bootstrap_room: int, failure_reason: str) -> None:
        """sglang's CommonKVManager.record_failure, which some of its
        versions call on their own error paths before update_status."""
        if len(self._recorded) >= 4096 and bootstrap_room not in self._recorded:
            self._recorded.pop(next(iter(self._recorded)))
        self._recorded[bootstrap_room] = str(failure_reason)

    def update_status(self, bootstrap_room: int, status: Any) -> None:
        """sglang's CommonKVManager.update_status as its error paths use it:
        Failed fails that room (the reason record_failure gave, else the
        scheduler's); other states are kvbridge's own to set, not taken."""
        if status != KVPoll.Failed:
            return
        reason = self._recorded.pop(bootstrap_room, "the scheduler marked the request failed")
        room = self._rooms.get(bootstrap_room)
        if room is not None:
            room._fail_for_scheduler(reason)

    def supports_dspark_hidden_streaming(self) -> bool:
        """DSpark hidden-state streaming: not carried by kvbridge."""
        return False

    def has_parallel_info(self, bootstrap_addr: str) -> bool:
        """Decode (newer sglang): whether that prefill instance is known
        here already (no attempt made)."""
        return bootstrap_addr in self.prefill_info_table

    def parallel_info_epoch(self, bootstrap_addr: str) -> int:
        """Decode (newer sglang): how many times the parallel info of the
        prefill instance at `bootstrap_addr` was evicted (_handle_node_failure);
        0 until then. sglang's decode queue discards a prefill dp rank answer
        asked for under another epoch."""
        addr = _norm_addr(bootstrap_addr or "")
        with self.connection_lock:
            return self._parallel_info_epochs.get(addr, 0)

    def _handle_node_failure(self, failed_bootstrap_addr: str, epoch: Optional[int] = None,
                             why: Optional[str] = None) -> bool:
        """sglang's CommonKVManager._handle_node_failure: the prefill instance
        at `failed_bootstrap_addr` is gone. Evicts its parallel info
        (prefill_info_table) and its kvbridge manager (sglang's connection
        pool: the next try_ensure_parallel_info asks the instance again and
        makes a new manager, so a restart with another shape is seen with
        it), and bumps its epoch. Requests for it that arrived before and
        were not initialized yet fail (sglang fails the rooms it tracked for
        the address; their prefill dp rank may come from the info evicted);
        those already handed to the evicted kvbridge manager are its to
        finish or fail, with the record of what happened: its handle is
        closed at once on a worker thread (_close_off_thread), and the C++
        manager goes then or when the last room made from it is cleared,
        publishing the failure records it still holds as it goes (sglang
        clears a failed request's rooms right after failure_exception, and
        the group's other ranks wait for those records).

        The next try_ensure_parallel_info makes a new kvbridge manager for
        this decode rank: a new incarnation of the same process. Requests
        still in flight on the evicted manager to prefill ranks of that
        instance that are still alive may then fail, as those ranks meet the
        new incarnation and fail the old one's rooms ("rejoined as
        incarnation ... (same process)"). sglang's own _handle_node_failure
        fails every unfinished room of the address at eviction, so no
        request sglang would have kept is lost by it.

        `epoch`: evict only if the instance is still at that epoch (a
        failure seen under an older one says nothing of the instance known
        now). Returns whether it evicted."""
        addr = _norm_addr(failed_bootstrap_addr or "")
        with self.connection_lock:
            current = self._parallel_info_epochs.get(addr, 0)
            if epoch is not None and epoch != current:
                return False
            self._parallel_info_epochs[addr] = current + 1
            for key in [k for k in self.prefill_info_table if _norm_addr(k) == addr]:
                del self.prefill_info_table[key]
            core = self._cores.pop(addr, None)
            waiting = [r for r in list(self._rooms.values())
                       if isinstance(r, KVBridgeKVReceiver) and r._addr == addr
                       and r._epoch == current and r._r is None]
        reason = (f"Lost connection with prefill instance (bootstrap_addr: "
                  f"{failed_bootstrap_addr})" + (f": {why}" if why else ""))
        for rx in waiting:
            rx._fail_early(reason)
        log.error("%s; its parallel info evicted (epoch %d), %d requests not initialized yet "
                  "failed", reason, current + 1, len(waiting))
        if core is not None:
            self._close_off_thread(core)
        return True

    def _close_off_thread(self, core: _Manager) -> None:
        """Closes `core`'s handle on a worker thread: with no room made from
        it left, the C++ manager is destroyed then, which may block for a
        few seconds while its transport stops (never on sglang's scheduler
        thread); otherwise it goes when the last of them is cleared. Each
        manager is closed once, by one thread; close() waits for those still
        pending. After close(), closes it here."""
        with self._recompute_lock:
            if not self._closed:
                if self._close_pool is None:
                    import concurrent.futures
                    self._close_pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="kvbridge-evicted-close")
                self._close_pool.submit(self._close_logged, core)
                return
        self._close_logged(core)

    @staticmethod
    def _close_logged(core: _Manager) -> None:
        try:
            core.close()
        except Exception:  # noqa: BLE001 -- a worker's: logged, never lost silently
            log.exception("closing an evicted kvbridge manager failed")

    def _note_failure(self, bootstrap_addr: str, epoch: int,
                      error: kvbridge.KVTransferError) -> None:
        """A receiver for `bootstrap_addr` (made under `epoch`) failed with
        `error`: if its record says the instance's registry is lost
        (registry_lost) or a prefill rank of it exited (peer_exited, origin
        a prefill rank), the instance is evicted (_handle_node_failure). A
        prefill rank unreachable or unresponsive evicts nothing."""
        record = error.record or {}
        cause = record.get("cause")
        origin = record.get("origin") or {}
        if cause in _RANK_GONE_CAUSES and origin.get("role") == "prefill":
            why = f"{origin.get('name')} (pid {origin.get('pid')}): {cause}"
        elif cause in _REGISTRY_GONE_CAUSES and record.get("mechanism") != "bootstrap lookup":
            # Not a registry that answered a lookup wrongly (a 429 from a
            # proxy): it is there; evicting would make a new decode manager,
            # whose incarnation gets this one fenced.
            why = str(cause)
        else:
            return
        self._handle_node_failure(bootstrap_addr, epoch=epoch, why=why)

    def _ensure_prefill_recompute_executor(self) -> Any:
        """Newer sglang's decode submits its dp-rank queries (sglang's own
        query_prefill_dp_ranks) to this shared pool every step, as it does
        the retraction's re-bootstrap; made at the first call,
        SGLANG_DISAGGREGATION_THREAD_POOL_SIZE threads (16), as sglang's."""
        import concurrent.futures
        with self._recompute_lock:
            if self._closed:  # an answer, never a new pool: nothing would shut it down
                return _ClosedExecutor()
            if self._recompute_pool is None:
                workers = _env_seconds_or("SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", 16)
                self._recompute_pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=workers, thread_name_prefix="kvbridge-rebootstrap")
            return self._recompute_pool

    def teardown(self) -> None:
        """sglang's role switch frees a backend with it; kvbridge says it
        does not switch (supports_role_switch), and this only closes."""
        self.close()

    def submit_dp_rank_query(self, bootstrap_addr: str,
                             bootstrap_rooms: List[int]) -> Any:
        """Decode (newer sglang): query_prefill_dp_ranks off the scheduler's
        thread; a concurrent.futures.Future of {str(room): dp rank} (rooms
        not registered yet are absent; {} when the registry cannot be asked,
        logged). Runs on the manager's shared executor, as the newest
        sglang submits these itself; after close() the future is done with
        {} (an answer, never an exception in sglang's loop)."""
        return self._ensure_prefill_recompute_executor().submit(
            KVBridgeKVReceiver.query_prefill_dp_ranks, bootstrap_addr, list(bootstrap_rooms))

    def _fresh_refusal(self, addr: str) -> Optional[kvbridge.KVTransferError]:
        """Why the prefill instance at `addr` was refused, while that is
        under _REFUSAL_RECHECK_S old; None otherwise."""
        refused = self._refusals.get(addr)
        if refused is None or time.monotonic() - refused[0] >= _REFUSAL_RECHECK_S:
            return None
        return refused[1]

    def _ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        if bootstrap_addr in self.prefill_info_table:
            return True
        addr = _norm_addr(bootstrap_addr)
        if self._closed or self._fresh_refusal(addr) is not None:
            return False
        epoch = self.parallel_info_epoch(addr)
        try:
            info = _kvbridge.prefill_info(addr, 5.0)
        except kvbridge.UnavailableError as e:
            # 503 until every prefill rank registered (sglang's server too).
            log.info("prefill parallel info from %s not ready: %s", bootstrap_addr, e)
            return False
        except kvbridge.KVTransferError as e:
            log.error("prefill parallel info from %s: %s", bootstrap_addr, e)
            return False
        if not info["complete"]:
            log.info("prefill at %s: %d of %d ranks registered", bootstrap_addr,
                     info["ranks_registered"], info["ranks_expected"])
            return False
        page_size = info["page_size"] or None
        if page_size is not None and page_size != int(self._args.page_size):
            raise RuntimeError(f"Page size mismatch: prefill server has page_size={page_size}, "
                               f"but decode server has page_size={self._args.page_size}.")
        made: Optional[_Manager] = None
        if addr not in self._cores:
            try:
                args = self._args_for(info)
            except kvbridge.KVTransferError as e:
                # Refused by name (docs/sglang.md, A9): logged once per
                # check, never raised into sglang's decode loop, which would
                # stop on it; its receivers fail with it (core()).
                log.error("prefill at %s: cannot place its KV here: %s", bootstrap_addr, e)
                self._refusals[addr] = (time.monotonic(), e)
                return False
            self._refusals.pop(addr, None)
            try:
                made = _Manager(args, self._mode, self._config(addr), self.is_mla_backend)
            except kvbridge.KVTransferError as e:  # logged, never into sglang's loop
                # As a refusal: its receivers fail with it (core()).
                log.error("prefill at %s: no kvbridge manager for it: %s", bootstrap_addr, e)
                self._refusals[addr] = (time.monotonic(), e)
                return False
        with self.connection_lock:
            # Evicted while this was asked (sglang: a fetch that resolves
            # after the eviction must not republish a dead prefill).
            current = self._parallel_info_epochs.get(addr, 0) == epoch and not self._closed
            if current:
                if made is not None and addr not in self._cores:
                    self._cores[addr], made = made, None
                self.prefill_info_table[bootstrap_addr] = PrefillServerInfo(
                    attn_tp_size=info["attn_tp_size"], attn_cp_size=info["attn_cp_size"] or 1,
                    dp_size=info["dp_size"], pp_size=info["pp_size"], page_size=page_size,
                    kv_cache_dtype=info["kv_cache_dtype"] or None,
                    follow_bootstrap_room=info["follow_bootstrap_room"],
                    prefill_http_port=info.get("prefill_http_port"))
        if made is not None:  # not published: evicted meanwhile, or another thread's won
            self._close_off_thread(made)
        if not current:
            log.info("prefill at %s was evicted while its parallel info was asked (or this "
                     "manager closed); not kept", bootstrap_addr)
        return current

    def _args_for(self, info: dict) -> KVArgs:
        """Decode's args with what its KVArgs left unset taken from prefill:
        the kv head counts, and a compressed-MLA pool's layer numbering
        (sglang gives decode no mla_compression_ratios)."""
        total = info.get("total_kv_heads")
        heads = getattr(self.kv_args, "total_kv_head_num", None) is None and total is not None
        ratios = list(info.get("mla_compression_ratios") or [])
        numbering = bool(ratios) and not self._args.kv_layer_ids
        if not heads and not numbering:
            return self._args
        args = to_kvbridge_args(self.kv_args, self.server_args, self._mode)
        if heads:
            args.total_kv_head_num = int(total)
            tp = max(int(args.parallel.tp_size), 1)
            args.kv_head_num = 1 if info.get("is_mla") else max(int(total) // tp, 1)
        if numbering:
            _sglang_mla.number_buffers(self.kv_args, args, ratios, args.parallel.pp_size,
                                       self._mode)
        return args

    def core(self, bootstrap_addr: Optional[str] = None) -> _Manager:
        """The kvbridge manager: prefill's, or decode's for that address."""
        if self._mode == "prefill":
            return self._core  # type: ignore[return-value]
        addr = _norm_addr(bootstrap_addr or "")
        if addr not in self._cores and not self._ensure_parallel_info(bootstrap_addr or ""):
            if self._closed:
                raise kvbridge.FailedPreconditionError(None, "KVManager is closed")
            e = self._fresh_refusal(addr)
            if e is not None:  # a new one each time: no traceback kept across requests
                raise type(e)(e.bootstrap_room, e.failure_reason, record=e.record)
            raise kvbridge.UnavailableError(
                None, f"prefill instance at {bootstrap_addr} not reachable or not fully "
                f"registered yet")
        core = self._cores.get(addr)
        if core is None:  # evicted since (another thread's _handle_node_failure)
            raise kvbridge.UnavailableError(
                None, f"prefill instance at {bootstrap_addr} was lost (evicted)")
        return core

    def submit_prefill_recompute(self, kv_receiver: Any, payload: dict) -> None:
        """sglang's PD retraction re-bootstrap: the decode scheduler made a new
        receiver for the retracted request (same room), sent its metadata,
        and asks here that the prefill server recompute the request: one
        POST of `payload` to http://<bootstrap host>:<prefill_http_port>/generate,
        from the group's leader only (attention tp rank 0, pp rank 0), off
        the scheduler's thread. The prefill server treats it as a new request
        for that room, whose sender meets this receiver. Any failure (no
        port registered, an HTTP error, no answer within
        SGLANG_DISAGGREGATION_WAITING_TIMEOUT) aborts the receiver with the
        reason (poll() says Failed; failure_exception() tells why)."""
        if self.attn_tp_rank != 0 or self.pp_rank != 0:
            return
        bootstrap_addr = getattr(kv_receiver, "bootstrap_addr", None)
        info = self.prefill_info_table.get(bootstrap_addr)
        port = getattr(info, "prefill_http_port", None)
        if info is None:
            # Its parallel info (the port with it) is gone: evicted, or
            # never fetched (sglang fetches it before any receiver's init).
            lost = self.parallel_info_epoch(bootstrap_addr or "") > 0
            self._fail_recompute(
                kv_receiver, "PD retract rebootstrap could not resolve the prefill /generate "
                f"URL: the prefill instance at {bootstrap_addr} "
                + ("was lost (its parallel info evicted)" if lost
                   else "is not known (no parallel info fetched)"))
            return
        if not port:
            self._fail_recompute(kv_receiver, "PD retract rebootstrap could not resolve the "
                                 "prefill /generate URL: the prefill server registered no "
                                 "HTTP port")
            return
        host = _norm_addr(kv_receiver.bootstrap_addr).rsplit(":", 1)[0]
        url = f"http://{host}:{int(port)}/generate"
        self._ensure_prefill_recompute_executor().submit(self._run_recompute, kv_receiver, url,
                                                         dict(payload))

    def _run_recompute(self, kv_receiver: Any, url: str, payload: dict) -> None:
        import urllib.error
        import urllib.request
        rid = payload.get("rid")
        timeout = float(_env_seconds("SGLANG_DISAGGREGATION_WAITING_TIMEOUT"))
        req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as answer:
                answer.read()
        except urllib.error.HTTPError as e:
            self._fail_recompute(kv_receiver, f"PD retract rebootstrap {url} failed for rid={rid} "
                                 f"(status={e.code})")
        except Exception as e:  # noqa: BLE001 -- any transport error fails the request
            self._fail_recompute(kv_receiver, f"PD retract rebootstrap {url} request errored "
                                 f"for rid={rid}: {e}")

    def _fail_recompute(self, kv_receiver: Any, reason: str) -> None:
        log.error("room %s: %s", getattr(kv_receiver, "bootstrap_room", None), reason)
        fail = getattr(kv_receiver, "fail", None)
        if fail is not None:
            fail(reason)
        else:
            kv_receiver.abort()

    def close(self) -> None:
        with self._recompute_lock:
            self._closed = True
            pool, self._recompute_pool = self._recompute_pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        with self.connection_lock:  # taken out: an eviction now finds none to close
            cores = list(self._cores.values())
            self._cores.clear()
        if self._close_pool is not None:  # evicted managers whose close is pending
            self._close_pool.shutdown(wait=True)
        for m in [self._core, *cores]:
            if m is not None:
                m.close()


class _ClosedExecutor:
    """A closed manager's executor: what is submitted does not run; its
    future is done at once with {} (sglang's dp-rank queries read that as
    "not known yet")."""

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import concurrent.futures
        done: Any = concurrent.futures.Future()
        done.set_result({})
        return done

    def shutdown(self, wait: bool = True, **kwargs: Any) -> None:
        return None


def _info_state(known: bool) -> Any:
    """try_ensure_parallel_info's answer in the form the sglang present
    takes: its ParallelInfoState where it has one, else a bool. Looked up
    again while not found (an import that failed once, e.g. while sglang
    was still importing, must not leave a newer sglang with bools)."""
    global ParallelInfoState
    if ParallelInfoState is None:
        try:
            from sglang.srt.disaggregation.common.conn import ParallelInfoState as found
            ParallelInfoState = found  # type: ignore[misc]
        except Exception:  # noqa: BLE001 -- older sglang, or none
            return known
    return ParallelInfoState.READY if known else ParallelInfoState.FAILED


def _conclude(poll: int) -> Optional[KVPoll]:
    return KVPoll(poll) if poll in (KVPoll.Failed, KVPoll.Success) else None


def _is_room_id(bootstrap_room: Any) -> bool:
    try:
        _room_id(bootstrap_room)
        return True
    except kvbridge.KVTransferError:
        return False


class _RefusedRoom:
    """In place of a kvbridge sender whose request cannot be one (its room id
    is none): Failed from the start with `reason`; everything else a no-op."""

    class _Impl:
        @staticmethod
        def decode_prefix_pages() -> int:
            return 0

        @staticmethod
        def timing() -> Tuple[Optional[float], Optional[float]]:
            return None, None

    _impl = _Impl()

    def __init__(self, bootstrap_room: Any):
        self.error = kvbridge.InvalidArgumentError(
            None, f"bootstrap_room {bootstrap_room!r} is not a room id (an integer from 0 to "
            "2**64 - 1): this request is refused")

    def poll(self) -> KVPoll:
        return KVPoll.Failed

    def failure(self) -> kvbridge.KVTransferError:
        return self.error

    def failure_exception(self) -> None:
        raise type(self.error)(None, self.error.failure_reason)  # a new one: no traceback kept

    def init(self, *args: Any) -> None:
        pass

    send = reject = init

    def clear(self) -> None:
        pass

    abort = clear


class _Quiet:
    """sglang reports errors through poll()/failure_exception(), not raises."""

    kv_mgr: KVBridgeKVManager
    bootstrap_room: Any

    def _quiet(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except kvbridge.KVTransferError as e:
            log.warning("%s", e)  # the room is Failed now; failure_exception() says why

    def _raise(self, room: Any) -> None:
        try:
            room.failure_exception()
        except kvbridge.KVTransferError as e:
            self._raise_error(e)

    def _raise_error(self, e: kvbridge.KVTransferError) -> None:
        """Raises `e`; is_from_another_rank only for a sibling's failure."""
        e.bootstrap_room = self.bootstrap_room
        me = self.kv_mgr._args.parallel
        e.is_from_another_rank = bool(
            e.origin_role == self.kv_mgr._mode and e.origin_dp == me.dp_rank and
            (e.origin_tp, e.origin_pp) != (me.tp_rank, me.pp_rank))
        if not e.is_from_another_rank:
            log.warning("room %s failed: %s", self.bootstrap_room,
                        json.dumps(e.record) if e.record else e)
        raise e


class KVBridgeKVSender(_Quiet, BaseKVSender):
    def __init__(self, mgr: KVBridgeKVManager, bootstrap_addr: str, bootstrap_room: int,
                 dest_tp_ranks: Optional[List[int]] = None, pp_rank: Optional[int] = None,
                 req_has_disagg_prefill_dp_rank: bool = False):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.bootstrap_server_url = bootstrap_addr
        self.aux_index: Optional[int] = None
        self._prefix_pages = 0
        self._first = True
        self._pages = 0
        self._states = 0
        if not _is_room_id(bootstrap_room):
            # A room id from the router that is none: this request fails
            # (sglang builds its sender outside any try: a raise here would
            # stop its scheduler).
            self._s = _RefusedRoom(bootstrap_room)
            self.poll = self._s.poll
            log.warning("%s", self._s.error)
            return
        self._s = _Sender(mgr.core(), bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank)
        self.poll = self._s.poll  # the C++ method itself: no Python frame per poll
        mgr._rooms[bootstrap_room] = self
        self._route_dp_rank(req_has_disagg_prefill_dp_rank)

    def _route_dp_rank(self, req_has_disagg_prefill_dp_rank: bool) -> None:
        """sglang's sender with dp > 1: decode must learn which dp rank took
        the room. Following the room, the room says it (a request dispatched
        elsewhere is refused, naming both ranks, unless sglang's force-query
        variable is set); otherwise the sender registers it."""
        dp_size = int(getattr(self.kv_mgr.server_args, "dp_size", 1) or 1)
        if dp_size <= 1 or req_has_disagg_prefill_dp_rank or self.kv_mgr.is_dummy_cp_rank:
            return  # as sglang's: a dummy cp rank takes no part in routing
        dp_rank = int(self.kv_mgr.attn_dp_rank)
        if follows_bootstrap_room(self.kv_mgr.server_args):
            if dp_rank == self.bootstrap_room % dp_size:
                return
            if not _force_query_prefill_dp_rank():
                self._s.reject(
                    f"follow_bootstrap_room conflict: dispatched to dp rank {dp_rank} but "
                    f"bootstrap_room {self.bootstrap_room} implies dp rank "
                    f"{self.bootstrap_room % dp_size}; set "
                    "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing")
                return
        try:
            _kvbridge.register_dp_rank(_norm_addr(self.bootstrap_server_url), self.bootstrap_room,
                                       dp_rank)
        except kvbridge.KVTransferError as e:
            # As sglang: logged; decode's query then finds no rank for the
            # room and keeps the request pending until its own timeout.
            log.error("room %s: registering prefill dp rank %s failed: %s", self.bootstrap_room,
                      dp_rank, e)

    @property
    def conclude_state(self) -> Optional[KVPoll]:
        return _conclude(self._s.poll())

    @conclude_state.setter
    def conclude_state(self, state: Any) -> None:
        # Some sglang versions set it on their own error paths (as on their
        # common sender, where it is a plain attribute): Failed fails a room
        # not yet concluded, so poll() and the other ranks agree; a room
        # already concluded keeps its state and record; nothing else is taken.
        if state == KVPoll.Failed:
            self._fail_for_scheduler("the scheduler set conclude_state to Failed")

    def _fail_for_scheduler(self, reason: str) -> None:
        """conclude_state = Failed, or KVManager.update_status(room, Failed):
        fails this room, unless concluded, with the scheduler's reason."""
        if self.conclude_state is None:
            self._s.reject(reason)

    def pop_decode_prefix_len(self) -> int:
        """Tokens decode already holds; valid once poll() said WaitingForInput."""
        self._prefix_pages = max(self._s._impl.decode_prefix_pages(), 0)
        return self._prefix_pages * int(self.kv_mgr._args.page_size)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        """`num_kv_indices`: pages prefill will send (decode's prefix excluded)."""
        self.aux_index = aux_index
        self._prefix_pages = max(self._s._impl.decode_prefix_pages(), 0)
        self._quiet(self._s.init, int(num_kv_indices) + self._prefix_pages, aux_index)

    def send(self, kv_indices: Any, state_indices: Optional[List] = None,
             num_kv_tokens: Optional[int] = None, token_position_offset: int = 0) -> None:
        """One chunk. `num_kv_tokens` (newer sglang: `send(page_indices,
        state_indices, num_kv_tokens=...)`): the tokens this chunk's pages
        hold, the last page possibly partial; kvbridge writes whole pages (a
        partial page's unused rows land in the request's own page), so it
        only checks that the count fits the pages. `token_position_offset`
        (an older base class's third parameter, which no scheduler passed):
        the request's token position of the chunk's first index; 0 means not
        given. kvbridge places chunks in order, so a given offset must be
        where this chunk starts (decode's prefix plus the pages sent so far).
        Either one wrong fails the request (invalid_request, naming the
        values)."""
        refusal = self._chunk_refusal(len(kv_indices), num_kv_tokens, token_position_offset)
        if refusal:
            self._s.reject(refusal)
            log.warning("room %s: %s", self.bootstrap_room, refusal)
            return
        pages = kv_indices  # an int32 array reaches C++ without a copy
        self._pages += len(kv_indices)
        if self._first and self._prefix_pages:
            # kvbridge counts decode's prefix pages and skips them: stand-ins.
            pages = np.concatenate([np.zeros(self._prefix_pages, np.int64),
                                    np.asarray(kv_indices, dtype=np.int64).reshape(-1)])
        self._first = False
        try:
            state = self.kv_mgr.state_indices(state_indices)
        except kvbridge.KVTransferError as e:
            self._s.reject(e.failure_reason)  # poll() says Failed, with this reason
            log.warning("room %s: %s", self.bootstrap_room, e.failure_reason)
            return
        self._states += sum(1 for i in (state or []) if i >= 0)
        self._quiet(self._s.send, pages, state)

    def _chunk_refusal(self, num_pages: int, num_kv_tokens: Optional[int],
                       token_position_offset: int) -> Optional[str]:
        """Why the chunk about to be sent must fail the request, or None."""
        page_size = int(self.kv_mgr._args.page_size)
        if num_kv_tokens is not None:
            if isinstance(num_kv_tokens, bool) or not isinstance(num_kv_tokens, numbers.Integral):
                return f"num_kv_tokens {num_kv_tokens!r} is not an integer"
            n = int(num_kv_tokens)
            if n < 0 or n > num_pages * page_size:
                return (f"num_kv_tokens {n} does not fit the chunk's {num_pages} pages of "
                        f"{page_size} tokens (0 to {num_pages * page_size})")
        expected = (self._prefix_pages + self._pages) * page_size
        if token_position_offset and int(token_position_offset) != expected:
            return (f"token_position_offset {int(token_position_offset)} is not where this chunk "
                    f"starts (token {expected}: {self._prefix_pages} prefix pages and "
                    f"{self._pages} pages sent, page_size {page_size}); kvbridge sends chunks "
                    f"in order")
        return None

    def get_max_transfer_tokens(self) -> Optional[int]:
        """Newer sglang cuts each send into segments of this many tokens
        (for a backend's pack buffer); None: one send per chunk, as kvbridge
        writes the pages where they are."""
        return None

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk  # an empty last chunk still sends aux/state

    def get_transfer_metric(self) -> KVTransferMetric:
        """sglang's metric: bytes by common's formula (pages x kv_item_lens_sum
        + state slots x state_item_lens_sum); latencies measured in C++
        (KVSender::Timing): transfer = first write posted to last write
        completed (mooncake's span), alloc = sender made to decode's metadata
        (its pages allocated). None until reached; valid after clear()."""
        alloc, transfer = self._s._impl.timing()
        return KVTransferMetric(transfer_latency_s=transfer, alloc_latency_s=alloc,
                                transfer_total_bytes=self._pages * self.kv_mgr.kv_item_lens_sum +
                                self._states * self.kv_mgr.state_item_lens_sum)

    def poll(self) -> KVPoll:  # replaced per instance in __init__
        return self._s.poll()

    def failure(self) -> Optional[kvbridge.KVTransferError]:
        return self._s.failure()

    def failure_exception(self) -> None:
        self._raise(self._s)

    def clear(self) -> None:
        self._s.clear()

    def abort(self) -> None:
        self._s.abort()


class KVBridgeKVReceiver(_Quiet, BaseKVReceiver):
    """Created before the prefill instance is known (sglang's order): the
    kvbridge receiver is made in init(), after try_ensure_parallel_info."""

    def __init__(self, mgr: KVBridgeKVManager, bootstrap_addr: str,
                 bootstrap_room: Optional[int] = None):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self._addr = _norm_addr(bootstrap_addr or "")
        with mgr.connection_lock:
            # The prefill instance's epoch when this request arrived (sglang
            # tracks the request under its address from here): an eviction
            # of that epoch fails it, a later one does not.
            self._epoch = mgr._parallel_info_epochs.get(self._addr, 0)
            if _is_room_id(bootstrap_room):  # else init() fails it, naming the value
                mgr._rooms[bootstrap_room] = self
        self.require_staging = False
        self.supports_host_destination = False  # see the manager's
        # sglang's deferred release holds pages only for a receiver that told
        # prefill of its abort; kvbridge's Failed already means quiesced.
        self.abort_notified = False
        self._r: Optional[_Receiver] = None
        self._early: Optional[kvbridge.KVTransferError] = None  # failed before init
        self._reason: Optional[str] = None  # set by fail()

    def poll(self) -> KVPoll:  # replaced by the C++ method once init() made it
        return KVPoll.Failed if self._early is not None else KVPoll.Bootstrapping

    @property
    def conclude_state(self) -> Optional[KVPoll]:
        return _conclude(self.poll())

    @conclude_state.setter
    def conclude_state(self, state: Any) -> None:
        if state == KVPoll.Failed:  # as the sender's setter
            self._fail_for_scheduler("the scheduler set conclude_state to Failed")

    def _fail_for_scheduler(self, reason: str) -> None:
        """KVManager.update_status(room, Failed): see the sender's."""
        if self.conclude_state is None:
            self.fail(reason)

    def _fail_early(self, reason: str) -> None:
        if self._early is None:
            self._early = kvbridge.AbortedError(self.bootstrap_room, reason)
            log.warning("room %s: %s", self.bootstrap_room, reason)

    @staticmethod
    def query_prefill_dp_ranks(bootstrap_addr: str, bootstrap_rooms: List[int]) -> Dict[str, int]:
        """sglang's CommonKVReceiver.query_prefill_dp_ranks: {str(room): dp
        rank} for the rooms whose prefill sender registered one; {} (logged)
        when the registry cannot be asked, as sglang's."""
        # A room id that is none (from the router) is left out, not the batch:
        # its request waits for its own timeout, the others get their ranks.
        try:
            asked = list(bootstrap_rooms)
            rooms = [r for r in asked if _is_room_id(r)]
            if len(rooms) < len(asked):
                log.warning("querying prefill dp ranks: left out room ids that are none: %s",
                            [r for r in asked if not _is_room_id(r)][:8])
            return dict(_kvbridge.query_dp_ranks(_norm_addr(bootstrap_addr),
                                                 [operator.index(r) for r in rooms]))
        except Exception as e:  # noqa: BLE001 -- as sglang's: never into its loop
            log.error("querying prefill dp ranks from %s failed: %s", bootstrap_addr, e)
            return {}

    def init(self, prefill_dp_rank: int = 0) -> None:
        if self._r is not None or self._early is not None:
            return
        try:
            core = self.kv_mgr.core(self.bootstrap_addr)
            self._r = _Receiver(core, _norm_addr(self.bootstrap_addr), self.bootstrap_room)
        except kvbridge.KVTransferError as e:
            self._fail_early(f"prefill at {self.bootstrap_addr}: {e.failure_reason}")
            return
        self.poll = self._r._impl.poll_settled  # Failed only once quiesced
        if self.kv_mgr.parallel_info_epoch(self._addr) != self._epoch:
            # The instance was evicted after this request arrived (as sglang's
            # eviction fails the rooms it tracks for the address).
            self.fail(f"Lost connection with prefill instance (bootstrap_addr: "
                      f"{self.bootstrap_addr}): evicted before init")
            return
        try:
            dp_rank = _dp_rank(prefill_dp_rank)
        except kvbridge.KVTransferError as e:  # from the router: fails this request only
            self.fail(e.failure_reason, refused=True)
            return
        self._quiet(self._r.init, dp_rank)

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None,
                      state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None,
                      spec_metadata: Any = None, destination: Any = None,
                      device_kv_indices: Any = None) -> None:
        if str(getattr(destination, "name", destination or "")).upper() == "HOST":
            # As sglang's backends without host receive: raised, nothing sent.
            raise NotImplementedError(
                "Host KV destination is not supported by kvbridge (supports_host_destination "
                "is False); turn off decode host receive")
        if spec_metadata is not None:
            # A version with DSpark hidden-state streaming passes it always
            # (None without DSpark); kvbridge does not carry it.
            self.fail("spec_metadata (DSpark hidden-state streaming) is not carried by kvbridge",
                      refused=True)
            return
        if device_kv_indices is not None:
            # HiSparse (DeepSeek V4): a second set of destination pages on the
            # device, which sglang sends only to a backend in mooncake's slot.
            self.fail("device_kv_indices (HiSparse device-resident pages) are not carried by "
                      "kvbridge; run the decode server without HiSparse", refused=True)
            return
        if self._r is None:
            self._fail_early("send_metadata before init")
            return
        try:
            state = self.kv_mgr.state_indices(state_indices)
        except kvbridge.KVTransferError as e:
            log.warning("room %s: %s; aborting the request", self.bootstrap_room, e.failure_reason)
            self._r.abort()
            return
        self._quiet(self._r.send_metadata, kv_indices, aux_index, state, decode_prefix_len or 0)

    def fail(self, reason: str, refused: bool = False) -> None:
        """Fails the request for a reason of the adapter's own (a retraction
        whose recompute could not be asked, an evicted instance): poll() says
        Failed, prefill is told (as an abort), failure() and
        failure_exception() carry `reason`. `refused`: a request kvbridge
        cannot carry as asked; prefill is told it as invalid_request with
        `reason`."""
        self._reason = str(reason)
        if self._r is None:
            self._fail_early(self._reason)
        elif refused:
            self._r.reject(self._reason)
        else:
            self._r.abort()

    def _with_reason(self, e: Optional[kvbridge.KVTransferError]
                     ) -> Optional[kvbridge.KVTransferError]:
        if e is not None and self._reason is not None:
            e.failure_reason = e.message = self._reason
            e.args = (self._reason,)
        return e

    def failure(self) -> Optional[kvbridge.KVTransferError]:
        return self._with_reason(self._early if self._r is None else self._r.failure())

    def failure_exception(self) -> None:
        """Raises why the request failed. sglang frees the pages right after
        this: a request that failed on another rank of the group is aborted
        here and its writes waited out first (bounded, GIL released)."""
        if self._r is None:
            raise self._early or kvbridge.AbortedError(self.bootstrap_room, "not initialized")
        # The group's record; this rank's request fails with it (not as an
        # abort of its own), so its prefill ranks stop writing.
        error = from_record(self._r._impl.fail_as_group_json())
        if not self._r._impl.wait_quiesced(QUIESCE_WAIT_S):
            log.warning("room %s: writes still in flight %.0f s after the failure",
                        self.bootstrap_room, QUIESCE_WAIT_S)
        try:  # registry lost or a prefill rank exited: the instance is evicted
            self.kv_mgr._note_failure(self.bootstrap_addr, self._epoch, error)
        except Exception:  # noqa: BLE001 -- never into sglang's loop but as the record
            log.exception("room %s: evicting prefill instance %s failed", self.bootstrap_room,
                          self.bootstrap_addr)
        self._raise_error(self._with_reason(error))

    def clear(self) -> None:
        if self._r is not None:
            self._r.clear()

    def abort(self) -> None:
        if self._r is None:
            self._fail_early("aborted before init")
        else:
            self._r.abort()

    def quiesced(self) -> bool:
        return True if self._r is None else self._r.quiesced()


class KVBridgeKVBootstrapServer(BaseKVBootstrapServer):
    def __init__(self, host: str, port: int, *args: Any, **kwargs: Any):
        self.host = host
        self.port = port
        self._server = kvbridge.BootstrapServer(host, port)

    def close(self) -> None:
        self._server.close()

    def poll(self) -> KVPoll:
        return KVPoll.Success


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
    utils.get_kv_class = get_kv_class
    for name, module in list(sys.modules.items()):
        fn = getattr(module, "get_kv_class", None) if name.startswith("sglang") else None
        if fn is not None and (fn is original or
                               getattr(fn, "_kvbridge_original", None) is original):
            module.get_kv_class = get_kv_class
