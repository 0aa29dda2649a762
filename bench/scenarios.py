"""The benchmark's scenarios, a to n, one function or class each.

Each is called once per RTT with the harness and yields its cells as
`Result`s, one at a time, so the cells measured before a scenario fails
still reach the report. What a scenario keeps from one RTT to the next
(the workspace c resumes, the peers h stopped running) lives in its
instance: `scenarios()` makes fresh ones for each run.
"""
import glob, json, os, random, re, shutil, signal, statistics, subprocess, sys, threading, time
from dataclasses import replace
from typing import Callable, Dict, Iterator, List

from harness import (BUCKET, GIT_ENV, REAL, ROOT, WS, Cell, Harness, Sample, log, log_result, median_counts, run_rss,
                     read_file, sh, unmount, vm_hwm_mib, walk_read)
from results import (FLOOR_ROW, GIT_CLONE_ROW, GIT_PUSH_ROW, GIT_SPARSE_ROW, IMPORT_ROW, J_CHECKOUT_COLD,
                     J_CHECKOUT_COLD_LOCAL, J_CHECKOUT_COLD_PINNED, J_CHECKOUT_WARM, J_CHECKPOINT, J_CP,
                     J_DISK_READ, J_GET1, J_GET8, J_GET8_PINNED, J_MOUNT_COLD_PINNED,
                     J_IMPORT_LOCAL, J_IMPORT_S3, J_MOUNT_COLD, J_MOUNT_RANDOM, J_MOUNT_WARM, J_ROWS, J_RTT, J_WRITE,
                     K_CHECKPOINT, K_EDITS, K_GIT, K_TOUCH, K_TOUCHES, ck_system, L_BIG_RTT, L_CHANGED, L_IMPORT,
                     L_NEXT, L_NEXT_COLD, L_NEXT_PUSH, L_PUSH, l_system,
                     MATERIALIZE, MOUNT, PEERS, REAL_CHECKOUT_ROW, REAL_CHECKOUT_SUB_ROW, REAL_MATERIALIZE_ROW,
                     REAL_MOUNT_ROW, REAL_SUB, RESUME_ROW, UNTAR_ROW, Counts, Layout, Result, Subtree, Table,
                     large_system, materialize_row, mount_row, readers_row, size_label, writers_row,
                     M_GUEST_COLD, M_GUEST_DISK, M_GUEST_WARM, M_HOST_COLD, M_HOST_WARM)
from results import (N_LOCAL, N_MOUNT, N_QUICK_FILES, N_ROWS, N_RTT, O_QUICK_SIZES, O_RTT, O_SIZES, P_MEM_ROWS,
                     P_QUICK_TOPS, P_ROWS, P_RTT, P_TOPS, P_UP_ROW, o_system, p_system, work_system)

DENSE = Subtree.DENSE.value


def materialize(h: Harness, rtt: int) -> Iterator[Result]:
    """a. Cold walk-and-read without the mount (`mado materialize`)."""
    for sub in (Subtree.DENSE, Subtree.THIN):
        for layout in Layout:
            def run(cache, layout=layout, sub=sub):
                h.mado_run(h.env(layout.value, cache), "materialize", sub.value)
            # Emptying the cache is setup, outside the timed part.
            yield h.cell(MATERIALIZE[sub], materialize_row(layout), rtt, h.s3proxy, h.fresh_cache, run)


def mount_walk(h: Harness, rtt: int) -> Iterator[Result]:
    """b. The same through the mount; time to first file."""
    for sub in Subtree:
        for layout in Layout:
            mnt = os.path.join(h.work, "mnt")

            def setup(layout=layout, mnt=mnt):
                os.makedirs(mnt, exist_ok=True)
                h.mado_run(h.env(layout.value, h.fresh_cache()), "mount", "main", mnt)
                return mnt

            def run(m, sub=sub):
                t0 = time.perf_counter()
                _, _, ttff = walk_read(os.path.join(m, sub.value))
                return Sample(wall=time.perf_counter() - t0, ttff=ttff)

            def teardown(m, layout=layout):
                subprocess.run([h.mado, "umount", m], env=h.env(layout.value), capture_output=True)

            yield h.cell(MOUNT[sub], mount_row(layout), rtt, h.s3proxy, setup, run, teardown,
                         extra_of=lambda xs: dict(ttff=statistics.median(x.ttff for x in xs)))


class Resume:
    """c. Resume of a 2000 x 1 KiB workspace (created once, at the first RTT)."""

    def __init__(self):
        self.ready = False

    def __call__(self, h: Harness, rtt: int) -> Iterator[Result]:
        if not self.ready:
            d0 = os.path.join(h.work, "ws0")
            h.mado_run(h.env(WS, direct=True), "ws", "create", "bench", "--dir", d0)
            # Free the lease, so each timed resume takes it (and pays for it).
            h.mado_run(h.env(WS, direct=True), "ws", "release", "--dir", d0)
            self.ready = True
        dst = os.path.join(h.work, "resumed")

        def setup():
            h.discard(dst)
            return h.fresh_cache()

        def run(cache):
            h.mado_run(h.env(WS, cache), "ws", "resume", "bench", dst)

        def teardown(cache):
            # Untimed: give the lease back for the next run.
            h.mado_run(h.env(WS, cache), "ws", "release", "--dir", dst)

        yield h.cell(Table.C, RESUME_ROW, rtt, h.s3proxy, setup, run, teardown)


def import_pack_build(h: Harness, rtt: int) -> Iterator[Result]:
    """d. First import of the workspace tree (with its pack build), and its
    peer (issue #13): `git push` of the same repository, h.wsrepo, into a
    fresh empty bare repository each run."""
    k = [0]

    def run(cache):
        # A new store each run, so every import builds its packs.
        k[0] += 1
        out = h.mado_run(h.env(f"imp-{rtt}-{k[0]}", cache), "import-git", h.wsrepo, "--json")
        rep = json.loads(out)
        return Sample(build_ms=sum(p.get("build_ms", 0) for p in rep.get("packs", [])))

    yield h.cell(Table.D, IMPORT_ROW, rtt, h.s3proxy, h.fresh_cache, run,
                 extra_of=lambda xs: dict(build_ms=statistics.median(x.build_ms for x in xs)))

    # The transport is git:// to the harness's `git daemon` (started with
    # --enable=receive-pack) through the git proxy, the one scenario h's
    # clones go through: the same RTT, handshake and byte counts as mado's
    # S3 proxy. The timed part is the whole push: the client's pack-objects,
    # the transfer, the server's index-pack and ref update.
    bare = os.path.join(h.gitroot, "push.git")

    def fresh_bare():
        shutil.rmtree(bare, ignore_errors=True)
        sh("git", "init", "-q", "--bare", bare)

    def push(_):
        sh("git", "-C", h.wsrepo, "push", "-q", h.git_url("push.git"), "main:main")

    yield h.cell(Table.D, GIT_PUSH_ROW, rtt, h.gitproxy, fresh_bare, push,
                 lambda _: shutil.rmtree(bare, ignore_errors=True))


