"""Small shared helpers for the benchmark: logging, commands with timeouts,
statistics, mount detection, page-cache dropping, RSS sampling and CPU accounting.

Every external command goes through `run()`, which always has a timeout and
runs the command in its own process group so that a timeout kills exactly the
processes this suite started (never anything found by name).
"""

import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time

LOG_FILE = None


def log(msg):
    """Print a timestamped line to stderr and to the run's log file."""
    line = time.strftime("%H:%M:%S ") + msg
    print(line, file=sys.stderr, flush=True)
    if LOG_FILE:
        with open(LOG_FILE, "a") as f:
            f.write(line + "\n")


class CmdError(Exception):
    """A command failed (non-zero exit) or timed out."""

    def __init__(self, msg, rc=None, out="", err=""):
        super().__init__(msg)
        self.rc = rc
        self.out = out
        self.err = err


def end_process(p, grace):
    """Stop process `p` (a Popen): SIGTERM, then SIGKILL if it is still there after `grace` s."""
    if p and p.poll() is None:
        p.terminate()
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(cmd, timeout, cwd=None, env=None, check=True, shell=False, input=None):
    """Run `cmd` with a hard timeout. Returns (rc, stdout, stderr, seconds).

    On timeout the whole process group is killed and CmdError is raised.
    With check=True a non-zero exit raises CmdError carrying stderr's tail.
    """
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=full_env, shell=shell, text=True,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        errors="replace")
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        raise CmdError("timeout after %ss: %s" % (timeout, _short(cmd)))
    except BaseException:  # interrupted (signal, Ctrl-C): leave no child behind
        _kill_group(proc)
        raise
    dt = time.monotonic() - t0
    if check and proc.returncode != 0:
        raise CmdError("exit %s: %s: %s" % (proc.returncode, _short(cmd), gist(err or out)),
                       proc.returncode, out, err)
    return proc.returncode, out, err, dt


def timed(cmd, timeout, **kw):
    """Run a command that must succeed; return its wall time in seconds."""
    return run(cmd, timeout, **kw)[3]


def _short(cmd):
    s = cmd if isinstance(cmd, str) else " ".join(str(c) for c in cmd)
    return s if len(s) < 160 else s[:157] + "..."


IMPORTANT = re.compile(r"error|fatal|denied|not permitted|no such|read-only|input/output|"
                       r"not supported|failed|timeout|illegal", re.I)


def gist(text, n=400):
    """The telling part of a failed command's output: its last lines that look
    like errors (compiler notes and code excerpts are dropped)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    hits = [ln for ln in lines if IMPORTANT.search(ln)]
    return tail(" / ".join((hits or lines)[-3:]), n)


def tail(text, n=400):
    text = (text or "").strip()
    return text[-n:]


def summarize(runs):
    """min/median/max of a list of numbers, keeping the raw runs."""
    runs = [float(r) for r in runs]
    return {"runs": [round(r, 6) for r in runs], "n": len(runs),
            "min": min(runs), "median": statistics.median(runs), "max": max(runs)}


def na(reason):
    return {"na": reason}


def error(msg):
    return {"error": str(msg)[:600]}


def drop_caches(pages_only=False):
    """Drop the kernel page cache, and unless `pages_only` its dentries and inodes too
    (root only); silently skipped otherwise."""
    try:
        run(["sync"], 120, check=False)  # in a child: a hung mount cannot stall us
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n" if pages_only else "3\n")
        return True
    except (OSError, CmdError):
        return False


def mounted_paths():
    """Mount points from /proc/self/mountinfo, without touching the mounts."""
    res = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            mp = parts[4].encode().decode("unicode_escape")
            i = parts.index("-")
            res[mp] = parts[i + 1]
    return res


def is_mounted(path):
    return os.path.abspath(path) in mounted_paths()


def read_status(pid):
    """VmRSS and VmHWM of a process in MiB, or None if it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            vals = {}
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":", 1)
                    vals[k] = int(v.split()[0]) / 1024.0
            return vals
    except (OSError, ValueError):
        return None


_TICK = os.sysconf("SC_CLK_TCK")


def _machine_jiffies():
    """(busy, all) jiffies of every core since boot, from /proc/stat's first line
    (idle and iowait are not busy)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def proc_cpu(pid):
    """user+system CPU seconds of a process so far, or None if it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def cpu_per_gb(cpu_s, nbytes):
    """CPU seconds per GB (1e9 bytes) moved, or None when nothing moved or no CPU was read.
    /proc counts CPU in ticks of 1/CLK_TCK s (10 ms here), so below about 100 MB moved a
    figure is coarse."""
    if cpu_s is None or not nbytes or nbytes <= 0:
        return None
    return max(0.0, cpu_s) * 1e9 / nbytes


