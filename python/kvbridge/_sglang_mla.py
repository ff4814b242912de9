"""Compressed MLA (sglang's ``KVArgs.mla_compression_ratios``, DeepSeek V4)
as model-layer ids, so that a pipeline stage's buffers pair with decode's.

sglang's compressed-MLA pools list their buffers by compression bucket, not
by layer (its mooncake backend, ``_mla_slice_ptrs_for_pp``; docs/sglang.md,
A9). With ``ratios[l]`` the compression of model layer l, and a stage
holding layers [start, end):

- kv buffers: the stage's ratio-4 layers, then their indexer buffers (the
  same layers again), then its ratio-128 layers;
- a ``SWA`` state component: the stage's SWA layers (as many as the
  component has buffers beyond the ratio-4 ones), then the ratio-4 layers'
  compress state, then their indexer compress state;
- ``C128_STATE``: the stage's ratio-128 layers; ``SWA_RING``: its SWA layers.

Each buffer gets the model layer it holds. A layer listed twice (a ratio-4
layer's buffer and its indexer's) pairs by occurrence, as sglang pairs
repeated layer ids (decode's earliest unused buffer of the same id). Ids
sglang gives itself (``kv_layer_ids``) are kept, and then the ratios are
not published.

sglang sets the ratios on prefill only. A prefill rank that numbered its
buffers publishes them in its registry layout; a decode adapter whose
KVArgs lack them takes them from there (``try_ensure_parallel_info``) and
numbers its own buffers the same way, for the whole model (decode pp 1;
a decode stage is refused by name).
"""

from __future__ import annotations

import numbers
from typing import Any, List, NamedTuple, Sequence

import kvbridge

# sglang's draft-model kv entries are numbered from here (its utils.py).
_DRAFT_KV_LAYER_ID_BASE = 1_000_000


def _error(message: str) -> kvbridge.InvalidArgumentError:
    return kvbridge.InvalidArgumentError(None, f"compressed MLA (mla_compression_ratios): {message}")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


class _Stage(NamedTuple):
    """The model layers [start, end) a rank's buffers hold, and which of
    them are ratio-4 and ratio-128 layers."""
    start: int
    end: int
    c4: List[int]
    c128: List[int]


def _stage(args: Any, ratios: Sequence[int], pp_size: int, mode: str) -> _Stage:
    """The layers [start, end) the buffers hold: a prefill rank's
    prefill_start_layer and prefill_end_layer (the whole model where they
    are unset and pp is 1); a decode of pp 1 holds the whole model, as
    sglang's slicing counts it. A decode stage, and a prefill stage without
    its range, are refused by name."""
    if mode == "decode":
        if pp_size > 1:
            raise kvbridge.UnimplementedError(
                None, f"compressed MLA (mla_compression_ratios) into a decode server of "
                f"pp_size {pp_size}: kvbridge places a prefill stage's compressed-MLA buffers "
                "only in a decode of pp 1; run decode with --pp-size 1")
        return _stage_of(ratios, 0, len(ratios))
    start = getattr(args, "prefill_start_layer", None)
    end = getattr(args, "prefill_end_layer", None)
    if end is None and pp_size > 1:
        raise kvbridge.UnimplementedError(
            None, f"compressed MLA (mla_compression_ratios) in a prefill stage of pp_size "
            f"{pp_size} whose KVArgs give no prefill_end_layer: kvbridge cannot tell which "
            "layers the stage's buffers hold")
    start = 0 if start is None else start
    end = len(ratios) if end is None else end
    for name, v in (("prefill_start_layer", start), ("prefill_end_layer", end)):
        if not _is_int(v):
            raise _error(f"{name} {v!r:.40} is not an integer")
    start, end = int(start), int(end)
    if not 0 <= start <= end <= len(ratios):
        raise _error(f"layers [{start}, {end}) do not lie within the {len(ratios)} model layers "
                     "the ratios describe")
    return _stage_of(ratios, start, end)


