"""What a benchmark run produces, as typed records, and its JSON form.

Owns the names everything else refers to: the result tables (`Table`), the
subtrees, the store layouts and the row labels the report looks up; seed
003's figures and the brief's goals (`BRIEF`), keyed by the same `Table`;
one table cell (`Result`, with the proxy's `Counts`); a whole run (`Run`);
and docs/bench-results.json, which `--report-only` reads back.
"""
import json
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Dict, List, Optional, Tuple


class Table(Enum):
    """One results table of the report. The value is its name in
    bench-results.json, its plot's title and its plot's file name."""
    A_DENSE = "a-dense"
    A_THIN = "a-thin"
    B_DENSE = "b-dense"
    B_THIN = "b-thin"
    B_DENSE300 = "b-dense300"
    C = "c"
    D = "d"
    E = "e"
    F_READERS = "f-readers"
    F_FG = "f-fg"
    G = "g"
    H_DENSE = "h-dense"
    H_THIN = "h-thin"
    I_SUB = "i-subtree"
    I_WHOLE = "i-whole"
    J = "j"
    K = "k"
    L = "l"
    M = "m"
    N = "n"
    O = "o"
    P = "p"


class Subtree(Enum):
    """A directory of the synthetic repository; the value is its path."""
    DENSE = "dense"
    THIN = "thin"
    DENSE300 = "dense300"


class Layout(Enum):
    """How the repository is stored; the value is its prefix in the bucket."""
    UNPACKED = "unpacked"
    V1 = "v1"
    V2 = "v2"


# The tables each subtree's scenarios fill.
MATERIALIZE = {Subtree.DENSE: Table.A_DENSE, Subtree.THIN: Table.A_THIN}
MOUNT = {Subtree.DENSE: Table.B_DENSE, Subtree.THIN: Table.B_THIN, Subtree.DENSE300: Table.B_DENSE300}
PEERS = {Subtree.DENSE: Table.H_DENSE, Subtree.THIN: Table.H_THIN}


# Row labels ("systems") that the summary and the ratios look up.
def materialize_row(layout: Layout) -> str:
    return f"mado {layout.value}"


def mount_row(layout: Layout) -> str:
    return f"mado mount {layout.value}"


def readers_row(n: int) -> str:
    return f"{n} readers"


def writers_row(n: int) -> str:
    return f"{n} writers"


RESUME_ROW = "mado ws resume"
IMPORT_ROW = "mado import-git"
# d's peer (issue #13): `git push` of the same repository into a fresh empty
# bare repository, through the git proxy (git:// to `git daemon`).
GIT_PUSH_ROW = "git push (git://)"

# Scenario i (issue #12): a real tree (crate sources of the cargo registry),
# its subtree `REAL_SUB`, and the floors mado is measured against. The
# floor rows are the same labels in both tables (I_SUB, I_WHOLE).
REAL_SUB = "sub"
UNTAR_ROW = "untar floor"
FLOOR_ROW = "floor + download + 3 RTT"  # computed, not run
REAL_CHECKOUT_SUB_ROW = f"mado checkout main DIR {REAL_SUB}"
REAL_MATERIALIZE_ROW = f"mado materialize {REAL_SUB}"
REAL_MOUNT_ROW = "mado mount + walk-and-read"
GIT_SPARSE_ROW = f"git clone --sparse (partial) + sparse-checkout set {REAL_SUB}"
REAL_CHECKOUT_ROW = "mado checkout main DIR"
GIT_CLONE_ROW = "git clone --depth 1"