class FsCpu:
    """utime+stime of the file system's process (/proc/PID/stat: all its threads) across
    a block: `seconds` after it, None if there is no process (native disk) or it went away.
    `pid` is the daemon's pid, or a callable returning it (a remount gives a new one)."""

    def __init__(self, pid):
        self.pid = pid() if callable(pid) else pid
        self.seconds = None

    def __enter__(self):
        self._t0 = proc_cpu(self.pid) if self.pid else None
        return self

    def __exit__(self, *exc):
        if self._t0 is not None:
            t1 = proc_cpu(self.pid)
            self.seconds = None if t1 is None else t1 - self._t0

    def per_gb(self, nbytes):
        return cpu_per_gb(self.seconds, nbytes)


def pids_by_comm(names):
    """pids of the running processes whose command name is one of `names`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/comm" % d) as f:
                    if f.read().strip() in names:
                        out.append(int(d))
            except OSError:
                pass
    return out


class CpuMeter:
    """Where the machine's CPU went while a block ran: the machine's busy fraction and
    busy seconds (all cores, /proc/stat), and the CPU seconds of each named group of
    processes (`groups`: name -> pids), of this process's own threads ("self") and of
    the children it waited for ("children": getrusage). On a machine whose cores are
    all busy, a rate is bounded by cores / (CPU seconds per byte moved)."""

    def __init__(self, groups=None):
        self.groups = {k: list(v) for k, v in (groups or {}).items()}
        self.result = None

    def _snap(self):
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        me = resource.getrusage(resource.RUSAGE_SELF)
        return {"machine": _machine_jiffies(),
                "children": kids.ru_utime + kids.ru_stime, "self": me.ru_utime + me.ru_stime,
                "groups": {k: {p: proc_cpu(p) for p in v} for k, v in self.groups.items()}}

    def __enter__(self):
        self._start = self._snap()
        return self

    def __exit__(self, *exc):
        a, b = self._start, self._snap()
        (busy0, all0), (busy1, all1) = a["machine"], b["machine"]
        res = {"busy": (busy1 - busy0) / max(1, all1 - all0),
               "machine_s": (busy1 - busy0) / _TICK,
               "children_s": b["children"] - a["children"], "self_s": b["self"] - a["self"]}
        for k, pids in self.groups.items():
            res[k + "_s"] = sum(b["groups"][k][p] - a["groups"][k][p] for p in pids
                                if a["groups"][k][p] is not None
                                and b["groups"][k][p] is not None)
        self.result = res


class MemSampler:
    """Samples VmRSS/VmHWM of the process returned by `pid_fn` every `interval`
    seconds in a background thread. `pid_fn` is called at each tick because
    remounting gives the filesystem a new process."""

    def __init__(self, pid_fn, interval=0.2):
        self.pid_fn = pid_fn
        self.interval = interval
        self.rss = []
        self.hwm = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            pid = None
            try:
                pid = self.pid_fn()
            except Exception:
                pid = None
            if pid:
                st = read_status(pid)
                if st and "VmRSS" in st:
                    self.rss.append(st["VmRSS"])
                    self.hwm = max(self.hwm, st.get("VmHWM", 0.0), st["VmRSS"])
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def result(self):
        if not self.rss:
            return None
        return {"peak_mb": self.hwm, "steady_mb": statistics.median(self.rss),
                "samples": len(self.rss)}


def machine_info():
    info = {"nproc": os.cpu_count()}
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory_gib"] = round(kb / 1024 / 1024, 1)
    except OSError:
        pass
    info["kernel"] = os.uname().release
    try:
        info["loadavg_at_start"] = os.getloadavg()[0]
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    info["os"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return info


def port_free(port):
    import socket
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except (OSError, CmdError):
        return False
    finally:
        s.close()


def wait_idle(pid, quiet=0.5, timeout=20.0):
    """Wait until process `pid` used under 10 ms of CPU in `quiet` seconds (its background
    work done), at most `timeout` seconds; whether it went idle."""
    end = time.monotonic() + timeout
    before = proc_cpu(pid)
    while before is not None and time.monotonic() < end:
        time.sleep(quiet)
        now = proc_cpu(pid)
        if now is None or now - before < 0.01:
            return True
        before = now
    return before is None


def wait_for(pred, timeout, interval=0.1):
    """Poll `pred` until it returns truthy or `timeout` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            v = pred()
            if v:
                return v
        except Exception:
            pass
        time.sleep(interval)
    return None
