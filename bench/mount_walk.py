#!/usr/bin/env python3
"""Cold walk-and-read of a dense 300-file subtree through a real mado mount.

For each RTT (a fixed delay before every store request, injected by mado's
delay wrapper with MADO_INJECT_RTT_MS) and for a packed and an unpacked
import: N cold runs (fresh disk cache, new mount), timing only the walk
after the mount is up. Prints a markdown table: median / min / max wall
time of the walk, time to the first file, and GETs during the walk.

    bench/mount_walk.py [--runs N] [--rtts 0,20,50] [--files 300]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(*args, env=None, cwd=None):
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


def settle():
    """Flush dirty pages and drop the page cache before a timed run, so one
    run's writeback does not land in the next one's time."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass  # not root: flushing alone still removes most of the skew


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rtts", default="0,20,50")
    ap.add_argument("--files", type=int, default=300)
    a = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/mado-build/target"))
    sh("cargo", "build", "-q", "--release", "-p", "mado", cwd=ROOT)
    mado = os.path.join(target, "release", "mado")
    work = tempfile.mkdtemp(prefix="mado-walk-")
    try:
        repo = os.path.join(work, "repo")
        os.makedirs(os.path.join(repo, "dense"))
        for i in range(a.files):
            with open(os.path.join(repo, "dense", f"f{i:03}.txt"), "w") as f:
                f.write(f"line {i}\n" * (20 + i % 50))
        genv = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b",
                    GIT_COMMITTER_EMAIL="b@b")
        sh("git", "init", "-q", repo, env=genv)
        sh("git", "add", "-A", cwd=repo, env=genv)
        sh("git", "commit", "-qm", "dense", cwd=repo, env=genv)
        rows = []
        for packed in (True, False):
            home = os.path.join(work, "home-packed" if packed else "home-unpacked")
            env = dict(os.environ, HOME=home, MADO_REMOTE_ADDR=f"file://{home}/store")
            for k in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "MADO_CACHE_DIR", "MADO_CONFIG"):
                env.pop(k, None)
            os.makedirs(home)
            sh(mado, "import-git", repo, *([] if packed else ["--no-packs"]), env=env)
            for rtt in [int(x) for x in a.rtts.split(",")]:
                walls, firsts, gets = [], [], []
                for _ in range(a.runs):
                    shutil.rmtree(os.path.join(home, ".cache", "mado"), ignore_errors=True)
                    mnt = os.path.join(work, "mnt")
                    os.makedirs(mnt, exist_ok=True)
                    e = dict(env, MADO_INJECT_RTT_MS=str(rtt))
                    settle()
                    sh(mado, "mount", "main", mnt, env=e)
                    try:
                        before = json.loads(sh(mado, "stats", mnt, "--json", env=env))["remote"]
                        t0 = time.perf_counter()
                        first = None
                        d = os.path.join(mnt, "dense")
                        for name in sorted(os.listdir(d)):
                            with open(os.path.join(d, name), "rb") as f:
                                f.read()
                            if first is None:
                                first = time.perf_counter() - t0
                        wall = time.perf_counter() - t0
                        after = json.loads(sh(mado, "stats", mnt, "--json", env=env))["remote"]
                    finally:
                        sh(mado, "umount", mnt, env=env)
                    walls.append(wall * 1000)
                    firsts.append(first * 1000)
                    gets.append((after["gets"] + after["ranged_gets"]) - (before["gets"] + before["ranged_gets"]))
                rows.append((rtt, "packed (v2)" if packed else "unpacked", walls, firsts, gets))
        print(f"| RTT | import | walk of {a.files} files: median (min–max) | first file: median | GETs in the walk |")
        print("|---|---|---|---|---|")
        for rtt, kind, walls, firsts, gets in sorted(rows):
            print(f"| {rtt} ms | {kind} | {statistics.median(walls):.0f} ms ({min(walls):.0f}–{max(walls):.0f}) "
                  f"| {statistics.median(firsts):.1f} ms | {statistics.median(gets):.0f} |")
    finally:
        subprocess.run(["fusermount3", "-uz", os.path.join(work, "mnt")], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
