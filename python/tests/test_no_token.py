"""A user who set no secret (issue 12: "with no token configured the user
gets one clear instruction"): the Python API refuses to start a bootstrap
server or a manager, raising FailedPreconditionError with the instruction.

Each case runs in a fresh interpreter whose environment lacks both token
variables (this test process holds one, set by conftest.py).
"""

import os
import subprocess
import sys

import pytest

_CASES = {
    "bootstrap server": "kvbridge.BootstrapServer('127.0.0.1', 0)",
    "manager": (
        "import numpy as np\n"
        "kv = [np.zeros((8, 4, 2, 8), np.uint16) for _ in range(4)]\n"
        "aux = np.zeros((8, 32), np.uint8)\n"
        "a = kvbridge.KVArgs(page_size=4, kv_head_num=2, total_kv_head_num=2)\n"
        "for b in kv:\n"
        "    a.add_kv_buffer(b, b[0].nbytes)\n"
        "a.add_aux_buffer(aux, 32)\n"
        "kvbridge.KVManager(a, 'prefill', kvbridge.KVConfig(\n"
        "    bootstrap_addr='127.0.0.1:1', start_bootstrap_server=False))"
    ),
}

_SCRIPT = """
import kvbridge
try:
{body}
except kvbridge.KVTransferError as e:
    print("REFUSED:" + type(e).__name__ + ": " + str(e))
else:
    print("STARTED")
"""


@pytest.mark.parametrize("what", sorted(_CASES))
def test_no_token_is_one_clear_instruction(what):
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVBRIDGE_AUTH_TOKEN", "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN")}
    body = "\n".join("    " + line for line in _CASES[what].splitlines())
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(body=body)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith(("REFUSED:", "STARTED"))]
    assert len(lines) == 1 and lines[0].startswith("REFUSED:FailedPreconditionError"), \
        r.stdout + r.stderr
    for part in ("no auth token", "KVBRIDGE_AUTH_TOKEN",
                 "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "--auth-token-file"):
        assert part in lines[0], lines[0]
