"""Compressed MLA (DeepSeek V4: KVArgs.mla_compression_ratios) from two
prefill pipeline stages into one decode (docs/sglang.md, A9), through the
adapter. The pools are laid out as sglang's compressed-MLA pools list them
(by compression bucket, not by layer), and, as sglang fills KVArgs, only
prefill gives the ratios. Where each stage's buffers must land is computed
as sglang's mooncake backend slices decode's lists for a stage
(`_mla_slice_ptrs_for_pp`: offsets by counting ratios before the stage),
not by layer ids."""

from __future__ import annotations

from typing import List, Tuple

import logging

import numpy as np
import pytest

import kvbridge
from kvbridge import KVPoll, _sglang_mla
from kvbridge import sglang as sg
from sglang_standins import SgKVArgs, server_args, settle, wait_until

RATIOS = [4, 128, 4, 0, 4, 128]  # layer 3: no compressed cache
STAGES = [(0, 3), (3, 6)]
PAGES, PAGE_SIZE, ROWS = 32, 4, 8


def count(ratio: int, first: int, last: int) -> int:
    return sum(1 for r in RATIOS[first:last] if r == ratio)


class MlaPool:
    """One rank's compressed-MLA buffers for layers [start, end): kv as
    [ratio-4 layers | their indexers | ratio-128 layers]; state components
    SWA [SWA layers | ratio-4 compress states | their indexers] and
    C128_STATE [ratio-128 compress states]."""

    def __init__(self, mode: str, start: int, end: int):
        c4, c128 = count(4, start, end), count(128, start, end)
        self.kv = [np.zeros((PAGES, PAGE_SIZE, 1, 8), np.uint16)
                   for _ in range(2 * c4 + c128)]
        self.swa = [np.zeros((ROWS, 16), np.uint8) for _ in range((end - start) + 2 * c4)]
        self.c128 = [np.zeros((ROWS, 24), np.uint8) for _ in range(c128)]
        self.aux = np.zeros((8, 32), np.uint8)
        a = SgKVArgs()
        a.engine_rank, a.pp_rank, a.system_dp_rank, a.gpu_id, a.ib_device = 0, 0, 0, 0, None
        a.kv_data_ptrs = [int(b.ctypes.data) for b in self.kv]
        a.kv_data_lens = [int(b.nbytes) for b in self.kv]
        a.kv_item_lens = [int(b[0].nbytes) for b in self.kv]
        a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = (
            [int(self.aux.ctypes.data)], [int(self.aux.nbytes)], [int(self.aux[0].nbytes)])
        comps = (self.swa, self.c128)
        a.state_types = ["SWA", "C128_STATE"]
        a.state_data_ptrs = [[int(b.ctypes.data) for b in c] for c in comps]
        a.state_data_lens = [[int(b.nbytes) for b in c] for c in comps]
        a.state_item_lens = [[int(b[0].nbytes) for b in c] for c in comps]
        a.page_size = PAGE_SIZE
        if mode == "prefill":  # sglang's decode sets no ratios
            a.mla_compression_ratios = list(RATIOS)
            a.kv_head_num = a.total_kv_head_num = 1
            a.prefill_start_layer, a.prefill_end_layer = start, end
        self.args = a

    def fill(self, seed: int) -> None:
        for i, buf in enumerate(self.kv + self.swa + self.c128):
            buf[...] = ((seed * 7919 + i * 131 + np.arange(buf.size)) % 251 + 1
                        ).astype(buf.dtype).reshape(buf.shape)


def sglang_slices(start: int, end: int) -> Tuple[List[int], List[int], List[int]]:
    """Decode's kv, SWA-state and C128-state buffers a stage's buffers land
    in, in the stage's order: sglang's slicing of decode's whole-model lists."""
    c4_all, c128_all = count(4, 0, len(RATIOS)), count(128, 0, len(RATIOS))
    c4s, c4e = count(4, 0, start), count(4, 0, end)
    c128s, c128e = count(128, 0, start), count(128, 0, end)
    kv = (list(range(c4s, c4e)) + list(range(c4_all + c4s, c4_all + c4e)) +
          list(range(2 * c4_all + c128s, 2 * c4_all + c128e)))
    swa_all = len(RATIOS)
    swa = (list(range(start, end)) + list(range(swa_all + c4s, swa_all + c4e)) +
           list(range(swa_all + c4_all + c4s, swa_all + c4_all + c4e)))
    return kv, swa, list(range(c128s, c128e))


