"""The seccomp filter bubblewrap installs on a tool call (`bwrap --seccomp FD`), built by libseccomp
(through pyseccomp, its ctypes binding): libseccomp resolves each name for this machine's architecture
and writes the BPF program, with the architecture check that makes a call through another ABI (i386's
`int 0x80`, x32's numbers) kill the process instead of slipping past the rules.

Every syscall below fails with EPERM (clone3 with ENOSYS, see there); everything else is allowed: the
namespaces, mounts, cgroup and rlimits (lean_rl/rollout/bwrap.py, cgroups.py, sandbox.py) bound the
rest. bubblewrap installs the filter last, just before it execs the interpreter, so bwrap's own set-up
(mounts, namespaces, uid map) is done by then; its PID 1 (an init that only reaps) runs without it.

The list: the calls Docker's default profile refuses to a container without capabilities (it allows a
list of calls and refuses the rest; these are the refused ones that exist on Linux today), which tool
code has no use for, plus the kernel objects that are charged per user and that no cgroup bounds:
- keyrings are not namespaced: a call could read or leave keys in the run user's keyrings;
- inotify / fanotify instances and POSIX message queues are charged to the user (a call could take the
  user's whole quota: every process of that user then gets EMFILE/EDQUOT/ENOSPC);
- mounting, namespaces, root changes, tracing, other processes' memory, kernel modules, kexec, BPF,
  perf events, userfaultfd, io_uring (Docker refuses it too: a large attack surface), clocks, swap,
  quotas, memory policy, file handles (open_by_handle_at reads files by inode, outside any mount).
"""

from __future__ import annotations

import errno
import functools
import os

SECCOMP_INSTALL_HINT = "apt-get install libseccomp2, and pip install -r requirements.txt (pyseccomp)"

DENIED = {
    "kernel keyrings (not namespaced)": ("add_key", "request_key", "keyctl"),
    "per-user inotify/fanotify instances": ("inotify_init", "inotify_init1", "fanotify_init"),
    "per-user POSIX message queues": ("mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
                                      "mq_getsetattr"),
    "mounts, namespaces, root changes": ("mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns",
                                         "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
                                         "mount_setattr"),
    "tracing, other processes' memory": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
                                         "perf_event_open", "userfaultfd"),
    "kernel modules, kexec, BPF, reboot": ("init_module", "finit_module", "delete_module", "create_module",
                                           "kexec_load", "kexec_file_load", "bpf", "reboot"),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "clocks, swap, quotas, accounting, host names": ("settimeofday", "clock_settime", "clock_adjtime", "stime",
                                                     "swapon", "swapoff", "quotactl", "quotactl_fd",
                                                     "acct", "syslog", "sethostname", "setdomainname", "vhangup"),
    "memory policy": ("mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
                      "set_mempolicy_home_node"),
    "file handles": ("name_to_handle_at", "open_by_handle_at"),
    "obsolete or I/O-port calls": ("uselib", "ustat", "sysfs", "_sysctl", "lookup_dcookie", "nfsservctl",
                                   "get_kernel_syms", "query_module", "ioperm", "iopl", "vm86", "vm86old"),
}
# clone with a namespace flag (the capability check refuses most of them already; Docker refuses them all).
# clone3 passes its flags in memory, which a filter cannot read: ENOSYS makes glibc fall back to clone.
_CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
                          0x00000080)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME


class SeccompUnavailable(RuntimeError):
    """No seccomp filter can be built here; the message is one line naming the cause and the fix."""


def denied_names() -> list[str]:
    return [name for names in DENIED.values() for name in names]


@functools.lru_cache(maxsize=1)
def program() -> bytes:
    """The filter as the BPF program bwrap reads (struct sock_filter[]), built once per process;
    SeccompUnavailable when libseccomp or its binding is missing here."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as err:  # pyseccomp raises RuntimeError without libseccomp.so
        raise SeccompUnavailable(f"no libseccomp for the tool sandbox's seccomp filter ({err}): "
                                 f"{SECCOMP_INSTALL_HINT}") from None
    try:
        rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        rules.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
        for name in denied_names():  # a name this architecture lacks (vm86 on x86_64) is skipped by libseccomp
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        for flag in _CLONE_NAMESPACE_FLAGS:
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
        rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
        with os.fdopen(os.memfd_create("lean_rl_seccomp_build"), "w+b") as sink:
            rules.export_bpf(sink)
            sink.seek(0)
            bpf = sink.read()
    except OSError as err:
        raise SeccompUnavailable(f"libseccomp could not build the tool sandbox's seccomp filter ({err}): "
                                 f"{SECCOMP_INSTALL_HINT}") from None
    if not bpf or len(bpf) % 8:
        raise SeccompUnavailable(f"libseccomp wrote a seccomp program of {len(bpf)} bytes (not whole BPF "
                                 f"instructions): {SECCOMP_INSTALL_HINT}")
    return bpf


def program_fd() -> int:
    """A memfd holding the program, at offset 0, for `bwrap --seccomp FD` (passed with pass_fds; bwrap reads
    it whole before the call's code runs and closes it); the caller closes its copy once bwrap has started."""
    fd = os.memfd_create("lean_rl_seccomp")
    try:
        os.write(fd, program())
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
