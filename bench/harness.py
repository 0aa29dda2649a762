"""The benchmark's machinery, shared by every scenario.

Owns the processes (MinIO, `git daemon`, the two latency proxies, the FUSE
peers' mounts) and their clean-up; the synthetic repositories and loading
them into the stores; mado's hermetic environment; and one timed cell:
cold runs with the page cache dropped, the proxy's counts (GETs, ranged
GETs, connections, bytes) reset around each, and their medians as a
`Result`. What the scenarios measure is in scenarios.py.
"""
import contextlib, glob, json, os, random, re, shutil, socket, statistics, subprocess, sys, tempfile, threading, time
from dataclasses import dataclass, fields
from typing import Any, Callable, List, Optional

from results import REAL_SUB, Counts, Layout, Result, Subtree, Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "mado-test"
WS = "ws"  # the workspace tree's store, beside the Layout ones
REAL = "real"  # scenario i's real tree's store (packs-first, as Layout.V2)
# Scenario i's subtree (full run): the Unix system-interface crates, a
# handful of whole crates (2,780 files of the selection on this machine).
SYS_CRATES = re.compile(r"(libc|linux-raw-sys|nix|rustix)-[0-9]")
GIT_ENV = dict(GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@b")


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def sh(*args, env=None, cwd=None):
    """Runs a command; exits with its stderr if it fails; returns stdout."""
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


def settle(drop=True):
    """Flush dirty pages and drop the page cache before a timed run, so one
    run's writeback does not land in the next one's time. `drop=False`
    only flushes (a warm run: scenario k's checkpoints)."""
    os.sync()
    if not drop:
        return
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass  # not root: flushing alone still removes most of the skew


def busy(seconds=0.5):
    """Over `seconds`: the machine's busy share of all its cores
    (/proc/stat), and the share of the time some task stalled on I/O
    (/proc/pressure/io; 0 where the kernel has no PSI)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        io = 0
        try:
            with open("/proc/pressure/io") as f:
                io = int(f.readline().split("total=")[1])  # "some" stall, microseconds
        except (OSError, IndexError, ValueError):
            pass
        return sum(v), v[3] + v[4], io  # total, idle + iowait, io stall
    t0, i0, s0 = sample()
    time.sleep(seconds)
    t1, i1, s1 = sample()
    return 1 - (i1 - i0) / max(1, t1 - t0), (s1 - s0) / (seconds * 1e6)


def wait_quiet(limit: float) -> bool:
    """Waits, up to `limit` seconds, until the machine is quiet (for half a
    second, under 10 % of its cores busy and under 5 % of the time stalled
    on I/O): for a run on a machine shared with builds and tests
    (MADO_BENCH_QUIET_S). False if it never was."""
    end = time.time() + limit
    while True:
        cpu, io = busy()
        if cpu < 0.10 and io < 0.05:
            return True
        if time.time() >= end:
            return False


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Proxy:
    """A latency-proxy process and its control port."""

    def __init__(self, binary, upstream, http):
        self.p = subprocess.Popen([binary, "--upstream", upstream] + (["--http"] if http else []),
                                  stdout=subprocess.PIPE, text=True)
        info = json.loads(self.p.stdout.readline())
        self.port, self.control = info["port"], info["control"]

    def cmd(self, c):
        with socket.create_connection(("127.0.0.1", self.control)) as s:
            s.sendall((c + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)

    def rtt(self, ms):
        self.cmd(f"rtt {ms}")

    def reset(self) -> Counts:
        """The counts since the last reset; starts counting afresh."""
        st = self.cmd("reset")
        methods = st.get("methods", {})
        return Counts(gets=methods.get("GET", 0), requests=st.get("requests", 0),
                      ranged=st.get("ranged_gets", 0), connections=st.get("connections", 0),
                      bytes_down=st.get("bytes_down", 0), puts=methods.get("PUT", 0),
                      heads=methods.get("HEAD", 0), bytes_up=st.get("bytes_up", 0))

    def stop(self):
        self.p.terminate()
        self.p.wait()


def median_counts(cs: List[Counts]) -> Counts:
    """Each count's median over the runs (None where a run has none)."""
    def med(name):
        col = [getattr(c, name) for c in cs]
        return None if None in col else int(statistics.median(col))
    return Counts(**{f.name: med(f.name) for f in fields(Counts)})


@dataclass(frozen=True)
class RealTree:
    """Scenario i's tree, built once: the repository (one commit, in the
    store `REAL`), the subtree and the whole tree as tars of exactly their
    committed files, their sizes, and the plain GET throughput."""
    repo: str
    crates: str  # which crates the whole tree holds, for the report
    sub_crates: str  # and the subtree
    sub_tar: str
    sub_files: int
    sub_bytes: int
    whole_tar: str
    whole_files: int
    whole_bytes: int
    get_mb_s: float  # one plain 64 MiB GET through the S3 proxy at RTT 0 (median of 5, cold)


def registry_crates():
    """(name, folder) of every crate source folder of this machine's cargo
    registry (~/.cargo/registry/src/*/), sorted by name; a name found under
    two indexes counts once (the first index in sorted order)."""
    home = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
    by_name = {}
    for idx in sorted(glob.glob(os.path.join(home, "registry", "src", "*"))):
        for name in sorted(os.listdir(idx)):
            p = os.path.join(idx, name)
            if os.path.isdir(p) and not os.path.islink(p):
                by_name.setdefault(name, p)
    return sorted(by_name.items())


def count_files(root):
    return sum(len(files) for _, _, files in os.walk(root))


@dataclass(frozen=True)
class Cell:
    """One cell to measure (`Harness.cells`): what `Harness.cell` takes."""
    table: Table
    system: str
    proxy: "Proxy"
    setup: Optional[Callable[[], Any]]
    run: Callable[[Any], Optional["Sample"]]
    teardown: Optional[Callable[[Any], Any]] = None
    extra_of: Optional[Callable[[List["Sample"]], dict]] = None
    drop_caches: bool = True  # False: the page cache stays warm (dirty pages are still flushed)


class _Acc:
    """A cell's runs so far; the first failure or overrun ends it (note)."""

    def __init__(self, runs: int):
        self.runs, self.walls, self.counts, self.samples, self.note = runs, [], [], [], None

    def more(self) -> bool:
        return self.note is None and len(self.walls) < self.runs


@dataclass(frozen=True)
class Sample:
    """What one timed run reports besides the proxy's counts."""
    wall: Optional[float] = None  # the run's own timing, when part of it must not count
    ttff: Optional[float] = None  # seconds to the first file's content
    build_ms: Optional[float] = None  # the import's pack build
    rss_mib: Optional[float] = None  # j: max RSS of the process measured (MiB)
    up_bytes: Optional[int] = None  # j: bytes up, as mado's --json counts them
    counts: Optional[Counts] = None  # j: mado's own request counts (--json), where no proxy sees them
    # k: from `ws checkpoint --json`, and what the run changed.
    round_trips: Optional[int] = None
    index_bytes: Optional[int] = None
    stat_bytes: Optional[int] = None
    files_read: Optional[int] = None
    changed: Optional[int] = None
    content_bytes: Optional[int] = None


def run_rss(argv, env=None, cwd=None):
    """Runs a command to the end; returns (seconds, its max RSS in MiB,
    stdout). The RSS is what mado reports under --verbose ("memory: peak
    N KiB resident", its VmHWM, counted from exec); for another command,
    wait4's ru_maxrss, which also counts this Python process's own peak
    when the child was spawned with vfork (so it is never below it).
    Raises RuntimeError with its stderr if it fails."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(map(str, argv))}: exit {p.returncode}: "
                               + err.read().decode(errors="replace").strip())
        out.seek(0)
        err.seek(0)
        peak = re.search(r"memory: peak (\d+) KiB resident", err.read().decode(errors="replace"))
        rss = int(peak.group(1)) / 1024 if peak else ru.ru_maxrss / 1024
        return wall, rss, out.read().decode(errors="replace")


def vm_hwm_mib(pid: int) -> Optional[float]:
    """A live process's peak resident set (VmHWM), MiB; None if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def parse_counts(text: str) -> List[int]:
    """`5000,20k` -> [5000, 20000] (k = 1000): scenario k's tree sizes."""
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        mult, digits = (1000, x[:-1]) if x.endswith("k") else (1, x)
        if not digits.isdigit() or int(digits) * mult < 100:
            raise ValueError(f"{x!r}: tree sizes are file counts of at least 100, like 5000 or 20k")
        out.append(int(digits) * mult)
    return out


def parse_sizes(text: str) -> List[int]:
    """`300M,1G` -> bytes (M = MiB, G = GiB)."""
    out = []
    for x in text.split(","):
        x = x.strip().upper()
        mult = {"M": 1 << 20, "G": 1 << 30}.get(x[-1:])
        if not mult or not x[:-1].isdigit() or int(x[:-1]) == 0:
            raise ValueError(f"{x!r}: sizes are like 300M or 1G")
        out.append(int(x[:-1]) * mult)
    return out


def read_file(path) -> int:
    """Reads the file at `path` whole, as `cat` does (open, read in 128 KiB
    pieces, close); returns its length. Not Python's `open()`: this
    machine's (3.11) asks every file it opens whether it is a terminal (an
    ioctl, TCGETS), which the local disk answers in the kernel but a FUSE
    filesystem must answer itself: one request more per file, 2,781 of a
    cold walk's 6,713 requests in scenario i's subtree (the kernel's
    `fuse:fuse_request_send` tracepoint). cat, grep, tar and compilers ask
    no such thing."""
    fd = os.open(path, os.O_RDONLY)
    try:
        n = 0
        while True:
            piece = os.read(fd, 128 << 10)
            if not piece:
                return n
            n += len(piece)
    finally:
        os.close(fd)


def walk_read(root):
    """Walks `root` in sorted order reading every file; returns (files,
    bytes, seconds to the first file's content)."""
    n, b, t0, ttff = 0, 0, time.perf_counter(), None
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            if os.path.islink(p):
                continue
            size = read_file(p)
            if ttff is None:
                ttff = time.perf_counter() - t0
            n += 1
            b += size
    return n, b, ttff


def wait_mounted(path, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.ismount(path):
            return True
        time.sleep(0.05)
    return False


def unmount(path):
    subprocess.run(["fusermount3", "-uz", path], capture_output=True)


def log_result(r: Result) -> Result:
    med, k = r.median, r.counts
    counts = ""
    if k and k.requests:  # the S3 proxy
        counts = f", {k.gets} GETs" + (f", {k.puts} PUTs" if k.puts else "")
    elif k and k.bytes_up:  # the git proxy counts no requests
        counts = f", {k.bytes_up / 1e6:.1f} MB up"
    log(f"{r.table.value:12} {r.system:22} rtt {r.rtt:>3}: "
        + (f"{med:.3f} s" if isinstance(med, float) else str(r.note or "-")) + counts)
    return r


class Harness:
    def __init__(self, quick: bool, runs: int, timeout: float, profile: str, large_sizes: Optional[List[int]] = None,
                 ck_sizes: Optional[List[int]] = None, import_sizes: Optional[List[int]] = None):
        self.quick, self.runs, self.timeout, self.profile = quick, runs, timeout, profile
        # Scenario j's file sizes (run.py --large-sizes).
        self.large_sizes = large_sizes or ([16 << 20, 48 << 20] if quick else [300 << 20, 1 << 30])
        # Scenario k's tree sizes in files (run.py --ck-sizes).
        self.ck_sizes = ck_sizes or ([300, 1200] if quick else [5000, 20000, 40000])
        # Scenario l's synthetic trees in files (run.py --import-sizes; none by default).
        self.import_sizes = import_sizes or []
        self.work = tempfile.mkdtemp(prefix="mado-bench-")
        self.procs = []
        # MADO_BENCH_QUIET_S: before each timed run, wait up to that many
        # seconds for the machine to be quiet (a machine shared with builds);
        # 0 only counts the runs that start on a busy one.
        q = os.environ.get("MADO_BENCH_QUIET_S")
        self.quiet = float(q) if q else None
        self.timed_runs = self.busy_runs = 0  # the latter started on a busy machine anyway

    # ---- setup ----

    def build(self):
        prof = self.profile
        args = ["cargo", "build", "-q", "-p", "mado", "-p", "mado-bench"] + (["--release"] if prof == "release" else [])
        # MADO_BENCH_TARGET_DIR: build into (and run from) a target folder of
        # the bench's own, e.g. to leave the default one to a build in progress.
        env = dict(os.environ)
        if os.environ.get("MADO_BENCH_TARGET_DIR"):
            env["CARGO_TARGET_DIR"] = os.environ["MADO_BENCH_TARGET_DIR"]
        log("building", prof)
        sh(*args, cwd=ROOT, env=env)
        target = env.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/mado-build/target"))
        d = os.path.join(target, prof)
        self.mado, self.proxy_bin = os.path.join(d, "mado"), os.path.join(d, "latency-proxy")

    @contextlib.contextmanager
    def store_on_own_core(self):
        """MinIO and the S3 proxy on the first CPU, this thread (and so every
        command and thread it starts) on the second: as when the store is
        another machine. Yields False (and pins nothing) with fewer than 2
        CPUs or without `taskset`."""
        cpus = os.sched_getaffinity(0)
        if len(cpus) < 2 or not shutil.which("taskset"):
            yield False
            return
        store_cpu, own_cpu = sorted(cpus)[:2]
        pids = [int(open(os.path.join(self.minio_state, "minio.pid")).read().strip()), self.s3proxy.p.pid]

        def pin(mask):
            for pid in pids:
                subprocess.run(["taskset", "-a", "-p", "-c", mask, str(pid)], capture_output=True, check=True)

        pin(str(store_cpu))
        os.sched_setaffinity(0, {own_cpu})
        try:
            yield True
        finally:
            os.sched_setaffinity(0, cpus)
            pin(",".join(str(c) for c in sorted(cpus)))

    def start_servers(self):
        st = os.path.join(self.work, "minio")
        os.makedirs(st)
        sh(os.path.join(ROOT, "scripts", "minio.sh"), "start", st)
        self.minio_state = st
        env = {}
        for line in open(os.path.join(st, "env")):
            k, v = line.replace("export ", "").strip().split("=", 1)
            env[k] = v
        self.s3 = env
        self.minio_addr = env["AWS_ENDPOINT_URL"].replace("http://", "")
        self.s3proxy = Proxy(self.proxy_bin, self.minio_addr, http=True)
        self.git_port = free_port()
        gitroot = os.path.join(self.work, "git")
        os.makedirs(gitroot, exist_ok=True)
        self.gitroot = gitroot
        # receive-pack too: scenario d pushes (anonymously, over git://) into
        # fresh bare repositories under gitroot.
        self.git_daemon = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack", f"--base-path={gitroot}",
             "--listen=127.0.0.1", f"--port={self.git_port}", gitroot], stderr=subprocess.DEVNULL)
        self.gitproxy = Proxy(self.proxy_bin, f"127.0.0.1:{self.git_port}", http=False)

    def git_url(self, name):
        """The git:// URL of gitroot/`name` through the git proxy."""
        return f"git://127.0.0.1:{self.gitproxy.port}/{name}"

    def set_rtt(self, ms):
        self.s3proxy.rtt(ms)
        self.gitproxy.rtt(ms)

    def gen_repo(self):
        """The synthetic tree: a dense subtree (one directory), a thin one
        (files spread over many small directories), a 300-file dense
        directory for the mount row, and filler around them."""
        q = self.quick
        repo = os.path.join(self.work, "repo")
        rnd = random.Random(7)

        def w(path, n):
            p = os.path.join(repo, path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(rnd.randbytes(n // 2) .hex().encode()[:n])

        nd = 200 if q else 1000
        for i in range(nd):
            w(f"{Subtree.DENSE.value}/f{i:04}.c", rnd.randint(1000, 12000))
        # Thin: 4 files per directory, two levels deep.
        for i in range(nd):
            w(f"{Subtree.THIN.value}/d{i // 40:02}/e{(i // 4) % 10}/f{i % 4}.txt", rnd.randint(200, 4000))
        for i in range(100 if q else 300):
            w(f"{Subtree.DENSE300.value}/f{i:03}.rs", rnd.randint(1000, 8000))
        for i in range(300 if q else 3000):
            w(f"other/g{i // 100:02}/h{i:04}.js", rnd.randint(500, 6000))
        self.subtree_files = {Subtree.DENSE: nd, Subtree.THIN: nd, Subtree.DENSE300: 100 if q else 300}
        genv = dict(os.environ, **GIT_ENV)
        sh("git", "init", "-q", "-b", "main", repo, env=genv)
        sh("git", "add", "-A", cwd=repo, env=genv)
        sh("git", "commit", "-qm", "synthetic", cwd=repo, env=genv)
        self.repo = repo
        # The workspace tree: 2000 x 1 KiB in 40 directories.
        ws = os.path.join(self.work, "wsrepo")
        nws = 400 if q else 2000
        for i in range(nws):
            p = os.path.join(ws, f"d{i % 40:02}", f"f{i:04}.txt")
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(rnd.randbytes(512).hex().encode())
        sh("git", "init", "-q", "-b", "main", ws, env=genv)
        sh("git", "add", "-A", cwd=ws, env=genv)
        sh("git", "commit", "-qm", "ws", cwd=ws, env=genv)
        self.wsrepo, self.ws_files = ws, nws
        # The git server's copy (partial clone needs allowFilter).
        bare = os.path.join(self.work, "git", "repo.git")
        sh("git", "clone", "-q", "--bare", repo, bare)
        sh("git", "-C", bare, "config", "uploadpack.allowFilter", "true")
        sh("git", "-C", bare, "config", "uploadpack.allowAnySHA1InWant", "true")

    def real_tree(self, rtt) -> RealTree:
        """Scenario i's tree, from the crate sources of this machine's cargo
        registry (no network): the crate folders in name order until there
        are 15,000 files (--quick: only crates of <= 30 files, until 300),
        the subtree's crates under `sub/`, the others under `vendor/`; one
        commit; imported packs-first into the store `REAL`; served by the
        git daemon as real.git. The subtree: the system-interface crates
        (libc, linux-raw-sys, nix, rustix) when they hold 2,000 to 3,500
        files, else crates from the middle of the selection until 2,500
        files (--quick: 100). Also measures the plain GET throughput, at
        RTT 0, then sets `rtt` back. Built once: scenarios i and l share it."""
        if getattr(self, "_real", None) is not None:
            return self._real
        q = self.quick
        crates = [(name, path, count_files(path)) for name, path in registry_crates()]
        if q:
            crates = [c for c in crates if c[2] <= 30]
        want, sub_want = (300, 100) if q else (15000, 2500)
        chosen, n = [], 0
        for c in crates:
            if n >= want:
                break
            chosen.append(c)
            n += c[2]
        if n < want:
            raise RuntimeError(f"the cargo registry has only {n} files in usable crates (want {want}): "
                               "run a cargo build first")
        sub = [c for c in chosen if SYS_CRATES.match(c[0])]
        if q or not 2000 <= sum(c[2] for c in sub) <= 3500:
            sub, k = [], 0
            for c in chosen[len(chosen) // 2:]:
                if k >= sub_want:
                    break
                sub.append(c)
                k += c[2]
        sub_names = {c[0] for c in sub}
        log(f"real tree: {len(chosen)} crates ({chosen[0][0]} to {chosen[-1][0]}), {n} files; subtree "
            f"{REAL_SUB}/: {len(sub)} crates ({', '.join(sorted(sub_names))})")
        repo = os.path.join(self.work, "realrepo")
        for name, path, _ in chosen:
            shutil.copytree(path, os.path.join(repo, REAL_SUB if name in sub_names else "vendor", name),
                            symlinks=True)
        genv = dict(os.environ, **GIT_ENV)
        sh("git", "init", "-q", "-b", "main", repo, env=genv)
        # -f: crates ship .gitignore files; every file copied is committed.
        sh("git", "add", "-A", "-f", cwd=repo, env=genv)
        sh("git", "commit", "-qm", "cargo registry crate sources", cwd=repo, env=genv)
        bare = os.path.join(self.gitroot, "real.git")
        sh("git", "clone", "-q", "--bare", repo, bare)
        sh("git", "-C", bare, "config", "uploadpack.allowFilter", "true")
        sh("git", "-C", bare, "config", "uploadpack.allowAnySHA1InWant", "true")
        # Packed, with a bitmap, as a git host serves it (the clone left the
        # objects loose: every clone would compress them all again).
        sh("git", "-C", bare, "repack", "-a", "-d", "-b", "-q")
        t0 = time.time()
        sh(self.mado, "import-git", repo, env=self.env(REAL, direct=True))
        log(f"real tree imported in {time.time() - t0:.1f} s")

        def tar_of(name, *paths):
            files = sh("git", "-C", repo, "ls-files", "-z", "--", *paths).split("\0")
            files = [f for f in files if f]
            lst = os.path.join(self.work, f"{name}.list")
            with open(lst, "w") as f:
                f.write("\0".join(files) + "\0")
            tar = os.path.join(self.shm(), f"{name}.tar")
            sh("tar", "-cf", tar, "-C", repo, "--null", "-T", lst)
            return tar, len(files), sum(os.lstat(os.path.join(repo, f)).st_size for f in files)

        sub_tar, sub_files, sub_bytes = tar_of("real-sub", REAL_SUB)
        whole_tar, whole_files, whole_bytes = tar_of("real-whole")
        self._real = RealTree(
            repo=repo, crates=f"{len(chosen)} crates, {chosen[0][0]} to {chosen[-1][0]} in name order",
            sub_crates=f"{len(sub)} crates: " + ", ".join(sorted(sub_names)), sub_tar=sub_tar, sub_files=sub_files,
            sub_bytes=sub_bytes, whole_tar=whole_tar, whole_files=whole_files, whole_bytes=whole_bytes,
            get_mb_s=self.get_throughput(rtt))
        return self._real

    def shm(self):
        """A folder on tmpfs (/dev/shm) for the floor's tars: dropping the
        page cache does not evict them, so the untar floor times creating
        the files, not reading the tar back from disk (the download is the
        floor's other term). The work folder where there is no /dev/shm."""
        if getattr(self, "_shm", None) is None:
            self._shm = tempfile.mkdtemp(prefix="mado-bench-", dir="/dev/shm") if os.path.isdir("/dev/shm") \
                else self.work
        return self._shm

    def get_throughput(self, rtt) -> float:
        """MB/s of one plain GET of a 64 MiB object through the S3 proxy at
        RTT 0 (curl, SigV4; its transfer time), cold (page cache dropped),
        the median of 5; puts the proxy back at `rtt`."""
        blob = os.path.join(self.work, "blob")
        size = 64 << 20
        with open(blob, "wb") as f:
            f.write(os.urandom(size))
        auth = self.s3_auth()
        key = f"{BUCKET}/bench-floor/blob"
        self.put_object(blob, key)
        os.remove(blob)
        self.s3proxy.rtt(0)
        rates = []
        try:
            for _ in range(5):
                settle()
                if self.quiet:
                    wait_quiet(self.quiet)
                out = sh("curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total}", *auth,
                         f"http://127.0.0.1:{self.s3proxy.port}/{key}").split()
                if out[0] != "200" or int(out[1]) != size:
                    raise RuntimeError(f"GET of the throughput object: HTTP {out[0]}, {out[1]} bytes")
                rates.append(size / float(out[2]) / 1e6)
        finally:
            self.s3proxy.rtt(rtt)
            self.s3proxy.reset()
        log(f"plain GET through the proxy at RTT 0: {', '.join(f'{r:.0f}' for r in rates)} MB/s")
        return statistics.median(rates)

    def s3_auth(self) -> List[str]:
        """curl's arguments to sign a request to MinIO (SigV4)."""
        return ["--aws-sigv4", f"aws:amz:{self.s3['AWS_REGION']}:s3", "-u",
                f"{self.s3['AWS_ACCESS_KEY_ID']}:{self.s3['AWS_SECRET_ACCESS_KEY']}"]

    def put_object(self, path, key):
        """PUTs a file as the plain object `key` (bucket/...), straight to MinIO."""
        code = sh("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *self.s3_auth(), "-T", path,
                  f"http://{self.minio_addr}/{key}")
        if code != "200":
            raise RuntimeError(f"PUT of {key}: HTTP {code}")

    def delete_object(self, key):
        subprocess.run(["curl", "-s", "-o", "/dev/null", "-X", "DELETE", *self.s3_auth(),
                        f"http://{self.minio_addr}/{key}"], capture_output=True)

    def get_object(self, key, size: int, ranges: int = 1) -> int:
        """GETs the plain object `key` (of `size` bytes) through the S3
        proxy, to /dev/null: one request, or `ranges` ranged requests of
        equal spans in parallel (a curl each, so each its own connection).
        Returns the bytes received."""
        url = f"http://127.0.0.1:{self.s3proxy.port}/{key}"
        fmt = ["-w", "%{http_code} %{size_download}"]
        step = -(-size // ranges)
        cmds = [["curl", "-s", "-o", "/dev/null", *fmt, *self.s3_auth(), url]] if ranges == 1 else \
            [["curl", "-s", "-o", "/dev/null", *fmt, "-r", f"{a}-{min(size, a + step) - 1}", *self.s3_auth(), url]
             for a in range(0, size, step)]
        ps = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in cmds]
        got = 0
        for p in ps:
            code, n = p.communicate()[0].split()
            if code not in ("200", "206"):
                raise RuntimeError(f"GET of {key}: HTTP {code}")
            got += int(n)
        return got

    def env(self, prefix, cache=None, direct=False):
        """A hermetic environment for mado on the store under `prefix` in
        the bucket, through the proxy unless `direct`."""
        home = os.path.join(self.work, "home")
        os.makedirs(home, exist_ok=True)
        e = dict(os.environ, HOME=home, MADO_REMOTE_ADDR=f"s3://{BUCKET}/{prefix}")
        e.update(self.s3)
        e["AWS_ENDPOINT_URL"] = f"http://{self.minio_addr}" if direct else f"http://127.0.0.1:{self.s3proxy.port}"
        e["MADO_CACHE_DIR"] = cache or os.path.join(self.work, "cache-setup")
        for k in ("XDG_CACHE_HOME", "MADO_DISK_CACHE_MAX_BYTES", "MADO_INJECT_RTT_MS"):
            e.pop(k, None)
        return e

    def env_local(self, store, cache):
        """A hermetic environment for mado on the embedded store (file://)
        in the folder `store`."""
        return dict(self.env("-", cache), MADO_REMOTE_ADDR=f"file://{os.path.abspath(store)}")

    def fresh_cache(self):
        d = os.path.join(self.work, "cache")
        self.discard(d)
        return d

    # Free space below which discard() deletes what it has set aside.
    TRASH_FLOOR = 6 << 30

    def discard(self, path):
        """Removes `path` (a directory or file) before a timed run writes
        there again, by renaming it into the work folder's trash, deleted
        at the end of the run (or when free space falls below TRASH_FLOOR).
        Deleting it here would bench the filesystem: an ext4 without a
        journal (this machine's root) will not reuse an inode freed less
        than a minute ago, and each new inode scans past every recently
        freed one in its group, from the start. 2,000 creates right after
        2,000 deletes took 0.22 s where they take 0.07 s (untar, measured
        in a loop); perf showed `recently_deleted` and the block lookups
        it makes as 60 % of a resume's samples. Every system in a table
        gets the same treatment."""
        if not os.path.lexists(path):
            return
        trash = os.path.join(self.work, "trash")
        os.makedirs(trash, exist_ok=True)
        self._trashed = getattr(self, "_trashed", 0) + 1
        os.rename(path, os.path.join(trash, str(self._trashed)))
        if shutil.disk_usage(trash).free < self.TRASH_FLOOR:
            log("low on disk space: deleting what earlier runs set aside")
            shutil.rmtree(trash, ignore_errors=True)

    def load_stores(self):
        log("importing into MinIO: unpacked, v1, v2, workspace tree; plain objects for rclone and s3fs")
        sh(self.mado, "import-git", self.repo, "--no-packs", env=self.env(Layout.UNPACKED.value, direct=True))
        sh(self.mado, "import-git", self.repo, "--no-packs", env=self.env(Layout.V1.value, direct=True))
        sh(self.mado, "pack", "--per-dir", env=self.env(Layout.V1.value, direct=True))
        sh(self.mado, "import-git", self.repo, env=self.env(Layout.V2.value, direct=True))
        sh(self.mado, "import-git", self.wsrepo, env=self.env(WS, direct=True))
        # Plain objects, one per file, for rclone and s3fs.
        self.rclone_env = dict(os.environ, RCLONE_CONFIG_MINIO_TYPE="s3", RCLONE_CONFIG_MINIO_PROVIDER="Minio",
                               RCLONE_CONFIG_MINIO_ACCESS_KEY_ID=self.s3["AWS_ACCESS_KEY_ID"],
                               RCLONE_CONFIG_MINIO_SECRET_ACCESS_KEY=self.s3["AWS_SECRET_ACCESS_KEY"],
                               RCLONE_CONFIG_MINIO_REGION=self.s3["AWS_REGION"],
                               RCLONE_CONFIG_MINIO_ENDPOINT=f"http://{self.minio_addr}")
        # Debian's rclone fails while AWS_CA_BUNDLE is set.
        self.rclone_env.pop("AWS_CA_BUNDLE", None)
        sh("rclone", "copy", "--exclude", ".git/**", self.repo, f"minio:{BUCKET}/plain", env=self.rclone_env)
        self.passwd = os.path.join(self.work, "s3fs-passwd")
        with open(self.passwd, "w") as f:
            f.write(f"{self.s3['AWS_ACCESS_KEY_ID']}:{self.s3['AWS_SECRET_ACCESS_KEY']}\n")
        os.chmod(self.passwd, 0o600)

    # ---- running ----

    def mado_run(self, env, *args):
        r = subprocess.run([self.mado, *args], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mado {' '.join(args)}: {r.stderr}")
        return r.stdout

    def quiet_start(self):
        """Just before a timed run, with MADO_BENCH_QUIET_S: waits for a
        quiet machine, and counts the run (and whether it started on a busy
        one anyway) for the report's notes."""
        if self.quiet is None:
            return
        self.timed_runs += 1
        if not wait_quiet(self.quiet):
            self.busy_runs += 1
            if self.quiet:
                log(f"machine still busy after {self.quiet:.0f} s: running anyway")

    def timed(self, proxy, setup, run, teardown, timeout, drop_caches=True):
        """One cold run: setup, settle, reset counts, run, count
        (`drop_caches=False`: the page cache is only flushed, not dropped)."""
        ctx = setup() if setup else None
        settle(drop_caches)
        self.quiet_start()
        proxy.reset()
        t0 = time.perf_counter()
        out = {}
        err = None
        def body():
            try:
                out["r"] = run(ctx)
            except BaseException as e:  # noqa: B036 (sh() exits with SystemExit)
                out["e"] = f"failed: {str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}"

        th = threading.Thread(target=body, daemon=True)
        th.start()
        th.join(timeout)
        wall = time.perf_counter() - t0
        if th.is_alive():
            err = f"> {timeout:.0f} s (stopped)"
        elif "e" in out:
            err = out["e"]
        counts = proxy.reset()
        if teardown:
            teardown(ctx)
        if th.is_alive():
            th.join(30)
        return wall, counts, out.get("r"), err

    def cell(self, table: Table, system: str, rtt: int, proxy: Proxy, setup: Optional[Callable[[], Any]],
             run: Callable[[Any], Optional[Sample]], teardown: Optional[Callable[[Any], Any]] = None,
             extra_of: Optional[Callable[[List[Sample]], dict]] = None) -> Result:
        """Cold runs of `run` (setup and teardown untimed) for one cell;
        `extra_of` gives the cell's extra Result fields from the samples.
        The first failure or overrun ends the cell with a note."""
        return self.cells(rtt, [Cell(table, system, proxy, setup, run, teardown, extra_of)])[0]

    def cells(self, rtt: int, specs: List["Cell"]) -> List[Result]:
        """Cold runs of several cells, interleaved: one run of each in turn,
        round after round, so that cells compared with each other share
        the machine's conditions (on a machine shared with builds, a slow
        minute then slows one run of each, not every run of one). Each
        cell as `cell` measures it; the Results in the order of `specs`."""
        accs = [_Acc(self.runs) for _ in specs]
        while any(a.more() for a in accs):
            for spec, a in zip(specs, accs):
                if not a.more():
                    continue
                wall, c, r, err = self.timed(spec.proxy, spec.setup, spec.run, spec.teardown, self.timeout,
                                             spec.drop_caches)
                if err:
                    a.note = err
                    continue
                if not a.walls and not self.quick:
                    # Slow cells (peers at high RTT) get fewer runs; the table
                    # says how many.
                    a.runs = min(a.runs, 2 if wall > 60 else 3 if wall > 15 else a.runs)
                a.walls.append(r.wall if r is not None and r.wall is not None else wall)
                a.counts.append(c)
                a.samples.append(r if r is not None else Sample())
        out = []
        for spec, a in zip(specs, accs):
            if a.note:
                out.append(log_result(Result(spec.table, spec.system, rtt, note=a.note, n=len(a.walls))))
                continue
            extra = spec.extra_of(a.samples) if spec.extra_of else {}
            out.append(log_result(Result(spec.table, spec.system, rtt, n=len(a.walls),
                                         median=statistics.median(a.walls), min=min(a.walls), max=max(a.walls),
                                         counts=median_counts(a.counts), **extra)))
        return out

    # ---- the FUSE peers ----

    def rclone_mount(self):
        mnt = os.path.join(self.work, "peer-mnt")
        cache = os.path.join(self.work, "rclone-cache")
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(mnt, exist_ok=True)
        env = dict(self.rclone_env, RCLONE_CONFIG_MINIO_ENDPOINT=f"http://127.0.0.1:{self.s3proxy.port}")
        p = subprocess.Popen(["rclone", "mount", f"minio:{BUCKET}/plain", mnt, "--vfs-cache-mode", "full",
                              "--cache-dir", cache, "--read-only"], env=env, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        if not wait_mounted(mnt):
            raise RuntimeError("rclone mount did not come up")
        return mnt

    def s3fs_mount(self):
        mnt = os.path.join(self.work, "peer-mnt")
        os.makedirs(mnt, exist_ok=True)
        sh("s3fs", f"{BUCKET}:/plain", mnt, "-o", f"url=http://127.0.0.1:{self.s3proxy.port}", "-o",
           "use_path_request_style", "-o", f"passwd_file={self.passwd}", "-o", "ro", "-o",
           f"endpoint={self.s3['AWS_REGION']}")
        if not wait_mounted(mnt):
            raise RuntimeError("s3fs did not come up")
        return mnt

    def fuse_teardown(self, mnt):
        if mnt:
            unmount(mnt)
        for p in self.procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []

    # ---- the end ----

    def close(self):
        """Stops whatever is still running and removes the work folder;
        safe after a setup that failed part way."""
        self.fuse_teardown(None)
        for m in ("mnt", "peer-mnt"):
            unmount(os.path.join(self.work, m))
        for p in (getattr(self, "s3proxy", None), getattr(self, "gitproxy", None)):
            if p:
                p.stop()
        if getattr(self, "git_daemon", None):
            self.git_daemon.terminate()
        if getattr(self, "minio_state", None):
            subprocess.run([os.path.join(ROOT, "scripts", "minio.sh"), "stop", self.minio_state], capture_output=True)
        shutil.rmtree(self.work, ignore_errors=True)
        if getattr(self, "_shm", None):
            shutil.rmtree(self._shm, ignore_errors=True)