# Scenario j (issue #19): one large file of random bytes, at each of a few
# sizes. Its rows, in the report's order; a cell's system is
# `large_system(row, size)`. The store (and so the RTT a cell is recorded
# at) is part of each row: the embedded store (file://, no network: RTT 0)
# for the local work, MinIO behind the proxy at J_RTT for the rest.
J_RTT = 20
J_IMPORT_LOCAL = "mado import-git (embedded store)"
J_IMPORT_S3 = f"mado import-git (MinIO, RTT {J_RTT})"
J_CHECKOUT_COLD_LOCAL = "mado checkout, cold cache (embedded store)"
J_CHECKOUT_COLD = f"mado checkout, cold cache (MinIO, RTT {J_RTT})"
J_CHECKOUT_WARM = "mado checkout, warm cache (embedded store)"
J_CP = "cp of the file on the local disk"
J_WRITE = "writing the bytes (dd from /dev/zero)"
J_CHECKPOINT = "mado ws checkpoint after appending 100 B (embedded store)"
J_MOUNT_COLD = f"mount: cat, cold (MinIO, RTT {J_RTT})"
J_MOUNT_WARM = "mount: cat, mado cache warm"
J_MOUNT_RANDOM = f"mount: one 4 KiB read, cold (MinIO, RTT {J_RTT})"
J_DISK_READ = "cat from the local disk"
J_GET1 = f"GET, one stream (MinIO, RTT {J_RTT})"
J_GET8 = f"GET, 8 ranged streams (MinIO, RTT {J_RTT})"
# The same three again with MinIO and the proxy on one CPU and everything
# else (mado, its mount daemon, curl, cat) on another: as when the store is
# another machine (on two shared cores, the store's CPU is the reader's).
J_PINNED = "; the store on its own core"
J_GET8_PINNED = J_GET8[:-1] + J_PINNED + ")"
J_CHECKOUT_COLD_PINNED = J_CHECKOUT_COLD[:-1] + J_PINNED + ")"
J_MOUNT_COLD_PINNED = J_MOUNT_COLD[:-1] + J_PINNED + ")"
# row -> (RTT its cells are recorded at, whether it moves the whole file
# (the report gives its MB/s), whether it is a mado process whose max RSS
# issue #19 bounds).
J_ROWS = {
    J_IMPORT_LOCAL: (0, True, True),
    J_IMPORT_S3: (J_RTT, True, True),
    J_CHECKOUT_COLD_LOCAL: (0, True, True),
    J_CHECKOUT_COLD: (J_RTT, True, True),
    J_CHECKOUT_WARM: (0, True, True),
    J_CP: (0, True, False),
    J_WRITE: (0, True, False),
    J_CHECKPOINT: (0, False, True),
    J_MOUNT_COLD: (J_RTT, True, True),
    J_MOUNT_WARM: (J_RTT, True, True),
    J_MOUNT_RANDOM: (J_RTT, False, True),
    J_DISK_READ: (0, True, False),
    J_GET1: (J_RTT, True, False),
    J_GET8: (J_RTT, True, False),
    J_GET8_PINNED: (J_RTT, True, False),
    J_CHECKOUT_COLD_PINNED: (J_RTT, True, True),
    J_MOUNT_COLD_PINNED: (J_RTT, True, True),
}
J_RSS_LIMIT_MIB = 256  # issue #19: import, checkout, checkpoint and the mount daemon

# Scenario m (issue #14): the dense subtree walked and read (`find -exec
# cat`) in a VM guest through `mado serve-virtiofs`, against the same
# walk through `mado mount` on the host and on the guest's own disk.
M_GUEST_COLD = "guest: serve-virtiofs, cold"
M_GUEST_WARM = "guest: serve-virtiofs, mado cache warm (guest caches dropped)"
M_GUEST_DISK = "guest: its local disk (ext4, virtio-blk; caches dropped)"
M_HOST_COLD = "host: mado mount, cold"
M_HOST_WARM = "host: mado mount, warm (page cache dropped)"
M_WARM_LIMIT = 1.5  # issue #14: the guest's warm walk <= 1.5x its local disk


# Scenario n (issue #20, part 3): work in a workspace. bench/workspace-work.sh
# times the same commands on a plain directory of the local disk and in a
# read-write workspace mount of one real tree (the embedded store: no
# network, so its cells are recorded at N_RTT whatever the run's RTTs), one
# row each; a cell's system is `work_system(row, where)`, where is N_LOCAL or
# N_MOUNT. The rows are the script's labels (the cp row's ends with the
# folder it copies, in parentheses), in its order, with issue #20's limit on
# each one's ratio, the mount's median over the local disk's.
N_RTT = 0
# Scenario o (issue #47): a fleet of workspace mounts; recorded at O_RTT
# (local work, no network), one row per number of agents, `o_system(n)`.
O_RTT = 0
O_SIZES = (1, 10, 30, 100)
O_QUICK_SIZES = (1, 4)


def o_system(agents: int) -> str:
    return f"{agents} agents"


