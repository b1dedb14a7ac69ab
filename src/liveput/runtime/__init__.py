"""The training runtime: real PyTorch training through preemptions (``docs/runtime.md``).

A coordinator (``coordinator``) and one agent per instance (``agent``) share a store
(``store``, whose keys ``keys`` spells; ``prune`` keeps it bounded); each agent's engine
(``engine``) executes the migration plans the coordinator publishes (``protocol``, ``planning``)
and trains under an exactly-once commit protocol (``ledger``). :mod:`liveput.launch.local` runs it
all on one machine against the emulated cloud (:mod:`liveput.cloud`).
"""
