"""The command-line interface: parses options, calls the library, renders with rich."""

import sys

from liveput.runtime.entry import prepare_agent_process, wants_agent

# ``liveput agent``: before the CLI and torch are imported, as ``python -m liveput.runtime``
# does (a notice signal that comes while the process imports must not end it).
if wants_agent(sys.argv[1:]):
    prepare_agent_process()
