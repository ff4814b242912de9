"""Exceptions of kvbridge: one table from Status codes to classes.

Every error kvbridge raises is a ``KVTransferError`` (sglang's constructor:
``bootstrap_room, failure_reason, is_from_another_rank``) of the class that
``STATUS_EXCEPTIONS`` names for its Status code. The per-code classes also
derive from the builtin a Python caller expects, so ``except ValueError``
catches bad input. Errors of a failed request (``failure_exception()``) carry
the failure record as attributes: who failed (``origin_*``), why (``cause``),
when (``phase``), who noticed and how (``detected_by``, ``mechanism``) and
what to do (``hint``).
"""

from __future__ import annotations

import enum
import json
from typing import Any, Mapping, Optional


class StatusCode(enum.IntEnum):
    """kvbridge::StatusCode (canonical codes, same values as C++)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# Attributes a failure record gives an exception; None when not known.
RECORD_ATTRIBUTES = (
    "origin", "origin_role", "origin_dp", "origin_tp", "origin_pp", "origin_cp",
    "origin_host", "origin_pid", "cause", "detail", "phase", "detected_by",
    "mechanism", "hint", "message", "generation", "detected_at", "silence_s",
)


class KVTransferError(Exception):
    """A kvbridge error; sglang's KVTransferError with the record attached."""

    code = StatusCode.UNKNOWN

    def __init__(self, bootstrap_room: Optional[int], failure_reason: str,
                 is_from_another_rank: bool = False, *,
                 record: Optional[Mapping[str, Any]] = None):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank
        self.record = dict(record) if record else None
        for name in RECORD_ATTRIBUTES:
            setattr(self, name, None)
        self.message = failure_reason
        if record:
            _apply_record(self, record)

    def __str__(self) -> str:
        return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"


def _apply_record(exc: KVTransferError, r: Mapping[str, Any]) -> None:
    origin = r.get("origin") or {}
    detected = r.get("detected_by") or {}
    exc.origin = origin.get("name")
    for key in ("role", "dp", "tp", "pp", "cp", "host", "pid"):
        setattr(exc, "origin_" + key, origin.get(key))
    exc.detected_by = _rank_text(detected) if detected else None
    for key in ("cause", "detail", "phase", "mechanism", "hint", "generation", "silence_s"):
        setattr(exc, key, r.get(key))
    exc.message = r.get("message", exc.failure_reason)
    if "detected_at_us" in r:
        exc.detected_at = r["detected_at_us"] / 1e6


def _rank_text(rank: Mapping[str, Any]) -> str:
    return f"{rank.get('name')} (host {rank.get('host')}, pid {rank.get('pid')})"


def _cls(name: str, code: StatusCode, *builtins: type) -> type:
    doc = f"kvbridge error with Status code {code.name}."
    return type(name, (KVTransferError, *builtins), {"code": code, "__doc__": doc})


CancelledError = _cls("CancelledError", StatusCode.CANCELLED)
UnknownError = _cls("UnknownError", StatusCode.UNKNOWN)
InvalidArgumentError = _cls("InvalidArgumentError", StatusCode.INVALID_ARGUMENT, ValueError)
DeadlineExceededError = _cls("DeadlineExceededError", StatusCode.DEADLINE_EXCEEDED)
NotFoundError = _cls("NotFoundError", StatusCode.NOT_FOUND, LookupError)
AlreadyExistsError = _cls("AlreadyExistsError", StatusCode.ALREADY_EXISTS)
PermissionDeniedError = _cls("PermissionDeniedError", StatusCode.PERMISSION_DENIED)
ResourceExhaustedError = _cls("ResourceExhaustedError", StatusCode.RESOURCE_EXHAUSTED)
FailedPreconditionError = _cls("FailedPreconditionError", StatusCode.FAILED_PRECONDITION,
                               RuntimeError)
AbortedError = _cls("AbortedError", StatusCode.ABORTED)
OutOfRangeError = _cls("OutOfRangeError", StatusCode.OUT_OF_RANGE, ValueError)
UnimplementedError = _cls("UnimplementedError", StatusCode.UNIMPLEMENTED, NotImplementedError)
InternalError = _cls("InternalError", StatusCode.INTERNAL, RuntimeError)
UnavailableError = _cls("UnavailableError", StatusCode.UNAVAILABLE)
DataLossError = _cls("DataLossError", StatusCode.DATA_LOSS)
UnauthenticatedError = _cls("UnauthenticatedError", StatusCode.UNAUTHENTICATED, PermissionError)

# THE table: a Status code -> the class raised for it. Nothing else decides.
STATUS_EXCEPTIONS = {
    StatusCode.CANCELLED: CancelledError,
    StatusCode.UNKNOWN: UnknownError,
    StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    StatusCode.NOT_FOUND: NotFoundError,
    StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    StatusCode.ABORTED: AbortedError,
    StatusCode.OUT_OF_RANGE: OutOfRangeError,
    StatusCode.UNIMPLEMENTED: UnimplementedError,
    StatusCode.INTERNAL: InternalError,
    StatusCode.UNAVAILABLE: UnavailableError,
    StatusCode.DATA_LOSS: DataLossError,
    StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def exception_class(code: int) -> type:
    """The class for a Status code (by value or name); UnknownError otherwise."""
    if isinstance(code, str):
        code = StatusCode.__members__.get(code, StatusCode.UNKNOWN)
    try:
        return STATUS_EXCEPTIONS[StatusCode(code)]
    except (ValueError, KeyError):
        return UnknownError


def from_status(code: int, message: str, bootstrap_room: Optional[int] = None
                ) -> KVTransferError:
    """The exception for a failed C++ call (called by the C++ module)."""
    return exception_class(code)(bootstrap_room, message)


def from_record(record: Mapping[str, Any] | str) -> KVTransferError:
    """The exception for a failure record (a dict or its JSON text)."""
    if isinstance(record, str):
        record = json.loads(record)
    code = record.get("code")
    if code is None and record.get("cause"):  # a record without its code: derive it
        from kvbridge import _kvbridge
        code = dict(_kvbridge.failure_causes()).get(record["cause"])
    cls = exception_class(StatusCode.UNKNOWN if code is None else code)
    return cls(record.get("room"), record.get("message", "failed"),
               bool(record.get("is_from_another_rank", False)), record=record)


def invalid_argument(message: str, bootstrap_room: Optional[int] = None) -> KVTransferError:
    return STATUS_EXCEPTIONS[StatusCode.INVALID_ARGUMENT](bootstrap_room, message)
