"""kvbridge ranks against sglang's own bootstrap server (a stand-in written
from its route table: sglang_bootstrap_standin.py). That server keeps no
liveness and no failure records and lists a prefill rank by rank_ip and
rank_port alone: kvbridge's decode reads the rest of a prefill rank's record
from the rank itself, decode ranks are not listed, liveness comes from peers
and failure records travel between peers."""

import urllib.error
import urllib.request


from sg_harness import SgCluster
from test_sglang_scheduler import sigkill_prefill_mid_transfer, tp2_specs


def _get(url, method="GET", body=None, token=None):
    req = urllib.request.Request(url, method=method, data=body)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_standin_has_sglangs_routes_only(sglang_bootstrap):
    base = f"http://{sglang_bootstrap.address}"
    assert _get(base + "/health")[0] == 200
    for path in ("/heartbeat", "/failures?since=0", "/ranks"):
        assert _get(base + path)[0] == 404, path
    assert _get(base + "/failure", "POST", b"{}")[0] == 404
    assert _get(base + "/route", "PUT", b"{}")[0] == 401  # writes need the token
    every = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
    assert _get(base + every)[0] == 503  # nobody registered


def test_kvbridge_ranks_against_sglangs_server_tp2(sglang_bootstrap):
    rooms = list(range(1, 7))
    c = SgCluster(tp2_specs(sglang_bootstrap.address, rooms, deadline_s=30))
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
    # Only the two prefill ranks were listed (a decode rank's registration
    # would have been filed as a prefill rank's), each by its location only.
    assert sglang_bootstrap.puts == 2
    assert sorted(sglang_bootstrap.ranks) == [(0, 0, 0, 0), (0, 0, 1, 0)]
    for where in sglang_bootstrap.ranks.values():
        assert set(where) == {"rank_ip", "rank_port"} and where["rank_port"] > 0


def test_sigkill_prefill_against_sglangs_server(sglang_bootstrap):
    # No registry liveness or records: what a rank learns comes from its
    # peers. Decode tp1 (rank 3), connected to the victim, names it. Decode
    # tp r reads prefill tp r only (tp2 -> tp2), so decode tp1 also connects
    # prefill tp0, which it reads nothing from, and tells it why the rooms
    # failed; prefill tp0 tells decode tp0 (docs/sglang.md, B3). Every
    # survivor names the victim, every room fails, none hangs, and no write
    # lands in freed pages.
    sigkill_prefill_mid_transfer(sglang_bootstrap.address, must_name=(0, 2, 3))


def test_a_decode_ranks_own_failure_reaches_every_rank_against_sglangs_server(sglang_bootstrap):
    # Decode tp1 (rank 3) rejects its own metadata for one room (a page past
    # its pool). With no registry to carry the record, it still reaches the
    # ranks that share no transfer with decode tp1: decode tp1 tells prefill
    # tp0 (connected for this, though it reads nothing from it), which tells
    # decode tp0 (docs/sglang.md, B3). Every rank fails that room naming
    # decode tp1 and invalid_request; every other room succeeds.
    rooms, bad = [1, 2, 3, 4], 3
    specs = tp2_specs(sglang_bootstrap.address, rooms, deadline_s=30)
    assert (specs[3].role, specs[3].engine_rank) == ("decode", 1)
    specs[3].bad_page_rooms = [bad]
    c = SgCluster(specs)
    c.start()
    try:
        culprit = c.procs[3].pid
        reports = c.finish(list(range(4)), timeout=45)
    finally:
        c.stop()
    problems = []
    for r in reports.values():
        who = f"{r['role']} tp{r['engine_rank']}"
        for room in rooms:
            o = r["outcomes"][room]
            if room != bad:
                if o["state"] != "success":
                    problems.append(f"{who} room {room}: {o}")
                continue
            e = o.get("error")
            if o["state"] != "failed" or e is None:
                problems.append(f"{who} room {room}: {o}")
                continue
            named = (e["origin_role"], e["origin_tp"], e["origin_pid"], e["cause"])
            if named != ("decode", 1, culprit, "invalid_request"):
                problems.append(f"{who} room {room}: names {named}: {e['str']}")
    assert not problems, "\n".join(problems)
