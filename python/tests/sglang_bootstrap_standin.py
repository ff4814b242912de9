"""A stand-in for sglang's own bootstrap HTTP server (CommonKVBootstrapServer),
written from its route table in docs/sglang.md (H1-H8), not from its code.

What matters for kvbridge ranks is what it lacks and drops: no /heartbeat,
/failure, /failures or /ranks (404, as aiohttp answers an unknown route); a
registration keeps only the rank's rank_ip and rank_port (the rest of the
body is read for the instance's shape and dropped); a rank lookup answers
those two alone. Writes need `Authorization: Bearer <token>` (fail closed).
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional, Tuple
from urllib.parse import parse_qs, urlparse

_REQUIRED = ("attn_tp_size", "attn_tp_rank", "attn_cp_size", "attn_cp_rank", "attn_dp_size",
             "attn_dp_rank", "pp_size", "pp_rank", "system_dp_size", "system_dp_rank", "rank_ip",
             "rank_port", "page_size", "kv_cache_dtype")


class SglangBootstrapStandin:
    """Serves on 127.0.0.1 at a free port; `address` is "host:port"."""

    def __init__(self, token: Optional[str]):
        self.token = token
        self.lock = threading.Lock()
        self.shape: Optional[dict] = None  # the first registration's sizes
        self.ranks: Dict[Tuple[int, int, int, int], dict] = {}  # (dp, cp, tp, pp) -> location
        self.dp_ranks: Dict[int, Tuple[int, float]] = {}  # room -> (dp rank, when)
        self.puts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self, code: int, body, ctype="text/plain"):
                data = body if isinstance(body, bytes) else (
                    json.dumps(body).encode() if ctype == "application/json" else body.encode())
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"null")

            def _authorized(self) -> bool:
                scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
                return bool(outer.token) and scheme.lower() == "bearer" and \
                    hmac.compare_digest(token.strip(), outer.token)

            def do_GET(self):  # noqa: N802
                url = urlparse(self.path)
                if url.path == "/health":
                    return self._answer(200, "OK")
                if url.path != "/route":
                    return self._answer(404, "404: Not Found")
                q = parse_qs(url.query)
                names = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
                if any(n not in q for n in names):
                    return self._answer(400, "Missing inputs for bootstrap server.")
                dp, cp, tp, pp = (int(q[n][0]) for n in names)
                with outer.lock:
                    shape, ranks = outer.shape, dict(outer.ranks)
                if shape is None or len(ranks) < shape["expected"]:
                    return self._answer(503, "Prefill server not fully registered")
                if (dp, cp, tp, pp) == (-1, -1, -1, -1):
                    info = {k: shape[k] for k in (
                        "attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size",
                        "kv_cache_dtype", "follow_bootstrap_room", "enable_dsa_cache_layer_split",
                        "prefill_http_port")}
                    info.update(target_tp_rank=None, target_tp_ranks=None, target_cp_ranks=None,
                                target_pp_ranks=None, required_dst_info_num=None,
                                required_prefill_response_num=None)
                    if shape.get("dsv41_spec_layout") is not None:  # newer sglang: only if set
                        info["dsv41_spec_layout"] = shape["dsv41_spec_layout"]
                    return self._answer(200, info, "application/json")
                where = ranks.get((dp, cp, tp, pp))
                if where is None:
                    return self._answer(404, "Bootstrap info not Found")
                return self._answer(200, where, "application/json")

            def do_PUT(self):  # noqa: N802
                if urlparse(self.path).path != "/route":
                    return self._answer(404, "404: Not Found")
                if not self._authorized():
                    return self._answer(401, "Unauthorized")
                d = self._body()
                try:
                    rank = {k: d[k] for k in _REQUIRED}  # sglang reads them with data[...]
                except (KeyError, TypeError) as e:
                    return self._answer(500, f"missing field {e}")
                system_dp = int(rank["system_dp_size"])
                dp_size = int(rank["attn_dp_size"]) if system_dp == 1 else system_dp
                dp_group = int(rank["attn_dp_rank"]) if system_dp == 1 else \
                    int(rank["system_dp_rank"])
                layout = d.get("dsv41_spec_layout")  # newer sglang's DSpark layout
                with outer.lock:
                    outer.puts += 1
                    if outer.ranks and outer.shape.get("dsv41_spec_layout") != layout:
                        return self._answer(
                            400, "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks")
                    if outer.shape is None:
                        method = d.get("load_balance_method") or "follow_bootstrap_room"
                        outer.shape = {
                            "attn_tp_size": int(rank["attn_tp_size"]),
                            "attn_cp_size": int(rank["attn_cp_size"]),
                            "dp_size": dp_size, "pp_size": int(rank["pp_size"]),
                            "page_size": int(rank["page_size"]),
                            "kv_cache_dtype": rank["kv_cache_dtype"],
                            "follow_bootstrap_room": method == "follow_bootstrap_room",
                            "enable_dsa_cache_layer_split":
                                bool(d.get("enable_dsa_cache_layer_split", False)),
                            "prefill_http_port": d.get("prefill_http_port"),
                            "dsv41_spec_layout": layout,
                            "expected": dp_size * int(rank["attn_cp_size"]) *
                            int(rank["attn_tp_size"]) * int(rank["pp_size"])}
                    key = (dp_group, int(rank["attn_cp_rank"]), int(rank["attn_tp_rank"]),
                           int(rank["pp_rank"]))
                    outer.ranks[key] = {"rank_ip": rank["rank_ip"],
                                        "rank_port": int(rank["rank_port"])}
                return self._answer(200, "OK")

            def do_POST(self):  # noqa: N802
                path = urlparse(self.path).path
                if path == "/register_dp_rank":
                    if not self._authorized():
                        return self._answer(401, "Unauthorized")
                    d = self._body()
                    with outer.lock:
                        outer.dp_ranks[int(d["bootstrap_room"])] = (int(d["dp_rank"]),
                                                                    time.monotonic())
                    return self._answer(200, "OK")
                if path == "/query_dp_ranks":
                    rooms = self._body().get("bootstrap_rooms", [])
                    with outer.lock:
                        found = {str(r): outer.dp_ranks[int(r)][0] for r in rooms
                                 if int(r) in outer.dp_ranks}
                    return self._answer(200, found, "application/json")
                if path == "/route":
                    return self._answer(405, "Method Not Allowed")
                return self._answer(404, "404: Not Found")

            def do_DELETE(self):  # noqa: N802
                if urlparse(self.path).path == "/route":
                    return self._answer(405, "Method Not Allowed")
                return self._answer(404, "404: Not Found")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