# Scenario p (issue #46): bench/scale.sh at each tree size; recorded at
# P_RTT (local work), one Result per (row, size) with tree_files the size.
# The rows: (label, the script's column, seconds or MiB).
P_RTT = 0
P_TOPS = (10, 100, 300, 1000)
P_QUICK_TOPS = (10,)
P_ROWS = (
    ("import-git", 1, "s"),
    ("mount", 2, "s"),
    ("find -printf %s over the mount, cold", 4, "s"),
    ("find -printf %s over git's checkout, cold", 5, "s"),
    ("ws create --mount", 7, "s"),
    ("ws status, 10 edits", 8, "s"),
    ("ws checkpoint, 10 edits (the second)", 9, "s"),
    ("ws resume --mount", 13, "s"),
)
# Bytes up by the second 10-edit checkpoint (the script's column 10).
P_UP_ROW = ("bytes up by that checkpoint", 10)


def p_system(label: str, files: int) -> str:
    return f"{label}, {files} files"


P_MEM_ROWS = (
    ("import-git max RSS", 1),
    ("mount daemon at rest", 3),
    ("mount daemon after the find", 6),
    ("workspace daemon after the checkpoints", 11),
    ("mount daemon once the kernel forgot the find's inodes", 12),
)

N_LOCAL = "local disk"
N_MOUNT = "workspace mount"
N_GIT = "git init && git add -A && git commit"
N_STATUS = "git status (clean)"
N_GREP = "grep -r (no match)"
N_STAT = "find -printf %s (stat every file)"
N_READ = "read every file (cat)"
N_CP = "cp -r of the largest top-level directory"
N_RM = "rm -rf of that copy"
N_SED = "sed -i on 500 files"
N_BUILD = "make -j2 of 120 C files"
N_ROWS = {N_GIT: 2.0, N_STATUS: 1.5, N_GREP: 1.5, N_STAT: 1.5, N_READ: 1.5, N_CP: 3.0, N_RM: 2.0, N_SED: 2.0,
          N_BUILD: 1.1}
N_QUICK_FILES = 1500  # --quick: the script's FILES (its default, ~12,000, otherwise)


def work_system(row: str, where: str) -> str:
    return f"{row} [{where}]"


def size_label(n: int) -> str:
    """A file size as scenario j names it: 300 MiB, 1 GiB."""
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n / (1 << 20):g} MiB"


def large_system(row: str, size: int) -> str:
    return f"{row} [{size_label(size)}]"


# Scenario k (issue #18): a workspace checkpoint after editing a few files
# of a synthetic source tree, at each of a few tree sizes, beside `git
# commit -a && git push` of the same edit through the git proxy. Its rows;
# a cell's system is `ck_system(row, files)`, its RTT the run's.
K_EDITS = 10  # files edited (a line appended to each) before each timed checkpoint
K_TOUCHES = 1000  # files whose mtime alone changes, for the touch row (fewer on a small tree)
K_CHECKPOINT = f"mado ws checkpoint, {K_EDITS} files edited"
K_GIT = f"git commit -a && git push, the same {K_EDITS} edits"
K_TOUCH = f"mado ws checkpoint, {K_TOUCHES} mtimes touched"
K_ROWS = (K_CHECKPOINT, K_GIT, K_TOUCH)
# Issue #18's goals.
K_META_LIMIT = 64 << 10  # bytes of metadata a 10-file checkpoint uploads, at every tree size
K_FLAT = 1.5  # the largest tree's figure over the smallest's
K_TOUCH_PER_FILE = 50  # bytes per touched mtime, on top of K_META_LIMIT
K_RTTS_AFTER_WALK = 4  # sequential round trips after the walk
K_WALK_RTTS = 2  # the first round trips (lease, ref, writer lock), made while the working copy is walked
K_VS_GIT = 1.5  # wall time over git's, at K_GOAL_RTT
K_GOAL_RTT = 20


def ck_system(row: str, files: int) -> str:
    return f"{row} [{files:,} files]"


