"""sglang's scheduler order through kvbridge.sglang with real processes
(sg_harness.py): prefill tp2 -> decode tp2, attention dp 2, two prefill
instances behind one decode, and a SIGKILL of a prefill rank mid-transfer
with the freed pages checked after a barrier."""

import os
import signal

import kvbridge

from harness import room_pages
from sg_harness import SgCluster, SgSpec


def _port(bootstrap):
    return int(bootstrap.rsplit(":", 1)[1])


def tp2_specs(bootstrap, rooms, **kw):
    specs = []
    for role, base, port in (("prefill", 0, 30100), ("decode", 2, 30200)):
        for r in range(2):
            specs.append(SgSpec(role, base + r, [base, base + 1], [_port(bootstrap)], rooms,
                                {room: 0 for room in rooms}, tp_size=2, engine_rank=r,
                                http_port=port, **kw))
    return specs


def test_sglang_order_prefill_tp2_to_decode_tp2(bootstrap):
    rooms = list(range(1, 7))
    c = SgCluster(tp2_specs(bootstrap, rooms, deadline_s=30))
    c.start()
    try:
        reports = c.finish(list(range(4)), timeout=45)
    finally:
        c.stop()
    for r in reports.values():
        for room in rooms:
            o = r["outcomes"][room]
            assert o["state"] == "success", f"{r['role']} {r['engine_rank']} room {room}: {o}"
            if r["role"] == "decode":
                assert o["corrupt_buffers"] == 0 and o["aux_ok"], f"room {room}: {o}"
            else:
                assert o["bytes"] > 0


def test_dp_attention_sglang_order(bootstrap):
    # tp 2 with attention dp 2 on both sides: attention tp 1, each rank its
    # own group. Prefill dp d serves rooms with room % 2 == d
    # (follow_bootstrap_room); decode dp d gets rooms from both prefill dps.
    rooms_of = {0: [0, 1, 4, 5], 1: [2, 3, 6, 7]}  # decode dp -> rooms
    prefill_rooms = {0: [0, 2, 4, 6], 1: [1, 3, 5, 7]}
    specs = []
    for d in range(2):
        specs.append(SgSpec("prefill", d, [d], [_port(bootstrap)], prefill_rooms[d],
                            {r: 0 for r in prefill_rooms[d]}, tp_size=2, dp_size=2,
                            enable_dp_attention=True, engine_rank=d, http_port=30300,
                            deadline_s=30))
    for d in range(2):
        specs.append(SgSpec("decode", 2 + d, [2 + d], [_port(bootstrap)], rooms_of[d],
                            {r: 0 for r in rooms_of[d]}, tp_size=2, dp_size=2,
                            enable_dp_attention=True, engine_rank=0, system_dp_rank=d,
                            http_port=30400, deadline_s=30))
    c = SgCluster(specs)
    c.start()
    try:
        reports = c.finish(list(range(4)), timeout=45)
    finally:
        c.stop()
    for r in reports.values():
        for room, o in r["outcomes"].items():
            assert o["state"] == "success", f"{r['role']} {r['index']} room {room}: {o}"
            if r["role"] == "decode":
                assert o["corrupt_buffers"] == 0 and o["aux_ok"], f"room {room}: {o}"


def test_sigkill_prefill_mid_transfer_sglang_order(bootstrap):
    sigkill_prefill_mid_transfer(bootstrap)


