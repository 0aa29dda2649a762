#!/usr/bin/env python3
"""mado's benchmark harness (`make bench`): every scenario of the benchmark
issue, mado and its peers side by side, on one MinIO behind a latency and
counting proxy on loopback, at each RTT. Writes docs/BENCHMARKS.md and
PNG plots under docs/.

    bench/run.py [--quick] [--runs N] [--rtts 0,20,50] [--out docs/BENCHMARKS.md]
                 [--profile release|debug] [--only a,b,...]

The proxy (`latency-proxy`, crates/bench) delays each direction of every
connection by RTT/2 and a new connection by one more RTT (the handshake);
it counts connections, requests by method, ranged GETs and bytes. MinIO
sits behind one proxy (mado, rclone, s3fs); `git daemon` behind another
(git). Each timed run is cold: a fresh mado cache (or a fresh clone, a
fresh rclone cache, a new s3fs mount) and a dropped page cache.

`--quick` uses a small synthetic tree, one run and RTT 0 and 20 ms, and
finishes in a few minutes: the test suite runs it as a smoke test.
"""
import argparse, datetime, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, settle, sh  # noqa: E402

BUCKET = "mado-test"
# Seed 003's figures (BRIEF.md's table), by scenario key and RTT.
SEED = {
    ("a-dense", 20): "2 GETs, 1.4 s",
    ("a-thin", 20): "2 GETs, 10.4 s",
    ("b-dense300", 50): "1 GET, 283 ms",
    ("ttff", 50): "83 ms",
    ("c", 0): "2.1 s", ("c", 20): "5.3 s", ("c", 50): "9.7 s",
    ("d", None): "0.15 s",
    ("f-fg", 50): "p99 1.30-1.39x",
    ("g", None): "0.5 W GETs",
}
GOAL = {
    ("a-dense", 20): "<= 2 GETs, <= 0.3 s",
    ("a-thin", 20): "<= 3 GETs, <= 1 s",
    ("b-dense300", 50): "1 GET, <= 150 ms",
    ("ttff", 50): "<= 60 ms",
    ("c", 0): "<= 0.3 s", ("c", 20): "<= 0.4 s", ("c", 50): "<= 0.5 s",
    ("d", None): "<= 0.1 s",
    ("f-fg", 50): "<= 1.2x",
    ("g", None): "clearly fewer than 0.5 W",
}


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


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

    def reset(self):
        return self.cmd("reset")

    def stop(self):
        self.p.terminate()
        self.p.wait()


def gets_of(st):
    return st.get("methods", {}).get("GET", 0)


def stats_row(walls, st_list, extra=None):
    """median/min/max of wall times plus the median counts."""
    row = {
        "n": len(walls),
        "median": statistics.median(walls) if walls else None,
        "min": min(walls) if walls else None,
        "max": max(walls) if walls else None,
    }
    if st_list:
        row["gets"] = int(statistics.median(gets_of(s) for s in st_list))
        row["requests"] = int(statistics.median(s.get("requests", 0) for s in st_list))
        row["ranged"] = int(statistics.median(s.get("ranged_gets", 0) for s in st_list))
        row["connections"] = int(statistics.median(s.get("connections", 0) for s in st_list))
        row["bytes_down"] = int(statistics.median(s.get("bytes_down", 0) for s in st_list))
    if extra:
        row.update(extra)
    return row