def warm_mount(h: Harness, rtt: int) -> Iterator[Result]:
    """e. Warm walk-and-read through the mount against the local disk."""
    mnt = os.path.join(h.work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    env = h.env(Layout.V2.value, h.fresh_cache())
    h.mado_run(env, "mount", "main", mnt)
    try:
        walk_read(os.path.join(mnt, DENSE))  # warm it
        for system, root in (("mado mount (warm)", mnt), ("local disk", h.repo)):
            def run(_, root=root):
                t0 = time.perf_counter()
                walk_read(os.path.join(root, DENSE))
                return Sample(wall=time.perf_counter() - t0)
            yield h.cell(Table.E, system, rtt, h.s3proxy, None, run)
    finally:
        subprocess.run([h.mado, "umount", mnt], env=env, capture_output=True)


def concurrency(h: Harness, rtt: int) -> Iterator[Result]:
    """f. Concurrent readers; a foreground reader under background writers."""
    files = sorted(os.listdir(os.path.join(h.repo, DENSE)))
    mnt = os.path.join(h.work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    v2 = Layout.V2.value
    for readers in (1, 2, 4, 8):
        def setup():
            h.mado_run(h.env(v2, h.fresh_cache()), "mount", "main", mnt)
            return mnt

        def run(m, readers=readers):
            # Reader i reads 60 % of the files starting at its own offset:
            # every file is read by several readers.
            span = int(len(files) * 0.6)

            def reader(i):
                start = i * len(files) // 8
                for j in range(span):
                    read_file(os.path.join(m, DENSE, files[(start + j) % len(files)]))
            ts = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
            t0 = time.perf_counter()
            [t.start() for t in ts]
            [t.join() for t in ts]
            return Sample(wall=time.perf_counter() - t0)

        yield h.cell(Table.F_READERS, readers_row(readers), rtt, h.s3proxy, setup, run,
                     lambda m: subprocess.run([h.mado, "umount", m], capture_output=True, env=h.env(v2)))
    for agents in ((0, 2) if h.quick else (0, 2, 4, 8)):
        yield foreground(h, rtt, agents, files, mnt)


# One background agent of scenario f, a process of its own: in a thread of
# the harness it would hold Python's lock between its writes, and the
# foreground reader (a thread of the harness) would wait for that lock, not
# for mado. argv: its directory, mado, a file whose presence stops it.
AGENT = r"""
import os, subprocess, sys
d, mado, stop = sys.argv[1:4]
k = 0
while not os.path.exists(stop):
    for j in range(20):
        with open(os.path.join(d, f"out{j}.txt"), "w") as f:
            f.write(f"{k} {j}\n" * 50)
    subprocess.run([mado, "ws", "checkpoint", "--dir", d], capture_output=True)
    k += 1
"""


def foreground(h: Harness, rtt: int, agents: int, files, mnt) -> Result:
    """Per-file read latency of a foreground reader through a cold
    mount while `agents` workspaces write and checkpoint in a loop, each
    agent a process of its own."""
    v2 = Layout.V2.value
    stop = os.path.join(h.work, f"agents-stop-{rtt}")
    dirs = []
    for i in range(agents):
        d = os.path.join(h.work, f"agent-{rtt}-{i}")
        if not os.path.exists(d):
            h.mado_run(h.env(WS, direct=False), "ws", "create", f"agent-{rtt}-{i}", "--dir", d)
        dirs.append(d)

    lat = []

    def setup():
        h.mado_run(h.env(v2, h.fresh_cache()), "mount", "main", mnt)
        if os.path.exists(stop):
            os.unlink(stop)
        ps = [subprocess.Popen([sys.executable, "-c", AGENT, d, h.mado, stop], env=h.env(WS, d + "-cache"))
              for d in dirs]
        time.sleep(0.5 if agents else 0)
        return (mnt, ps)

    def run(ctx):
        m, _ = ctx
        t0 = time.perf_counter()
        for name in files:
            s = time.perf_counter()
            read_file(os.path.join(m, DENSE, name))
            lat.append(time.perf_counter() - s)
        return Sample(wall=time.perf_counter() - t0)

    def teardown(ctx):
        m, ps = ctx
        open(stop, "w").close()
        for p in ps:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        subprocess.run([h.mado, "umount", m], capture_output=True, env=h.env(v2))

    res = h.cell(Table.F_FG, writers_row(agents), rtt, h.s3proxy, setup, run, teardown)
    # Over every run's reads, also those of a cell that failed part way.
    if lat:
        lat.sort()
        res = replace(res, p50_ms=lat[len(lat) // 2] * 1000, p99_ms=lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000)
    return res


def capped_cache(h: Harness, rtt: int) -> Iterator[Result]:
    """g. The cache capped at half the working set: GETs on the second pass."""
    dense = os.path.join(h.repo, DENSE)
    total = sum(os.path.getsize(os.path.join(dense, f)) for f in os.listdir(dense))
    for layout in (Layout.UNPACKED, Layout.V2):
        cache = os.path.join(h.work, "capped")

        def setup(layout=layout):
            h.discard(cache)
            e = dict(h.env(layout.value, cache), MADO_DISK_CACHE_MAX_BYTES=str(total // 2))
            h.mado_run(e, "materialize", DENSE)  # first pass, not timed
            return e

        def run(e):
            h.mado_run(e, "materialize", DENSE)

        yield h.cell(Table.G, materialize_row(layout), rtt, h.s3proxy, setup, run,
                     extra_of=lambda xs: dict(working_set=h.subtree_files[Subtree.DENSE]))


class Peers:
    """h. The peers (git, rclone, s3fs) on the same subtrees. A FUSE peer
    that overran the time limit is not run again at a higher RTT."""

    def __init__(self):
        self.skip = {}  # (system, subtree) -> the note its later cells get

    def __call__(self, h: Harness, rtt: int) -> Iterator[Result]:
        url = h.git_url("repo.git")
        for sub in (Subtree.DENSE, Subtree.THIN):
            table = PEERS[sub]
            dst = os.path.join(h.work, "clone")

            def clean():
                h.discard(dst)

            def sparse(_, sub=sub):
                sh("git", "clone", "-q", "--depth", "1", "--filter=blob:none", "--sparse", url, dst)
                sh("git", "-C", dst, "sparse-checkout", "set", sub.value)
                walk_read(os.path.join(dst, sub.value))

            yield h.cell(table, "git sparse partial", rtt, h.gitproxy, clean, sparse, lambda _: clean())

            def full(_, sub=sub):
                sh("git", "clone", "-q", "--depth", "1", url, dst)
                walk_read(os.path.join(dst, sub.value))

            yield h.cell(table, "git clone --depth 1", rtt, h.gitproxy, clean, full, lambda _: clean())

            def walk(m, sub=sub):
                walk_read(os.path.join(m, sub.value))

            for system, setup in (("rclone mount", h.rclone_mount), ("s3fs", h.s3fs_mount)):
                if self.skip.get((system, sub)):
                    yield log_result(Result(table, system, rtt, note=self.skip[(system, sub)]))
                    continue
                res = h.cell(table, system, rtt, h.s3proxy, setup, walk, h.fuse_teardown)
                yield res
                if res.median is None:
                    self.skip[(system, sub)] = "not run: slower than the time limit at a lower RTT"


class Real:
    """i. A real tree (issue #12): the crate sources of this machine's cargo
    registry as one commit (harness.real_tree, built at the first RTT). A
    subtree of whole crates, then the whole tree, each against its floor:
    untar of a tar of exactly its files into a fresh directory, and that
    plus the download plus 3 RTT (computed, not run); mado's checkout,
    materialize and mount walk, and git's clones through the git proxy.
    Every run is cold (fresh mado cache, fresh target directory, page
    cache dropped); a table's rows are measured interleaved, one run of
    each in turn (Harness.cells)."""

    def __init__(self):
        self.tree = None

    def __call__(self, h: Harness, rtt: int) -> Iterator[Result]:
        if self.tree is None:
            self.tree = h.real_tree(rtt)
        t = self.tree
        dst = os.path.join(h.work, "real-out")
        url = h.git_url("real.git")
        env = lambda cache=None: h.env(REAL, cache)  # noqa: E731

        def mado(cache, *args):  # a timed run returns a Sample or None, not mado's output
            h.mado_run(env(cache), *args)

        def run(*args):
            sh(*args)

        def clean(_=None):
            h.discard(dst)

        def empty_dst():
            clean()
            os.makedirs(dst)

        def fresh():
            clean()
            return h.fresh_cache()

        def untar(table, tar):
            return Cell(table, UNTAR_ROW, h.s3proxy, empty_dst, lambda _: run("tar", "-xf", tar, "-C", dst), clean)

        def tree(r: Result, files, size, crates) -> Result:
            # Local: no traffic; the row says what the tree is.
            return replace(r, counts=None, tree_files=files, tree_bytes=size, crates=crates)

        def floor(table, untarred: Result, checkout: Result) -> Result:
            """The untar time, plus mado's download (the proxy's bytes down
            of its checkout) at the plain GET throughput, plus 3 RTT."""
            if untarred.median is None or checkout.median is None or not checkout.counts:
                return log_result(Result(table, FLOOR_ROW, rtt, note="not computed: a row it needs failed"))
            down = checkout.counts.bytes_down
            m = untarred.median + down / (t.get_mb_s * 1e6) + 3 * rtt / 1000
            return log_result(Result(table, FLOOR_ROW, rtt, n=1, median=m, min=m, max=m, dl_bytes=down,
                                     get_mb_s=t.get_mb_s))

        mnt = os.path.join(h.work, "mnt")

        def mount():
            os.makedirs(mnt, exist_ok=True)
            h.mado_run(env(h.fresh_cache()), "mount", "main", mnt)
            return mnt

        def walk(m):
            t0 = time.perf_counter()
            _, _, ttff = walk_read(os.path.join(m, REAL_SUB))
            return Sample(wall=time.perf_counter() - t0, ttff=ttff)

        def sparse(_):
            sh("git", "clone", "-q", "--depth", "1", "--filter=blob:none", "--sparse", url, dst)
            sh("git", "-C", dst, "sparse-checkout", "set", REAL_SUB)

        # The subtree, its rows measured interleaved (h.cells): the ratios
        # compare rows measured under the same conditions.
        sub = Table.I_SUB
        u, co, mat, mo, git = h.cells(rtt, [
            untar(sub, t.sub_tar),
            Cell(sub, REAL_CHECKOUT_SUB_ROW, h.s3proxy, fresh,
                 lambda cache: mado(cache, "checkout", "main", dst, REAL_SUB), clean),
            Cell(sub, REAL_MATERIALIZE_ROW, h.s3proxy, h.fresh_cache,
                 lambda cache: mado(cache, "materialize", REAL_SUB)),
            Cell(sub, REAL_MOUNT_ROW, h.s3proxy, mount, walk,
                 lambda m: subprocess.run([h.mado, "umount", m], env=env(), capture_output=True),
                 extra_of=lambda xs: dict(ttff=statistics.median(x.ttff for x in xs))),
            Cell(sub, GIT_SPARSE_ROW, h.gitproxy, clean, sparse, clean)])
        u = tree(u, t.sub_files, t.sub_bytes, t.sub_crates)
        yield from (u, floor(sub, u, co), co, mat, mo, git)

        # The whole tree, the same way.
        whole = Table.I_WHOLE
        u, co, git = h.cells(rtt, [
            untar(whole, t.whole_tar),
            Cell(whole, REAL_CHECKOUT_ROW, h.s3proxy, fresh, lambda cache: mado(cache, "checkout", "main", dst),
                 clean),
            Cell(whole, GIT_CLONE_ROW, h.gitproxy, clean,
                 lambda _: run("git", "clone", "-q", "--depth", "1", url, dst), clean)])
        u = tree(u, t.whole_files, t.whole_bytes, t.crates)
        yield from (u, floor(whole, u, co), co, git)


class Large:
    """j. Large files (issue #19): one file of random bytes (and a tiny one
    beside it) in a git repository, at each of `h.large_sizes`; time and
    max RSS of mado's import, checkout, checkpoint and mount daemon, beside
    the raw GET of the same bytes and the local disk. Measured once per
    run, at the first RTT it is called at: the local work on the embedded
    store (file://), the rest on MinIO behind the S3 proxy at J_RTT,
    whatever the run's RTTs (the proxy is set back afterwards). Each timed
    run drops the page cache first (Harness.timed); the rows that compare
    with each other are measured interleaved (Harness.cells)."""

    def __init__(self):
        self.done = False

    def __call__(self, h: Harness, rtt: int) -> Iterator[Result]:
        if self.done:
            return
        self.done = True
        h.set_rtt(J_RTT)
        try:
            for size in h.large_sizes:
                yield from self.one(h, size)
        finally:
            h.set_rtt(rtt)

    def one(self, h: Harness, size: int) -> Iterator[Result]:
        tag = f"{size >> 20}m"
        d = os.path.join(h.work, f"large-{tag}")
        repo, out, wsd = (os.path.join(d, x) for x in ("repo", "out", "ws"))
        big, out_big = os.path.join(repo, "big.bin"), os.path.join(out, "big.bin")
        store = os.path.join(d, "store")  # the embedded store
        prefix = f"large-{tag}"  # the MinIO store
        key = f"{BUCKET}/bench-large/{tag}"  # the same bytes as one plain object, for the raw GETs
        mnt = os.path.join(h.work, "mnt")
        # The random read: 200 MiB into the file (half-way into a smaller one).
        at = 200 << 20 if size >= (200 << 20) + 4096 else (size // 2) & ~4095
        purge = []  # MinIO prefixes to delete when done
        try:
            log(f"large file: {size_label(size)} of random bytes")
            os.makedirs(repo)
            with open(big, "wb") as f:
                for k in range(0, size, 16 << 20):
                    f.write(os.urandom(min(16 << 20, size - k)))
            with open(os.path.join(repo, "small.txt"), "w") as f:
                f.write("a small file beside the large one\n")
            genv = dict(os.environ, **GIT_ENV)
            sh("git", "init", "-q", "-b", "main", repo, env=genv)
            sh("git", "add", "-A", cwd=repo, env=genv)
            sh("git", "commit", "-qm", "one large file", cwd=repo, env=genv)
            h.put_object(big, key)
            # The MinIO store the checkout and mount rows read (untimed).
            purge.append(prefix)
            h.mado_run(h.env(prefix, self.cache(d, "setup"), direct=True), "import-git", repo)
            shutil.rmtree(self.cache(d, "setup"), ignore_errors=True)
            yield from self.measure(h, size, d, repo, out, wsd, big, out_big, store, prefix, key, mnt, at, purge)
        finally:
            unmount(mnt)
            for p in purge:
                subprocess.run(["rclone", "purge", f"minio:{BUCKET}/{p}"], env=h.rclone_env, capture_output=True)
            h.delete_object(key)
            shutil.rmtree(d, ignore_errors=True)

    @staticmethod
    def cache(d, name):
        return os.path.join(d, f"cache-{name}")

    def fresh(self, d, name):
        c = self.cache(d, name)
        shutil.rmtree(c, ignore_errors=True)
        return c

    def measure(self, h: Harness, size, d, repo, out, wsd, big, out_big, store, prefix, key, mnt, at,
                purge) -> Iterator[Result]:
        local_env = lambda cache: h.env_local(store, cache)  # noqa: E731
        s3_env = lambda cache: h.env(prefix, cache)  # noqa: E731
        held = {}  # system -> the samples of its cell (for mado's own counts)

        def spec(row, setup, run, teardown=None) -> Cell:
            system = large_system(row, size)

            def extra(xs):
                held[system] = xs
                med = lambda v: statistics.median(v) if v else None  # noqa: E731
                return dict(rss_mib=med([x.rss_mib for x in xs if x.rss_mib is not None]),
                            up_bytes=med([x.up_bytes for x in xs if x.up_bytes is not None]),
                            read_at=at if row == J_MOUNT_RANDOM else None)
            return Cell(Table.J, system, h.s3proxy, setup, run, teardown, extra)

        def done(results: List[Result]) -> Iterator[Result]:
            for r in results:
                row = r.system.rsplit(" [", 1)[0]
                r = replace(r, rtt=J_ROWS[row][0], file_bytes=size)
                if J_ROWS[row][0] == 0:
                    # No traffic through the proxy: the counts are mado's own
                    # (--json) of its requests to the embedded store, if any.
                    xs = [x.counts for x in held.get(r.system, []) if x.counts]
                    r = replace(r, counts=median_counts(xs) if xs else None)
                yield r

        def mado(env, *args) -> Sample:
            wall, rss, stdout = run_rss([h.mado, *args, "--json", "--verbose"], env=env)
            st = json.loads(stdout).get("remote", {})
            counts = Counts(gets=st.get("gets", 0) + st.get("ranged_gets", 0),
                            requests=sum(st.get(k, 0) for k in ("gets", "ranged_gets", "heads", "puts", "lists",
                                                                "deletes", "copies")),
                            ranged=st.get("ranged_gets", 0), connections=0, bytes_down=st.get("bytes_down", 0),
                            puts=st.get("puts", 0), heads=st.get("heads", 0), bytes_up=st.get("bytes_up", 0))
            return Sample(wall=wall, rss_mib=rss, up_bytes=st.get("bytes_up"), counts=counts)

        def timed_sh(*args) -> Sample:
            t0 = time.perf_counter()
            sh(*args)
            return Sample(wall=time.perf_counter() - t0)

        def clean(_=None):
            shutil.rmtree(out, ignore_errors=True)

        def empty_out():
            clean()
            os.makedirs(out)

        def checked(sample: Sample) -> Sample:
            if os.path.getsize(out_big) != size:
                raise RuntimeError(f"{out_big}: {os.path.getsize(out_big)} bytes, not {size}")
            return sample

        # Import: a new store each run (the cache is fresh too).
        k = [0]

        def s3_import_setup():
            k[0] += 1
            purge.append(f"{prefix}-imp{k[0]}")
            return self.fresh(d, "import")

        def s3_import_teardown(_):
            subprocess.run(["rclone", "purge", f"minio:{BUCKET}/{purge.pop()}"], env=h.rclone_env,
                           capture_output=True)

        def local_import_setup():
            shutil.rmtree(store, ignore_errors=True)
            return self.fresh(d, "import")

        yield from done(h.cells(J_RTT, [
            spec(J_IMPORT_LOCAL, local_import_setup, lambda c: mado(local_env(c), "import-git", repo)),
            spec(J_IMPORT_S3, s3_import_setup,
                 lambda c: mado(h.env(f"{prefix}-imp{k[0]}", c), "import-git", repo), s3_import_teardown)]))
        shutil.rmtree(self.cache(d, "import"), ignore_errors=True)
        if not os.path.isdir(os.path.join(store, "refs")):
            # The local import failed: the local rows need the store.
            h.mado_run(local_env(self.fresh(d, "import")), "import-git", repo)

        # The workspace: one append of 100 bytes before each checkpoint.
        h.mado_run(local_env(self.cache(d, "ws")), "ws", "create", "large", "--dir", wsd)

        def append():
            with open(os.path.join(wsd, "big.bin"), "ab") as f:
                f.write(os.urandom(100))

        yield from done(h.cells(J_RTT, [
            spec(J_CHECKPOINT, append, lambda _: mado(local_env(self.cache(d, "ws")), "ws", "checkpoint",
                                                      "--dir", wsd, "-m", "100 bytes more"))]))
        shutil.rmtree(wsd, ignore_errors=True)
        shutil.rmtree(self.cache(d, "ws"), ignore_errors=True)

        # Local work: checkouts from the embedded store against cp; the warm
        # mount against reading the file from the disk.
        h.mado_run(local_env(self.fresh(d, "warm")), "checkout", "main", out)  # fills the cache
        clean()

        def mount(cache):
            """Mounts the MinIO store's main on `mnt` with this cache; (the
            daemon's pid, the cache)."""
            os.makedirs(mnt, exist_ok=True)
            h.mado_run(s3_env(cache), "mount", "main", mnt)
            try:
                os.stat(os.path.join(mnt, "big.bin"))  # the lookup is not timed
                return json.loads(h.mado_run(s3_env(cache), "stats", mnt, "--json"))["pid"], cache
            except BaseException:
                umount((None, cache))
                raise

        def umount(ctx):
            subprocess.run([h.mado, "umount", mnt], env=s3_env(ctx[1]), capture_output=True)

        def cat(ctx) -> Sample:
            # The daemon's peak RSS since it started (it served nothing before).
            t0 = time.perf_counter()
            sh("sh", "-c", f'cat "{os.path.join(mnt, "big.bin")}" > /dev/null')
            return Sample(wall=time.perf_counter() - t0, rss_mib=vm_hwm_mib(ctx[0]))

        ctx = mount(self.fresh(d, "mount-warm"))  # fill the mount's cache
        cat(ctx)
        umount(ctx)

        yield from done(h.cells(J_RTT, [
            spec(J_CHECKOUT_COLD_LOCAL, lambda: (clean(), self.fresh(d, "co"))[1],
                 lambda c: checked(mado(local_env(c), "checkout", "main", out)), clean),
            spec(J_CHECKOUT_WARM, lambda: (clean(), self.cache(d, "warm"))[1],
                 lambda c: checked(mado(local_env(c), "checkout", "main", out)), clean),
            spec(J_CP, empty_out, lambda _: checked(timed_sh("cp", big, out_big)), clean),
            spec(J_WRITE, empty_out,
                 lambda _: checked(timed_sh("dd", "if=/dev/zero", f"of={out_big}", "bs=1M", f"count={size >> 20}",
                                            "status=none")), clean),
            spec(J_MOUNT_WARM, lambda: mount(self.cache(d, "mount-warm")), cat, umount),
            spec(J_DISK_READ, None, lambda _: timed_sh("sh", "-c", f'cat "{big}" > /dev/null'))]))
        for x in ("co", "warm", "mount-warm"):
            shutil.rmtree(self.cache(d, x), ignore_errors=True)

        # Over the network: MinIO behind the proxy at J_RTT.
        with open(big, "rb") as f:
            f.seek(at)
            want = f.read(4096)

        def random_read(ctx) -> Sample:
            t0 = time.perf_counter()
            fd = os.open(os.path.join(mnt, "big.bin"), os.O_RDONLY)
            try:
                got = os.pread(fd, 4096, at)
            finally:
                os.close(fd)
            wall = time.perf_counter() - t0
            if got != want:
                raise RuntimeError(f"the 4 KiB read at {at} through the mount returned other bytes")
            return Sample(wall=wall, rss_mib=vm_hwm_mib(ctx[0]))

        def get(ranges) -> Sample:
            t0 = time.perf_counter()
            got = h.get_object(key, size, ranges)
            if got != size:
                raise RuntimeError(f"GET of {key}: {got} bytes, not {size}")
            return Sample(wall=time.perf_counter() - t0)

        yield from done(h.cells(J_RTT, [
            spec(J_GET1, None, lambda _: get(1)),
            spec(J_GET8, None, lambda _: get(8)),
            spec(J_CHECKOUT_COLD, lambda: (clean(), self.fresh(d, "co"))[1],
                 lambda c: checked(mado(s3_env(c), "checkout", "main", out)), clean),
            spec(J_MOUNT_COLD, lambda: mount(self.fresh(d, "mount")), cat, umount),
            spec(J_MOUNT_RANDOM, lambda: mount(self.fresh(d, "mount")), random_read, umount)]))
        # Again with the store on a core of its own (issue #19's two
        # throughput goals, without the store's CPU taken from the reader).
        with h.store_on_own_core() as pinned:
            if pinned:
                yield from done(h.cells(J_RTT, [
                    spec(J_GET8_PINNED, None, lambda _: get(8)),
                    spec(J_CHECKOUT_COLD_PINNED, lambda: (clean(), self.fresh(d, "co"))[1],
                         lambda c: checked(mado(s3_env(c), "checkout", "main", out)), clean),
                    spec(J_MOUNT_COLD_PINNED, lambda: mount(self.fresh(d, "mount")), cat, umount)]))


class CkTree:
    """One of scenario k's trees, set up once: the file list by leaf
    directory, the mado working copy and its cache, the git clone, and how
    many rounds of edits and touches each has had."""

    def __init__(self, files: int, d: str, prefix: str, leaves: List[List[str]], wsd: str, cache: str, clone: str):
        self.files, self.d, self.prefix, self.leaves = files, d, prefix, leaves
        self.wsd, self.cache, self.clone = wsd, cache, clone
        self.all = [f for leaf in leaves for f in leaf]
        self.edits = {"mado": 0, "git": 0}  # rounds of edits so far (round 0: the warm-up)
        self.touches = 0

    def edit_paths(self, c: int) -> List[str]:
        """Round c's K_EDITS files: one in each of K_EDITS leaf directories
        spread evenly over the tree (so over different top-level folders),
        moving on each round."""
        n = len(self.leaves)
        out = []
        for i in range(K_EDITS):
            leaf = self.leaves[(c * 37 + i * n // K_EDITS) % n]
            out.append(leaf[c % len(leaf)])
        return out

    def edit(self, root: str, c: int) -> int:
        """Appends round c's line to round c's files under `root` (the same
        bytes in the mado working copy and the git clone); returns the
        edited files' sizes after the edit."""
        total = 0
        for rel in self.edit_paths(c):
            p = os.path.join(root, rel)
            with open(p, "a") as f:
                f.write(f"// edit {c}: {random.Random(c).randbytes(16).hex()}\n")
            total += os.path.getsize(p)
        return total

    def touch(self, t: int) -> int:
        """Sets a new mtime (content unchanged) on K_TOUCHES files spread
        over the tree (half the tree when it is smaller); returns how many."""
        k = min(K_TOUCHES, self.files // 2)
        ns = time.time_ns() + t * 1000
        stride = len(self.all) / k
        for i in range(k):
            p = os.path.join(self.wsd, self.all[(int(i * stride) + t) % len(self.all)])
            os.utime(p, ns=(ns, ns))
        return k


class Checkpoints:
    """k. Checkpoint after k edits (issue #18): a synthetic source tree of
    each of `h.ck_sizes` files (10 per directory, three levels of 10-way
    directories under n/1000 top-level ones, small text files), committed to
    git, imported into MinIO (its own prefix) and checked out as a plain
    working copy (`mado ws create --dir`); the same commit cloned from a
    bare repository that `git daemon` serves through the git proxy. After a
    warm-up (one edit checkpointed and pushed: the first checkpoint after
    an import writes whole metadata), each round appends a line to 10 files
    in 10 directories and times `mado ws checkpoint` through the S3 proxy,
    then the same edit in the clone and `git commit -a && git push` through
    the git proxy; then touches the mtimes of 1,000 files and times a
    checkpoint. The three rows are measured interleaved (Harness.cells),
    fresh edits each round, with the page cache warm (as for an agent that
    checkpoints every minute; dirty pages are flushed before each run).
    Trees are built at the first RTT and kept for the next."""

    def __init__(self):
        self.trees: Dict[int, CkTree] = {}

    def __call__(self, h: Harness, rtt: int) -> Iterator[Result]:
        for n in h.ck_sizes:
            if n not in self.trees:
                self.trees[n] = self.build(h, n)
            yield from self.measure(h, rtt, self.trees[n])

    @staticmethod
    def generate(root: str, n: int) -> List[List[str]]:
        """n small source-like files, 10 per leaf directory:
        `m<top>/p<0-9>/d<0-9>/f<0-9>.rs` (files in order); returns the
        files by leaf directory (relative paths)."""
        rnd = random.Random(n)
        leaves: List[List[str]] = []
        for i in range(n):
            j = i // 10
            rel = f"m{j // 100:02}/p{(j // 10) % 10}/d{j % 10}/f{i % 10}.rs"
            if i % 10 == 0:
                leaves.append([])
                os.makedirs(os.path.join(root, os.path.dirname(rel)))
            leaves[-1].append(rel)
            lines = [f"// {rel}\n"]
            for k in range(rnd.randint(5, 60)):
                word = rnd.randbytes(rnd.randint(2, 12)).hex()
                lines.append(f"    let v{k} = 0x{word}; // {rnd.randint(0, 1 << 30)}\n")
            with open(os.path.join(root, rel), "w") as f:
                f.write("fn main() {\n" + "".join(lines) + "}\n")
        return leaves

    def build(self, h: Harness, n: int) -> CkTree:
        d = os.path.join(h.work, f"ck-{n}")
        repo, wsd, clone = (os.path.join(d, x) for x in ("repo", "ws", "git"))
        prefix, name = f"ck-{n}", f"ck-{n}"
        t0 = time.time()
        os.makedirs(repo)
        leaves = self.generate(repo, n)
        genv = dict(os.environ, **GIT_ENV)
        sh("git", "init", "-q", "-b", "main", repo, env=genv)
        sh("git", "add", "-A", cwd=repo, env=genv)
        sh("git", "commit", "-qm", f"a {n}-file tree", cwd=repo, env=genv)
        bare = os.path.join(h.gitroot, f"{name}.git")
        sh("git", "clone", "-q", "--bare", repo, bare)
        sh("git", "clone", "-q", bare, clone)
        sh("git", "-C", clone, "remote", "set-url", "origin", h.git_url(f"{name}.git"))
        # The store: imported straight into MinIO (untimed); the working copy
        # and every checkpoint through the S3 proxy.
        h.mado_run(h.env(prefix, os.path.join(d, "cache-import"), direct=True), "import-git", repo)
        shutil.rmtree(os.path.join(d, "cache-import"), ignore_errors=True)
        cache = os.path.join(d, "cache")
        h.mado_run(h.env(prefix, cache), "ws", "create", name, "--dir", wsd)
        shutil.rmtree(repo)
        t = CkTree(n, d, prefix, leaves, wsd, cache, clone)
        # Warm-up: round 0's edit, checkpointed and pushed.
        t.edit(wsd, 0)
        h.mado_run(h.env(prefix, cache), "ws", "checkpoint", "--dir", wsd, "-m", "warm-up")
        t.edit(clone, 0)
        sh("git", "-C", clone, "commit", "-qam", "warm-up", env=genv)
        sh("git", "-C", clone, "push", "-q", env=genv)
        log(f"checkpoint tree of {n} files in {len(leaves)} leaf directories set up in {time.time() - t0:.1f} s")
        return t

    def measure(self, h: Harness, rtt: int, t: CkTree) -> Iterator[Result]:
        env = h.env(t.prefix, t.cache)
        genv = dict(os.environ, **GIT_ENV)

        def edit_mado():
            t.edits["mado"] += 1
            return K_EDITS, t.edit(t.wsd, t.edits["mado"])

        def edit_git():
            t.edits["git"] += 1
            return K_EDITS, t.edit(t.clone, t.edits["git"])

        def touch():
            t.touches += 1
            return t.touch(t.touches), 0

        def checkpoint(ctx) -> Sample:
            changed, content = ctx
            rep = json.loads(h.mado_run(env, "ws", "checkpoint", "--dir", t.wsd, "-m", "bench", "--json"))
            if rep.get("unchanged"):
                raise RuntimeError("mado ws checkpoint saw nothing changed")
            st = rep.get("remote", {})
            return Sample(up_bytes=st.get("bytes_up"), round_trips=st.get("round_trips"),
                          index_bytes=rep.get("index_bytes"), stat_bytes=rep.get("stat_bytes"),
                          files_read=rep.get("files_read"), changed=changed, content_bytes=content)

        def push(ctx) -> Sample:
            changed, content = ctx
            sh("git", "-C", t.clone, "commit", "-qam", "bench", env=genv)
            sh("git", "-C", t.clone, "push", "-q", env=genv)
            return Sample(changed=changed, content_bytes=content)

        def extra(xs: List[Sample]) -> dict:
            def med(name):
                v = [getattr(x, name) for x in xs if getattr(x, name) is not None]
                return int(statistics.median(v)) if v else None
            ups = [x.up_bytes for x in xs if x.up_bytes is not None]
            return dict(tree_files=t.files, up_bytes=med("up_bytes"), max_up_bytes=max(ups) if ups else None,
                        round_trips=med("round_trips"), index_bytes=med("index_bytes"), stat_bytes=med("stat_bytes"),
                        files_read=med("files_read"), changed=med("changed"), content_bytes=med("content_bytes"))

        def cell(row, proxy, setup, run) -> Cell:
            return Cell(Table.K, ck_system(row, t.files), proxy, setup, run, extra_of=extra, drop_caches=False)

        yield from h.cells(rtt, [cell(K_CHECKPOINT, h.s3proxy, edit_mado, checkpoint),
                                 cell(K_GIT, h.gitproxy, edit_git, push),
                                 cell(K_TOUCH, h.s3proxy, touch, checkpoint)])


class ImportTree:
    """One of scenario l's repositories: `main` (the first commit) and
    `l-next` (main with L_CHANGED files changed), its files and bytes."""

    def __init__(self, repo: str, files: int, size: int, changed: int, content: int):
        self.repo, self.files, self.size, self.changed, self.content = repo, files, size, changed, content


def next_commit(repo: str, n: int) -> ImportTree:
    """Commits, as the branch `l-next`, main with a line appended to `n`
    files spread evenly over the tree (.rs files where there are enough),
    without touching the working tree or main (git plumbing, a temporary
    index); returns the repository's ImportTree."""
    genv = dict(os.environ, **GIT_ENV)
    entries = []  # (mode, blob, path, size) of every file of main
    for line in sh("git", "-C", repo, "ls-tree", "-r", "-z", "-l", "main").split("\0"):
        if not line:
            continue
        meta, path = line.split("\t", 1)
        mode, kind, blob, size = meta.split()
        if kind == "blob":
            entries.append((mode, blob, path, 0 if size == "-" else int(size)))
    plain = [e for e in entries if e[0] == "100644"]
    pool = [e for e in plain if e[2].endswith(".rs")]
    pool = pool if len(pool) >= n else plain
    picks = [pool[i * len(pool) // n] for i in range(n)]
    ienv = dict(genv, GIT_INDEX_FILE=os.path.join(repo, ".git", "l-next-index"))
    sh("git", "-C", repo, "read-tree", "main", env=ienv)
    content = 0
    for mode, blob, path, _ in picks:
        data = subprocess.run(["git", "-C", repo, "cat-file", "blob", blob], capture_output=True, check=True).stdout
        data += f"// the next commit: {path}\n".encode()
        content += len(data)
        new = subprocess.run(["git", "-C", repo, "hash-object", "-w", "--stdin"], input=data, capture_output=True,
                             check=True).stdout.decode().strip()
        sh("git", "-C", repo, "update-index", "--cacheinfo", f"{mode},{new},{path}", env=ienv)
    tree = sh("git", "-C", repo, "write-tree", env=ienv).strip()
    commit = subprocess.run(["git", "-C", repo, "commit-tree", tree, "-p", "main", "-m", f"{n} files changed"],
                            env=genv, capture_output=True, text=True, check=True).stdout.strip()
    sh("git", "-C", repo, "update-ref", "refs/heads/l-next", commit)
    os.remove(ienv["GIT_INDEX_FILE"])
    return ImportTree(repo, len(entries), sum(e[3] for e in entries), n, content)


class RealImport:
    """l. Import of a real tree (issue #13): scenario i's tree (the crate
    sources of this machine's cargo registry as one commit,
    harness.real_tree, built once) imported with `mado import-git --json`
    through the S3 proxy into a new store (a fresh prefix) with a fresh
    cache, against `git push` of the same commit through the git proxy
    into a fresh empty bare repository that `git daemon` serves (as d).
    Then the next commit (`next_commit`: L_CHANGED files changed): `mado
    import-git --rev l-next` into a store that already holds the first
    (imported straight into MinIO in setup, untimed), with the cache that
    import left (as on the machine that imported the first) and with an
    empty one; and `git push` of it to a bare repository that already
    holds the first. A new store and bare repository each run, page cache
    dropped; the rows of each group measured interleaved (Harness.cells).
    With `h.import_sizes`, the first import and push of a synthetic source
    tree of each size (scenario k's generator), at L_BIG_RTT only."""

    def __init__(self):
        self.real = None
        self.big: Dict[int, ImportTree] = {}
        self.k = 0  # stores made so far (each run's own prefix)

    def __call__(self, h: Harness, rtt: int) -> Iterator[Result]:
        if self.real is None:
            t = h.real_tree(rtt)
            self.real = next_commit(t.repo, L_CHANGED)
            log(f"l: the real tree ({self.real.files} files, {self.real.size / 1e6:.0f} MB) and its next commit")
        yield from self.measure(h, rtt, self.real, lambda row: row, True)
        if rtt != L_BIG_RTT:
            return
        for n in h.import_sizes:
            if n not in self.big:
                self.big[n] = self.build(h, n)
            yield from self.measure(h, rtt, self.big[n], lambda row, n=n: l_system(row, n), False)

    @staticmethod
    def build(h: Harness, n: int) -> ImportTree:
        t0 = time.time()
        repo = os.path.join(h.work, f"l-{n}")
        os.makedirs(repo)
        Checkpoints.generate(repo, n)
        genv = dict(os.environ, **GIT_ENV)
        sh("git", "init", "-q", "-b", "main", repo, env=genv)
        sh("git", "add", "-A", cwd=repo, env=genv)
        sh("git", "commit", "-qm", f"a {n}-file tree", cwd=repo, env=genv)
        t = next_commit(repo, L_CHANGED)
        log(f"l: a synthetic {n}-file tree ({t.size / 1e6:.0f} MB) set up in {time.time() - t0:.1f} s")
        return t

    def measure(self, h: Harness, rtt: int, t: ImportTree, system: Callable[[str], str],
                nexts: bool) -> Iterator[Result]:
        bare = os.path.join(h.gitroot, "l-push.git")
        held = os.path.join(h.work, "l-cache-held")  # the cache a setup import leaves

        def new_store():
            self.k += 1
            return f"l-{rtt}-{self.k}"

        def purge(prefix):
            subprocess.run(["rclone", "purge", f"minio:{BUCKET}/{prefix}"], env=h.rclone_env, capture_output=True)

        def mado(prefix, cache, *args) -> Sample:
            t0 = time.perf_counter()
            rep = json.loads(h.mado_run(h.env(prefix, cache), "import-git", t.repo, "--json", *args))
            wall = time.perf_counter() - t0
            if not any(i.get("new_snapshot") for i in rep.get("imported", [])):
                raise RuntimeError("mado import-git made no new snapshot")
            st = rep.get("remote", {})
            return Sample(wall=wall, build_ms=sum(p.get("build_ms", 0) for p in rep.get("packs", [])),
                          up_bytes=st.get("bytes_up"), round_trips=st.get("round_trips"))

        def extra(changed: int, content: int):
            def of(xs: List[Sample]) -> dict:
                def med(name):
                    v = [getattr(x, name) for x in xs if getattr(x, name) is not None]
                    return statistics.median(v) if v else None
                return dict(tree_files=t.files, tree_bytes=t.size, changed=changed or None,
                            content_bytes=content or None, build_ms=med("build_ms"),
                            up_bytes=None if med("up_bytes") is None else int(med("up_bytes")),
                            max_up_bytes=max([x.up_bytes for x in xs if x.up_bytes is not None], default=None),
                            round_trips=None if med("round_trips") is None else int(med("round_trips")))
            return of

        def fresh_bare(with_first: bool):
            shutil.rmtree(bare, ignore_errors=True)
            sh("git", "init", "-q", "--bare", bare)
            if with_first:  # straight into the bare repository, not through the proxy
                sh("git", "-C", t.repo, "push", "-q", bare, "main:main")

        def push(branch):
            sh("git", "-C", t.repo, "push", "-q", h.git_url("l-push.git"), f"{branch}:main")

        # The first import: a new store, an empty cache.
        def first_setup():
            prefix = new_store()
            return prefix, h.fresh_cache()

        yield from h.cells(rtt, [
            Cell(Table.L, system(L_IMPORT), h.s3proxy, first_setup, lambda c: mado(*c), lambda c: purge(c[0]),
                 extra(0, 0)),
            Cell(Table.L, system(L_PUSH), h.gitproxy, lambda: fresh_bare(False), lambda _: push("main"),
                 lambda _: shutil.rmtree(bare, ignore_errors=True), extra(0, 0))])
        if not nexts:
            return

        # The next commit: a store holding the first, imported in setup
        # (straight into MinIO) with the cache the timed import then uses,
        # or with one emptied after it.
        def next_setup(cold: bool):
            def setup():
                prefix = new_store()
                shutil.rmtree(held, ignore_errors=True)
                h.mado_run(h.env(prefix, held, direct=True), "import-git", t.repo)
                if cold:
                    shutil.rmtree(held, ignore_errors=True)
                return prefix, held
            return setup

        def next_teardown(c):
            purge(c[0])
            shutil.rmtree(held, ignore_errors=True)

        yield from h.cells(rtt, [
            Cell(Table.L, system(L_NEXT), h.s3proxy, next_setup(False), lambda c: mado(*c, "--rev", "l-next"),
                 next_teardown, extra(t.changed, t.content)),
            Cell(Table.L, system(L_NEXT_COLD), h.s3proxy, next_setup(True), lambda c: mado(*c, "--rev", "l-next"),
                 next_teardown, extra(t.changed, t.content)),
            Cell(Table.L, system(L_NEXT_PUSH), h.gitproxy, lambda: fresh_bare(True), lambda _: push("l-next"),
                 lambda _: shutil.rmtree(bare, ignore_errors=True), extra(t.changed, t.content))])


# The guest's walk: the same tool on the share and on its disk; timed by
# the guest's own clock (/proc/uptime, 10 ms), so the boot is not counted.
GUEST_WALK = "find {d} -type f -exec cat {{}} + > /dev/null"
GUEST_CLOCK = "$(cut -d' ' -f1 /proc/uptime)"


def guest_times(out: bytes) -> List[float]:
    """The intervals a guest script printed as `mado-bench T0 T1 [T2 T3]`."""
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("mado-bench "):
            t = [float(x) for x in line.split()[1:]]
            return [t[i + 1] - t[i] for i in range(0, len(t), 2)]
    raise RuntimeError(f"no timing line from the guest: {out[-300:]!r}")


class VirtioFs:
    """m. The dense subtree in a VM guest through `mado serve-virtiofs`
    (issue #14): a cold walk and read with an empty mado cache, then a warm
    one after the guest drops its caches, in the same guest; the guest's
    local disk; and `mado mount` on the host, cold and warm."""

    def __init__(self):
        self.vm = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "vm-run.sh")

    def guest(self, sock: str, script: str, *extra: str) -> bytes:
        # vm-run's kernel and image are cached under the real HOME.
        p = subprocess.run([self.vm, "--virtiofs-socket", sock, *extra, "--", script], capture_output=True,
                           env=dict(os.environ))
        if p.returncode != 0:
            raise RuntimeError(f"vm-run exited {p.returncode}: {p.stderr.decode(errors='replace')[-400:]}")
        return p.stdout

    def serve(self, h: Harness, cache: str) -> subprocess.Popen:
        sock = os.path.join(h.work, "vfs.sock")
        p = subprocess.Popen([h.mado, "serve-virtiofs", "main", "--socket", sock], env=h.env(Layout.V2.value, cache),
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        for line in p.stderr:  # woken by its readiness line, not a timer
            if line.startswith("serving "):
                threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()
                p.sock = sock
                return p
        raise RuntimeError(f"serve-virtiofs exited ({p.wait()}) before it was ready")

    @staticmethod
    def stop(p: subprocess.Popen):
        p.terminate()
        p.wait(30)

    def __call__(self, h: Harness, rtt: int) -> Iterator[Result]:
        warm: List[float] = []
        two = (f"a={GUEST_CLOCK}; {GUEST_WALK.format(d=DENSE)}; b={GUEST_CLOCK}; "
               f"sync; echo 3 > /proc/sys/vm/drop_caches; "
               f"c={GUEST_CLOCK}; {GUEST_WALK.format(d=DENSE)}; d={GUEST_CLOCK}; echo mado-bench $a $b $c $d")

        def cold_and_warm(p):
            cold, w = guest_times(self.guest(p.sock, two))
            warm.append(w)
            return Sample(wall=cold)

        yield h.cell(Table.M, M_GUEST_COLD, rtt, h.s3proxy, lambda: self.serve(h, h.fresh_cache()), cold_and_warm,
                     self.stop)
        if warm:
            yield log_result(Result(Table.M, M_GUEST_WARM, rtt, n=len(warm), median=statistics.median(warm),
                                    min=min(warm), max=max(warm)))
        disk = (f"cp -a {DENSE} /mnt/disk/ && sync && echo 3 > /proc/sys/vm/drop_caches && "
                f"a={GUEST_CLOCK}; {GUEST_WALK.format(d='/mnt/disk/' + DENSE)}; b={GUEST_CLOCK}; echo mado-bench $a $b")
        yield h.cell(Table.M, M_GUEST_DISK, rtt, h.s3proxy, lambda: self.serve(h, h.fresh_cache()),
                     lambda p: Sample(wall=guest_times(self.guest(p.sock, disk, "--scratch-disk", "256M"))[0]),
                     self.stop)
        mnt = os.path.join(h.work, "mnt")
        os.makedirs(mnt, exist_ok=True)

        def mount(cache, warm_it):
            h.mado_run(h.env(Layout.V2.value, cache), "mount", "main", mnt)
            if warm_it:
                walk_read(os.path.join(mnt, DENSE))
            return mnt

        def walk(m):
            t0 = time.perf_counter()
            walk_read(os.path.join(m, DENSE))
            return Sample(wall=time.perf_counter() - t0)

        def umount(m):
            subprocess.run([h.mado, "umount", m], env=h.env(Layout.V2.value), capture_output=True)

        yield h.cell(Table.M, M_HOST_COLD, rtt, h.s3proxy, lambda: mount(h.fresh_cache(), False), walk, umount)
        yield h.cell(Table.M, M_HOST_WARM, rtt, h.s3proxy, lambda: mount(h.fresh_cache(), True), walk, umount)


def run_script(args: List[str], env: dict, limit: float, leftovers: List[str]) -> str:
    """Runs a by-hand benchmark script (its own session, so that a timeout
    stops the command it is timing too, and SIGTERM lets its trap clean
    up), unmounts what the `leftovers` globs match that it could not, and
    returns its stdout; raises with its last stderr line if it failed."""
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        out, err = p.communicate()
        err += f"\nstopped after {limit:.0f} s"
    finally:
        for m in (m for g in leftovers for m in glob.glob(g)):
            unmount(m)
    if p.returncode != 0:
        last = [x for x in err.splitlines() if x.strip()]
        raise ScriptFailed(f"{os.path.basename(args[1] if args[0] == sys.executable else args[0])} exited "
                           f"{p.returncode}: " + (last[-1] if last else "no message"), out)
    return out


class ScriptFailed(RuntimeError):
    """A script failed; `out` is what it printed (rows it measured)."""

    def __init__(self, message: str, out: str):
        super().__init__(message)
        self.out = out


class OncePerRun:
    """A scenario of local work, run once per run at the first RTT it is
    called at (there is no network): subclasses define `once`."""

    def __init__(self):
        self.done = False

    def __call__(self, h: Harness, rtt: int) -> Iterator[Result]:
        if self.done:
            return
        self.done = True
        yield from self.once(h)

    def once(self, h: Harness) -> Iterator[Result]:
        raise NotImplementedError


class Work(OncePerRun):
    """n. Work in a workspace (issue #20, part 3): bench/workspace-work.sh,
    which times git, grep, find, cat, cp -r, rm -rf, sed -i and make on a
    plain directory of the local disk and in a read-write workspace mount
    of the same real tree (the cargo registry's crates in name order until
    ~12,000 files, N_QUICK_FILES with --quick, as one commit, plus a small C
    project) on the embedded store, warm; each row's median (min–max) over
    h.runs runs (--quick: one), the git row's one run. The script times its
    own runs (warm by design: no page cache dropped, no proxy), so this only
    parses its table, one Result per row and side. Measured once per run,
    at the first RTT it is called at (there is no network), and recorded
    at N_RTT; with MADO_BENCH_QUIET_S, the wait for a quiet machine is once,
    before the script starts."""

    SCRIPT = os.path.join(ROOT, "bench", "workspace-work.sh")
    CELL = re.compile(r"([0-9.]+) s(?: \(([0-9.]+)–([0-9.]+)\))?")

    def once(self, h: Harness) -> Iterator[Result]:
        runs = 1 if h.quick else h.runs
        # TMPDIR: the script's work folder goes under the harness's, which
        # h.close() removes whatever happens here.
        env = dict(os.environ, RUNS=str(runs), TMPDIR=h.work)
        env.pop("FILES", None)
        if h.quick:
            env["FILES"] = str(N_QUICK_FILES)
        log(f"n: {os.path.relpath(self.SCRIPT, ROOT)} {h.mado}, {runs} runs"
            + (f", {N_QUICK_FILES} files" if h.quick else ""))
        h.quiet_start()
        limit = h.timeout * len(N_ROWS)  # far more than a healthy run takes
        try:
            out = run_script([self.SCRIPT, h.mado], env, limit, [os.path.join(h.work, "mado-work.*", "mnt")])
        except ScriptFailed as e:
            yield from self.parse(e.out, runs)
            raise
        yield from self.parse(out, runs)

    def parse(self, out: str, runs: int) -> Iterator[Result]:
        """The script's table as Results: for each row, the local disk's
        cell then the mount's, with the tree's file count (and, on the cp
        row, the crate it copies). A cell with a range is over `runs` runs,
        one without over one."""
        files = re.search(r"^Files: (\d+) in the tree", out, re.M)
        files = int(files.group(1)) if files else None
        for line in out.splitlines():
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) != 4 or not self.CELL.fullmatch(cols[1]):
                continue  # the header, its rule, the text above
            label = cols[0]
            row = next((r for r in N_ROWS if label.startswith(r)), None)
            if row is None:
                raise RuntimeError(f"the script has a row results.N_ROWS does not know: {label!r}")
            crate = label[len(row):].strip(" ()") or None
            for where, text in ((N_LOCAL, cols[1]), (N_MOUNT, cols[2])):
                m = self.CELL.fullmatch(text)
                if not m:
                    raise RuntimeError(f"{label}: not a time: {text!r}")
                med = float(m.group(1))
                lo, hi = (float(m.group(2)), float(m.group(3))) if m.group(2) else (med, med)
                yield log_result(Result(Table.N, work_system(row, where), N_RTT,
                                        n=runs if m.group(2) else 1, median=med, min=lo, max=hi,
                                        tree_files=files, crates=crate))


class Fleet(OncePerRun):
    """o. A fleet of agents on one machine (issue #47): bench/fleet.py,
    which creates N workspace mounts of a real tree (the cargo registry's
    crates until ~10,000 files; --quick: N_QUICK_FILES), has every agent read
    a ~3,000-file subtree, then run an edit -> grep -> checkpoint loop while
    a foreground reader reads in workspace 0; for N in O_SIZES (--quick:
    O_QUICK_SIZES). Local work on the embedded store: measured once per run
    and recorded at O_RTT. This parses the script's table, one Result per N."""

    SCRIPT = os.path.join(ROOT, "bench", "fleet.py")

    def once(self, h: Harness) -> Iterator[Result]:
        sizes = O_QUICK_SIZES if h.quick else O_SIZES
        args = [sys.executable, self.SCRIPT, h.mado, "--sizes", ",".join(map(str, sizes))]
        if h.quick:
            args += ["--files", str(N_QUICK_FILES), "--subtree", "300"]
        log(f"o: {' '.join(args[1:])}")
        h.quiet_start()
        limit = h.timeout * 4 * len(sizes)
        try:
            out = run_script(args, dict(os.environ, TMPDIR=h.work), limit,
                             [os.path.join(h.work, "mado-fleet.*", "m*-*")])
        except ScriptFailed as e:
            yield from self.parse(e.out)
            raise
        yield from self.parse(out)

    def parse(self, out: str) -> Iterator[Result]:
        files = re.search(r"^Tree: (\d+) files", out, re.M)
        files = int(files.group(1)) if files else None
        num = lambda x: float(x.split()[0])  # noqa: E731
        for line in out.splitlines():
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) != 13 or not cols[0].isdigit():
                continue
            n = int(cols[0])
            pss = [float(x) for x in cols[5].split("/")]
            p50 = [float(x) for x in cols[7].split("/")]
            p99 = [float(x) for x in cols[8].split("/")]
            local = [float(x) for x in cols[9].split("/")]
            yield log_result(Result(Table.O, o_system(n), O_RTT, n=1, median=num(cols[1]), min=num(cols[1]),
                                    max=num(cols[1]), agents=n, mem_idle_mib=num(cols[2]),
                                    mem_read_mib=num(cols[3]), private_mib=num(cols[4]), pss_idle_mib=pss[0],
                                    pss_read_mib=pss[1], cache_x=num(cols[6]),
                                    p50_alone_ms=p50[0], p50_ms=p50[1], p99_alone_ms=p99[0], p99_ms=p99[1],
                                    p99_local_alone_ms=local[0], p99_local_ms=local[1],
                                    ckpt_per_s=num(cols[11]), landed=int(cols[12].split()[0]),
                                    tree_files=files))


class Scale(OncePerRun):
    """p. A million files (issue #46): bench/scale.sh makes a synthetic
    monorepo of TOPS x 1,000 small files (P_TOPS; --quick: P_QUICK_TOPS)
    and times import, mount, a cold stat walk against the same over git's
    checkout, ws create, ws status and a 10-edit checkpoint, with each
    process's memory. Local work on the embedded store: once per run, at
    P_RTT. One Result per row and size (time in median, memory in
    rss_mib)."""

    SCRIPT = os.path.join(ROOT, "bench", "scale.sh")

    def once(self, h: Harness) -> Iterator[Result]:
        tops = P_QUICK_TOPS if h.quick else P_TOPS
        log(f"p: {os.path.relpath(self.SCRIPT, ROOT)} {h.mado} {' '.join(map(str, tops))}")
        h.quiet_start()
        limit = h.timeout * 2 * sum(max(1, t // 50) for t in tops)
        leftovers = [os.path.join(h.work, "mado-scale.*", "*", d) for d in ("mnt", "ws", "ws2")]
        try:
            out = run_script([self.SCRIPT, h.mado, *map(str, tops)], dict(os.environ, TMPDIR=h.work), limit, leftovers)
        except ScriptFailed as e:
            yield from self.parse(e.out)
            raise
        yield from self.parse(out)

    @staticmethod
    def parse(out: str) -> Iterator[Result]:
        for line in out.splitlines():
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) != 14 or not cols[0].isdigit():
                continue
            files = int(cols[0])
            for label, col, _ in P_ROWS:
                t = float(cols[col].split()[0])
                yield log_result(Result(Table.P, p_system(label, files), P_RTT, n=1, median=t, min=t, max=t,
                                        tree_files=files))
            for label, col in P_MEM_ROWS:
                text = cols[col]
                mib = float(text.split("(")[1].rstrip(")")) if col == 1 else float(text)
                yield log_result(Result(Table.P, p_system(label, files), P_RTT, n=1, rss_mib=mib, tree_files=files))
            label, col = P_UP_ROW
            yield log_result(Result(Table.P, p_system(label, files), P_RTT, n=1, up_bytes=int(cols[col]),
                                    tree_files=files))


def scenarios() -> Dict[str, Callable[[Harness, int], Iterator[Result]]]:
    """By the letter `--only` takes."""
    return {"a": materialize, "b": mount_walk, "c": Resume(), "d": import_pack_build, "e": warm_mount,
            "f": concurrency, "g": capped_cache, "h": Peers(), "i": Real(), "j": Large(), "k": Checkpoints(),
            "l": RealImport(), "m": VirtioFs(), "n": Work(), "o": Fleet(), "p": Scale()}
