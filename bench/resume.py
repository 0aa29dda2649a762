#!/usr/bin/env python3
"""`mado ws resume` of a 2000 x 1 KiB workspace (the seed's shape), cold.

A workspace of N files of 1 KiB in a few directories is created and
checkpointed once; then, for each RTT (a fixed delay before every store
request, MADO_INJECT_RTT_MS), N cold resumes (fresh disk cache, new
directory) are timed end to end: ref, snapshot, index, stat object, packs,
writing every file and restoring every mtime. Prints a markdown table.

    bench/resume.py [--runs N] [--rtts 0,20,50] [--files 2000]
"""
import argparse, json, os, shutil, statistics, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import clean_env, release_mado, settle, sh  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rtts", default="0,20,50")
    ap.add_argument("--files", type=int, default=2000)
    a = ap.parse_args()
    mado = release_mado()
    work = tempfile.mkdtemp(prefix="mado-resume-")
    try:
        home = os.path.join(work, "home")
        os.makedirs(home)
        env = clean_env(home, f"file://{work}/store")
        # A base snapshot (one file), then a workspace holding the N files.
        repo = os.path.join(work, "repo")
        os.makedirs(repo)
        genv = dict(env, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@b")
        with open(os.path.join(repo, "README"), "w") as f:
            f.write("base\n")
        sh("git", "-C", repo, "init", "-q", env=genv)
        sh("git", "-C", repo, "add", "-A", env=genv)
        sh("git", "-C", repo, "commit", "-qm", "base", env=genv)
        sh(mado, "import-git", repo, env=env)
        ws = os.path.join(work, "ws")
        sh(mado, "ws", "create", "bench", "--dir", ws, env=env)
        for i in range(a.files):
            d = os.path.join(ws, f"d{i % 20:02}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"f{i:04}.txt"), "wb") as f:
                f.write(os.urandom(512).hex().encode())  # 1 KiB, distinct
        sh(mado, "ws", "checkpoint", "--dir", ws, env=env)
        print(f"| RTT | resume of {a.files} x 1 KiB: median (min–max) | GETs | of which ranged | seed (seed 003) |")
        print("|---|---|---|---|---|")
        seed = {0: "2.1 s", 20: "5.3 s", 50: "9.7 s"}
        for rtt in [int(x) for x in a.rtts.split(",")]:
            times, gets, ranged = [], [], []
            for run in range(a.runs):
                shutil.rmtree(os.path.join(home, ".cache", "mado"), ignore_errors=True)
                dest = os.path.join(work, f"r{rtt}-{run}")
                settle()
                t0 = time.perf_counter()
                out = json.loads(sh(mado, "ws", "resume", "bench", dest, "--json", env=dict(env, MADO_INJECT_RTT_MS=str(rtt))))
                times.append(time.perf_counter() - t0)
                r = out["remote"]
                gets.append(r["gets"] + r["ranged_gets"])
                ranged.append(r["ranged_gets"])
                assert out["files"] == a.files + 1, out
                shutil.rmtree(dest)
            print(f"| {rtt} ms | {statistics.median(times):.3f} s ({min(times):.3f}–{max(times):.3f}) "
                  f"| {statistics.median(gets):.0f} | {statistics.median(ranged):.0f} | {seed.get(rtt, '–')} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
