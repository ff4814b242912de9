"""sglang's scheduler order through kvbridge.sglang, one process per rank.

Decode (decode.py's queues): every request's receiver is made first; its
prefill dp rank is resolved once try_ensure_parallel_info knows the address
(pending until then), then init(); the handshake queue polls (MIN over the
attention tp group) and only a request that saw WaitingForInput gets pages
and send_metadata; the transfer queue polls, and on Failed reads
failure_exception() and frees the pages at once (they are overwritten with a
marker, as a reuse would), then clear(). At the end, after the parent's
barrier (every surviving prefill rank finished), each freed page must still
hold the marker: no write landed after the free.

Prefill (prefill.py's queues): sender first; once the group is
WaitingForInput, pop_decode_prefix_len(), init(pages to send, aux row), then
a chunk per step; on Success or Failed, failure_exception() / clear().
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time
from typing import Dict, List, Optional

import numpy as np

from harness import ERROR_FIELDS, RankProcesses, Shape, aux_pattern, page_indices, pattern

MARKER = 0xEEEE


@dataclasses.dataclass
class SgSpec:
    role: str
    index: int
    group: List[int]  # indices of this rank's attention tp group
    bootstrap_ports: List[int]  # prefill instances; a prefill rank registers at [0]
    rooms: List[int]
    room_addr: Dict[int, int]  # room -> index into bootstrap_ports
    tp_size: int = 1  # server tp
    dp_size: int = 1
    enable_dp_attention: bool = False
    engine_rank: int = 0
    system_dp_rank: int = 0
    hold_last_chunk: List[int] = dataclasses.field(default_factory=list)
    chunk_pages: int = 3
    deadline_s: float = 40.0
    http_port: int = 30000
    stride: int = 0  # rooms per rank in the shared state array (set by SgCluster)
    # Hybrid model: state types (e.g. ["mamba", "swa"]); each room's state
    # rows go in sglang's per-type forms (mamba: a list of arrays, swa: an
    # array, a third type: None).
    state_types: List[str] = dataclasses.field(default_factory=list)
    # Decode: rooms whose metadata names a page past the pool (the rank's
    # own bad input: it fails them as invalid_request).
    bad_page_rooms: List[int] = dataclasses.field(default_factory=list)


def state_payload(types: List[str], row: int) -> Optional[list]:
    if not types:
        return None
    out: list = []
    for t in types:
        out.append([np.array([row], np.int64)] if t == "mamba" else
                   np.array([row], np.int32) if t == "swa" else None)
    return out


def state_value(room: int, t: int) -> int:
    return (room * 29 + t * 7 + 1) & 0xFF


def _attn_tp(spec: SgSpec) -> int:
    return spec.tp_size // spec.dp_size if spec.enable_dp_attention else spec.tp_size


def run_sg_rank(spec: SgSpec, states, progress, go, done, results) -> None:
    from kvbridge import KVPoll, KVTransferError
    from kvbridge import sglang as sg
    from sglang_standins import SgPool, server_args

    s = Shape(pool_pages=256)
    attn_tp = _attn_tp(spec)
    tp_rank = spec.engine_rank % attn_tp
    pool = SgPool(spec.role, tp_size=attn_tp, tp_rank=tp_rank, engine_rank=spec.engine_rank,
                  pages=s.pool_pages, heads=s.heads, page_size=s.page_size, layers=s.layers,
                  system_dp_rank=spec.system_dp_rank, state_types=spec.state_types)
    local = s.heads // attn_tp
    heads = np.arange(tp_rank * local, (tp_rank + 1) * local)
    sa = server_args(spec.bootstrap_ports[0], tp_size=spec.tp_size, dp_size=spec.dp_size,
                     enable_dp_attention=spec.enable_dp_attention, port=spec.http_port)
    mgr = sg.KVBridgeKVManager(pool.args, spec.role, sa)
    addrs = [f"127.0.0.1:{p}" for p in spec.bootstrap_ports]
    n = spec.stride or len(spec.rooms)
    slot = {room: i for i, room in enumerate(spec.rooms)}
    pages = {room: page_indices(spec.role, spec.rooms, room, s.pool_pages) for room in spec.rooms}
    outcome: Dict[int, Dict] = {}
    freed: List[int] = []

    def group_poll(room: int, xfer) -> int:
        states[spec.index * n + slot[room]] = int(xfer.poll())
        return min(states[g * n + slot[room]] for g in spec.group)

    def fail(room: int, xfer) -> Dict:
        o = {"state": "failed", "raised": False}
        try:
            xfer.failure_exception()
        except KVTransferError as e:
            o.update(raised=True, error={k: getattr(e, k, None) for k in ERROR_FIELDS})
            o["error"]["str"] = str(e)
        return o

    deadline = time.monotonic() + spec.deadline_s
    if spec.role == "decode":
        queue = {room: sg.KVBridgeKVReceiver(mgr, addrs[spec.room_addr[room]], room)
                 for room in spec.rooms}
        pending = set(spec.rooms)
        transfer: Dict[int, object] = {}
        tried: Dict[str, float] = {}
        while (queue or transfer) and time.monotonic() < deadline:
            for room in sorted(pending):  # _resolve_pending_reqs
                addr = addrs[spec.room_addr[room]]
                if addr not in mgr.prefill_info_table and \
                        time.monotonic() - tried.get(addr, 0.0) < 0.05:
                    continue  # sglang retries an address at most once a second
                tried[addr] = time.monotonic()
                if mgr.try_ensure_parallel_info(addr):
                    info = mgr.prefill_info_table[addr]
                    queue[room].init(room % info.dp_size if info.follow_bootstrap_room else 0)
                    pending.discard(room)
            for room in list(queue):  # _update_handshake_waiters + pop_preallocated
                rx = queue[room]
                p = group_poll(room, rx)
                if p == KVPoll.WaitingForInput:
                    dst = pages[room]  # pre-allocated only now
                    for arr in pool.kv:
                        arr[dst] = 0
                    if room in spec.bad_page_rooms:
                        dst = dst.copy()
                        dst[-1] = s.pool_pages + 1000
                    rx.send_metadata(dst, slot[room], state_payload(spec.state_types, slot[room]),
                                     decode_prefix_len=0)
                    transfer[room] = queue.pop(room)
                elif p == KVPoll.Failed:
                    outcome[room] = fail(room, rx)
                    rx.clear()
                    del queue[room]
                    done[spec.index] += 1
                elif p != KVPoll.Bootstrapping:
                    raise ValueError(f"Unexpected poll case: {p}")  # as sglang does
            for room in list(transfer):  # pop_transferred
                rx = transfer[room]
                p = group_poll(room, rx)
                if p == KVPoll.Failed:
                    outcome[room] = fail(room, rx)
                    for arr in pool.kv:  # release_kv_cache: the pages are reused now
                        arr[pages[room]] = MARKER
                    freed.append(room)
                elif p == KVPoll.Success:
                    dst = pages[room]
                    bad = sum(int(not np.array_equal(
                        arr[dst], pattern(room, b, np.arange(len(dst)), heads, s)))
                        for b, arr in enumerate(pool.kv))
                    # each type's own pool; a type sent as None stays untouched
                    bad += sum(int(not np.all(st[slot[room]] == (
                        state_value(room, t) if spec.state_types[t] in ("mamba", "swa") else 0)))
                               for t, st in enumerate(pool.states))
                    outcome[room] = {"state": "success", "corrupt_buffers": bad,
                                     "aux_ok": bool(np.array_equal(pool.aux[slot[room]],
                                                                   aux_pattern(room, s)))}
                else:
                    continue
                rx.clear()
                del transfer[room]
                done[spec.index] += 1
            time.sleep(0.001)  # scheduler step pacing, not synchronisation
        for room in list(queue) + list(transfer):
            outcome[room] = {"state": "nonterminal"}
    else:
        boot = {room: sg.KVBridgeKVSender(mgr, addrs[0], room, [spec.engine_rank], 0)
                for room in spec.rooms}
        inflight: Dict[int, List] = {}
        while (boot or inflight) and time.monotonic() < deadline:
            for room in list(boot):  # pop_bootstrapped
                tx = boot[room]
                p = group_poll(room, tx)
                if p == KVPoll.Bootstrapping:
                    continue
                if p == KVPoll.Failed:
                    outcome[room] = fail(room, tx)
                    tx.clear()
                    del boot[room]
                    done[spec.index] += 1
                    continue
                src = pages[room]
                prefix = tx.pop_decode_prefix_len() // s.page_size
                for b, arr in enumerate(pool.kv):
                    arr[src] = pattern(room, b, np.arange(len(src)), heads, s)
                pool.aux[slot[room]] = aux_pattern(room, s)
                for t, st in enumerate(pool.states):  # prefill's rows: 8 + slot
                    st[8 + slot[room]] = state_value(room, t)
                assert prefix == 0, "this harness's decode holds no prefix"
                tx.init(len(src), slot[room])
                inflight[room] = [boot.pop(room), 0]
            for room in list(inflight):  # send_kv_chunk + inflight queue
                tx, sent = inflight[room]
                src = pages[room]
                if sent < len(src):
                    k = min(spec.chunk_pages, len(src) - sent)
                    last = sent + k == len(src)
                    if last and room in spec.hold_last_chunk and not go.value:
                        progress[spec.index] |= 1 << slot[room]  # only the last chunk left
                    else:
                        # The newest sglang cuts a chunk into sends of at
                        # most get_max_transfer_tokens() tokens (None: one).
                        limit = tx.get_max_transfer_tokens()
                        step = k if limit is None else max(int(limit) // s.page_size, 1)
                        for at in range(sent, sent + k, step):
                            seg = min(step, sent + k - at)
                            seg_last = last and at + seg == len(src)
                            if tx.should_send_kv_chunk(seg, seg_last):
                                tx.send(src[at:at + seg],
                                        state_payload(spec.state_types, 8 + slot[room])
                                        if seg_last else None,
                                        num_kv_tokens=seg * s.page_size)  # newer sglang passes it
                        inflight[room][1] = sent + k
                p = group_poll(room, tx)
                if p == KVPoll.Success:
                    outcome[room] = {"state": "success",
                                     "bytes": tx.get_transfer_metric().transfer_total_bytes}
                elif p == KVPoll.Failed:
                    outcome[room] = fail(room, tx)
                else:
                    continue
                tx.clear()
                del inflight[room]
                done[spec.index] += 1
            time.sleep(0.001)
        for room in list(boot) + list(inflight):
            outcome[room] = {"state": "nonterminal"}
    done[spec.index] += 1000
    wait_until = time.monotonic() + 30
    while go.value < 2 and time.monotonic() < wait_until:  # the parent's barrier
        time.sleep(0.01)
    intact = {room: bool(all(np.all(arr[pages[room]] == MARKER) for arr in pool.kv))
              for room in freed}
    results.put({"index": spec.index, "role": spec.role, "engine_rank": spec.engine_rank,
                 "pid": mgr.core(addrs[0]).rank["pid"] if spec.role == "prefill" else None,
                 "outcomes": outcome, "freed_intact": intact})
    results.close()
    results.join_thread()
    while go.value < 3 and time.monotonic() < wait_until:
        time.sleep(0.01)


class SgCluster(RankProcesses):
    def __init__(self, specs: List[SgSpec]):
        self.ctx = mp.get_context("spawn")
        self.specs = specs
        nrooms = max(len(sp.rooms) for sp in specs)
        for sp in specs:
            sp.stride = nrooms
        self.states = self.ctx.Array("b", [1] * (len(specs) * nrooms), lock=False)
        self.progress = self.ctx.Array("i", [0] * len(specs), lock=False)
        self.done = self.ctx.Array("i", [0] * len(specs), lock=False)
        self.go = self.ctx.Value("i", 0, lock=False)
        self.results = self.ctx.Queue()
        self.procs = [self.ctx.Process(target=run_sg_rank, daemon=True,
                                       args=(sp, self.states, self.progress, self.go, self.done,
                                             self.results)) for sp in specs]

    @staticmethod
    def rank_name(spec) -> str:
        return f"{spec.role} rank {spec.index}"

    def finish(self, alive: List[int], timeout: float) -> Dict[int, Dict]:
        """Waits until every rank in `alive` is done, then lets them check
        their freed pages (the barrier) and collects their reports."""
        self.wait_for(lambda: all(self.done[i] >= 1000 for i in alive), timeout, "ranks done")
        self.go.value = 2
        out: Dict[int, Dict] = {}
        deadline = time.monotonic() + timeout
        while len(out) < len(alive):
            if time.monotonic() > deadline:
                raise AssertionError(f"reports from {sorted(out)} of {alive}")
            try:
                r = self.results.get(timeout=0.5)
                out[r["index"]] = r
            except Exception:  # noqa: BLE001 -- queue.Empty
                pass
        return out

    def stop(self) -> None:
        self.go.value = 3
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
