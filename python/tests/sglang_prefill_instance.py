"""One sglang prefill instance in its own process, as sglang runs one: the
bootstrap server at --port (sglang starts it in the prefill server's
process) and one kvbridge prefill rank per attention dp rank (dp-attention,
attention tp 1), all through kvbridge.sglang. Prints "ready" once every
rank registered, then idles until its stdin closes (or it is killed).

    python3 sglang_prefill_instance.py PORT DP_SIZE LOAD_BALANCE_METHOD
"""

import sys

from kvbridge import sglang as sg
from sglang_standins import SgPool, server_args


def main() -> None:
    port, dp, method = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    server = sg.KVBridgeKVBootstrapServer("127.0.0.1", port)
    pools, managers = [], []
    for rank in range(dp):
        sa = server_args(port, tp_size=dp, dp_size=dp, enable_dp_attention=dp > 1)
        sa.load_balance_method = method
        pool = SgPool("prefill", engine_rank=rank)
        pools.append(pool)
        managers.append(sg.KVBridgeKVManager(pool.args, "prefill", sa))
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes it
    for m in managers:
        m.close()
    server.close()


if __name__ == "__main__":
    main()