def test_each_pipeline_stage_lands_where_sglang_slices_it(bootstrap):  # A9
    port = int(bootstrap.rsplit(":", 1)[1])
    stages = []
    for s, (start, end) in enumerate(STAGES):
        pool = MlaPool("prefill", start, end)
        pool.args.pp_rank = s
        sa = server_args(port, port=30950)
        sa.pp_size = 2
        stages.append((pool, sg.KVBridgeKVManager(pool.args, "prefill", sa, True)))
    d = MlaPool("decode", 0, len(RATIOS))
    dm = sg.KVBridgeKVManager(d.args, "decode", server_args(port, port=30951), True)
    try:
        src, dst = np.array([3, 4], np.int32), np.array([20, 9], np.int32)
        swa_rows, c128_rows = (np.array([2]), np.array([6])), (np.array([1]), np.array([5]))
        rx = sg.KVBridgeKVReceiver(dm, bootstrap, 51)
        txs = [sg.KVBridgeKVSender(m, bootstrap, 51, [0], s) for s, (_, m) in enumerate(stages)]
        assert dm.try_ensure_parallel_info(bootstrap)
        rx.init(0)
        wait_until(lambda: rx.poll() != KVPoll.Bootstrapping, what="handshake with both stages")
        assert rx.poll() == KVPoll.WaitingForInput, rx.failure()
        rx.send_metadata(dst, 2, [swa_rows[1], c128_rows[1]])
        for s, ((pool, _), tx) in enumerate(zip(stages, txs)):
            wait_until(lambda: tx.poll() != KVPoll.Bootstrapping, what="prefill metadata")
            pool.fill(51 + 100 * s)
            tx.init(len(src), 2)
            tx.send(src, [swa_rows[0], c128_rows[0]], num_kv_tokens=len(src) * PAGE_SIZE)
        wait_until(lambda: rx.poll() in (KVPoll.Success, KVPoll.Failed), what="transfer")
        assert rx.poll() == KVPoll.Success, rx.failure()
        written = set()
        for s, ((pool, _), (start, end)) in enumerate(zip(stages, STAGES)):
            kv, swa, c128 = sglang_slices(start, end)
            assert len(kv) == len(pool.kv) and len(swa) == len(pool.swa)
            for b, into in enumerate(kv):
                assert np.array_equal(d.kv[into][dst], pool.kv[b][src]), \
                    f"stage {s} kv buffer {b} -> decode {into}"
                written.add(("kv", into))
            for b, into in enumerate(swa):
                assert np.array_equal(d.swa[into][swa_rows[1]], pool.swa[b][swa_rows[0]]), \
                    f"stage {s} SWA state buffer {b} -> decode {into}"
                written.add(("swa", into))
            for b, into in enumerate(c128):
                assert np.array_equal(d.c128[into][c128_rows[1]], pool.c128[b][c128_rows[0]]), \
                    f"stage {s} C128 state buffer {b} -> decode {into}"
                written.add(("c128", into))
        # every decode buffer came from exactly one stage
        assert {into for kind, into in written if kind == "kv"} == set(range(len(d.kv)))
        assert {into for kind, into in written if kind == "swa"} == set(range(len(d.swa)))
        assert {into for kind, into in written if kind == "c128"} == set(range(len(d.c128)))
        settle(txs, rx)
    finally:
        dm.close()
        for _, m in stages:
            m.close()