# Scenario l (issue #13): import of a real tree (scenario i's: the cargo
# registry's crate sources as one commit) against `git push` of the same
# commit into an empty bare repository, through the same proxies; then the
# next commit (L_CHANGED files changed) into a store, and a bare repository,
# that already hold the first. With `--import-sizes`, also the first import
# of a synthetic source tree of each size (scenario k's generator), at
# L_BIG_RTT only; a cell's system is then `l_system(row, files)`.
L_CHANGED = 5  # files the next commit changes (a line appended to each)
L_IMPORT = "mado import-git, first import"
L_PUSH = "git push (git://), first push"
L_NEXT = f"mado import-git, next commit ({L_CHANGED} files changed)"
L_NEXT_COLD = f"mado import-git, next commit ({L_CHANGED} files changed), cold cache"
L_NEXT_PUSH = f"git push (git://), next commit ({L_CHANGED} files changed)"
L_ROWS = (L_IMPORT, L_PUSH, L_NEXT, L_NEXT_COLD, L_NEXT_PUSH)
# Issue #13's goals.
L_VS_PUSH = 3.0  # first import's wall time over git push's, at every RTT
L_PUT_BYTES = 64 << 20  # at most one PUT per this many bytes of content ...
L_PUT_EXTRA = 4  # ... plus this many
L_NEXT_RTTS = 6  # sequential round trips of the next commit's import
L_BIG_RTT = 20  # the synthetic trees' RTT (the Linux-sized tree's goal is stated at RTT 20)


def l_system(row: str, files: int) -> str:
    return f"{row} [{files:,} files]"


@dataclass(frozen=True)
class Target:
    seed: str  # seed 003's figure (an Intel N100), as BRIEF.md gives it
    goal: str  # the brief's goal for it


# By table and RTT in ms; None: the figure is not tied to an RTT.
BRIEF: Dict[Tuple[Table, Optional[int]], Target] = {
    (Table.A_DENSE, 20): Target("2 GETs, 1.4 s", "<= 2 GETs, <= 0.3 s"),
    (Table.A_THIN, 20): Target("2 GETs, 10.4 s", "<= 3 GETs, <= 1 s"),
    (Table.B_DENSE300, 50): Target("1 GET, 283 ms", "1 GET, <= 150 ms"),
    (Table.C, 0): Target("2.1 s", "<= 0.3 s"),
    (Table.C, 20): Target("5.3 s", "<= 0.4 s"),
    (Table.C, 50): Target("9.7 s", "<= 0.5 s"),
    (Table.D, None): Target("0.15 s", "<= 0.1 s"),
    (Table.F_FG, 50): Target("p99 1.30-1.39x", "<= 1.2x"),
    (Table.G, None): Target("0.5 W GETs", "clearly fewer than 0.5 W"),
}
# Time to the first file of a pack at RTT 50 ms: a column of the b tables,
# not a table of its own, so it has no Table key.
FIRST_FILE = Target("83 ms", "<= 60 ms")
# Issue #13's goal for the first import (table d), at every RTT: mado
# import-git's wall time over git push's of the same tree, same proxy. Not
# a seed 003 figure, so not in BRIEF (its table rows say "seed 003").
IMPORT_VS_PUSH = Target("–", "≤ 3× git push")
# Issue #12's goals for scenario i, as ratios (mado's wall time over the
# named reference; for GIT_SPARSE, git's over mado's): the limit, and the
# RTT it is stated at (None: every RTT).
REAL_GOALS = {
    "checkout_floor": (1.5, None),  # cold subtree checkout <= 1.5x (untar + download + 3 RTT)
    "checkout_git": (6.0, 20),  # and >= 6x faster than git sparse partial clone
    "materialize_floor": (1.5, None),  # cold materialize <= 1.5x (download + write once + 3 RTT)
    "mount_floor": (2.0, None),  # cold mount walk <= 2x (untar floor + 3 RTT)
    "whole_git": (0.5, 20),  # whole-tree cold checkout <= 0.5x git clone --depth 1
}


@dataclass(frozen=True)
class Counts:
    """The proxy's counts, each the median over a cell's runs. Requests
    (and so GETs, PUTs, HEADs, ranged GETs) are only counted by the HTTP
    proxy: the git proxy counts connections and bytes. The fields with a
    default were added later: a saved cell without them has None."""
    gets: int
    requests: int
    ranged: int
    connections: int
    bytes_down: int
    puts: Optional[int] = None
    heads: Optional[int] = None
    bytes_up: Optional[int] = None