def walk_read(root, first=None):
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


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = tempfile.mkdtemp(prefix="mado-bench-")
        self.results = {}  # key -> {system -> {rtt -> row}}
        self.notes = []
        self.procs = []

    # ---- setup ----

    def build(self):
        prof = self.a.profile
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
        self.git_daemon = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--export-all", f"--base-path={gitroot}", "--listen=127.0.0.1",
             f"--port={self.git_port}", gitroot], stderr=subprocess.DEVNULL)
        self.gitproxy = Proxy(self.proxy_bin, f"127.0.0.1:{self.git_port}", http=False)

    def stop_servers(self):
        for p in (getattr(self, "s3proxy", None), getattr(self, "gitproxy", None)):
            if p:
                p.stop()
        if getattr(self, "git_daemon", None):
            self.git_daemon.terminate()
        if getattr(self, "minio_state", None):
            subprocess.run([os.path.join(ROOT, "scripts", "minio.sh"), "stop", self.minio_state], capture_output=True)

    def gen_repo(self):
        """The synthetic tree: a dense subtree (one directory), a thin one
        (files spread over many small directories), a 300-file dense
        directory for the mount row, and filler around them."""
        q = self.a.quick
        repo = os.path.join(self.work, "repo")
        rnd = __import__("random").Random(7)

        def w(path, n):
            p = os.path.join(repo, path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(rnd.randbytes(n // 2) .hex().encode()[:n])

        nd = 200 if q else 1000
        for i in range(nd):
            w(f"dense/f{i:04}.c", rnd.randint(1000, 12000))
        # Thin: 4 files per directory, two levels deep.
        for i in range(nd):
            w(f"thin/d{i // 40:02}/e{(i // 4) % 10}/f{i % 4}.txt", rnd.randint(200, 4000))
        for i in range(100 if q else 300):
            w(f"dense300/f{i:03}.rs", rnd.randint(1000, 8000))
        for i in range(300 if q else 3000):
            w(f"other/g{i // 100:02}/h{i:04}.js", rnd.randint(500, 6000))
        self.subtree_files = {"dense": nd, "thin": nd, "dense300": 100 if q else 300}
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

    def env(self, mode, cache=None, direct=False):
        """A hermetic environment for mado on store `mode`, through the proxy."""
        home = os.path.join(self.work, "home")
        os.makedirs(home, exist_ok=True)
        e = dict(os.environ, HOME=home, MADO_REMOTE_ADDR=f"s3://{BUCKET}/{mode}")
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
        sh(self.mado, "import-git", self.repo, "--no-packs", env=self.env("unpacked", direct=True))
        sh(self.mado, "import-git", self.repo, "--no-packs", env=self.env("v1", direct=True))
        sh(self.mado, "pack", "--per-dir", env=self.env("v1", direct=True))
        sh(self.mado, "import-git", self.repo, env=self.env("v2", direct=True))
        sh(self.mado, "import-git", self.wsrepo, env=self.env("ws", direct=True))
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

    def record(self, key, system, rtt, row):
        self.results.setdefault(key, {}).setdefault(system, {})[rtt] = row
        med = row.get("median")
        log(f"{key:12} {system:22} rtt {rtt:>3}: "
            + (f"{med:.3f} s" if isinstance(med, float) else str(row.get("note", "-")))
            + (f", {row['gets']} GETs" if "gets" in row else ""))

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
        st = proxy.reset()
        if teardown:
            teardown(ctx)
        if th.is_alive():
            th.join(30)
        return wall, st, out.get("r"), err

    def cell(self, key, system, rtt, proxy, setup, run, teardown=None, runs=None, extra_of=None):
        runs = runs or self.a.runs
        walls, sts, extras = [], [], []
        i = 0
        while i < runs:
            i += 1
            wall, st, r, err = self.timed(proxy, setup, run, teardown, self.a.timeout)
            if err:
                self.record(key, system, rtt, {"note": err, "n": len(walls)})
                return False
            if i == 1 and not self.a.quick:
                # Slow cells (peers at high RTT) get fewer runs; the table
                # says how many.
                runs = min(runs, 2 if wall > 60 else 3 if wall > 15 else runs)
            walls.append(r.get("wall", wall) if isinstance(r, dict) else wall)
            sts.append(st)
            extras.append(r if isinstance(r, dict) else {})
        extra = extra_of(extras) if extra_of else None
        self.record(key, system, rtt, stats_row(walls, sts, extra))
        return True

    def mado_run(self, env, *args):
        r = subprocess.run([self.mado, *args], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mado {' '.join(args)}: {r.stderr}")
        return r.stdout

    # a. cold walk-and-read without the mount (`mado materialize`).
    def scenario_a(self, rtt):
        for sub in ("dense", "thin"):
            for mode in ("unpacked", "v1", "v2"):
                def run(cache, mode=mode, sub=sub):
                    self.mado_run(self.env(mode, cache), "materialize", sub)
                # Emptying the cache is setup, outside the timed part.
                self.cell(f"a-{sub}", f"mado {mode}", rtt, self.s3proxy, self.fresh_cache, run)

    # b. the same through the mount; time to first file.
    def scenario_b(self, rtt):
        for sub in ("dense", "thin", "dense300"):
            for mode in ("unpacked", "v1", "v2"):
                mnt = os.path.join(self.work, "mnt")

                def setup(mode=mode, mnt=mnt):
                    os.makedirs(mnt, exist_ok=True)
                    self.mado_run(self.env(mode, self.fresh_cache()), "mount", "main", mnt)
                    return mnt

                def run(m, sub=sub):
                    t0 = time.perf_counter()
                    n, b, ttff = walk_read(os.path.join(m, sub))
                    return {"wall": time.perf_counter() - t0, "ttff": ttff, "files": n}

                def teardown(m, mode=mode):
                    subprocess.run([self.mado, "umount", m], env=self.env(mode), capture_output=True)

                self.cell(f"b-{sub}", f"mado mount {mode}", rtt, self.s3proxy, setup, run, teardown,
                          extra_of=lambda xs: {"ttff": statistics.median(x["ttff"] for x in xs)})

    # h. the peers on the same subtrees.
    def scenario_h(self, rtt):
        url = f"git://127.0.0.1:{self.gitproxy.port}/repo.git"
        for sub in ("dense", "thin"):
            dst = os.path.join(self.work, "clone")

            def clean():
                shutil.rmtree(dst, ignore_errors=True)

            def sparse(_, sub=sub):
                sh("git", "clone", "-q", "--depth", "1", "--filter=blob:none", "--sparse", url, dst)
                sh("git", "-C", dst, "sparse-checkout", "set", sub)
                n, b, _ = walk_read(os.path.join(dst, sub))
                return {"files": n}

            self.cell(f"h-{sub}", "git sparse partial", rtt, self.gitproxy, clean, sparse, lambda _: clean())

            def full(_, sub=sub):
                sh("git", "clone", "-q", "--depth", "1", url, dst)
                walk_read(os.path.join(dst, sub))

            self.cell(f"h-{sub}", "git clone --depth 1", rtt, self.gitproxy, clean, full, lambda _: clean())

            # The FUSE peers; one that overran the time limit is not run
            # again at a higher RTT.
            for system, setup in (("rclone mount", self.rclone_setup), ("s3fs", self.s3fs_setup)):
                if self.skip.get((system, sub)):
                    self.record(f"h-{sub}", system, rtt, {"note": self.skip[(system, sub)]})
                    continue
                ok = self.cell(f"h-{sub}", system, rtt, self.s3proxy, setup,
                               lambda m, sub=sub: {"files": walk_read(os.path.join(m, sub))[0]}, self.fuse_teardown)
                if not ok:
                    self.skip[(system, sub)] = "not run: slower than the time limit at a lower RTT"

    def rclone_setup(self):
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

    def s3fs_setup(self):
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

    # c. resume of a 2000 x 1 KiB workspace.
    def scenario_c(self, rtt):
        if not getattr(self, "ws_ready", False):
            d0 = os.path.join(self.work, "ws0")
            self.mado_run(self.env("ws", direct=True), "ws", "create", "bench", "--dir", d0)
            # Free the lease, so each timed resume takes it (and pays for it).
            self.mado_run(self.env("ws", direct=True), "ws", "release", "--dir", d0)
            self.ws_ready = True
        dst = os.path.join(self.work, "resumed")

        def setup():
            shutil.rmtree(dst, ignore_errors=True)
            return self.fresh_cache()

        def run(cache):
            self.mado_run(self.env("ws", cache), "ws", "resume", "bench", dst)

        def teardown(cache):
            # Untimed: give the lease back for the next run.
            self.mado_run(self.env("ws", cache), "ws", "release", "--dir", dst)

        self.cell("c", "mado ws resume", rtt, self.s3proxy, setup, run, teardown)

    # d. import-time pack build of the 2000-file tree.
    def scenario_d(self, rtt):
        k = [0]

        def run(cache):
            k[0] += 1
            out = self.mado_run(self.env(f"imp-{rtt}-{k[0]}", cache), "import-git", self.wsrepo, "--json")
            rep = json.loads(out)
            return {"build_ms": sum(p.get("build_ms", 0) for p in rep.get("packs", []))}

        self.cell("d", "mado import-git", rtt, self.s3proxy, self.fresh_cache, run,
                  extra_of=lambda xs: {"build_ms": statistics.median(x["build_ms"] for x in xs)})

    # e. warm walk-and-read through the mount against the local disk.
    def scenario_e(self, rtt):
        mnt = os.path.join(self.work, "mnt")
        os.makedirs(mnt, exist_ok=True)
        env = self.env("v2", self.fresh_cache())
        self.mado_run(env, "mount", "main", mnt)
        try:
            walk_read(os.path.join(mnt, "dense"))  # warm it
            for system, root in (("mado mount (warm)", mnt), ("local disk", self.repo)):
                def run(_, root=root):
                    t0 = time.perf_counter()
                    walk_read(os.path.join(root, "dense"))
                    return {"wall": time.perf_counter() - t0}
                self.cell("e", system, rtt, self.s3proxy, None, run)
        finally:
            subprocess.run([self.mado, "umount", mnt], env=env, capture_output=True)

    # f. concurrent readers; a foreground reader under background writers.
    def scenario_f(self, rtt):
        files = sorted(os.listdir(os.path.join(self.repo, "dense")))
        mnt = os.path.join(self.work, "mnt")
        os.makedirs(mnt, exist_ok=True)
        for readers in (1, 2, 4, 8):
            def setup():
                self.mado_run(self.env("v2", self.fresh_cache()), "mount", "main", mnt)
                return mnt

            def run(m, readers=readers):
                # Reader i reads 60 % of the files starting at its own offset:
                # every file is read by several readers.
                span = int(len(files) * 0.6)

                def reader(i):
                    start = i * len(files) // 8
                    for j in range(span):
                        with open(os.path.join(m, "dense", files[(start + j) % len(files)]), "rb") as f:
                            f.read()
                ts = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
                t0 = time.perf_counter()
                [t.start() for t in ts]
                [t.join() for t in ts]
                return {"wall": time.perf_counter() - t0}

            self.cell("f-readers", f"{readers} readers", rtt, self.s3proxy, setup, run,
                      lambda m: subprocess.run([self.mado, "umount", m], capture_output=True, env=self.env("v2")))
        for agents in ((0, 2) if self.a.quick else (0, 2, 4, 8)):
            self.foreground(rtt, agents, files, mnt)

    def foreground(self, rtt, agents, files, mnt):
        """Per-file read latency of a foreground reader through a cold
        mount while `agents` workspaces write and checkpoint in a loop."""
        stop = threading.Event()
        dirs = []
        for i in range(agents):
            d = os.path.join(self.work, f"agent-{rtt}-{i}")
            if not os.path.exists(d):
                self.mado_run(self.env("ws", direct=False), "ws", "create", f"agent-{rtt}-{i}", "--dir", d)
            dirs.append(d)

        def agent(d):
            k = 0
            while not stop.is_set():
                for j in range(20):
                    with open(os.path.join(d, f"out{j}.txt"), "w") as f:
                        f.write(f"{k} {j}\n" * 50)
                subprocess.run([self.mado, "ws", "checkpoint", "--dir", d], env=self.env("ws", d + "-cache"),
                               capture_output=True)
                k += 1

        lat = []

        def setup():
            self.mado_run(self.env("v2", self.fresh_cache()), "mount", "main", mnt)
            ts = [threading.Thread(target=agent, args=(d,), daemon=True) for d in dirs]
            [t.start() for t in ts]
            time.sleep(0.5 if agents else 0)
            return (mnt, ts)

        def run(ctx):
            m, _ = ctx
            t0 = time.perf_counter()
            for name in files:
                s = time.perf_counter()
                with open(os.path.join(m, "dense", name), "rb") as f:
                    f.read()
                lat.append(time.perf_counter() - s)
            return {"wall": time.perf_counter() - t0}

        def teardown(ctx):
            m, ts = ctx
            stop.set()
            [t.join(60) for t in ts]
            subprocess.run([self.mado, "umount", m], capture_output=True, env=self.env("v2"))

        self.cell("f-fg", f"{agents} writers", rtt, self.s3proxy, setup, run, teardown)
        row = self.results["f-fg"][f"{agents} writers"][rtt]
        if lat:
            lat.sort()
            row["p50_ms"] = lat[len(lat) // 2] * 1000
            row["p99_ms"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000

    # g. the cache capped at half the working set: GETs on the second pass.
    def scenario_g(self, rtt):
        dense = os.path.join(self.repo, "dense")
        total = sum(os.path.getsize(os.path.join(dense, f)) for f in os.listdir(dense))
        for mode in ("unpacked", "v2"):
            cache = os.path.join(self.work, "capped")

            def setup():
                shutil.rmtree(cache, ignore_errors=True)
                e = dict(self.env(mode, cache), MADO_DISK_CACHE_MAX_BYTES=str(total // 2))
                self.mado_run(e, "materialize", "dense")  # first pass, not timed
                return e

            def run(e):
                self.mado_run(e, "materialize", "dense")

            self.cell("g", f"mado {mode}", rtt, self.s3proxy, setup, run,
                      extra_of=lambda xs: {"working_set": self.subtree_files["dense"]})

    # ---- report ----

    def fmt_t(self, row):
        if not row:
            return "–"
        if row.get("median") is None:
            return row.get("note", "–")
        m = row["median"]
        s = f"{m:.3f} s" if m >= 0.1 else f"{m * 1000:.1f} ms"
        if row["n"] > 1:
            s += f" ({row['min']:.3f}–{row['max']:.3f})"
        return s

    def table(self, key, title, extra_cols=(), seed_key=None):
        res = self.results.get(key)
        out = [f"### {title}", ""]
        if not res:
            out += ["not yet measured in this run", ""]
            return out
        rtts = self.rtts
        cols = ["system"] + [f"RTT {r} ms" for r in rtts] + [f"{c} @ {rtts[-1]} ms" for c, _ in extra_cols]
        out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        sk = seed_key or key
        seeds = [f"{SEED[(sk, r)]} (goal {GOAL.get((sk, r), '–')})" if (sk, r) in SEED else "–" for r in rtts]
        if any(s != "–" for s in seeds):
            out.append("| " + " | ".join(["seed 003"] + seeds + ["–"] * len(extra_cols)) + " |")
        for system, by_rtt in res.items():
            cells = []
            for r in rtts:
                row = by_rtt.get(r)
                c = self.fmt_t(row)
                if row and "gets" in row:
                    c += f"; {row['gets']} GET" + (f" ({row['ranged']} ranged)" if row.get("ranged") else "")
                    if key.startswith("h-") or key.startswith("a-") or key.startswith("b-"):
                        c += f", {row['bytes_down'] / 1e6:.1f} MB, {row['connections']} conn"
                cells.append(c)
            last = by_rtt.get(rtts[-1]) or {}
            ex = [f(last) for _, f in extra_cols]
            out.append("| " + " | ".join([system] + cells + ex) + " |")
        out.append("")
        # Ratio to the best peer, when there are peers.
        return out

    def get(self, key, system, rtt):
        return (self.results.get(key, {}).get(system, {}).get(rtt)) or {}

    def summary(self):
        """The brief's table: seed, goal and mado's figure from this run."""
        def t(row):
            return self.fmt_t(row).split(" (")[0] if row else "–"

        def g(row):
            return f"{row['gets']} GET" if "gets" in row else ""

        hi = self.rtts[-1]
        rows = []
        for sub, label in (("dense", "dense"), ("thin", "thin (many small dirs)")):
            at = 20 if 20 in self.rtts else hi
            r = self.get(f"a-{sub}", "mado v2", at)
            b = self.get(f"b-{sub}", "mado mount v2", at)
            rows.append((f"{self.subtree_files[sub]}-file {label} subtree, cold walk, RTT {at} ms",
                         SEED.get((f"a-{sub}", 20), "–"), GOAL.get((f"a-{sub}", 20), "–"),
                         f"materialize {t(r)}, {g(r)}; mount {t(b)}, {g(b)}"))
        r = self.get("b-dense300", "mado mount v2", hi)
        rows.append((f"{self.subtree_files['dense300']}-file dense walk through the mount, RTT {hi} ms",
                     SEED[("b-dense300", 50)], GOAL[("b-dense300", 50)], f"{t(r)}, {g(r)}"))
        ttffs = [self.get(f"b-{s}", "mado mount v2", hi).get("ttff") for s in ("dense", "thin", "dense300")]
        ttffs = [x for x in ttffs if x]
        rows.append((f"time to first file of a pack, RTT {hi} ms", SEED[("ttff", 50)], GOAL[("ttff", 50)],
                     " / ".join(f"{x * 1000:.1f} ms" for x in ttffs) + " (dense / thin / dense300)" if ttffs else "–"))
        rows.append((f"resume {self.ws_files} × 1 KiB, RTT " + " / ".join(map(str, self.rtts)) + " ms",
                     " / ".join(SEED.get(("c", r), "–") for r in self.rtts),
                     " / ".join(GOAL.get(("c", r), "–") for r in self.rtts),
                     " / ".join(t(self.get("c", "mado ws resume", r)) for r in self.rtts)))
        d = self.get("d", "mado import-git", self.rtts[0])
        rows.append((f"import-time pack build, {self.ws_files}-file tree", SEED[("d", None)], GOAL[("d", None)],
                     f"{d.get('build_ms', 0):.0f} ms build (whole import {t(d)} at RTT {self.rtts[0]})" if d else "–"))
        fg = self.results.get("f-fg", {})
        most = [k for k in fg if k != "0 writers"]
        base = self.get("f-fg", "0 writers", hi).get("p99_ms")
        if base and most:
            top = most[-1]
            p = self.get("f-fg", top, hi).get("p99_ms", 0)
            rows.append((f"foreground read p99 under {top}, RTT {hi} ms", SEED[("f-fg", 50)], GOAL[("f-fg", 50)],
                         f"{p / base:.2f}× ({p:.1f} ms against {base:.1f} ms)"))
        for mode in ("unpacked", "v2"):
            r = self.get("g", f"mado {mode}", hi)
            if r:
                rows.append((f"cache capped at half the working set, second pass ({mode}), RTT {hi} ms",
                             SEED[("g", None)], GOAL[("g", None)],
                             f"{r.get('gets', '–')} GETs for W = {r.get('working_set')} files"))
        out = ["## Summary against the brief", "",
               "| case | seed 003 | goal | mado in this run |", "|---|---|---|---|"]
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
        return out + [""]

    def ratios(self, sub):
        """mado v2 (mount and materialize) against the best peer, per RTT."""
        lines = []
        peers = self.results.get(f"h-{sub}", {})
        for r in self.rtts:
            best = None
            for system, by in peers.items():
                row = by.get(r)
                if row and row.get("median") is not None and (best is None or row["median"] < best[1]):
                    best = (system, row["median"])
            mine = (self.results.get(f"a-{sub}", {}).get("mado v2", {}).get(r) or {}).get("median")
            mount = (self.results.get(f"b-{sub}", {}).get("mado mount v2", {}).get(r) or {}).get("median")
            if best and mine:
                lines.append(f"| {sub} | {r} | {best[0]}: {best[1]:.3f} s | materialize {mine:.3f} s "
                             f"(**{best[1] / mine:.1f}×** faster) | mount walk "
                             + (f"{mount:.3f} s (**{best[1] / mount:.1f}×**)" if mount else "–") + " |")
        return lines

    def plots(self, outdir):
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            self.notes.append("matplotlib is missing: no plots (scripts/ensure-deps.sh --bench installs it)")
            return []
        made = []
        for key, res in self.results.items():
            fig, ax = plt.subplots(figsize=(6, 4))
            any_line = False
            for system, by in res.items():
                pts = [(r, by[r]["median"]) for r in self.rtts if by.get(r) and by[r].get("median") is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
                    any_line = True
            if not any_line:
                plt.close(fig)
                continue
            ax.set_xlabel("RTT (ms)")
            ax.set_ylabel("wall time (s, median)")
            ax.set_yscale("log")
            ax.set_title(key)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            name = f"bench-{key}.png"
            fig.tight_layout()
            fig.savefig(os.path.join(outdir, name), dpi=90)
            plt.close(fig)
            made.append(name)
        return made

    def report(self, path, elapsed):
        outdir = os.path.dirname(os.path.abspath(path))
        os.makedirs(outdir, exist_ok=True)
        pngs = self.plots(outdir)
        # The run's own date (kept in the results, so --report-only keeps it).
        now = getattr(self, "measured_at", None) or datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC")
        self.measured_at = now
        cmd = "make bench" if not self.a.quick else "bench/run.py --quick"
        L = ["# Benchmarks", "",
             f"Produced by `{cmd}` ({' '.join(sys.argv[1:]) or 'defaults'}) on {now}, in {elapsed:.0f} s, "
             f"on this project's machine (2 cores, 24 GiB, a VM). Every number below comes from that one run.", "",
             "Latency is injected by `latency-proxy` (crates/bench) on loopback: each direction of every "
             "connection is delayed by RTT/2 and a new connection pays one more RTT (the handshake). MinIO "
             "sits behind it for mado, rclone and s3fs; `git daemon` behind another for git. Counts (GETs, "
             "ranged GETs, connections, bytes) are the proxy's. Each cell: median wall time, (min–max) over "
             f"{self.a.runs} cold run(s) (fresh caches, page cache dropped), then the median counts. "
             "The seed's figures (seed 003, an Intel N100) and the brief's goals are in the `seed 003` rows.", "",
             f"Data: a synthetic git repository — `dense/` ({self.subtree_files['dense']} files in one directory), "
             f"`thin/` ({self.subtree_files['thin']} files, 4 per directory, two levels), `dense300/` "
             f"({self.subtree_files['dense300']} files), filler in `other/` — and a workspace tree of "
             f"{self.ws_files} × 1 KiB files. Whole-tree walks of real trees (Linux 6.1, an npm node_modules) "
             "are in the last section.", ""]
        L += self.summary()
        L += ["## mado against the best peer", "",
              "| subtree | RTT ms | best peer | mado | mado mount |", "|---|---|---|---|---|"]
        L += self.ratios("dense") + self.ratios("thin") + [""]
        L += self.table("a-dense", "a. Cold walk-and-read, dense subtree (`mado materialize dense`)")
        L += self.table("a-thin", "a. Cold walk-and-read, thin subtree (`mado materialize thin`)")
        ttff = [("first file", lambda r: f"{r['ttff'] * 1000:.1f} ms" if r.get("ttff") else "–")]
        L += self.table("b-dense", "b. Cold walk-and-read through the mount, dense subtree", ttff)
        L += self.table("b-thin", "b. Cold walk-and-read through the mount, thin subtree", ttff)
        L += self.table("b-dense300", f"b. Cold walk through the mount, {self.subtree_files['dense300']}-file dense "
                        "directory (seed row: 300 files; first file: seed 83 ms, goal ≤ 60 ms at 50 ms)", ttff)
        L += self.table("c", f"c. Resume of a {self.ws_files} × 1 KiB workspace (`mado ws resume`)")
        bm = [("pack build", lambda r: f"{r.get('build_ms', 0):.0f} ms")]
        L += self.table("d", f"d. Import of the {self.ws_files}-file tree, with its pack build (seed: 0.15 s "
                        "build; goal ≤ 0.1 s)", bm)
        L += self.table("e", "e. Warm walk-and-read of the dense subtree: mount against the local disk")
        L += self.table("f-readers", "f. Concurrent readers of overlapping parts of the dense subtree, one cold "
                        "mount (GETs must stay flat)")
        pl = [("p50", lambda r: f"{r.get('p50_ms', 0):.2f} ms"), ("p99", lambda r: f"{r.get('p99_ms', 0):.2f} ms")]
        L += self.table("f-fg", "f. Foreground reader (cold mount, dense subtree) while N workspaces write and "
                        "checkpoint (seed: p99 1.30–1.39× at 8 writers; goal ≤ 1.2×)", pl)
        fg = self.results.get("f-fg", {})
        base = (fg.get("0 writers", {}).get(self.rtts[-1]) or {}).get("p99_ms")
        if base:
            rat = [f"{k}: {((v.get(self.rtts[-1]) or {}).get('p99_ms', 0) / base):.2f}×" for k, v in fg.items()]
            L += ["p99 against 0 writers at the highest RTT: " + ", ".join(rat), ""]
        L += self.table("g", "g. Disk cache capped at half the dense subtree: the second pass (seed: 0.5 W GETs)")
        for sub in ("dense", "thin"):
            L += self.table(f"h-{sub}", f"h. Peers on the {sub} subtree (clone or mount, then walk and read it)")
        if pngs:
            L += ["## Plots (wall time against RTT, one line per system)", ""]
            L += [f"![{p}]({p})" for p in pngs] + [""]
        if self.notes:
            L += ["## Notes from this run", ""] + [f"- {n}" for n in self.notes] + [""]
        notes = os.path.join(ROOT, "bench", "NOTES.md")
        if os.path.exists(notes) and not self.a.quick:
            L += [open(notes).read()]
        with open(path, "w") as f:
            f.write("\n".join(L).rstrip() + "\n")
        with open(os.path.join(outdir, "bench-results.json"), "w") as f:
            json.dump({"measured_at": now, "elapsed": elapsed, "rtts": self.rtts, "runs": self.a.runs, "subtree_files": self.subtree_files,
                       "ws_files": self.ws_files, "notes": self.notes, "argv": sys.argv[1:],
                       "results": {k: {s: {str(r): row for r, row in by.items()} for s, by in v.items()}
                                   for k, v in self.results.items()}}, f, indent=1)
        log("wrote", path, "and", len(pngs), "plots")


SCENARIOS = {"a": "scenario_a", "b": "scenario_b", "c": "scenario_c", "d": "scenario_d", "e": "scenario_e",
             "f": "scenario_f", "g": "scenario_g", "h": "scenario_h"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--rtts")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "BENCHMARKS.md"))
    ap.add_argument("--profile", default="release", choices=["release", "debug"])
    ap.add_argument("--only", default="a,b,c,d,e,f,g,h")
    ap.add_argument("--timeout", type=float)
    ap.add_argument("--report-only", metavar="JSON", help="rewrite the report from a saved bench-results.json")
    a = ap.parse_args()
    a.runs = a.runs or (1 if a.quick else 5)
    a.timeout = a.timeout or (60 if a.quick else 300)
    b = Bench(a)
    b.rtts = [int(x) for x in (a.rtts or ("0,20" if a.quick else "0,20,50")).split(",")]
    b.skip = {}
    t0 = time.time()
    if a.report_only:
        saved = json.load(open(a.report_only))
        b.rtts, b.subtree_files, b.ws_files, b.notes = saved["rtts"], saved["subtree_files"], saved["ws_files"], \
            saved["notes"]
        a.runs = saved["runs"]
        b.results = {k: {s: {int(r): row for r, row in by.items()} for s, by in v.items()}
                     for k, v in saved["results"].items()}
        sys.argv = [sys.argv[0]] + saved["argv"]
        b.measured_at = saved.get("measured_at", "2026-11-22 08:35 UTC")
        b.report(a.out, saved.get("elapsed", 0))
        shutil.rmtree(b.work, ignore_errors=True)
        return
    interrupted = []
    signal.signal(signal.SIGTERM, lambda *_: interrupted.append(1) or sys.exit(1))
    try:
        b.build()
        b.start_servers()
        b.gen_repo()
        b.load_stores()
        for rtt in b.rtts:
            b.s3proxy.rtt(rtt)
            b.gitproxy.rtt(rtt)
            for s in a.only.split(","):
                log(f"scenario {s} at RTT {rtt} ms")
                try:
                    getattr(b, SCENARIOS[s])(rtt)
                except Exception as e:  # a failed scenario is reported, not dropped
                    b.notes.append(f"scenario {s} at RTT {rtt} ms failed: {e}".splitlines()[0])
                    log("FAILED", s, rtt, e)
        b.report(a.out, time.time() - t0)
    finally:
        b.fuse_teardown(None)
        for m in ("mnt", "peer-mnt"):
            unmount(os.path.join(b.work, m))
        b.stop_servers()
        shutil.rmtree(b.work, ignore_errors=True)


if __name__ == "__main__":
    main()
