"""What a tool call's child interpreter runs first (lean_rl/rollout/sandbox.py starts it as `python -I -S -B
-u -X utf8 -c BOOTSTRAP CONFIG_JSON`): the kernel limits, then the audit hook, then the call's code.

Set here, in the child before any user code runs (not in a `preexec_fn`, which is unsafe when the parent
has threads, as a rollout process does), each with hard = soft so the code cannot raise it:
RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_CORE = 0, RLIMIT_MSGQUEUE = 0, RLIMIT_SIGPENDING and
RLIMIT_NOFILE (small: per-user and per-process kernel objects a cgroup does not bound), and under bwrap
RLIMIT_NPROC. The audit hook is a friendly early error for common mistakes, not a boundary."""

MEMORY_EXIT = 86  # the bootstrap's exit code for an uncaught MemoryError

BOOTSTRAP = r'''
import json, linecache, os, resource, sys, traceback, types
cfg = json.loads(sys.argv[1])
sys.path.extend(cfg["site_dirs"])  # -S: site-packages without running their .pth files (lean_rl's is not there)
with open(cfg["code_path"], encoding="utf-8") as f:
    code = f.read()
cpu = cfg["cpu_seconds"]
limits = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_CORE, 0, 0),
          (resource.RLIMIT_AS, cfg["memory_mb"] << 20, cfg["memory_mb"] << 20),
          (resource.RLIMIT_FSIZE, cfg["max_file_bytes"], cfg["max_file_bytes"]),
          (resource.RLIMIT_MSGQUEUE, 0, 0),  # per-user message-queue bytes: none (mq_open is also filtered)
          (resource.RLIMIT_SIGPENDING, cfg["max_pending_signals"], cfg["max_pending_signals"]),
          (resource.RLIMIT_NOFILE, cfg["max_open_files"], cfg["max_open_files"])]
if cfg["max_processes"]:  # bwrap only: counted for the sandbox's uid in its own user namespace
    limits.append((resource.RLIMIT_NPROC, cfg["max_processes"], cfg["max_processes"]))
for kind, soft, hard in limits:
    resource.setrlimit(kind, (soft, hard))
work = os.path.realpath(cfg["workdir"])
readable = (work, *[os.path.realpath(p) for p in sys.path if os.path.isdir(p)])
REFUSED = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
           "os.killpg", "resource.setrlimit", "resource.prlimit"}
NETWORK = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
           "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"}
PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
               "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.copymode",
               "shutil.copystat", "shutil.copytree", "shutil.move", "os.setxattr", "os.removexattr"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

def inside(path, roots):
    path = os.path.realpath(os.fsdecode(path))
    return any(path == r or path.startswith(r + os.sep) for r in roots)

def hook(event, args):
    if event == "open":
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        writing = bool((isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & WRITE_FLAGS)
        if os.fsdecode(path) != "/dev/null" and not inside(path, (work,) if writing else readable):
            raise PermissionError(f"sandbox: {'writing' if writing else 'reading'} {path!r} is not allowed "
                                  "outside the working directory")
    elif event in REFUSED or event in NETWORK or (
            event == "os.kill" and args[0] != os.getpid()):
        raise PermissionError(f"sandbox: {event} is not allowed")
    elif event in PATH_EVENTS:
        for path in args:
            if isinstance(path, (str, bytes, os.PathLike)) and not inside(path, (work,)):
                raise PermissionError(f"sandbox: {event} on {path!r} is not allowed outside the working directory")

sys.addaudithook(hook)
sys.argv = ["<sandbox>"]
linecache.cache["<sandbox>"] = (len(code), None, code.splitlines(True), "<sandbox>")  # source in tracebacks
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
try:
    exec(compile(code, "<sandbox>", "exec"), main.__dict__)
except SystemExit:
    raise
except BaseException as e:
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # without this bootstrap's frame
    sys.stderr.flush()
    os._exit(cfg["memory_exit"] if isinstance(e, MemoryError) else 1)
'''
