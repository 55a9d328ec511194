"""A private Redis Cluster for tests, benchmarks and chaos: masters plus replicas on free loopback ports.

Each node is a ``RedisServer`` (tests/support/redis_server.py) with cluster mode on, in its own
temp dir; ``redis-cli --cluster create`` joins them. Nodes can be killed for real (SIGKILL) and
restarted from their own ``nodes.conf``; the replicas promote themselves (no CLUSTER FAILOVER).
Never touches the machine's Redis on 6379.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.cluster import ClusterNode as StartupNode
from redis.cluster import RedisCluster
from redis.crc import key_slot

from tests.support.redis_server import SERVER_ENV, RedisServer, free_port

SLOTS = 16384
#: Why the cluster tests skip (not fail) without redis-cli: ``--cluster create`` needs it.
NO_CLI_REASON = "redis-cli is not installed (Debian: apt-get install -y redis-tools); it creates the cluster"


def redis_cli_missing() -> bool:
    return shutil.which("redis-cli") is None


class ClusterUnavailable(RuntimeError):
    """The cluster could not be created (redis-cli missing, or Valkey refused): callers may skip."""


@dataclass(frozen=True)
class Node:
    """One line of CLUSTER NODES, plus the pid of our process on that port (None: not running)."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]
    pid: int | None

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return "fail" in self.flags

    def owns(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.slots)


def parse_nodes(text: str, pids: dict[int, int]) -> list[Node]:
    """CLUSTER NODES: ``id ip:port@cport flags master ping pong epoch link slot...``."""
    nodes = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        port = int(parts[1].split("@")[0].rsplit(":", 1)[1] or 0)
        slots = []
        for item in parts[8:]:
            if item.startswith("["):  # a slot being imported or migrated: not owned yet
                continue
            lo, _, hi = item.partition("-")
            slots.append((int(lo), int(hi or lo)))
        master = None if parts[3] == "-" else parts[3]
        nodes.append(Node(parts[0], port, frozenset(parts[2].split(",")), master, tuple(slots), pids.get(port)))
    return nodes