def sigkill_prefill_mid_transfer(bootstrap, must_name=(0, 2, 3)):
    """SIGKILL prefill tp1 (rank 1) with rooms mid-transfer: the survivors in
    `must_name` (rank indices) name it, every survivor fails those rooms with
    an exception, and no write lands in the pages decode freed."""
    early, held = [1, 2, 3], [4, 5, 6]
    assert all(room_pages(r) > 3 for r in held), "a held room needs two chunks"
    c = SgCluster(tp2_specs(bootstrap, early + held, hold_last_chunk=held, deadline_s=25))
    victim = 1  # prefill tp1
    c.start()
    try:
        held_bits = sum(1 << (len(early) + i) for i in range(len(held)))
        c.wait_for(lambda: all(c.progress[i] & held_bits == held_bits for i in range(2)) and
                   all(c.done[i] >= len(early) for i in range(4)),
                   timeout=30, what="early rooms done and held rooms mid-transfer")
        victim_pid = c.procs[victim].pid
        os.kill(victim_pid, signal.SIGKILL)
        c.procs[victim].join(timeout=10)
        # Decode freed the held rooms' pages right after Failed; then prefill
        # tp0's scheduler sends their last chunks anyway (as sglang's does
        # after a forward): none of it may land.
        c.wait_for(lambda: all(c.done[i] >= len(early) + len(held) for i in (2, 3)),
                   timeout=30, what="decode done with every room")
        c.go.value = 1
        reports = c.finish([0, 2, 3], timeout=30)
    finally:
        c.stop()
    problems = []
    for r in reports.values():
        who = f"{r['role']} tp{r['engine_rank']}"
        for room in early:
            if r["outcomes"][room]["state"] != "success":
                problems.append(f"{who} room {room}: {r['outcomes'][room]}")
        for room in held:
            o = r["outcomes"][room]
            e = o.get("error")
            if o["state"] != "failed" or not o["raised"] or e is None:
                problems.append(f"{who} room {room}: {o}")
                continue
            if r["index"] not in must_name:
                continue
            named = (e["origin_role"], e["origin_tp"], e["origin_pid"], e["cause"])
            if named != ("prefill", victim, victim_pid, "peer_exited"):
                problems.append(f"{who} room {room}: names {named}: {e['str']}")
            # prefill tp0: its sibling died (True); decode: the other side (False)
            want = r["role"] == "prefill"
            if e["is_from_another_rank"] is not want:
                problems.append(f"{who} room {room}: is_from_another_rank "
                                f"{e['is_from_another_rank']}")
        if r["role"] == "decode":
            if sorted(r["freed_intact"]) != held:
                problems.append(f"{who}: freed {sorted(r['freed_intact'])}, not {held}")
            for room, ok in r["freed_intact"].items():
                if not ok:
                    problems.append(f"{who} room {room}: a write landed in freed pages")
    assert not problems, "\n".join(problems)


def test_two_prefill_instances_behind_one_decode_sglang_order(bootstrap):
    other = kvbridge.BootstrapServer("127.0.0.1", 0)
    try:
        ports = [_port(bootstrap), other.port]
        rooms = list(range(1, 9))
        of = {room: room % 2 for room in rooms}  # the router's choice of prefill instance
        specs = [SgSpec("prefill", i, [i], [ports[i]], [r for r in rooms if of[r] == i],
                        {r: 0 for r in rooms if of[r] == i}, http_port=30500 + i,
                        deadline_s=30) for i in range(2)]
        specs.append(SgSpec("decode", 2, [2], ports, rooms, of, http_port=30600,
                            deadline_s=30))
        c = SgCluster(specs)
        c.start()
        try:
            reports = c.finish([0, 1, 2], timeout=45)
        finally:
            c.stop()
    finally:
        other.close()
    for r in reports.values():
        assert len(r["outcomes"]) == len(specs[r["index"]].rooms)
        for room, o in r["outcomes"].items():
            assert o["state"] == "success", f"{r['role']} {r['index']} room {room}: {o}"
            if r["role"] == "decode":
                assert o["corrupt_buffers"] == 0 and o["aux_ok"], f"room {room}: {o}"


def test_hybrid_state_indices_sglang_order(bootstrap):
    # A hybrid (mamba + SWA) model: every room's state rows travel in
    # sglang's per-type forms with its last chunk (a third type carries
    # none); decode checks each type's own pool (docs/sglang.md, A4).
    rooms = list(range(1, 7))
    types = ["mamba", "swa", "other"]
    specs = [SgSpec("prefill", 0, [0], [_port(bootstrap)], rooms, {r: 0 for r in rooms},
                    http_port=30700, state_types=types, deadline_s=30),
             SgSpec("decode", 1, [1], [_port(bootstrap)], rooms, {r: 0 for r in rooms},
                    http_port=30800, state_types=types, deadline_s=30)]
    c = SgCluster(specs)
    c.start()
    try:
        reports = c.finish([0, 1], timeout=45)
    finally:
        c.stop()
    for r in reports.values():
        for room, o in r["outcomes"].items():
            assert o["state"] == "success", f"{r['role']} room {room}: {o}"
            if r["role"] == "decode":
                assert o["corrupt_buffers"] == 0 and o["aux_ok"], f"room {room}: {o}"
