"""Linux network-namespace hosts: N namespaces joined by veth pairs to a bridge in a switch
namespace, each with an address of a /24 that exists only inside them (optionally the root
namespace on the bridge too), and commands run inside them (``ip netns exec``). A host's link
can be shaped to a rate (``tc``'s token bucket on both ends of its veth), as a cloud instance's
network interface is.

Needs root, ``ip`` and ``tc`` (``iproute2``); a missing one is a :class:`TestbedError`, never a
skip.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from liveput.runtime.store.etcd_server import pid_alive
from liveput.testbed.errors import TestbedError

__all__ = ["NETNS_SUBNET", "NetnsHosts", "remove_stale_beds"]

logger = logging.getLogger(__name__)

NETNS_SUBNET = "10.77.0"
"""First three octets of the /24 the namespace hosts use by default; it exists only inside them
(and in the root namespace, for hosts created with a gateway)."""
GATEWAY_OCTET = 254
"""Last octet of the root namespace's address on the bridge, for hosts with a gateway."""
_netns_serial = itertools.count()
_BED_NAME = re.compile(r"^lp(\d+)x\d+(?:sw|gw|h\d+)$")
"""A test bed's namespace or gateway link: ``lp<creator's pid>x<serial>`` and its part."""
BURST_S = 0.01
"""A shaped link's bucket holds this many seconds of its rate (at least 64 KiB): a shorter one
cannot pass the kernel's large segments at high rates, a longer one lets bursts pass the rate."""


def _run_iproute2(tool: str, *args: str) -> None:
    binary = shutil.which(tool)
    if not binary:
        raise TestbedError(
            f"`{tool}` is not installed: run `make system-deps` (Debian package iproute2)"
        )
    result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=20)
    if result.returncode != 0:
        raise TestbedError(f"{tool} {' '.join(args)}: {result.stderr.strip()}")


def _ip(*args: str) -> None:
    _run_iproute2("ip", *args)


