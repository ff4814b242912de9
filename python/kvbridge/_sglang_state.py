"""How sglang's state buffers are sharded across tp ranks, as kvbridge's
KVArgs fields state_slice_dims / state_slice_outer / state_slice_groups
(docs/sglang.md, A9).

sglang describes a mamba pool's tp sharding per state tensor, in lists that
follow state_data_ptrs: one entry per state type, each a per-tensor list
(or [] when the type is not sharded):

- ``state_dim_per_tensor``: this rank's size of the sharded axis;
- ``state_conv_shard_groups``: the full sizes of the sub-blocks that axis
  concatenates, each sharded on its own (GDN's conv [q | k | v]), or None
  for a tensor of one block. sglang uses them only when they add up to the
  axis of the whole group (dim * attn tp size); so does this adapter;
- ``state_slice_outer_counts`` (some versions; also spelled
  ``state_dim_outer_per_tensor``): blocks of the axis per slot, 1 when absent.

Some versions also pass a flat per-tensor list instead of one per type.
"""

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

import kvbridge

_DIMS = ("state_dim_per_tensor",)
_GROUPS = ("state_conv_shard_groups", "state_dim_components_per_tensor")
_OUTER = ("state_slice_outer_counts", "state_dim_outer_per_tensor")


def _buffers_per_type(args: Any) -> List[int]:
    ptrs = list(getattr(args, "state_data_ptrs", None) or [])
    if any(isinstance(p, (list, tuple)) for p in ptrs):
        return [len(p or []) for p in ptrs]
    return [len(ptrs)] if ptrs else []


def _field(args: Any, names: Sequence[str]) -> Tuple[str, Any]:
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            return name, value
    return names[0], None


def _is_entry(value: Any, per_tensor_is_list: bool) -> bool:
    """Whether `value` is one state type's per-tensor list (not a tensor's
    own entry of a flat list)."""
    if value is None:
        return True
    if not isinstance(value, (list, tuple)):
        return False
    if not per_tensor_is_list:
        return True
    return all(v is None or isinstance(v, (list, tuple)) for v in value)


def _per_buffer(name: str, value: Any, counts: List[int], per_tensor_is_list: bool,
                fill: Any) -> Optional[List[Any]]:
    """`value` aligned with the state buffers (None when not given); a type
    given as [] or None gets `fill` for each of its buffers."""
    if value is None:
        return None
    value = list(value)
    total = sum(counts)
    if not value:
        return None
    per_type = len(value) == len(counts) and all(_is_entry(v, per_tensor_is_list) for v in value)
    if not per_type:
        if len(value) != total:
            raise kvbridge.InvalidArgumentError(
                None, f"{name} has {len(value)} entries, the state buffers are {total} "
                f"({counts} per state type)")
        return value
    out: List[Any] = []
    for t, entry in enumerate(value):
        entry = list(entry or [])
        if not entry:
            out.extend([fill] * counts[t])
        elif len(entry) != counts[t]:
            raise kvbridge.InvalidArgumentError(
                None, f"{name}[{t}] has {len(entry)} entries, state type {t} has {counts[t]} "
                "buffers")
        else:
            out.extend(entry)
    return out


def _uint(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 or v >= 1 << 32:
        raise kvbridge.InvalidArgumentError(None, f"{name}: {v!r:.40} is not a size")
    return int(v)


def state_sharding(args: Any, tp_size: int) -> Tuple[List[int], List[int], List[List[int]]]:
    """(state_slice_dims, state_slice_outer, state_slice_groups) for
    kvbridge's KVArgs from sglang's KVArgs; three empty lists when sglang
    gave no sharding (every state slot then moves whole)."""
    counts = _buffers_per_type(args)
    dims_name, dims_value = _field(args, _DIMS)
    dims = _per_buffer(dims_name, dims_value, counts, False, 0)
    if dims is None or not any(dims):
        return [], [], []
    dims = [_uint(dims_name, d or 0) for d in dims]
    outer_name, outer_value = _field(args, _OUTER)
    outer = _per_buffer(outer_name, outer_value, counts, False, 1) or [1] * len(dims)
    outer = [_uint(outer_name, o if o else 1) for o in outer]
    groups_name, groups_value = _field(args, _GROUPS)
    raw_groups = _per_buffer(groups_name, groups_value, counts, True, None) or [None] * len(dims)
    groups: List[List[int]] = []
    for dim, g in zip(dims, raw_groups):
        g = [_uint(groups_name, x) for x in (g or [])]
        # As sglang: sub-blocks count only when they make up the whole axis.
        groups.append(g if g and sum(g) == dim * tp_size else [])
    return dims, outer, groups
