"""The product's assembly above the cloud: ``liveput train``'s local cluster (coordinator,
agents and the emulated provider on this machine) and the deadline job it may run."""