def _stage_of(ratios: Sequence[int], start: int, end: int) -> _Stage:
    layers = range(start, end)
    return _Stage(start, end, [layer for layer in layers if ratios[layer] == 4],
                  [layer for layer in layers if ratios[layer] == 128])


# At most this many model layers (the C++ layout's bound on buffers).
_MAX_LAYERS = 4096


def number_buffers(args: Any, ours: Any, ratios: Sequence[int], pp_size: int,
                   mode: str) -> None:
    """Gives `ours` (kvbridge's KVArgs made from sglang's `args`, on the
    `mode` server) the model layer of each kv buffer, and of each state
    buffer where sglang gave no state ids, from `ratios`."""
    if len(ratios) > _MAX_LAYERS or not all(0 <= r < 2**31 for r in ratios):
        raise _error(f"{len(ratios)} ratios: at most {_MAX_LAYERS}, each in [0, 2**31)")
    draft = ours.num_draft_entries or 0
    if not _is_int(draft) or not 0 <= draft <= len(ours.kv_data_ptrs):
        raise _error(f"num_draft_entries {draft!r:.40} is not a count of the "
                     f"{len(ours.kv_data_ptrs)} kv buffers")
    stage = _stage(args, ratios, pp_size, mode)
    ours.kv_layer_ids = kv_layer_ids(stage, len(ours.kv_data_ptrs), int(draft))
    if not ours.state_layer_ids and ours.state_type_names:
        counts = [0] * len(ours.state_type_names)
        for t in ours.state_buffer_types or [0] * len(ours.state_data_ptrs):
            if 0 <= t < len(counts):
                counts[t] += 1
        ours.state_layer_ids = state_layer_ids(stage, ours.state_type_names, counts)


def kv_layer_ids(stage: _Stage, num_buffers: int, num_draft: int) -> List[int]:
    """One model-layer id per kv buffer of a compressed-MLA pool (draft
    entries, the last `num_draft`, get sglang's draft ids).
    InvalidArgumentError naming both counts when the buffers are not the
    stage's ratio-4 layers twice and its ratio-128 layers."""
    start, end, c4, c128 = stage
    ids = c4 + c4 + c128
    if len(ids) + num_draft != num_buffers:
        raise _error(f"{num_buffers} kv buffers for layers [{start}, {end}), which hold "
                     f"{len(c4)} ratio-4 layers (each with an indexer buffer), {len(c128)} "
                     f"ratio-128 layers and {num_draft} draft entries: {len(ids) + num_draft} "
                     "expected")
    return ids + [_DRAFT_KV_LAYER_ID_BASE + i for i in range(num_draft)]


def state_layer_ids(stage: _Stage, names: Sequence[str], counts: Sequence[int]) -> List[int]:
    """One model-layer id per state buffer (components in order, `counts[i]`
    buffers each), -1 for a component other than SWA, SWA_RING and
    C128_STATE; [] when no component has ids."""
    start, end, c4, c128 = stage
    out: List[int] = []
    for name, n in zip(names, counts):
        kind = str(name).upper()
        if kind not in ("SWA", "SWA_RING", "C128_STATE"):
            out.extend([-1] * n)
            continue
        if kind == "C128_STATE":
            if n != len(c128):
                raise _error(f"the C128_STATE state component has {n} buffers for layers "
                             f"[{start}, {end}), which hold {len(c128)} ratio-128 layers")
            out.extend(c128)
            continue
        compress = c4 + c4 if kind == "SWA" else []
        swa = n - len(compress)  # the stage's SWA layers: [start, start + swa)
        if not 0 <= swa <= end - start:
            raise _error(f"the {kind} state component has {n} buffers for layers [{start}, "
                         f"{end}), which hold {end - start} SWA layers at most"
                         + (f" and {len(c4)} ratio-4 layers' two compress states"
                            if compress else ""))
        out.extend(list(range(start, start + swa)) + compress)
    return out if any(v >= 0 for v in out) else []
