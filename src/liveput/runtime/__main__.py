"""``python -m liveput.runtime --store URL``: the lean agent entry point for launchers.

The same as ``liveput agent --store URL`` (:func:`liveput.runtime.entry.agent_main`; the token
from ``LIVEPUT_TOKEN``), without importing the whole CLI: an emulated cloud starts many of these
at once on a small machine. Its ``--notices`` default is a launcher's on this machine
(``sigterm,emulator``); ``liveput agent``'s is a cloud instance's.
"""

from __future__ import annotations

from liveput.runtime.entry import prepare_agent_process

# First thing: a notice signal that comes while torch imports must not end the agent.
prepare_agent_process()

import argparse  # noqa: E402

from liveput.runtime.entry import LEAN_NOTICES, AgentArgs, agent_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m liveput.runtime")
    parser.add_argument("--store", required=True, help="store URL")
    parser.add_argument("--host", default="127.0.0.1", help="address peers reach this one at")
    parser.add_argument("--instance", type=int, default=None, help="instance id")
    parser.add_argument("--notices", default=LEAN_NOTICES, help="notice sources")
    parser.add_argument(
        "--device", default=None, help="auto, cpu, cuda or cuda:K (default: the job's)"
    )
    parser.add_argument("--verbose", action="store_true", help="log every step's timings")
    args = parser.parse_args(argv)
    return agent_main(
        AgentArgs(
            args.store,
            None,
            instance=args.instance,
            host=args.host,
            notices=args.notices,
            device=args.device,
            verbose=args.verbose,
        )
    )


if __name__ == "__main__":
    code = main()
    from liveput.runtime.comm import end_process  # noqa: E402 - torch is loaded by now

    end_process(code)
