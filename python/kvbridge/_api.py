"""KVManager, KVSender, KVReceiver, BootstrapServer: sglang's shapes over C++.

One KVManager per rank; one KVSender (prefill) or KVReceiver (decode) per
request and rank. ``poll()`` never raises and never blocks: call it every
scheduler step and MIN-reduce it over the rank group (KVPoll's order makes
one Failed rank fail the group). On Failed, call ``failure_exception()``
once -- it always raises, a KVTransferError naming the rank that failed and
why -- then ``clear()``, which releases the room (after ``clear()`` the
sender/receiver still answers ``poll()`` and ``failure_exception()``).
Calls that may block release the GIL.
"""

from __future__ import annotations

import enum
import json
import operator
from typing import Any, Optional

from kvbridge import _kvbridge
from kvbridge._args import KVArgs, KVConfig, as_indices
from kvbridge._errors import (KVTransferError, StatusCode, UnimplementedError, _apply_record,
                              from_record, invalid_argument)


class KVPoll(enum.IntEnum):
    """sglang's KVPoll; MIN over a group is the group's state."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


_kvbridge._set_poll_enum(list(KVPoll))


def _mode_name(mode: Any) -> str:
    """'prefill' / 'decode' from a string or a DisaggregationMode-like enum."""
    value = getattr(mode, "value", mode)
    name = str(value).lower()
    if name not in ("prefill", "decode"):
        raise invalid_argument(f"mode {mode!r} is not prefill or decode")
    return name


def _room_id(bootstrap_room: Any) -> int:
    """A room id: an integer (Python's or numpy's) in [0, 2**64). A float or a
    string is refused, not truncated (1.5 became room 1, which may be another
    request's); past 64 bits pybind raised TypeError, not a KVTransferError."""
    try:
        if isinstance(bootstrap_room, bool):
            raise TypeError("a bool")
        room = operator.index(bootstrap_room)
    except TypeError:
        raise invalid_argument(f"bootstrap_room {bootstrap_room!r} is not a room id "
                               "(an integer from 0 to 2**64 - 1)") from None
    if not 0 <= room < 1 << 64:
        raise invalid_argument(f"bootstrap_room {room} is not a room id (0 to 2**64 - 1)")
    return room


def _dp_rank(prefill_dp_rank: Any) -> int:
    """A prefill dp rank for init(): an integer in [0, 2**31); None is 0."""
    if prefill_dp_rank is None:
        return 0
    try:
        rank = operator.index(prefill_dp_rank)
    except TypeError:
        raise invalid_argument(f"prefill dp rank {prefill_dp_rank!r} is not an integer") from None
    if not 0 <= rank < 1 << 31:
        raise invalid_argument(f"prefill dp rank {rank} is out of range (0 to 2**31 - 1)")
    return rank


def _same_addr(a: str, b: str) -> bool:
    def norm(x: str) -> str:
        x = x.split("://", 1)[-1].split("/", 1)[0]
        return x.replace("localhost:", "127.0.0.1:").replace("0.0.0.0:", "127.0.0.1:")
    return norm(a) == norm(b)


def _with_room(room: int, fn: Any, *args: Any) -> Any:
    """fn(*args); an error it raises names the request's room."""
    try:
        return fn(*args)
    except KVTransferError as e:
        if e.bootstrap_room is None:
            e.bootstrap_room = room
        raise


class KVManager:
    """One rank's transfer manager (sglang's KVManager)."""

    def __init__(self, args: KVArgs, mode: Any, config: Optional[KVConfig] = None,
                 is_mla: bool = False):
        self.kv_args = args
        self.mode = _mode_name(mode)
        self.config = config or KVConfig()
        self.is_mla = bool(is_mla)
        options = self.config.to_dict()
        layout = getattr(args, "parallel", None)
        options.update(role=self.mode, is_mla=self.is_mla, args=args.to_dict(),
                       parallel=dict(vars(layout)) if layout is not None else {})
        self._impl = _kvbridge.Manager(options)
        self.rank = self._impl.self_rank()

    @property
    def bootstrap_addr(self) -> str:
        return self.config.bootstrap_addr

    def stats(self) -> dict:
        return self._impl.stats()

    def take_changed_rooms(self) -> list:
        """Rooms whose poll() answer changed since the last call, each once.

        Needs ``KVConfig(list_room_changes=True)``, else FailedPreconditionError.
        With thousands of requests in flight, a scheduler step polls these
        instead of every request; a new sender or receiver is polled once
        (its first answer is not a change).
        """
        return self._impl.take_changed_rooms()

    def report_fatal(self, reason: str) -> None:
        """Fails every live request of this rank with `reason`, on every rank it touches."""
        self._impl.report_fatal(reason)

    def close(self) -> None:
        """Releases the manager once its senders/receivers are cleared."""
        self._impl.close()

    def __enter__(self) -> "KVManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Room:
    """What senders and receivers share: poll, failure, clear."""

    _impl: Any

    def __init__(self, mgr: KVManager, bootstrap_room: Optional[int]):
        self.bootstrap_room = _room_id(bootstrap_room)
        self.kv_mgr = mgr

    def poll(self) -> KVPoll:
        """The room's state on this rank; one atomic load, never raises."""
        return self._impl.poll()

    def failure(self) -> Optional[KVTransferError]:
        """This room's KVTransferError without raising it; None while it has
        not failed here (the group's record: failure_exception())."""
        record = self._impl.failure_json()
        return None if record is None else from_record(record)

    def failure_exception(self) -> None:
        """Raises the KVTransferError of this room (always raises).

        On a rank whose own poll() is not Failed (the group's MIN is), the
        record comes from the rank that failed the request, through the
        registry; C++ waits for it without the GIL (Room::GroupFailure).
        """
        raise from_record(self._impl.group_failure_json())

    def clear(self) -> None:
        """Releases the room (an unfinished request is aborted first)."""
        self._impl.close()

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except KVTransferError as e:
            if e.bootstrap_room is None:
                e.bootstrap_room = self.bootstrap_room
            record = self._impl.failure_json()
            if record is not None and e.record is None:
                e.record = json.loads(record)
                _apply_record(e, e.record)
                e.is_from_another_rank = bool(e.record.get("is_from_another_rank"))
            raise


class KVSender(_Room):
    """The prefill side of one request on one rank (sglang's KVSender)."""

    def __init__(self, mgr: KVManager, bootstrap_addr: Optional[str], bootstrap_room: int,
                 dest_tp_ranks: Optional[list] = None, pp_rank: Optional[int] = None):
        super().__init__(mgr, bootstrap_room)
        self.bootstrap_addr = bootstrap_addr
        self.dest_tp_ranks = dest_tp_ranks
        self.pp_rank = pp_rank
        self._impl = _with_room(self.bootstrap_room, _kvbridge.Sender, mgr._impl,
                                self.bootstrap_room)
        self.poll = self._impl.poll  # the scheduler's hot path: the C++ method itself

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        """Declares the request's page count and aux row."""
        self._call(self._impl.init, int(num_kv_indices), -1 if aux_index is None else int(aux_index))

    def send(self, kv_indices: Any, state_indices: Any = None) -> None:
        """Posts one chunk; the chunk completing num_kv_indices is the last."""
        pages = as_indices(kv_indices, "kv_indices", self.bootstrap_room)
        state = as_indices(state_indices, "state_indices", self.bootstrap_room)
        self._call(self._impl.send, pages, state)

    def abort(self) -> None:
        self._impl.abort()

    def reject(self, reason: str) -> None:
        """Fails the request as invalid_request with `reason` (this rank must
        not serve it) and tells decode."""
        self._impl.reject(str(reason))


class KVReceiver(_Room):
    """The decode side of one request on one rank (sglang's KVReceiver)."""

    def __init__(self, mgr: KVManager, bootstrap_addr: Optional[str],
                 bootstrap_room: Optional[int] = None):
        super().__init__(mgr, bootstrap_room)
        if bootstrap_addr and not _same_addr(bootstrap_addr, mgr.bootstrap_addr):
            raise UnimplementedError(
                self.bootstrap_room, f"bootstrap_addr {bootstrap_addr}: this manager serves "
                f"the prefill instance at {mgr.bootstrap_addr} only")
        self.bootstrap_addr = bootstrap_addr or mgr.bootstrap_addr
        self._impl = _with_room(self.bootstrap_room, _kvbridge.Receiver, mgr._impl,
                                self.bootstrap_room)
        self.poll = self._impl.poll  # the scheduler's hot path: the C++ method itself

    def init(self, prefill_dp_rank: int = 0) -> None:
        """Starts finding and meeting the prefill ranks to read from; never
        waits on the network (the manager's resolver thread does). What it
        finds wrong fails the request: poll() says Failed."""
        self._call(self._impl.init, _dp_rank(prefill_dp_rank))

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None,
                      state_indices: Any = None, decode_prefix_len: Optional[int] = 0) -> None:
        """Tells prefill where the request's pages, aux row and state go."""
        pages = as_indices(kv_indices, "kv_indices", self.bootstrap_room)
        state = as_indices(state_indices, "state_indices", self.bootstrap_room)
        aux = -1 if aux_index is None else int(aux_index)
        self._call(self._impl.send_metadata, pages, aux, state, int(decode_prefix_len or 0))

    def abort(self) -> None:
        self._impl.abort()

    def reject(self, reason: str) -> None:
        """Fails the request as invalid_request with `reason` (this rank
        cannot serve it as asked) and tells prefill."""
        self._impl.reject(str(reason))

    def quiesced(self) -> bool:
        """True once no write of this request can land; pages may be reused then."""
        return self._impl.quiesced()


class BootstrapServer:
    """The bootstrap registry (sglang's bootstrap server, HTTP)."""

    def __init__(self, host: str = "0.0.0.0", port: int = 8998, *,
                 unresponsive_after_s: float = 0, dead_after_s: float = 0):
        self._impl = _kvbridge.BootstrapServer(host, int(port), int(unresponsive_after_s * 1000),
                                               int(dead_after_s * 1000))
        self.host = host

    @property
    def port(self) -> int:
        return self._impl.port

    @property
    def address(self) -> str:
        return self._impl.address

    def close(self) -> None:
        self._impl.stop()

    def __enter__(self) -> "BootstrapServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["KVPoll", "KVManager", "KVSender", "KVReceiver", "BootstrapServer", "StatusCode"]
