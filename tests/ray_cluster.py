"""Ray nodes on this machine with every listener on loopback (``ray.cluster_utils.
Cluster`` nodes given 127.0.0.1, one CPU and a 100 MB object store each, no
dashboard), and the check of that from /proc: for the ``--ray`` tests and
bench/bench_scale.py.

Ray 2.60 listens on loopback only when a node's IP is exactly 127.0.0.1; `ray start
--node-ip-address 127.0.0.1` swaps that for the machine's routable address unless
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which in turn stops `ray start --address` from
adding a node. A driver (`replayer ... --ray`) started while the nodes run inherits
the variable and finds its node on loopback."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SMALL_NODE = {
    "num_cpus": 1,
    "object_store_memory": 100_000_000,
    "node_ip_address": "127.0.0.1",
}
LOOPBACK_ONLY = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


class ClusterDidNotStart(RuntimeError):
    """The nodes did not come up within the host's deadline (the cluster's
    processes are stopped before this is raised)."""


def start_deadline_s() -> float:
    """How long the nodes may take to register: 60 s on an idle host, longer in
    step with the load on its cores (a node's GCS and raylet start several
    processes each; beside a CPU burner on 2 cores that took over 30 s), at most
    240 s."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(240.0, 60.0 * max(1.0, 1.0 + load))


@contextlib.contextmanager
def loopback_cluster(nodes: int = 2) -> Iterator[Any]:
    """``nodes`` Ray nodes on loopback (a ``Cluster``; its ``address`` is what
    ``--ray`` takes), with LOOPBACK_ONLY in this process's environment while they
    run. Shut down, and the environment restored, on exit.

    Raises:
        ClusterDidNotStart: the nodes did not register within
            :func:`start_deadline_s` (Ray's own wait is a fixed 30 s).
    """
    from ray.cluster_utils import Cluster

    saved = {name: os.environ.get(name) for name in LOOPBACK_ONLY}
    os.environ.update(LOOPBACK_ONLY)
    try:
        cluster: Any = Cluster(initialize_head=False)
        deadline = start_deadline_s()
        try:
            try:
                # One by one, as Cluster does: the nodes register in the order
                # added, and a driver connects to the first.
                for k in range(nodes):
                    extra = {} if k else {"include_dashboard": False}
                    node = cluster.add_node(wait=False, **SMALL_NODE, **extra)
                    cluster._wait_for_node(node, timeout=deadline)
                cluster.wait_for_nodes(timeout=deadline)
            except TimeoutError as exc:
                raise ClusterDidNotStart(
                    f"{nodes} Ray nodes did not register within {deadline:.0f} s on "
                    f"this host (load {os.getloadavg()[0]:.1f} on "
                    f"{os.cpu_count()} cores): {exc}"
                ) from None
            yield cluster
        finally:
            cluster.shutdown()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ray_pids(cluster: Any, *roots: int) -> list[int]:
    """This cluster's processes: each node's own (GCS, raylet, agents), ``roots``
    (a driver, say) and all their descendants (workers, actors); not another
    cluster's on the same machine."""
    ours = {
        info.process.pid
        for node in cluster.list_all_nodes()
        for infos in node.all_processes.values()
        for info in infos
    } | set(roots)
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found = set(ours)
    for pid in parent:
        seen, p = set(), pid
        while p in parent and p not in seen and p not in found:
            seen.add(p)
            p = parent[p]
        if p in found:
            found |= seen
    return sorted(found)


def replay_actors(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are ``--ray`` actors (``ray::ReplayActor``)."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if command.startswith(b"ray::ReplayActor"):
                found.append(pid)
    return found


def _hex_address(field: str) -> str:
    """A /proc/net/tcp{,6} local address as text: 127.0.0.1, ::ffff:7f00:1 or ::1."""
    raw = bytes.fromhex(field.split(":")[0])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening(pids: list[int]) -> dict[str, set[int]]:
    """The TCP addresses these processes listen on, each with its ports."""
    sockets: dict[str, str] = {}  # inode -> address
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A":  # LISTEN
                sockets[cols[9]] = cols[1]
    out: dict[str, set[int]] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            local = sockets.get(target[8:-1]) if target.startswith("socket:[") else None
            if local is not None:
                port = int(local.split(":")[1], 16)
                out.setdefault(_hex_address(local), set()).add(port)
    return out


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def beyond_loopback(listeners: dict[str, set[int]]) -> dict[str, set[int]]:
    """The listeners (address -> ports) that are not on loopback."""
    return {a: ports for a, ports in listeners.items() if not is_loopback(a)}
