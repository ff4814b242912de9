"""kvbridge: move LLM KV cache between prefill and decode processes.

A drop-in for sglang's disaggregation transfer layer: ``KVArgs``,
``KVPoll``, ``KVManager``, ``KVSender``, ``KVReceiver``,
``BootstrapServer`` and ``KVTransferError`` have sglang's names and
signatures; ``kvbridge.sglang`` registers kvbridge as an sglang transfer
backend. See docs/python.md.
"""

from kvbridge._api import BootstrapServer, KVManager, KVPoll, KVReceiver, KVSender
from kvbridge._args import KVArgs, KVConfig, ParallelLayout, as_indices, buffer_address
from kvbridge._errors import (STATUS_EXCEPTIONS, AbortedError, AlreadyExistsError,
                              DataLossError, DeadlineExceededError, FailedPreconditionError,
                              InternalError, InvalidArgumentError, KVTransferError, NotFoundError,
                              StatusCode, UnauthenticatedError, UnavailableError,
                              UnimplementedError, exception_class)

__all__ = [
    "BootstrapServer", "KVManager", "KVPoll", "KVReceiver", "KVSender", "KVArgs", "KVConfig",
    "ParallelLayout", "as_indices", "buffer_address", "KVTransferError", "STATUS_EXCEPTIONS",
    "StatusCode", "exception_class", "AbortedError", "AlreadyExistsError", "DataLossError",
    "DeadlineExceededError", "FailedPreconditionError", "InternalError", "InvalidArgumentError",
    "NotFoundError", "UnauthenticatedError", "UnavailableError", "UnimplementedError",
]
__version__ = "0.1.0"