def _info(client: redis.Redis, *args: str) -> dict[str, str]:
    """CLUSTER INFO or INFO <section> as {key: text value}: redis-py parses INFO itself (typed
    values), CLUSTER INFO sent as two words comes back raw; both end up as text here."""
    raw = client.execute_command(*args)
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def poll(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    """Poll ``predicate`` until true; RuntimeError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster: timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


class ClusterServers:
    """``masters`` masters with ``replicas_per_master`` replicas each, owned by the caller."""

    def __init__(self, masters: int = 3, replicas_per_master: int = 1, *, node_timeout_ms: int = 1000) -> None:
        self.masters_wanted = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        #: One temp dir for the whole cluster, a subdir (the node's ``--dir``) per node.
        self.dir: Path | None = None
        self.servers: dict[int, RedisServer] = {}
        #: The masters right after create: the startup nodes of ``url`` and ``client()``.
        self.startup_ports: list[int] = []
        #: What each killed master was (id, slots): after the kill no node can tell us.
        self._killed: dict[int, Node] = {}
        #: Clients handed out by ``client()``, closed by ``close_clients()`` (the fixture's teardown):
        #: a test that forgets one must not leave an unclosed socket for the collector to find
        #: (with warnings as errors, its ResourceWarning fails whichever test runs then).
        self._handed: list[RedisCluster] = []

    # -- lifecycle --------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> ClusterServers:
        """Start every node, create the cluster, wait until it is whole (``healthy``)."""
        self.dir = Path(tempfile.mkdtemp(prefix="plaita-cluster-"))
        try:
            self._spawn(self.masters_wanted * (1 + self.replicas_per_master))
            self._create()
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_ports = sorted(n.port for n in self.masters())
        return self

    def _spawn(self, count: int) -> None:
        # Two ports per node: the bus defaults to port + 10000, past 65535 for an ephemeral port.
        assert self.dir is not None
        taken: set[int] = set()
        for _ in range(count):
            port, bus = (self._unique_port(taken) for _ in range(2))
            node_dir = self.dir / str(port)
            node_dir.mkdir()
            # Sync delay 0: by default a master waits 5 s for more replicas before a diskless full
            # sync, which would hold every start and every rejoin for those 5 s.
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", str(self.node_timeout_ms), "--cluster-port", str(bus),
                     "--repl-diskless-sync-delay", "0"]  # fmt: skip
            server = RedisServer(port=port, workdir=str(node_dir), persist=False, extra_args=extra)
            self.servers[port] = server.start()

    @staticmethod
    def _unique_port(taken: set[int]) -> int:
        for _ in range(100):
            port = free_port()
            if port not in taken:
                taken.add(port)
                return port
        raise RuntimeError("no unique free port found")

    def _create(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ClusterUnavailable("redis-cli is not installed")
        # redis-cli makes the first ``masters`` addresses masters and the rest their replicas.
        addrs = [f"127.0.0.1:{p}" for p in self.servers]
        replicas = str(self.replicas_per_master)
        args = [cli, "--cluster", "create", *addrs, "--cluster-replicas", replicas, "--cluster-yes"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            msg = f"redis-cli --cluster create exited {done.returncode}: {done.stdout[-800:]} {done.stderr[-800:]}"
            raise (ClusterUnavailable if os.environ.get(SERVER_ENV) == "valkey" else RuntimeError)(msg)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL) and remove every temp dir. Safe to call twice."""
        self.close_clients()
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        self._killed.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> ClusterServers:
        return self.start() if not self.servers else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and clients ------------------------------------------------------------

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.startup_ports)

    def client(self, **kw: object) -> RedisCluster:
        nodes = [StartupNode("127.0.0.1", p) for p in self.startup_ports]
        client = RedisCluster(startup_nodes=nodes, socket_timeout=5, **kw)  # type: ignore[arg-type]
        self._handed.append(client)
        return client

    def close_clients(self) -> None:
        """Close every client ``client()`` handed out (closing one twice is harmless)."""
        handed, self._handed = self._handed, []
        for client in handed:
            client.close()

    def node_client(self, port: int, timeout_s: float = 1.0) -> redis.Redis:
        """A plain client of one node (not cluster-aware: no redirects followed)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    def pids(self) -> dict[int, int]:
        """{port: pid} of every node running now (for /proc/<pid>/stat)."""
        return {p: s.proc.pid for p, s in self.servers.items() if s.proc is not None}

    # -- topology -----------------------------------------------------------------------------

    def nodes(self, via: int | None = None) -> list[Node]:
        """CLUSTER NODES as seen by node ``via`` (default: the first running node)."""
        pids = self.pids()
        port = via if via is not None else next(iter(pids))
        c = self.node_client(port)
        try:
            raw = c.execute_command("CLUSTER", "NODES")
        finally:
            c.close()
        return parse_nodes(raw.decode() if isinstance(raw, bytes) else str(raw), pids)

    def masters(self) -> list[Node]:
        """The nodes that are masters now and not marked failed, by port."""
        return sorted((n for n in self.nodes() if n.is_master and not n.failed), key=lambda n: n.port)

    def master_of_slot(self, slot: int) -> Node:
        for node in self.masters():
            if node.owns(slot):
                return node
        raise LookupError(f"no live master owns slot {slot}")

    def master_of_key(self, key: str | bytes) -> Node:
        return self.master_of_slot(key_slot(key.encode() if isinstance(key, str) else key))

    # -- health ---------------------------------------------------------------------------

    def _node_ok(self, port: int) -> bool:
        """This node: cluster_state ok, every slot served, every node known; a replica's link up."""
        c = self.node_client(port)
        try:
            info = _info(c, "CLUSTER", "INFO")
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(SLOTS):
                return False
            if info.get("cluster_known_nodes") != str(len(self.servers)):
                return False
            repl = _info(c, "INFO", "replication")
            return repl.get("role") == "master" or repl.get("master_link_status") == "up"
        except redis.RedisError:
            return False
        finally:
            c.close()

    def _layout_ok(self, nodes: list[Node]) -> bool:
        """One node's view: the wanted masters, each with its replicas, none marked failed. (Right
        after create a node may still see the replicas-to-be as empty masters.)"""
        masters = [n for n in nodes if n.is_master]
        return (
            len(masters) == self.masters_wanted
            and all(m.slots for m in masters)
            and not any(n.failed for n in nodes)
            and all(sum(1 for r in nodes if r.master_id == m.node_id) == self.replicas_per_master for m in masters)
        )

    def healthy(self) -> bool:
        """Every node runs, is ok, and sees the whole layout (no failed marks left)."""
        pids = self.pids()
        if len(pids) != len(self.servers):
            return False
        try:
            return all(self._node_ok(p) and self._layout_ok(self.nodes(via=p)) for p in pids)
        except redis.RedisError:
            return False

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        poll(self.healthy, timeout_s, "every node ok and every replica's link up")

    def flushall(self) -> None:
        """FLUSHALL on every master of this private cluster (the replicas follow)."""
        for node in self.masters():
            c = self.node_client(node.port, timeout_s=5.0)
            try:
                c.flushall()
            finally:
                c.close()

    # -- faults ---------------------------------------------------------------------------

    def kill_master(self, port: int) -> Node:
        """SIGKILL the master on ``port``; returns what it was (its id and slots) for ``wait_failover``."""
        node = next((n for n in self.masters() if n.port == port), None)
        if node is None:
            raise ValueError(f"port {port} is not a live master")
        self.servers[port].kill()
        self._killed[port] = node
        return node

    def _owner_seen_by(self, port: int, slot: int) -> int | None:
        """The master ``port`` says serves ``slot``, if that node is ok and serves every slot."""
        c = self.node_client(port)
        try:
            info = _info(c, "CLUSTER", "INFO")
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(SLOTS):
                return None
            owner = next((n for n in self.nodes(via=port) if n.is_master and n.owns(slot)), None)
            return None if owner is None else owner.port
        except redis.RedisError:
            return None
        finally:
            c.close()

    def wait_failover(self, old_port: int, timeout_s: float = 20.0) -> int:
        """Port of the replica promoted in place of the killed master ``old_port``, once every
        running node says cluster_state:ok, serves every slot and names that port as the owner."""
        probe = self._killed[old_port].slots[0][0]
        owners: set[int | None] = set()

        def promoted() -> bool:
            owners.clear()
            owners.update(self._owner_seen_by(p, probe) for p in self.pids())
            return len(owners) == 1 and None not in owners and old_port not in owners

        poll(promoted, timeout_s, f"a replica to replace master {old_port}")
        (port,) = owners
        assert port is not None
        return port

    def restart_node(self, port: int, timeout_s: float = 20.0) -> None:
        """Start a killed node again from its own dir (its nodes.conf): it rejoins, as a replica if
        it was a master that lost a failover; returns once the whole cluster is healthy again."""
        self.servers[port].start()
        self.wait_healthy(timeout_s)

    def heal(self, timeout_s: float = 20.0) -> None:
        """Start every node that is down and wait until the cluster is whole: a test that killed a
        node and failed before restarting it must not break the next test on the shared cluster."""
        for server in self.servers.values():
            if server.proc is None:
                server.start()
        self.wait_healthy(timeout_s)
