"""The benchmark's machinery, shared by every scenario.

Owns the processes (MinIO, `git daemon`, the two latency proxies, the FUSE
peers' mounts) and their clean-up; the synthetic repositories and loading
them into the stores; mado's hermetic environment; and one timed cell:
cold runs with the page cache dropped, the proxy's counts (GETs, ranged
GETs, connections, bytes) reset around each, and their medians as a
`Result`. What the scenarios measure is in scenarios.py.
"""
import json, os, random, shutil, socket, statistics, subprocess, sys, tempfile, threading, time
from dataclasses import dataclass, fields
from typing import Any, Callable, List, Optional

from results import Counts, Layout, Result, Subtree, Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "mado-test"
WS = "ws"  # the workspace tree's store, beside the Layout ones


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def sh(*args, env=None, cwd=None):
    """Runs a command; exits with its stderr if it fails; returns stdout."""
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
class Sample:
    """What one timed run reports besides the proxy's counts."""
    wall: Optional[float] = None  # the run's own timing, when part of it must not count
    ttff: Optional[float] = None  # seconds to the first file's content
    build_ms: Optional[float] = None  # the import's pack build


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
            with open(p, "rb") as fh:
                data = fh.read()
            if ttff is None:
                ttff = time.perf_counter() - t0
            n += 1
            b += len(data)
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
    def __init__(self, quick: bool, runs: int, timeout: float, profile: str):
        self.quick, self.runs, self.timeout, self.profile = quick, runs, timeout, profile
        self.work = tempfile.mkdtemp(prefix="mado-bench-")
        self.procs = []

    # ---- setup ----

    def build(self):
        prof = self.profile
        args = ["cargo", "build", "-q", "-p", "mado", "-p", "mado-bench"] + (["--release"] if prof == "release" else [])
        log("building", prof)
        sh(*args, cwd=ROOT)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/mado-build/target"))
        d = os.path.join(target, prof)
        self.mado, self.proxy_bin = os.path.join(d, "mado"), os.path.join(d, "latency-proxy")

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
        genv = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b",
                    GIT_COMMITTER_EMAIL="b@b")
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

    def fresh_cache(self):
        d = os.path.join(self.work, "cache")
        shutil.rmtree(d, ignore_errors=True)
        return d

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

    def timed(self, proxy, setup, run, teardown, timeout):
        """One cold run: setup, settle, reset counts, run, count."""
        ctx = setup() if setup else None
        settle()
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
        runs = self.runs
        walls, counts, samples = [], [], []
        i = 0
        while i < runs:
            i += 1
            wall, c, r, err = self.timed(proxy, setup, run, teardown, self.timeout)
            if err:
                return log_result(Result(table, system, rtt, note=err, n=len(walls)))
            if i == 1 and not self.quick:
                # Slow cells (peers at high RTT) get fewer runs; the table
                # says how many.
                runs = min(runs, 2 if wall > 60 else 3 if wall > 15 else runs)
            walls.append(r.wall if r is not None and r.wall is not None else wall)
            counts.append(c)
            samples.append(r if r is not None else Sample())
        extra = extra_of(samples) if extra_of else {}
        return log_result(Result(table, system, rtt, n=len(walls), median=statistics.median(walls), min=min(walls),
                                 max=max(walls), counts=median_counts(counts), **extra))

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