@dataclass(frozen=True)
class Result:
    """One cell: `system` at `rtt` ms in `table`. A measured cell has the
    median/min/max wall time (s) over n cold runs and the median counts; a
    cell that was not measured has a note saying why (and n, the runs that
    had finished, when it failed part way)."""
    table: Table
    system: str
    rtt: int
    n: Optional[int] = None
    median: Optional[float] = None
    min: Optional[float] = None
    max: Optional[float] = None
    counts: Optional[Counts] = None
    ttff: Optional[float] = None  # b: seconds to the first file's content
    build_ms: Optional[float] = None  # d: the import's pack build
    working_set: Optional[int] = None  # g: files in the working set W
    p50_ms: Optional[float] = None  # f-fg: the foreground reader's per-file latency
    p99_ms: Optional[float] = None
    # i: the tree an untar row writes (files, bytes; n: every cell's tree's
    # files); what a computed floor row assumed (the bytes it downloads, the
    # plain GET throughput in MB/s).
    tree_files: Optional[int] = None
    tree_bytes: Optional[int] = None
    crates: Optional[str] = None  # which crates the tree holds (n: the crate its cp -r row copies)
    dl_bytes: Optional[int] = None
    get_mb_s: Optional[float] = None
    # j: the large file's size; the process's max RSS (MiB; for a mount row,
    # the daemon's VmHWM); bytes up as mado's --json counts them; where the
    # random read was (bytes into the file).
    file_bytes: Optional[int] = None
    rss_mib: Optional[float] = None
    up_bytes: Optional[int] = None
    read_at: Optional[int] = None
    # k: mado's own counts and sizes from `ws checkpoint --json` (medians):
    # its sequential round trips, the pack index layer and stat object it
    # wrote, the files it read; and what the run changed (files edited or
    # touched, the edited files' bytes after the edit). tree_files: the tree.
    round_trips: Optional[int] = None
    index_bytes: Optional[int] = None
    stat_bytes: Optional[int] = None
    files_read: Optional[int] = None
    changed: Optional[int] = None
    content_bytes: Optional[int] = None
    max_up_bytes: Optional[int] = None  # the largest bytes up of any run (a compaction shows here)
    # o: a fleet of `agents` workspace mounts (median: `ws create --mount`'s
    # average): memory in use per workspace idle and after reading (MiB),
    # each daemon's private memory (MiB), the cache against one workspace's,
    # the foreground reader alone (p50_ms/p99_ms: beside the agents),
    # checkpoints per second, and how many workspaces' last checkpoint held
    # their own edit.
    agents: Optional[int] = None
    mem_idle_mib: Optional[float] = None
    mem_read_mib: Optional[float] = None
    private_mib: Optional[float] = None
    pss_idle_mib: Optional[float] = None
    pss_read_mib: Optional[float] = None
    cache_x: Optional[float] = None
    p50_alone_ms: Optional[float] = None
    p99_alone_ms: Optional[float] = None
    # the same reader on the local disk's copy of the same files, pass for
    # pass with the mount's: alone and beside the agents (the floor under
    # p99_ms: waiting for a CPU among N agents)
    p99_local_alone_ms: Optional[float] = None
    p99_local_ms: Optional[float] = None
    ckpt_per_s: Optional[float] = None
    landed: Optional[int] = None
    note: Optional[str] = None

    def to_json(self) -> dict:
        # The flat row of bench-results.json; fields left at None are absent.
        row = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _CELL:
                continue
            if isinstance(v, Counts):
                row.update((c.name, getattr(v, c.name)) for c in fields(Counts) if getattr(v, c.name) is not None)
            elif v is not None:
                row[f.name] = v
        return row

    @classmethod
    def from_json(cls, table: Table, system: str, rtt: int, row: dict) -> "Result":
        names = [c.name for c in fields(Counts)]
        required = [c.name for c in fields(Counts) if c.default is MISSING]
        counts = Counts(**{c: row[c] for c in names if c in row}) if all(c in row for c in required) else None
        known = {f.name for f in fields(cls)} - _CELL - {"counts"}
        return cls(table, system, rtt, counts=counts, **{k: v for k, v in row.items() if k in known})


# Where a cell is: the nesting of bench-results.json, not fields of its row.
_CELL = {"table", "system", "rtt"}


class Results:
    """Every cell of a run by table, system and RTT, in the order each was
    first recorded: that order is the report's row and plot order."""

    def __init__(self):
        self._by: Dict[Table, Dict[str, Dict[int, Result]]] = {}

    def add(self, r: Result):
        # A later result for the same cell replaces it in place.
        self._by.setdefault(r.table, {}).setdefault(r.system, {})[r.rtt] = r

    def get(self, table: Table, system: str, rtt: int) -> Optional[Result]:
        return self._by.get(table, {}).get(system, {}).get(rtt)

    def rows(self, table: Table) -> Dict[str, Dict[int, Result]]:
        """system -> RTT -> cell; empty when the table was not measured."""
        return self._by.get(table, {})

    def tables(self) -> List[Table]:
        return list(self._by)

    def replace_table(self, table: Table, rows: Dict[str, Dict[int, Result]]):
        """Puts `rows` in place of the table's rows (the table keeps its
        place among the tables; its rows are the new ones, in their order)."""
        self._by[table] = {system: dict(by) for system, by in rows.items()}


