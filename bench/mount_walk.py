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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import clean_env, release_mado, settle, sh  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rtts", default="0,20,50")
    ap.add_argument("--files", type=int, default=300)
    a = ap.parse_args()
    mado = release_mado()
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
            env = clean_env(home, f"file://{home}/store")
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
