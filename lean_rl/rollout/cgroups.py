"""A cgroup per tool call, made with cgroup-tools (cgcreate, cgset, cgexec, cgget, cgdelete): its pids
and memory controllers bound ALL of the call's processes together, whoever they run as. The rlimits
cannot: RLIMIT_AS is per process, and RLIMIT_NPROC counts per uid (the kernel exempts root; lean_rl runs bwrap
as an unprivileged uid when it is root, lean_rl/rollout/bwrap.py).

Where the cgroup is made: as a child of lean_rl's own cgroup in each hierarchy (/proc/self/cgroup), so
a call stays inside (and counts against) whatever limits lean_rl itself runs under, and nothing is left
behind once the call's cgroup is deleted. cgroup v1 (pids and memory hierarchies) is used when both are
mounted; otherwise cgroup v2, where lean_rl's cgroup there offers both controllers and may hand them to a
child (v2 lets a cgroup that holds processes do that only at the root, e.g. in a container with its own
cgroup namespace, or in a subtree delegated to lean_rl).

Set per call: pids.max = max_processes + 1 (the bwrap process lean_rl starts runs outside the sandbox's
user namespace; the rest is what RLIMIT_NPROC counts in it: the namespace's init, the interpreter, its
processes and threads); memory.limit_in_bytes (v2: memory.max) = call_memory_mb, with swap held to the
same bound (v1: memory.memsw.limit_in_bytes where swap accounting exists; v2: memory.swap.max = 0).
Past the memory limit the kernel's OOM killer kills a process of the call; the OOM kill count
(memory.oom_control / memory.events) tells the caller. A fork past pids.max fails with EAGAIN.

Deleting: cgdelete moves any process still in a cgroup to its parent, out of the bound, so a call's
cgroup is deleted only once it holds no process (the PID namespace dies with bwrap); a cgroup whose
processes outlive the deadline is left in place, bounded, and named in a warning.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

TOOLS = ("cgcreate", "cgset", "cgexec", "cgget", "cgdelete")
INSTALL_HINT = "apt-get install cgroup-tools"
CONTROLLERS = ("pids", "memory")
TOOL_TIMEOUT_S = 10.0  # one cgroup-tools command (they only write a few cgroupfs files)
_names = itertools.count()


class CgroupUnavailable(RuntimeError):
    """No per-call cgroup can be made here; the message says why and what would fix it."""


@dataclass(frozen=True)
class Hierarchy:
    """Where calls' cgroups go: the cgroup version, and per controller lean_rl's own cgroup (relative to
    its hierarchy's mount, as cgroup-tools names it) and the directory that cgroup is at."""
    version: int
    parents: dict[str, str]   # controller -> lean_rl's cgroup path, e.g. "/process_api/ab12"
    dirs: dict[str, str]      # controller -> that cgroup's directory under the mount

    def describe(self) -> str:
        where = ", ".join(f"{c} {self.dirs[c]}" for c in CONTROLLERS)
        return f"cgroup v{self.version} ({where})"


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, controllers) of each cgroup mount: /proc/self/mountinfo."""
    found = []
    for line in _read("/proc/self/mountinfo").splitlines():
        ours, _, theirs = line.partition(" - ")
        fields, tail = ours.split(), theirs.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((tail[0], fields[3], fields[4], set(tail[2].split(","))))
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller -> this process's cgroup ("" names the v2 hierarchy): /proc/self/cgroup."""
    own = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _relative(path: str, mount_root: str) -> str:
    """`path` as seen from a mount of `mount_root` (a container may mount only a subtree)."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):] or "/"
    return path


def find_hierarchy() -> Hierarchy:
    """The hierarchy that offers pids and memory for calls' cgroups here, or CgroupUnavailable."""
    mounts, own = _mounts(), _own_cgroups()
    v1 = {c: (root, point) for kind, root, point, opts in mounts if kind == "cgroup" for c in CONTROLLERS if c in opts}
    if all(c in v1 and c in own for c in CONTROLLERS):
        parents = {c: _relative(own[c], v1[c][0]) for c in CONTROLLERS}
        return Hierarchy(1, parents, {c: os.path.join(v1[c][1], parents[c].lstrip("/")) for c in CONTROLLERS})
    v2 = next(((root, point) for kind, root, point, _ in mounts if kind == "cgroup2"), None)
    if v2 is None or "" not in own:
        missing = "/".join(c for c in CONTROLLERS if c not in v1)
        raise CgroupUnavailable(f"no cgroup v1 {missing} hierarchy and no cgroup v2 hierarchy is mounted here")
    parent = _relative(own[""], v2[0])
    directory = os.path.join(v2[1], parent.lstrip("/"))
    offered = _read(os.path.join(directory, "cgroup.controllers")).split()
    missing = [c for c in CONTROLLERS if c not in offered]
    if missing:
        held = [c for c in missing if c in v1]  # a controller is in one hierarchy at a time
        raise CgroupUnavailable(f"the cgroup v2 hierarchy ({directory}) offers no {'/'.join(missing)} controller"
                                + (f" ({'/'.join(held)}: in a cgroup v1 hierarchy, without the other)" if held else ""))
    return Hierarchy(2, {c: parent for c in CONTROLLERS}, {c: directory for c in CONTROLLERS})


def check_tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise CgroupUnavailable(f"cgroup-tools is not installed (no {', '.join(missing)} on PATH): `{INSTALL_HINT}`, "
                                "or bash scripts/setup.sh as root")