@dataclass
class NetnsHosts:
    """N emulated hosts: network namespaces on one bridge, host i at ``<subnet>.(i+1)``."""

    count: int
    """How many hosts."""
    subnet: str = NETNS_SUBNET
    """First three octets of the hosts' /24 (two host sets that live at once need two)."""
    gateway: bool = False
    """Also put the root namespace on the bridge, at ``<subnet>.254``: processes outside the
    hosts (a store, a coordinator, the test itself) then reach them and they reach it."""
    names: list[str] = field(default_factory=list)
    """The namespace of each host."""
    switch: str = ""
    """The namespace holding the bridge."""
    link_mbit: float | None = None
    """Every host's link rate, megabits per second each way (None: as fast as the kernel
    copies); :meth:`set_link_rate` changes one host's."""

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 200:
            raise ValueError(f"NetnsHosts count must be in [1, 200], got {self.count}")
        if self.link_mbit is not None and not self.link_mbit > 0:
            raise ValueError(f"NetnsHosts link_mbit must be > 0, got {self.link_mbit}")
        octets = self.subnet.split(".")
        if len(octets) != 3 or not all(o.isdigit() and int(o) < 256 for o in octets):
            raise ValueError(
                f"NetnsHosts subnet must be three octets (10.77.0), got {self.subnet!r}"
            )

    def address(self, index: int) -> str:
        """Host ``index``'s address; reachable only from inside the hosts' namespaces (and from
        the root namespace with a gateway)."""
        return f"{self.subnet}.{index + 1}"

    @property
    def gateway_address(self) -> str:
        """The root namespace's address on the bridge (hosts created with ``gateway``)."""
        return f"{self.subnet}.{GATEWAY_OCTET}"

    def create(self) -> NetnsHosts:
        """Create the namespaces, the bridge and the links (cleans up if any step fails)."""
        tag = f"lp{os.getpid()}x{next(_netns_serial)}"
        remove_stale_beds()
        if self.gateway:
            self._refuse_a_taken_gateway()
        self.switch = f"{tag}sw"
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for index in range(self.count):
                name = f"{tag}h{index}"
                _ip("netns", "add", name)
                self.names.append(name)
                port = f"port{index}"
                _ip(
                    "link",
                    "add",
                    "eth0",
                    "netns",
                    name,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    port,
                    "netns",
                    self.switch,
                )
                _ip("-n", self.switch, "link", "set", port, "master", "br0")
                _ip("-n", self.switch, "link", "set", port, "up")
                _ip("-n", name, "addr", "add", f"{self.address(index)}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
                if self.link_mbit is not None:
                    self.set_link_rate(index, self.link_mbit)
            if self.gateway:
                _ip(
                    "link",
                    "add",
                    self._gateway_link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "gw",
                    "netns",
                    self.switch,
                )
                _ip("-n", self.switch, "link", "set", "gw", "master", "br0")
                _ip("-n", self.switch, "link", "set", "gw", "up")
                _ip("addr", "add", f"{self.gateway_address}/24", "dev", self._gateway_link)
                _ip("link", "set", self._gateway_link, "up")
        except BaseException:
            self.destroy()
            raise
        return self

    @property
    def _gateway_link(self) -> str:
        # The root namespace's end, named after the set's tag: deleting the switch namespace
        # deletes it, and destroy deletes it first.
        return f"{self.switch.removesuffix('sw')}gw"

    def _refuse_a_taken_gateway(self) -> None:
        # A second interface with the gateway's address would take the hosts' traffic to a
        # bridge they are not on (a killed bed's is removed before: this one is a live bed's,
        # or not a bed's).
        binary = shutil.which("ip") or "ip"
        taken = subprocess.run(
            [binary, "-o", "-4", "addr", "show", "to", self.gateway_address],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.split()
        if taken:
            raise TestbedError(
                f"{self.gateway_address} is already on interface {taken[1]} (a running test "
                f"bed's?): use another subnet, or `ip link del {taken[1]}` if nothing uses it"
            )

    def argv(self, index: int, command: Sequence[str]) -> list[str]:
        """``command`` wrapped to run inside host ``index``'s namespace."""
        binary = shutil.which("ip") or "ip"
        return [binary, "netns", "exec", self.names[index], *command]

    def popen(
        self, index: int, command: Sequence[str], **kwargs: object
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` inside host ``index``'s namespace."""
        return subprocess.Popen(self.argv(index, command), **kwargs)  # type: ignore[call-overload]

    def run(
        self, index: int, command: Sequence[str], *, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` in host ``index``'s namespace to completion; output captured as text."""
        return subprocess.run(
            self.argv(index, command), capture_output=True, text=True, timeout=timeout_s
        )

    def set_link(self, index: int, up: bool) -> None:
        """Take host ``index``'s network link down (a partition: it reaches nobody, nobody
        reaches it) or bring it back up."""
        _ip("-n", self.names[index], "link", "set", "eth0", "up" if up else "down")

    def set_link_rate(self, index: int, mbit: float | None) -> None:
        """Shape host ``index``'s link to ``mbit`` megabits per second each way (a token bucket
        on its end of the veth for what it sends, on the switch's end for what it receives), or
        take the shaping off (None)."""
        if mbit is not None and not mbit > 0:
            raise ValueError(f"link rate must be > 0 Mbit/s, got {mbit}")
        for namespace, device in ((self.names[index], "eth0"), (self.switch, f"port{index}")):
            if mbit is None:
                # Nothing to take off is no error.
                subprocess.run(
                    ["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"],
                    capture_output=True,
                    timeout=20,
                )
                continue
            burst_bytes = max(64 * 1024, int(mbit * 1e6 / 8 * BURST_S))
            _run_iproute2(
                "tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", "tbf",
                "rate", f"{int(mbit * 1000)}kbit", "burst", str(burst_bytes),
                "latency", "100ms",
            )  # fmt: skip

    def destroy(self) -> None:
        """Delete every namespace created (their veth links go with them)."""
        if self.gateway and self.switch:
            # Its own deletion now: a namespace that a dying process still holds outlives `ip
            # netns del` for a while, and its gateway address with it (the next hosts refuse it).
            subprocess.run(
                ["ip", "link", "del", self._gateway_link],
                capture_output=True,
                timeout=20,
            )
        for name in [*self.names, self.switch]:
            if name:
                subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
        self.names = []
        self.switch = ""

    def __enter__(self) -> NetnsHosts:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def remove_stale_beds() -> list[str]:
    """Delete what test beds of processes that no longer run left behind (their namespaces and
    gateway links), and return their names.

    A bed killed before it removed itself (a suite stopped by a signal) left its gateway's
    address on the root namespace, and the next bed with that address was refused: a second
    ``make test`` on the machine failed. Beds whose creator still runs (another test worker's)
    are left as they are."""
    binary = shutil.which("ip")
    if not binary:
        return []  # the bed's own start says `ip` is missing

    def listed(*args: str) -> list[str]:
        out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=20).stdout
        return out.splitlines()

    def stale(names: list[str]) -> list[str]:
        return [
            name
            for name in names
            if (match := _BED_NAME.match(name)) and not pid_alive(int(match.group(1)))
        ]

    # Gateway links (the root namespace's ends) first: deleting their switch namespace would
    # delete them only once every process inside it is gone.
    links = stale([line.split(":")[1].strip().split("@")[0] for line in listed("-o", "link")])
    namespaces = stale([line.split()[0] for line in listed("netns", "list") if line.strip()])
    for link in links:
        subprocess.run([binary, "link", "del", link], capture_output=True, timeout=20)
    for namespace in namespaces:
        subprocess.run([binary, "netns", "del", namespace], capture_output=True, timeout=20)
    removed = sorted(links + namespaces)
    if removed:
        logger.warning("removed what killed test beds left: %s", " ".join(removed))
    return removed
