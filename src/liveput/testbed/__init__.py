"""Real infrastructure for the runtime's tests and benchmarks: an etcd server, network-namespace
hosts, and the fault-free reference a fault run's parameters are compared with."""

from liveput.testbed.errors import TestbedError
from liveput.testbed.etcd import EtcdServer, free_port, free_port_pair
from liveput.testbed.netns import NETNS_SUBNET, NetnsHosts

__all__ = [
    "EtcdServer",
    "NETNS_SUBNET",
    "NetnsHosts",
    "TestbedError",
    "free_port",
    "free_port_pair",
]
