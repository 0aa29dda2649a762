#!/usr/bin/env python3
"""mado's benchmark harness (`make bench`): every scenario of the benchmark
issue, mado and its peers side by side, on one MinIO behind a latency and
counting proxy on loopback, at each RTT. Writes docs/BENCHMARKS.md and
PNG plots under docs/.

    bench/run.py [--quick] [--runs N] [--rtts 0,20,50] [--out docs/BENCHMARKS.md]
                 [--profile release|debug] [--only a,b,...] [--merge JSON]
                 [--large-sizes 300M,1G] [--ck-sizes 5000,20000,40000] [--import-sizes 78k]
                 [--note TEXT]
    bench/run.py --report-only docs/bench-results.json

`--only d` (or `--only c,d`) runs only those scenarios (a to p) at each
RTT; the setup (MinIO, the stores, the repositories) is the same. Alone,
it writes a report of those tables only. With `--merge
docs/bench-results.json` the tables it measured replace that saved run's
(each table whole) and the report is of the saved run with them: the
other tables keep their numbers, and the replaced ones say which command
measured them and when. The trees must be the same (no --quick into a
full run) and the RTTs among the saved run's. The JSON is read before the
run starts; bench-results.json is written beside --out, so merging into
docs/bench-results.json with the default --out updates it in place.
`--note TEXT` says what this run measured (e.g. which mado): the report
prints it with the tables it measured.

The proxy (`latency-proxy`, crates/bench) delays each direction of every
connection by RTT/2 and a new connection by one more RTT (the handshake);
it counts connections, requests by method, ranged GETs and bytes. MinIO
sits behind one proxy (mado, rclone, s3fs); `git daemon` behind another
(git). Each timed run is cold: a fresh mado cache (or a fresh clone, a
fresh rclone cache, a new s3fs mount) and a dropped page cache.

Scenarios a to h use a synthetic tree. Scenario i (issue #12) uses a real
one, built without network from this machine's cargo registry sources
(~/.cargo/registry/src/*/: about 15,000 files, a subtree of about 2,800),
and measures mado's cold checkout, materialize and mount walk against the
untar floor and git; it needs a cargo registry with enough crates.
Scenario j (issue #19) uses one large file of random bytes at each of
`--large-sizes` (default 300M,1G; --quick 16M,48M; M = MiB, G = GiB; also
MADO_BENCH_LARGE_SIZES): time and max RSS of mado import-git, checkout
cold and warm, ws checkpoint after a 100-byte append and the mount
daemon's sequential and random reads, beside cp, the local disk and the
raw GET of the same bytes (one stream and 8 ranged). It runs once per
run, whatever --rtts: the local work on the embedded store (file://),
the network rows on MinIO at RTT 20 ms. It needs about 12 times the
largest size of free disk, in the work folder under $TMPDIR:

    bench/run.py --only j --rtts 20 --runs 1 --merge docs/bench-results.json

Scenario k (issue #18), checkpoint after k edits: a synthetic source tree
of each of `--ck-sizes` files (default 5000,20000,40000; --quick
300,1200; also MADO_BENCH_CK_SIZES; 20k = 20000), 10 small files per
directory, imported into MinIO and checked out as a plain working copy
(`mado ws create --dir`), and the same commit as a git clone pushing to
`git daemon` through the git proxy. Each round appends a line to 10 files
in 10 directories and times `mado ws checkpoint` (S3 proxy) against `git
commit -a && git push` (git proxy) of the same edit, then a checkpoint
after touching the mtimes of 1,000 files; bytes up, PUTs, HEADs and
mado's sequential round trips beside them. Page cache warm (flushed, not
dropped):

    bench/run.py --only k --rtts 0,20 --merge docs/bench-results.json

Scenario l (issue #13), import of a real tree: scenario i's tree (built
once if both run) imported cold with `mado import-git --json` into a new
store through the S3 proxy, against `git push` of the same commit into an
empty bare repository through the git proxy (as d); then the next commit,
5 files changed, into a store and a bare repository already holding the
first (mado with the cache its first import left, and with an empty one).
PUTs, bytes up and mado's sequential round trips beside the times.
`--import-sizes 78k` (also MADO_BENCH_IMPORT_SIZES; none by default) adds
the first import and push of a synthetic source tree of each size
(scenario k's generator; 78k: a Linux-sized file count), at RTT 20 only:

    bench/run.py --only l --rtts 0,20,50 --runs 3 --import-sizes 78k \
        --merge docs/bench-results.json

Scenario m (issue #14), serve-virtiofs: the dense subtree walked and read
in a QEMU guest (scripts/vm-run.sh) through `mado serve-virtiofs`, cold
(empty mado cache) and warm (guest caches dropped), against the guest's
own disk and `mado mount` on the host; it needs QEMU and the guest image
that `scripts/vm-run.sh --prepare` caches:

    bench/run.py --only m --rtts 0,20,50 --runs 3 --merge docs/bench-results.json

Scenario n (issue #20, part 3), work in a workspace: bench/workspace-work.sh
times git init/add/commit, git status, grep -r, find (stat every file),
cat of every file, cp -r, rm -rf, sed -i and make -j2 on a plain directory
of the local disk and in a read-write workspace mount of the same real tree
(whole crates of the cargo registry until about 12,000 files, --quick
1,500, as one commit, plus a 120-file C project), warm, on the embedded
store (no network); the report gives each row's ratio, mount over local
disk, against issue #20's goals (grep, git status, reads <= 1.5x; git
add/commit, sed -i, rm -rf <= 2x; cp -r <= 3x; a build <= 1.1x). It runs
once per run, whatever --rtts; each row --runs times (--quick: once):

    bench/run.py --only n --rtts 0 --runs 3 --merge docs/bench-results.json

Scenario o (issue #47), a fleet of agents: bench/fleet.py creates 1, 10,
30 and 100 workspace mounts (--quick: 1 and 4) of a real tree of about
10,000 files (--quick 1,500) on the embedded store, has each read a
~3,000-file subtree, then runs every agent's edit -> grep -> checkpoint
loop at once beside a foreground reader; the report gives memory in use
per workspace (idle, after reading), each daemon's private memory, the
cache against one workspace's, the reader's p50/p99 alone and busy,
checkpoints per second and how many landed, against issue #47's goals.
Once per run, whatever --rtts:

    bench/run.py --only o --rtts 0 --merge docs/bench-results.json

Scenario p (issue #46), a million files: bench/scale.sh at 10k, 100k,
300k and 1M files (--quick: 10k) of a synthetic monorepo: import, mount,
a cold stat walk against git's checkout, ws create, ws status and a
10-edit checkpoint, in time and memory, per file, against the tree's
size (about 20 minutes). Once per run, whatever --rtts:

    bench/run.py --only p --rtts 0 --merge docs/bench-results.json

`--quick` uses a small synthetic tree (and a real tree of a few hundred
files), one run and RTT 0 and 20 ms, and finishes in a few minutes: the
test suite runs it as a smoke test.

MADO_BENCH_TARGET_DIR, when set, is the cargo target folder the harness
builds mado into and runs it from (default: $CARGO_TARGET_DIR, else
~/.cache/mado-build/target). MADO_BENCH_QUIET_S=N makes each timed run
first wait up to N seconds for the machine to be quiet (CPU and I/O),
for a machine shared with builds; the report's notes say how many runs
started on a busy one anyway (N = 0: no waiting, only that count).
"""
# This file is only the command line (its docstring is the --help text, so
# the map is here): the machinery is in harness.py, the scenarios in
# scenarios.py, the typed results and their JSON in results.py, the report
# in report.py.
import argparse, os, signal, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402
from harness import ROOT, Harness, log, parse_counts, parse_sizes  # noqa: E402
from results import Run  # noqa: E402
from scenarios import scenarios  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--rtts")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "BENCHMARKS.md"))
    ap.add_argument("--profile", default="release", choices=["release", "debug"])
    ap.add_argument("--only", default="a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p",
                    help="scenarios to run, e.g. d or c,d (default: all)")
    ap.add_argument("--large-sizes", default=os.environ.get("MADO_BENCH_LARGE_SIZES"),
                    help="scenario j's file sizes, e.g. 64M,256M (default 300M,1G; --quick 16M,48M)")
    ap.add_argument("--ck-sizes", default=os.environ.get("MADO_BENCH_CK_SIZES"),
                    help="scenario k's tree sizes in files, e.g. 5000,20k (default 5000,20000,40000; --quick 300,1200)")
    ap.add_argument("--import-sizes", default=os.environ.get("MADO_BENCH_IMPORT_SIZES"),
                    help="scenario l's synthetic trees in files, imported at RTT 20, e.g. 78k (default: none)")
    ap.add_argument("--note", help="what this run measured, printed with its tables")
    ap.add_argument("--timeout", type=float)
    ap.add_argument("--report-only", metavar="JSON", help="rewrite the report from a saved bench-results.json")
    ap.add_argument("--merge", metavar="JSON", help="merge this run's tables into a saved bench-results.json "
                    "and report the result (see above)")
    a = ap.parse_args()
    a.runs = a.runs or (1 if a.quick else 5)
    a.timeout = a.timeout or (60 if a.quick else 300)
    rtts = [int(x) for x in (a.rtts or ("0,20" if a.quick else "0,20,50")).split(",")]
    if a.report_only:
        report.write(Run.load(a.report_only), a.out, a.quick)
        return
    todo = scenarios()
    only = a.only.split(",")
    unknown = [s for s in only if s not in todo]
    if unknown:
        ap.error(f"--only: no scenario {','.join(unknown)} (there are {','.join(todo)})")
    try:
        large = parse_sizes(a.large_sizes) if a.large_sizes else None
    except ValueError as e:
        ap.error(f"--large-sizes: {e}")
    try:
        ck = parse_counts(a.ck_sizes) if a.ck_sizes else None
    except ValueError as e:
        ap.error(f"--ck-sizes: {e}")
    try:
        imp = parse_counts(a.import_sizes) if a.import_sizes else None
    except ValueError as e:
        ap.error(f"--import-sizes: {e}")
    base = Run.load(a.merge) if a.merge else None
    if base and not set(rtts) <= set(base.rtts):
        ap.error(f"--merge: RTTs {rtts} are not among the saved run's {base.rtts}")
    t0 = time.time()
    h = Harness(a.quick, a.runs, a.timeout, a.profile, large, ck, imp)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        h.build()
        h.start_servers()
        h.gen_repo()
        run = Run(rtts=rtts, runs=a.runs, subtree_files=h.subtree_files, ws_files=h.ws_files, argv=sys.argv[1:],
                  note=a.note)
        if base:
            try:
                base.check_mergeable(run)  # before the scenarios, not after an hour of them
            except ValueError as e:
                sys.exit(f"--merge {a.merge}: {e}")
        h.load_stores()
        for rtt in rtts:
            h.set_rtt(rtt)
            for s in only:
                log(f"scenario {s} at RTT {rtt} ms")
                try:
                    for result in todo[s](h, rtt):
                        run.results.add(result)
                except Exception as e:  # a failed scenario is reported, not dropped
                    run.notes.append(f"scenario {s} at RTT {rtt} ms failed: {e}".splitlines()[0])
                    log("FAILED", s, rtt, e)
        run.elapsed = time.time() - t0
        if h.quiet is not None:
            run.notes.append((f"each timed run first waited up to {h.quiet:.0f} s for a quiet machine "
                              "(MADO_BENCH_QUIET_S); " if h.quiet else "")
                             + f"{h.busy_runs} of {h.timed_runs} timed runs started while something else kept the "
                             "machine busy (over 10 % of its CPU or 5 % I/O stall, in the half second before)")
        if a.note and not base:
            run.notes.append(a.note)
        if base:
            run.measured_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            base.merge(run)
            run = base
        report.write(run, a.out, a.quick)
    finally:
        h.close()


if __name__ == "__main__":
    main()