@dataclass(frozen=True)
class Part:
    """Where the cells of a table measured by a later, partial run come
    from (`run.py --only X --merge JSON`): that run's date, length,
    command line, runs per cell and RTTs."""
    measured_at: str
    elapsed: float
    argv: List[str]
    runs: int
    rtts: List[int]
    note: Optional[str] = None  # run.py --note: what the run measured (e.g. "baseline before ...")


@dataclass
class Run:
    """One benchmark run: its settings, its cells and the notes for the
    report; what bench-results.json holds. A run that other, partial runs
    were merged into (`merge`) keeps its own settings and lists, in
    `parts`, the tables those replaced and where they come from."""
    rtts: List[int]
    runs: int
    subtree_files: Dict[Subtree, int]
    ws_files: int
    argv: List[str]
    results: Results = field(default_factory=Results)
    notes: List[str] = field(default_factory=list)
    measured_at: Optional[str] = None
    elapsed: float = 0.0
    parts: Dict[Table, Part] = field(default_factory=dict)
    note: Optional[str] = None  # run.py --note, for the tables of a merged run (Part.note)

    def check_mergeable(self, later: "Run"):
        """Raises ValueError unless `later`'s cells can stand in this run's
        report: the same trees (a --quick run has smaller ones) and RTTs
        among this run's."""
        if later.subtree_files != self.subtree_files or later.ws_files != self.ws_files:
            raise ValueError("the runs measured different trees (is one of them --quick?)")
        if not set(later.rtts) <= set(self.rtts):
            raise ValueError(f"RTTs {later.rtts} are not among the saved run's {self.rtts}")

    def merge(self, later: "Run"):
        """Takes the tables `later` measured in place of this run's (each
        table whole: rows `later` no longer has go too), records where they
        come from, and adds `later`'s notes."""
        self.check_mergeable(later)
        part = Part(measured_at=later.measured_at or "", elapsed=later.elapsed, argv=later.argv,
                    runs=later.runs, rtts=later.rtts, note=later.note)
        for t in later.results.tables():
            self.results.replace_table(t, later.results.rows(t))
            self.parts[t] = part
        # Notes of earlier runs about the replaced tables stay: they name
        # their scenario and RTT, and the new ones say when they are from.
        self.notes += [f"{n} (run of {part.measured_at})" for n in later.notes]

    def save(self, path: str):
        with open(path, "w") as f:
            json.dump({"measured_at": self.measured_at, "elapsed": self.elapsed, "rtts": self.rtts,
                       "runs": self.runs, "subtree_files": {s.value: n for s, n in self.subtree_files.items()},
                       "ws_files": self.ws_files, "notes": self.notes, "argv": self.argv,
                       "results": {t.value: {s: {str(r): c.to_json() for r, c in by.items()}
                                             for s, by in self.results.rows(t).items()}
                                   for t in self.results.tables()},
                       # Only after a merge (an older file has none).
                       **({"parts": {t.value: {f.name: getattr(p, f.name) for f in fields(Part)
                                              if getattr(p, f.name) is not None}
                                     for t, p in self.parts.items()}} if self.parts else {})}, f, indent=1)

    @classmethod
    def load(cls, path: str) -> "Run":
        with open(path) as f:
            saved = json.load(f)
        run = cls(rtts=saved["rtts"], runs=saved["runs"], ws_files=saved["ws_files"], argv=saved["argv"],
                  subtree_files={Subtree(s): n for s, n in saved["subtree_files"].items()},
                  notes=saved["notes"], elapsed=saved.get("elapsed", 0),
                  # Files written before the date was saved are from the first full run.
                  measured_at=saved.get("measured_at", "2026-11-22 08:35 UTC"),
                  parts={Table(t): Part(**p) for t, p in saved.get("parts", {}).items()})
        for t, systems in saved["results"].items():
            for system, by in systems.items():
                for r, row in by.items():
                    run.results.add(Result.from_json(Table(t), system, int(r), row))
        return run
