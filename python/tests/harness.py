"""A scheduler imitation for multi-process tests: one process per rank.

Each rank runs what sglang's scheduler does with the transfer layer: every
step it polls each live request, publishes the state in a shared array, and
takes the MIN over its group (prefill ranks, or decode ranks) as sglang's
all-reduce does. Prefill starts a request once the group is WaitingForInput,
fills its pages with a pattern derived from (room, layer, position, token,
head) and sends them chunk by chunk; decode checks every page on Success. On
a group Failed, every rank calls failure_exception() once, catches the error
and clear()s the room. A killed rank's entries stay as it left them, as a
dead participant would leave an all-reduce.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time
from typing import Dict, List, Optional

import numpy as np

ERROR_FIELDS = ("origin", "origin_role", "origin_tp", "origin_dp", "origin_pid", "origin_host",
                "cause", "phase", "detected_by", "mechanism", "hint", "message",
                "is_from_another_rank", "bootstrap_room", "failure_reason")


@dataclasses.dataclass
class Shape:
    layers: int = 2
    heads: int = 4
    head_dim: int = 8
    page_size: int = 4
    pool_pages: int = 256
    aux_bytes: int = 32


@dataclasses.dataclass
class RankSpec:
    role: str
    tp_size: int
    tp_rank: int
    index: int  # position in the shared arrays
    group: List[int]  # indices of this rank's group
    bootstrap_addr: str
    rooms: List[int]  # room ids; pages of room r: room_pages(r)
    chunk_pages: int = 3
    hold_last_chunk: List[int] = dataclasses.field(default_factory=list)
    shape: Shape = dataclasses.field(default_factory=Shape)
    deadline_s: float = 40.0


def room_pages(room: int) -> int:
    return 2 + (room * 5) % 9


def page_indices(role: str, rooms: List[int], room: int, pool_pages: int) -> np.ndarray:
    """Scattered, disjoint pages; the same on every rank of a role."""
    order = np.random.default_rng(1 if role == "prefill" else 2).permutation(pool_pages)
    start = sum(room_pages(r) for r in rooms[:rooms.index(room)])
    return order[start:start + room_pages(room)].astype(np.int32)


def pattern(room: int, buf: int, positions: np.ndarray, heads: np.ndarray, s: Shape) -> np.ndarray:
    """uint16 of shape (pages, page_size, heads, head_dim)."""
    pos = positions.reshape(-1, 1, 1, 1).astype(np.uint64)
    tok = np.arange(s.page_size, dtype=np.uint64).reshape(1, -1, 1, 1)
    head = heads.reshape(1, 1, -1, 1).astype(np.uint64)
    d = np.arange(s.head_dim, dtype=np.uint64).reshape(1, 1, 1, -1)
    v = np.uint64(room * 1000003 + buf * 7919) + pos * np.uint64(131) + tok * np.uint64(31) \
        + head * np.uint64(7) + d
    return (v & np.uint64(0xFFFF)).astype(np.uint16)


def aux_pattern(room: int, s: Shape) -> np.ndarray:
    return ((np.arange(s.aux_bytes) + room * 13) & 0xFF).astype(np.uint8)


class Pools:
    """One rank's KV buffers (K then V per layer) and aux rows, as numpy."""

    def __init__(self, spec: RankSpec):
        s = spec.shape
        self.local_heads = s.heads // spec.tp_size
        self.heads = np.arange(spec.tp_rank * self.local_heads,
                               (spec.tp_rank + 1) * self.local_heads)
        self.kv = [np.zeros((s.pool_pages, s.page_size, self.local_heads, s.head_dim), np.uint16)
                   for _ in range(2 * s.layers)]
        self.aux = np.zeros((len(spec.rooms) + 1, s.aux_bytes), np.uint8)

    def args(self, spec: RankSpec):
        import kvbridge
        s = spec.shape
        a = kvbridge.KVArgs(engine_rank=spec.tp_rank, tp_size=spec.tp_size, tp_rank=spec.tp_rank,
                            page_size=s.page_size, kv_head_num=self.local_heads,
                            total_kv_head_num=s.heads, dtype="bfloat16")
        for buf in self.kv:
            a.add_kv_buffer(buf, buf[0].nbytes)
        a.add_aux_buffer(self.aux, s.aux_bytes)
        return a


def exception_fields(e: BaseException) -> Dict:
    out = {k: getattr(e, k, None) for k in ERROR_FIELDS}
    out["class"] = type(e).__name__
    out["str"] = str(e)
    return out