def test_buffers_that_do_not_fit_the_ratios_are_refused_naming_the_counts():  # A9
    pool = MlaPool("prefill", 0, 3)
    sa = server_args(1)
    sa.pp_size = 2
    pool.args.kv_data_ptrs = pool.args.kv_data_ptrs[:-1]  # one kv buffer short
    pool.args.kv_data_lens = pool.args.kv_data_lens[:-1]
    pool.args.kv_item_lens = pool.args.kv_item_lens[:-1]
    with pytest.raises(kvbridge.InvalidArgumentError,
                       match=r"4 kv buffers for layers \[0, 3\).* 5 expected"):
        sg.to_kvbridge_args(pool.args, sa, "prefill")
    for bad, words in ((["x"], "KVArgs.mla_compression_ratios"),
                       ([4, 4.5], "KVArgs.mla_compression_ratios"),
                       ([4, True], "KVArgs.mla_compression_ratios"),
                       ([4, -1, 4, 0, 4, 128], r"6 ratios: at most 4096, each in \[0, 2\*\*31\)"),
                       ([4, 2**40, 4, 0, 4, 128], "6 ratios"), ([0] * 5000, "5000 ratios")):
        pool = MlaPool("prefill", 0, 3)
        pool.args.mla_compression_ratios = bad
        with pytest.raises(kvbridge.InvalidArgumentError, match=words):
            sg.to_kvbridge_args(pool.args, sa, "prefill")
    for draft in ("2", 1.5, True, 99):
        pool = MlaPool("prefill", 0, 3)
        pool.args.num_draft_entries = draft
        with pytest.raises(kvbridge.InvalidArgumentError, match="num_draft_entries"):
            sg.to_kvbridge_args(pool.args, sa, "prefill")
    pool = MlaPool("prefill", 0, 3)
    pool.args.prefill_start_layer = np.int64(0)  # numpy integers are integers
    assert sg.to_kvbridge_args(pool.args, sa, "prefill").kv_layer_ids == [0, 2, 0, 2, 1]
    pool.args.prefill_end_layer = 9  # beyond the six layers the ratios describe
    with pytest.raises(kvbridge.InvalidArgumentError, match=r"\[0, 9\) do not lie within"):
        sg.to_kvbridge_args(pool.args, sa, "prefill")
    pool = MlaPool("prefill", 0, 3)
    for field in ("state_data_ptrs", "state_data_lens", "state_item_lens"):
        getattr(pool.args, field)[0] = getattr(pool.args, field)[0][:3]  # SWA: 3 for 3 + 2 x 2
    with pytest.raises(kvbridge.InvalidArgumentError, match="SWA state component has 3 buffers"):
        sg.to_kvbridge_args(pool.args, sa, "prefill")


def test_ids_sglang_gives_are_kept_and_the_ratios_not_published():  # A9
    pool = MlaPool("prefill", 0, 3)
    pool.args.kv_layer_ids = [7, 8, 7, 8, 9]
    ours = sg.to_kvbridge_args(pool.args, server_args(1), "prefill")
    assert ours.kv_layer_ids == [7, 8, 7, 8, 9]
    assert ours.mla_compression_ratios == []  # a decode numbers nothing from them


def test_a_decode_stage_is_refused_by_name(bootstrap, caplog):  # A9
    # Prefill publishes its ratios; a decode of pp 2 is refused by name,
    # logged, and never raised into sglang's decode loop.
    port = int(bootstrap.rsplit(":", 1)[1])
    pool = MlaPool("prefill", 0, 6)
    pm = sg.KVBridgeKVManager(pool.args, "prefill", server_args(port, port=30952), True)
    d = MlaPool("decode", 0, 3)
    sa = server_args(port, port=30953)
    sa.pp_size = 2
    dm = sg.KVBridgeKVManager(d.args, "decode", sa, True)
    try:
        with caplog.at_level(logging.ERROR, logger="kvbridge"):
            assert dm.try_ensure_parallel_info(bootstrap) is False
        assert "into a decode server of pp_size 2" in caplog.text, caplog.text
        # Asked again (sglang asks each step while a request waits): no new
        # lookup, no new log line; a receiver for that prefill fails with the
        # reason, not with "not reachable".
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="kvbridge"):
            assert dm.try_ensure_parallel_info(bootstrap) is False
        assert "cannot place its KV here" not in caplog.text, caplog.text
        rx = sg.KVBridgeKVReceiver(dm, bootstrap, 42)
        rx.init(0)
        assert rx.poll() == sg.KVPoll.Failed
        assert "into a decode server of pp_size 2" in str(rx.failure()), rx.failure()
        args = sg.to_kvbridge_args(d.args, sa, "decode")
        with pytest.raises(kvbridge.UnimplementedError, match="into a decode server of pp_size 2"):
            _sglang_mla.number_buffers(d.args, args, RATIOS, 2, "decode")
    finally:
        dm.close()
        pm.close()