class CallCgroup:
    """One call's cgroup: `await create()`, run the command behind `exec_prefix`, then `oom_kills()` and
    `await delete()` (both also after a timeout or a cancellation)."""

    def __init__(self, hierarchy: Hierarchy, max_processes: int, memory_mb: int) -> None:
        self.hierarchy = hierarchy
        name = f"lean_rl-{os.getpid()}-{next(_names)}"
        self.paths = {c: f"{hierarchy.parents[c].rstrip('/')}/{name}" for c in CONTROLLERS}
        self.pids_max, self.memory_bytes = max_processes + 1, memory_mb << 20
        self.groups = [f"{c}:{self.paths[c]}" for c in CONTROLLERS]  # cgroup-tools' -g CONTROLLER:PATH

    @property
    def exec_prefix(self) -> list[str]:
        """cgexec moves itself into the cgroup and execs the command: the command's pid is cgexec's."""
        return ["cgexec", *(arg for group in self.groups for arg in ("-g", group))]

    def _settings(self) -> dict[str, list[str]]:
        """controller -> its cgset -r arguments, in order: the memory limit before the swap limit that may
        not be set below it. Called once the cgroup exists: its swap file exists where swap is accounted."""
        if self.hierarchy.version == 2:
            memory, swap = [f"memory.max={self.memory_bytes}"], ("memory.swap.max", "0")
        else:
            memory, swap = [f"memory.limit_in_bytes={self.memory_bytes}"], ("memory.memsw.limit_in_bytes",
                                                                             str(self.memory_bytes))
        if os.path.exists(os.path.join(self.dir("memory"), swap[0])):
            memory.append("=".join(swap))
        return {"pids": [f"pids.max={self.pids_max}"], "memory": memory}

    async def create(self) -> None:
        """Make the cgroup and set its limits; CgroupUnavailable (and nothing left behind) if that fails."""
        await _tool("cgcreate", *(arg for group in self.groups for arg in ("-g", group)))
        try:
            for controller, settings in self._settings().items():
                await _tool("cgset", *(arg for setting in settings for arg in ("-r", setting)), self.paths[controller])
        except CgroupUnavailable:
            await self.delete()
            raise

    async def read(self, controller: str, knob: str) -> str:
        return await _tool("cgget", "-n", "-v", "-r", knob, self.paths[controller])

    async def oom_kills(self) -> int:
        """How many of the call's processes the OOM killer killed for the memory limit."""
        text = await self.read("memory", "memory.events" if self.hierarchy.version == 2 else "memory.oom_control")
        counts = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(counts.get("oom_kill", 0))

    async def delete(self, deadline_s: float = 10.0) -> bool:
        """Delete the cgroup once no process is left in it (see the module docstring); False (and a
        warning) when processes outlive the deadline: the cgroup then stays, bounding them."""
        end = time.monotonic() + deadline_s
        while True:
            left = len(self.processes())
            if left == 0:
                break
            if time.monotonic() > end:
                logger.warning("tool sandbox: %d processes of a call are still in its cgroup %s after %.0f s; "
                               "left in place (bounded) instead of freeing them", left, " ".join(self.groups),
                               deadline_s)
                return False
            await asyncio.sleep(0.02)
        try:
            await _tool("cgdelete", *self.groups)
        except CgroupUnavailable as err:
            if any(os.path.isdir(self.dir(c)) for c in CONTROLLERS):
                logger.warning("tool sandbox: could not delete a call's cgroup: %s", err)
                return False
        return True

    def processes(self) -> list[int]:
        """The processes in the cgroup: its cgroup.procs in either hierarchy (cgget does not read that file).
        Not pids.current: that keeps counting an exited process for a second or two after it was reaped."""
        found: set[int] = set()
        for controller in CONTROLLERS:
            found.update(int(pid) for pid in _read(os.path.join(self.dir(controller), "cgroup.procs")).split())
        return sorted(found)

    def dir(self, controller: str) -> str:
        """The cgroup's directory (for the logs and tests: reading it shows whether it still exists)."""
        parent = self.hierarchy.dirs[controller]
        return os.path.join(parent, os.path.basename(self.paths[controller]))


async def _tool(*argv: str) -> str:
    """Run a cgroup-tools command; its stdout, or CgroupUnavailable naming the command and its error."""
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE)
    except OSError as err:
        raise CgroupUnavailable(f"{argv[0]} could not run ({err})") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TOOL_TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise CgroupUnavailable(f"`{' '.join(argv)}` did not finish in {TOOL_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        why = (err.decode(errors="replace").strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise CgroupUnavailable(f"`{' '.join(argv)}` failed: {why}")
    return out.decode(errors="replace")


async def probe() -> Hierarchy:
    """Prove a call's cgroup works here, end to end: find the hierarchy, make a cgroup with both limits,
    run `true` in it through cgexec, read both limits back, delete it. CgroupUnavailable says why not."""
    check_tools()
    hierarchy = find_hierarchy()
    call = CallCgroup(hierarchy, max_processes=7, memory_mb=64)
    await call.create()
    try:
        await _tool(*call.exec_prefix, "true")
        pids_max = (await call.read("pids", "pids.max")).strip()
        limit = "memory.max" if hierarchy.version == 2 else "memory.limit_in_bytes"
        memory = (await call.read("memory", limit)).strip()
    finally:
        await call.delete()
    if pids_max != "8" or memory != str(64 << 20):
        raise CgroupUnavailable(f"a probe cgroup read back pids.max={pids_max} and memory limit {memory} instead of 8 "
                                f"and {64 << 20}")
    return hierarchy


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""
