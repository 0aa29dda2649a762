#!/usr/bin/env python3
"""A fleet of agents on one machine (issue #47): N workspace mounts of one
real tree, each agent in its own, all at once. For each N:

- the time to create all N (`ws create --mount`, one after another);
- memory in use (MemTotal - MemAvailable, so the figure holds whatever the
  process design) per workspace, idle and after each agent read a subtree
  of about 3,000 files;
- the disk cache's bytes against its bytes after one workspace read that
  subtree (every workspace shares one cache);
- a foreground reader's per-file latency (open, read, close of the
  subtree's files, in workspace 0, unbuffered as cat reads), alone and
  while every agent runs an edit -> grep -> checkpoint loop: p50 and p99;
  the same reader on the local disk's copy of the files, pass for pass
  (the floor: what waiting for a CPU costs any reader);
- checkpoints per second over that loop, and whether every checkpoint
  landed with its own agent's edit (read back from the store).

The tree: crate sources of this machine's cargo registry (whole crates in
name order until FILES files, default 10,000), one git commit, imported
into the embedded store. Prints a markdown table, one row per N; exits 1
(with the reason on stderr) if any step fails.

Usage: bench/fleet.py MADO_BINARY [--sizes 1,10,30,100] [--files 10000]
                      [--subtree 3000] [--rounds 2]
`make bench` runs it as scenario o (bench/scenarios.py, class Fleet).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def mem_used_mib() -> float:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            info[k] = int(v.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


def pss_mib(pids) -> float:
    """The processes' proportional set size (MiB): each shared page
    (the binary's text, a mapped index layer, the page cache of a mapped
    file) counted once over its sharers, private pages whole."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def proc_is(pid: int, exe: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == exe
    except OSError:
        return False


