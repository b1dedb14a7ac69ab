"""``python -m liveput.runtime --store URL``: a lean agent entry point for launchers.

The same as ``liveput agent --store URL`` (the token from ``LIVEPUT_TOKEN``), without importing
the whole CLI: an emulated cloud starts many of these at once on a small machine.
"""

from __future__ import annotations

import os
import signal

# The emulated cloud's notice signal may come while this process still imports torch (a
# notice due at launch): its default action would end the agent before it joins, and the job
# would wait for nothing. Ignored until the notice watcher installs its handler; the notice
# file, not the signal, is the notice.
signal.signal(signal.SIGUSR1, signal.SIG_IGN)

# Before torch loads: c10d's C++ warnings (a store connection failing, with dozens of stack
# frames, every heartbeat) would drown the agent's log; its own one-line messages say it.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

from liveput.errors import LiveputError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m liveput.runtime")
    parser.add_argument("--store", required=True, help="store URL")
    parser.add_argument("--host", default="127.0.0.1", help="address peers reach this one at")
    parser.add_argument("--instance", type=int, default=None, help="instance id")
    parser.add_argument("--notices", default="sigterm,emulator", help="notice sources")
    parser.add_argument(
        "--device", default=None, help="auto, cpu, cuda or cuda:K (default: the job's)"
    )
    parser.add_argument("--verbose", action="store_true", help="log every step's timings")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from liveput.runtime.launch import run_agent

    try:
        token = os.environ.get("LIVEPUT_TOKEN")
        if not token:
            raise LiveputError("LIVEPUT_TOKEN is not set")
        run_agent(
            args.store,
            token,
            args.instance,
            args.host,
            [s for s in args.notices.split(",") if s],
            device=args.device,
        )
    except LiveputError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    return 0


if __name__ == "__main__":
    code = main()
    from liveput.runtime.comm import end_process  # noqa: E402 - torch is loaded by now

    end_process(code)
