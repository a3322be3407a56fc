"""A Ray cluster of several nodes on one machine, one node per loopback address (127.0.0.2, 127.0.0.3,
...): what multi-node code is tested on here. Every hard-coded 127.0.0.1 or single-node assumption
shows up, because a socket bound to 127.0.0.3 is reachable from the other "nodes" only at that address.

    with SimulatedCluster(num_nodes=3, cpus_per_node=2) as cluster:
        ray.init(address=cluster.address)
        ...  resources={"node:127.0.0.3": 0.01} places a task on the third node
        cluster.kill_node("127.0.0.3")            # its raylet and everything under it, -9

Each `ray start` runs in a session of its own, so a node is exactly one process group: teardown
signals those groups (never `ray stop`, which would end every Ray on the machine) and waits, bounded.
The cluster's files live under its own --temp-dir.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lean_rl.utils.net import find_free_port


def _ray_executable() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


@dataclass
class SimulatedNode:
    ip: str
    pgid: int  # the process group of this node's `ray start` (raylet, agents, workers)
    head: bool


@dataclass
class SimulatedCluster:
    num_nodes: int = 2
    cpus_per_node: float = 1
    # GPUs each node declares to Ray (`ray start --num-gpus`); none exist: placement tests read which
    # ids Ray hands out (CUDA_VISIBLE_DEVICES of actors that ask for them), nothing touches a device
    gpus_per_node: int = 0
    first_ip: str = "127.0.0.2"
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 20.0
    nodes: list[SimulatedNode] = field(default_factory=list)
    temp_dir: str | None = None
    port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.first_ip}:{self.port}"

    @property
    def node_ips(self) -> list[str]:
        prefix, last = self.first_ip.rsplit(".", 1)
        return [f"{prefix}.{int(last) + i}" for i in range(self.num_nodes)]

    def start(self) -> "SimulatedCluster":
        # /tmp, not pytest's long tmp paths: Ray's socket paths must fit in 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix="lean_rl_ray_")
        self.port = find_free_port(self.first_ip)
        try:
            for i, ip in enumerate(self.node_ips):
                self._start_node(ip, head=i == 0)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, ip: str, head: bool) -> None:
        cmd = [_ray_executable(), "start", "--node-ip-address", ip, "--num-cpus", str(self.cpus_per_node),
               "--num-gpus", str(self.gpus_per_node), "--disable-usage-stats",
               # two nodes on one machine would both take the agent's default port (52365)
               "--dashboard-agent-listen-port", str(find_free_port(ip)),
               "--min-worker-port", "0", "--max-worker-port", "0"]
        if head:
            cmd += ["--head", "--port", str(self.port), "--temp-dir", self.temp_dir, "--include-dashboard=false",
                    "--ray-client-server-port", str(find_free_port(ip)),
                    "--dashboard-port", str(find_free_port(ip))]
        else:
            cmd += ["--address", self.address]
        log = open(Path(self.temp_dir) / f"start-{ip}.log", "w")
        # Ray 2.60 turns token auth on for a head started by `ray start` (token in ~/.ray/auth_token);
        # a joining `ray start` must be told (a driver's ray.init finds the token by itself).
        env = dict(os.environ, RAY_AUTH_MODE="token")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        # the session leader's pid is the group id of every daemon this `ray start` leaves behind
        self.nodes.append(SimulatedNode(ip=ip, pgid=proc.pid, head=head))
        try:
            code = proc.wait(timeout=self.start_timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        log.close()
        if code != 0:
            text = (Path(self.temp_dir) / f"start-{ip}.log").read_text()[-3000:]
            raise RuntimeError(f"ray start for simulated node {ip} failed (exit {code}):\n{text}")

    def wait_for_nodes(self, timeout_s: float = 60.0) -> None:
        """Until every node is alive in the cluster's view (the caller has ray.init'ed)."""
        import ray

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
            if alive >= set(self.node_ips):
                return
            time.sleep(0.5)
        raise TimeoutError(f"simulated nodes {sorted(set(self.node_ips) - alive)} not alive after {timeout_s}s")

    def kill_node(self, ip: str) -> None:
        """SIGKILL one (non-head) node: its raylet and everything it started, as a machine loss would."""
        node = next(n for n in self.nodes if n.ip == ip)
        if node.head:
            raise ValueError("kill_node: the head holds the cluster; kill a worker node")
        _signal_group(node.pgid, signal.SIGKILL)
        self._wait_gone([node], self.stop_timeout_s)
        self.nodes.remove(node)

    def restart_node(self, ip: str) -> None:
        self._start_node(ip, head=False)

    def stop(self) -> None:
        """SIGTERM every node's process group (workers first, head last), then SIGKILL what is left
        after stop_timeout_s. Idempotent."""
        nodes, self.nodes = sorted(self.nodes, key=lambda n: n.head), []
        for node in nodes:
            _signal_group(node.pgid, signal.SIGTERM)
        left = self._wait_gone(nodes, self.stop_timeout_s / 2, raise_on_left=False)
        for node in left:
            _signal_group(node.pgid, signal.SIGKILL)
        self._wait_gone(left, self.stop_timeout_s / 2)

    def _wait_gone(self, nodes: list[SimulatedNode], timeout_s: float, raise_on_left: bool = True):
        deadline = time.monotonic() + timeout_s
        left = [n for n in nodes if _group_alive(n.pgid)]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [n for n in left if _group_alive(n.pgid)]
        if left and raise_on_left:
            raise RuntimeError(f"simulated nodes {[n.ip for n in left]} still running {timeout_s:.0f}s after kill")
        return left

    def __enter__(self) -> "SimulatedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_ACTOR_TABLE = """
import json, sys, ray
from lean_rl.utils.ray_utils import init_ray
init_ray(sys.argv[1])
rows = [{"class": a.get("ActorClassName") or a.get("ClassName", ""), "ip": a["Address"]["IPAddress"],
         "node_id": a["Address"].get("NodeID"), "pid": a.get("Pid"), "state": a.get("State")}
        for a in ray._private.state.actors().values()]
print(json.dumps(rows))
"""


def actor_table(address: str, timeout_s: float = 60.0) -> list[dict]:
    """Every actor the cluster at `address` knows (dead ones included, for a while): class name, node
    IP, pid and state, read from Ray's GCS by a short-lived driver (this process may hold another Ray)."""
    import json

    result = subprocess.run([sys.executable, "-c", _ACTOR_TABLE, address], capture_output=True, text=True,
                            timeout=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"reading the actor table of {address} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
