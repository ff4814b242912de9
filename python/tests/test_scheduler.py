"""Multi-process tests: a scheduler imitation on prefill tp2 -> decode tp2,
one process per rank (see harness.py)."""

import os
import signal

import pytest

from harness import Cluster, room_pages

PREFILL_TP, DECODE_TP = 2, 2


def rank_name(r):
    return f"{r['role']} tp{r['tp']}"


def test_transfers_prefill_tp2_to_decode_tp2_every_page_verified(bootstrap):
    rooms = list(range(1, 9))
    c = Cluster(bootstrap, PREFILL_TP, DECODE_TP, rooms, deadline_s=30)
    c.start()
    try:
        reports = c.collect(PREFILL_TP + DECODE_TP, timeout=45)
    finally:
        c.stop()
    for r in reports.values():
        for room in rooms:
            o = r["outcomes"][room]
            assert o["state"] == "success", f"{rank_name(r)} room {room}: {o}"
            if r["role"] == "decode":
                assert o["pages"] == room_pages(room) * 4
                assert o["corrupt_buffers"] == 0 and o["aux_ok"], f"{rank_name(r)} room {room}"


def test_prefill_rank_sigkill_names_the_dead_rank_on_every_survivor(bootstrap):
    early = [1, 2, 3]  # finish before the kill
    held = [4, 5, 6]  # mid-transfer at the kill: last chunk withheld
    assert all(room_pages(r) > 3 for r in held), "a held room needs two chunks"
    c = Cluster(bootstrap, PREFILL_TP, DECODE_TP, early + held, hold_last_chunk=held,
                deadline_s=20)
    victim = 1  # prefill tp1
    c.start()
    try:
        c.wait_for(lambda: all(c.progress[i] >= len(held) for i in range(PREFILL_TP)) and
                   all(c.done[i] >= len(early) for i in range(PREFILL_TP + DECODE_TP)),
                   timeout=30, what="early rooms done and held rooms mid-transfer")
        victim_pid = c.procs[victim].pid
        os.kill(victim_pid, signal.SIGKILL)
        c.procs[victim].join(timeout=10)  # reaped: the kernel says it exited
        # The survivors keep their last chunks: in a TP group the forward that
        # produces them needs the dead rank's collectives.
        reports = c.collect(PREFILL_TP + DECODE_TP - 1, timeout=30)
    finally:
        c.stop()
    survivors = list(reports.values())
    assert {rank_name(r) for r in survivors} == {"prefill tp0", "decode tp0", "decode tp1"}
    for r in survivors:
        for room in early:
            assert r["outcomes"][room]["state"] == "success", f"{rank_name(r)} room {room}"
    # Every survivor, every held room: Failed, and the error names prefill tp1,
    # its pid and the cause, with is_from_another_rank (no survivor is the
    # origin). Collected so one run shows every rank that falls short.
    problems = []
    for r in survivors:
        for room in held:
            o = r["outcomes"][room]
            where = f"{rank_name(r)} room {room}"
            if o["state"] != "failed":
                problems.append(f"{where}: never Failed ({o})")
                continue
            e = o.get("error")
            if not o["raised"] or e is None:
                problems.append(f"{where}: failure_exception() did not raise")
                continue
            named = (e["origin_role"], e["origin_tp"], e["origin_pid"])
            if named != ("prefill", victim, victim_pid) or e["cause"] != "peer_exited":
                problems.append(f"{where}: names {named}, cause {e['cause']}: {e['str']}")
            if e["is_from_another_rank"] is not True:
                problems.append(f"{where}: is_from_another_rank {e['is_from_another_rank']}")
            if "prefill tp1" not in e["failure_reason"]:
                problems.append(f"{where}: reason does not name prefill tp1: {e['str']}")
    assert not problems, "\n".join(problems)
