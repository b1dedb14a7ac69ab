"""An agent process ends cleanly although daemon threads are blocked in C++ calls.

CPython before 3.14 ends a daemon thread whose C++ call returns during the interpreter's
finalization with ``pthread_exit``; unwinding through pybind11's ``noexcept`` GIL guard then
aborts the process (pytorch/pytorch#38228). An agent always has such threads (an abandoned
gloo operation, a store call), and a survivor of a fault campaign once died with SIGABRT after
the job was done. The script below makes the call return during finalization every time.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import datetime, sys, threading, time
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=30)
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout, wait_for_workers=False,
                           use_libuv=False)
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout, use_libuv=False)
    threading.Thread(target=client.wait, args=(["k"],), daemon=True).start()

    class Teardown:
        def __del__(self):  # runs while the interpreter finalizes
            server.set("k", b"1")  # the blocked call returns now
            time.sleep(1.0)

    keep = Teardown()
    time.sleep(0.2)
    print("work done", flush=False)
    if sys.argv[1] == "end_process":
        from liveput.runtime.comm import end_process
        end_process(0)
    sys.exit(0)
""")


def _run(how: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=60
    )


def test_a_call_returning_during_finalization_aborts_a_plain_exit():
    done = _run("sys.exit")
    if sys.version_info < (3, 14):  # 3.14 hangs such threads instead of ending them
        assert done.returncode == -signal.SIGABRT, done.stderr
        assert "terminate called without an active exception" in done.stderr


def test_end_process_exits_with_its_code_and_flushes_stdout():
    done = _run("end_process")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "work done\n"
    assert "terminate called" not in done.stderr