def run_rank(spec: RankSpec, states, progress, go, done, results) -> None:
    import kvbridge
    from kvbridge import KVPoll, KVTransferError

    s = spec.shape
    pools = Pools(spec)
    config = kvbridge.KVConfig(bootstrap_addr=spec.bootstrap_addr, start_bootstrap_server=False,
                               heartbeat_interval_ms=100, heartbeat_misses=5,
                               bootstrap_timeout_s=20, waiting_timeout_s=20, transfer_timeout_s=10)
    mgr = kvbridge.KVManager(pools.args(spec), spec.role, config)
    prefill = spec.role == "prefill"
    nrooms = len(spec.rooms)
    live, sent, started, held, outcome = {}, {}, set(), set(), {}
    for i, room in enumerate(spec.rooms):
        pages = page_indices(spec.role, spec.rooms, room, s.pool_pages)
        if prefill:
            live[room] = (i, pages, kvbridge.KVSender(mgr, spec.bootstrap_addr, room))
            sent[room] = 0
        else:
            r = kvbridge.KVReceiver(mgr, spec.bootstrap_addr, room)
            r.init(0)
            r.send_metadata(pages, aux_index=i)
            live[room] = (i, pages, r)
    deadline = time.monotonic() + spec.deadline_s
    while live and time.monotonic() < deadline:
        for room in list(live):
            i, pages, xfer = live[room]
            states[spec.index * nrooms + i] = int(xfer.poll())
            group = KVPoll(min(states[g * nrooms + i] for g in spec.group))
            if prefill and group >= KVPoll.WaitingForInput and room not in started:
                for buf, arr in enumerate(pools.kv):
                    arr[pages] = pattern(room, buf, np.arange(len(pages)), pools.heads, s)
                pools.aux[i] = aux_pattern(room, s)
                xfer.init(len(pages), i)
                started.add(room)
            if prefill and room in started and sent[room] < len(pages) and \
                    group in (KVPoll.WaitingForInput, KVPoll.Transferring):
                n = min(spec.chunk_pages, len(pages) - sent[room])
                last = sent[room] + n == len(pages)
                if not (last and room in spec.hold_last_chunk and not go.value):
                    xfer.send(pages[sent[room]:sent[room] + n])
                    sent[room] += n
                elif room not in held:
                    held.add(room)
                    progress[spec.index] += 1  # only the held last chunk remains
            if group == KVPoll.Success:
                o = {"state": "success"}
                if not prefill:
                    bad = sum(int(not np.array_equal(
                        arr[pages], pattern(room, buf, np.arange(len(pages)), pools.heads, s)))
                        for buf, arr in enumerate(pools.kv))
                    o.update(pages=len(pages) * len(pools.kv), corrupt_buffers=bad,
                             aux_ok=bool(np.array_equal(pools.aux[i], aux_pattern(room, s))))
                outcome[room] = o
            elif group == KVPoll.Failed:
                o = {"state": "failed", "local": int(xfer.poll()), "raised": False}
                try:
                    xfer.failure_exception()
                except KVTransferError as e:
                    o.update(raised=True, error=exception_fields(e))
                outcome[room] = o
            else:
                continue
            xfer.clear()
            del live[room]
            done[spec.index] += 1
        time.sleep(0.001)  # scheduler step pacing, not synchronisation
    for room, (i, _, xfer) in live.items():
        outcome[room] = {"state": "nonterminal", "local": int(xfer.poll()),
                         "group": min(states[g * nrooms + i] for g in spec.group)}
        xfer.clear()
    results.put({"index": spec.index, "role": spec.role, "tp": spec.tp_rank,
                 "pid": mgr.rank["pid"], "outcomes": outcome})
    results.close()
    results.join_thread()
    done[spec.index] += 1000  # reported; stay up so no peer sees us die
    wait_until = time.monotonic() + 30
    while not go.value >= 2 and time.monotonic() < wait_until:
        time.sleep(0.01)


class RankProcesses:
    """One process per rank spec (`self.specs`, `self.procs`): start them, and
    wait for a condition while failing fast if a rank exits on its own (a
    SIGKILL the test sent, -9, is expected). `rank_name(spec)` names a rank."""

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def wait_for(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            for sp, p in zip(self.specs, self.procs):
                if p.exitcode not in (None, 0, -9):
                    raise AssertionError(f"{self.rank_name(sp)} exited with {p.exitcode}")
            time.sleep(0.01)


class Cluster(RankProcesses):
    """Prefill tp P -> decode tp D, one process per rank (spawned)."""

    @staticmethod
    def rank_name(spec) -> str:
        return f"{spec.role} tp{spec.tp_rank}"

    def __init__(self, bootstrap_addr: str, prefill_tp: int, decode_tp: int, rooms: List[int],
                 hold_last_chunk: Optional[List[int]] = None, deadline_s: float = 40.0):
        self.ctx = mp.get_context("spawn")
        self.rooms = rooms
        n = prefill_tp + decode_tp
        self.states = self.ctx.Array("b", [1] * (n * len(rooms)), lock=False)
        self.progress = self.ctx.Array("i", [0] * n, lock=False)
        self.done = self.ctx.Array("i", [0] * n, lock=False)
        self.go = self.ctx.Value("i", 0, lock=False)
        self.results = self.ctx.Queue()
        self.specs = []
        pre, dec = list(range(prefill_tp)), list(range(prefill_tp, n))
        for role, size, group in (("prefill", prefill_tp, pre), ("decode", decode_tp, dec)):
            for r in range(size):
                self.specs.append(RankSpec(role, size, r, group[r], group, bootstrap_addr, rooms,
                                           hold_last_chunk=list(hold_last_chunk or []),
                                           deadline_s=deadline_s))
        self.procs = [self.ctx.Process(target=run_rank, daemon=True,
                                       args=(sp, self.states, self.progress, self.go, self.done,
                                             self.results)) for sp in self.specs]


    def collect(self, expected: int, timeout: float) -> Dict[int, Dict]:
        out, deadline = {}, time.monotonic() + timeout
        while len(out) < expected:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [f"{s.role} tp{s.tp_rank}" for s in self.specs if s.index not in out]
                raise AssertionError(f"no report from {missing} within {timeout} s")
            try:
                r = self.results.get(timeout=min(left, 0.5))
                out[r["index"]] = r
            except Exception:
                for sp, p in zip(self.specs, self.procs):
                    if sp.index not in out and p.exitcode not in (None, -9):
                        raise AssertionError(f"{sp.role} tp{sp.tp_rank} died: {p.exitcode}")
        return out

    def stop(self) -> None:
        self.go.value = 2
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