def proc_cpu(pid: int) -> float:
    """A live process's CPU seconds so far (user + system); 0 once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def du_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            try:
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Fleet:
    def __init__(self, mado: str, work: str, env: dict):
        self.mado, self.work, self.env = mado, work, env

    def run(self, *args, cwd=None, check=True) -> str:
        return self.run_cpu(*args, cwd=cwd, check=check)[0]

    def run_cpu(self, *args, cwd=None, check=True, cmd=None):
        """Runs `mado ARGS` (or `cmd`): its output and the CPU seconds it
        used (user + system, from wait4: a process of its own, whichever
        thread of this one waits for it)."""
        argv = cmd or [self.mado, *args]
        with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
            p = subprocess.Popen(argv, cwd=cwd, env=self.env, stdout=fo, stderr=fe)
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            fo.seek(0)
            fe.seek(0)
            out, err = fo.read().decode(errors="replace"), fe.read().decode(errors="replace")
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {err.strip()[-400:]}")
        return out, ru.ru_utime + ru.ru_stime

    def tree(self, files_wanted: int) -> str:
        src = os.path.join(self.work, "src")
        os.makedirs(src)
        n = 0
        reg = os.path.join(os.environ.get("REAL_HOME", os.path.expanduser("~")), ".cargo", "registry", "src")
        crates = sorted(os.path.join(r, c) for r in (os.path.join(reg, x) for x in os.listdir(reg))
                        for c in os.listdir(r)) if os.path.isdir(reg) else []
        for c in crates:
            if n >= files_wanted:
                break
            shutil.copytree(c, os.path.join(src, os.path.basename(c)), symlinks=True)
            n += sum(len(fs) for _, _, fs in os.walk(c))
        if n == 0:
            raise RuntimeError(f"no crate sources under {reg} to make the tree from")
        git = ["git", "-C", src, "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
        subprocess.run(git + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-qm", "tree"], check=True)
        return src

    def subtree(self, src: str, want: int):
        """Top directories in name order until about `want` files: (their
        names, the files' paths relative to the tree, as git tracks them)."""
        tracked = subprocess.run(["git", "-C", src, "ls-files"], capture_output=True, text=True,
                                 check=True).stdout.splitlines()
        out, tops = [], []
        for f in tracked:
            top = f.split("/", 1)[0]
            if "/" not in f:
                continue
            if top not in tops:
                if len(out) >= want:
                    break
                tops.append(top)
            out.append(f)
        return tops, out, len(tracked)


# Passes the foreground reader makes alone, after one to warm the caches.
ALONE_PASSES = 30

READER = r"""
import json, os, select, sys, time
roots, files = json.loads(sys.stdin.readline())
lat = {r: [] for r in roots}
passes = int(sys.argv[1])
done = 0
while True:
    for r in roots:
        for f in files:
            t0 = time.perf_counter()
            # Unbuffered, as cat reads: a buffered open() asks isatty()
            # (TCGETS) of every file, and on FUSE each such ioctl is a
            # request to the daemon (docs/DESIGN.md, "Mounts").
            with open(os.path.join(r, f), "rb", buffering=0) as fh:
                while fh.read(1 << 20):
                    pass
            lat[r].append(time.perf_counter() - t0)
    done += 1
    if passes and done >= passes:
        break
    if not passes and select.select([sys.stdin], [], [], 0)[0]:
        break
print(json.dumps(lat))
"""


def reader(roots, files, passes=0):
    """A foreground reader in a process of its own (not a thread of this
    one, whose interpreter lock 100 agent threads share): reads `files`
    under each of `roots` in turn, pass after pass, `passes` times or (0)
    until told to stop; returns a callable that stops it and gives the
    per-file seconds by root."""
    p = subprocess.Popen([sys.executable, "-c", READER, str(passes)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    p.stdin.write(json.dumps([roots, files]) + "\n")
    p.stdin.flush()

    def stop():
        out, _ = p.communicate("stop\n")
        if p.returncode != 0:
            raise RuntimeError(f"the foreground reader exited {p.returncode}")
        return json.loads(out)
    return stop


def read_files(root: str, files) -> list:
    """Reads each file whole; the seconds each took."""
    lat = []
    for f in files:
        t0 = time.perf_counter()
        with open(os.path.join(root, f), "rb") as fh:
            while fh.read(1 << 20):
                pass
        lat.append(time.perf_counter() - t0)
    return lat


def one_size(fl: Fleet, n: int, src: str, files, tops, rounds: int, cache_dir: str, one_cache):
    mnts = [os.path.join(fl.work, f"m{n}-{i}") for i in range(n)]
    for m in mnts:
        os.makedirs(m)
    names = [f"a{n}-{i}" for i in range(n)]
    used0 = mem_used_mib()
    t0 = time.perf_counter()
    try:
        for name, m in zip(names, mnts):
            fl.run("ws", "create", name, "--from", "main", "--mount", m)
        create = (time.perf_counter() - t0) / n
        time.sleep(1)
        idle = (mem_used_mib() - used0) / n
        pids = [x["pid"] for x in json.loads(fl.run("stats", "--all", "--json"))["mounts"]
                if x.get("mountpoint") in mnts]
        pss_idle = pss_mib(pids) / n
        # Every agent reads the subtree at once.
        with ThreadPoolExecutor(max_workers=min(n, 16)) as ex:
            list(ex.map(lambda m: read_files(m, files), mnts))
        time.sleep(1)
        after_read = (mem_used_mib() - used0) / n
        # Each daemon's own memory, as `mado stats --all` reports it.
        st = json.loads(fl.run("stats", "--all", "--json"))
        private = sum(x.get("private_bytes") or 0 for x in st["mounts"] if x.get("mountpoint") in mnts) / n / 2**20
        pss_read = pss_mib(pids) / n
        cache = du_bytes(cache_dir)
        if one_cache[0] is None:
            one_cache[0] = cache
        # The foreground reader alone, then beside the agents' loop.
        # The same reader on the local disk's copy of the same files (the
        # tree imported), pass for pass with the mount's: what waiting for
        # a CPU among the agents costs any reader, the floor under the
        # mount's figure.
        # Alone: a first pass to warm both page caches (the local disk's
        # copy may have been read last at import), then enough passes that
        # the p99 is not the luck of a few dozen samples: beside the agents
        # the reader makes about a hundred passes.
        fg = files[: min(len(files), 1000)]
        lat = reader([mnts[0], src], fg, passes=1 + ALONE_PASSES)()
        alone, alone_local = lat[mnts[0]][len(fg):], lat[src][len(fg):]

        cpu, cpu_lock = {"grep": 0.0, "ws checkpoint": 0.0}, threading.Lock()

        def count(what, secs):
            with cpu_lock:
                cpu[what] += secs

        def agent(i):
            m, done = mnts[i], 0
            for r in range(rounds):
                edited = os.path.join(m, files[(i * 7 + r) % len(files)])
                with open(edited, "ab") as fh:
                    fh.write(f"\n// agent {i} round {r}\n".encode())
                count("grep", fl.run_cpu(cmd=["grep", "-r", "-q", "no such string xyzzy", os.path.join(m, tops[0])],
                                         check=False)[1])
                count("ws checkpoint", fl.run_cpu("ws", "checkpoint", "-m", f"agent {i} round {r}", cwd=m)[1])
                done += 1
            return done

        def ws0_counts():
            m0 = next(x for x in json.loads(fl.run("stats", "--all", "--json"))["mounts"]
                      if x.get("mountpoint") == mnts[0])
            return m0.get("lookups", 0), m0.get("reads", 0), m0.get("ioctls", 0), m0.get("getattrs", 0)
        before = ws0_counts()
        # The mount daemons' and keepers' CPU over the loop (they are not
        # this process's children).
        mado_pids = [int(x) for x in os.listdir("/proc") if x.isdigit() and proc_is(int(x), fl.mado)]
        daemons0 = {p: proc_cpu(p) for p in mado_pids}
        stop_reader = reader([mnts[0], src], fg)
        t1 = time.perf_counter()
        try:
            with ThreadPoolExecutor(max_workers=n) as ex:
                made = sum(ex.map(agent, range(n)))
        finally:
            loop_s = time.perf_counter() - t1
            lat = stop_reader()
        busy, busy_local = lat[mnts[0]], lat[src]
        cpu["mount daemons and keepers"] = sum(max(0.0, proc_cpu(p) - c) for p, c in daemons0.items())
        print(f"fleet: {n}: CPU seconds over the {loop_s:.1f} s loop ({2 * loop_s:.1f} on two cores): "
              + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()), file=sys.stderr)
        after = ws0_counts()
        print(f"fleet: {n}: workspace 0 during the loop: {after[0] - before[0]} lookups, {after[1] - before[1]} reads, "
              f"{after[2] - before[2]} ioctls, {after[3] - before[3]} getattrs; "
              f"the reader read {len(busy)} files there", file=sys.stderr)
        # Each workspace's last checkpoint holds its agent's last edit.
        landed = 0
        for i, name in enumerate(names):
            path = files[(i * 7 + rounds - 1) % len(files)]
            text = fl.run("cat", f"ws/{name}", path)
            landed += f"// agent {i} round {rounds - 1}" in text
        return {
            "n": n, "create": create, "idle": idle, "read": after_read, "private": private, "cache": cache,
            "pss_idle": pss_idle, "pss_read": pss_read,
            "cache_x": cache / one_cache[0], "p50_alone": pct(alone, 50) * 1e3, "p99_alone": pct(alone, 99) * 1e3,
            "p50": pct(busy, 50) * 1e3, "p99": pct(busy, 99) * 1e3,
            "p50_local_alone": pct(alone_local, 50) * 1e3, "p99_local_alone": pct(alone_local, 99) * 1e3,
            "p50_local": pct(busy_local, 50) * 1e3, "p99_local": pct(busy_local, 99) * 1e3,
            "ckpt_s": made / loop_s, "made": made, "landed": landed,
        }
    finally:
        with ThreadPoolExecutor(max_workers=8) as ex:
            list(ex.map(lambda m: fl.run("umount", m, check=False), mnts))
        for name in names:
            fl.run("ws", "rm", name, "--force", check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mado")
    ap.add_argument("--sizes", default="1,10,30,100")
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--subtree", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mado-fleet.", dir=os.environ.get("TMPDIR", "/tmp"))
    home = os.path.join(work, "home")
    os.makedirs(home)
    env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=f"{home}/.config", XDG_DATA_HOME=f"{home}/.local/share",
               XDG_CACHE_HOME=f"{home}/.cache", XDG_STATE_HOME=f"{home}/.local/state",
               XDG_RUNTIME_DIR=os.path.join(work, "run"), REAL_HOME=os.path.expanduser("~"))
    for k in ("MADO_CONFIG", "MADO_CACHE_DIR", "MADO_REMOTE"):
        env.pop(k, None)
    os.makedirs(env["XDG_RUNTIME_DIR"], mode=0o700)
    fl = Fleet(os.path.abspath(a.mado), work, env)
    rows = []
    try:
        src = fl.tree(a.files)
        tops, files, tree_files = fl.subtree(src, a.subtree)
        fl.run("init")
        fl.run("import-git", src, "-q")
        cache_dir = os.path.join(home, ".cache", "mado")
        one_cache = [None]
        for n in (int(x) for x in a.sizes.split(",")):
            r = one_size(fl, n, src, files, tops, a.rounds, cache_dir, one_cache)
            rows.append(r)
            print(f"fleet: {n} agents done", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 (every failure is reported the same way)
        print(f"fleet: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    print(f"Tree: {tree_files} files; subtree read: {len(files)} files in {len(tops)} directories; "
          f"{a.rounds} rounds of edit, grep, checkpoint per agent.")
    print()
    print("| agents | ws create --mount s (avg) | MiB in use per idle ws | MiB per ws after reading | "
          "daemon private MiB per ws | daemon PSS MiB per ws, idle / after reading | cache × one ws | "
          "reader p50 ms alone / busy | reader p99 ms alone / busy | local disk p99 ms alone / busy | "
          "busy p99 × local disk's | checkpoints/s | checkpoints landed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['create']:.3f} | {r['idle']:.1f} | {r['read']:.1f} | {r['private']:.1f} | {r['pss_idle']:.1f} / {r['pss_read']:.1f} | {r['cache_x']:.2f} | "
              f"{r['p50_alone']:.3f} / {r['p50']:.3f} | {r['p99_alone']:.3f} / {r['p99']:.3f} | "
              f"{r['p99_local_alone']:.3f} / {r['p99_local']:.3f} | {r['p99'] / r['p99_local']:.2f} | "
              f"{r['ckpt_s']:.1f} | {r['landed']} of {r['n']} ({r['made']} made) |")


if __name__ == "__main__":
    main()
