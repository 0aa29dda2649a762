"""The benchmark report: docs/BENCHMARKS.md, its plots and bench-results.json.

Owns the wording and layout of the report: the summary against seed 003's
figures and the brief's goals (results.BRIEF), mado against the best peer,
one table per scenario, the plots (matplotlib, optional), the notes, and
bench/NOTES.md (the hand-run sections) appended to a full run's report.
It only reads a `Run`; it measures nothing.
"""
import datetime, os, shlex
from typing import Callable, List, Optional, Sequence, Tuple

from harness import ROOT, log
from results import (BRIEF, FIRST_FILE, FLOOR_ROW, GIT_CLONE_ROW, GIT_PUSH_ROW, GIT_SPARSE_ROW, IMPORT_ROW,
                     IMPORT_VS_PUSH, MATERIALIZE, MOUNT, PEERS, REAL_CHECKOUT_ROW, REAL_CHECKOUT_SUB_ROW, REAL_GOALS,
                     REAL_MATERIALIZE_ROW, REAL_MOUNT_ROW, REAL_SUB, RESUME_ROW, UNTAR_ROW, Counts, Layout, Result, Run,
                     Subtree, Table, materialize_row, mount_row, writers_row)
from results import (J_CHECKOUT_COLD, J_CHECKOUT_COLD_PINNED, J_CHECKOUT_WARM, J_CHECKPOINT, J_CP, J_DISK_READ,
                     J_GET8, J_GET8_PINNED, J_IMPORT_LOCAL, J_MOUNT_COLD, J_MOUNT_COLD_PINNED, J_MOUNT_RANDOM, J_MOUNT_WARM, J_ROWS, J_RSS_LIMIT_MIB, J_RTT, J_WRITE, large_system,
                     size_label)
from results import (K_CHECKPOINT, K_EDITS, K_FLAT, K_GIT, K_GOAL_RTT, K_META_LIMIT, K_ROWS, K_RTTS_AFTER_WALK,
                     K_TOUCH, K_TOUCH_PER_FILE, K_TOUCHES, K_VS_GIT, K_WALK_RTTS, ck_system)
from results import M_GUEST_DISK, M_GUEST_WARM, M_WARM_LIMIT
from results import (O_RTT, P_MEM_ROWS, P_ROWS, P_RTT, P_UP_ROW, p_system, N_BUILD, N_CP, N_GIT, N_GREP, N_LOCAL, N_MOUNT, N_QUICK_FILES, N_READ, N_RM, N_ROWS, N_RTT,
                     N_SED, N_STAT, N_STATUS, work_system)
from results import (L_BIG_RTT, L_CHANGED, L_IMPORT, L_NEXT, L_NEXT_COLD, L_NEXT_PUSH, L_NEXT_RTTS,
                     L_PUSH, L_PUT_BYTES, L_PUT_EXTRA, L_ROWS, L_VS_PUSH, l_system)

# Their cells also give the bytes and connections: the cold walks and the peers.
TRAFFIC = {Table.A_DENSE, Table.A_THIN, Table.B_DENSE, Table.B_THIN, Table.B_DENSE300, Table.H_DENSE, Table.H_THIN,
           Table.I_SUB, Table.I_WHOLE}
V2_MATERIALIZE, V2_MOUNT = materialize_row(Layout.V2), mount_row(Layout.V2)
BASE_WRITERS = writers_row(0)
# Scenario n's rows, as its summary line names them.
WORK_SHORT = {N_GIT: "git add/commit", N_STATUS: "git status", N_GREP: "grep -r", N_STAT: "find (stat)",
              N_READ: "cat", N_CP: "cp -r", N_RM: "rm -rf", N_SED: "sed -i", N_BUILD: "make -j2"}

# An extra column: its heading and its text for the cell at the highest RTT.
Column = Tuple[str, Callable[[Optional[Result]], str]]
FIRST_FILE_COL: Column = ("first file", lambda r: f"{r.ttff * 1000:.1f} ms" if r and r.ttff else "–")
BUILD_COL: Column = ("pack build", lambda r: f"{r.build_ms:.0f} ms" if r and r.build_ms is not None else "–")
LATENCY_COLS: List[Column] = [("p50", lambda r: f"{(r and r.p50_ms) or 0:.2f} ms"),
                              ("p99", lambda r: f"{(r and r.p99_ms) or 0:.2f} ms")]


def upload_counts(k: Counts) -> str:
    """Table d's counts: requests by method (the S3 proxy only; the git
    proxy sees none), bytes up and connections."""
    out = []
    if k.requests:
        out.append(f"{k.puts} PUT, {k.heads} HEAD, {k.gets} GET" if k.puts is not None
                   else f"{k.requests} requests, {k.gets} GET")
    if k.bytes_up is not None:
        out.append(f"{k.bytes_up / 1e6:.1f} MB up")
    return ", ".join(out + [f"{k.connections} conn"])


def debug_build(argv: List[str]) -> bool:
    """Whether run.py's command line chose the debug build."""
    return "--profile=debug" in argv or any(a == "--profile" and b == "debug" for a, b in zip(argv, argv[1:]))


def measured(r: Optional[Result]) -> bool:
    """Whether `r` has a time (else fmt_t says why not)."""
    return bool(r) and r.median is not None


def fmt_t(r: Optional[Result]) -> str:
    if not measured(r):
        return (r.note or "–") if r else "–"
    m = r.median
    s = f"{m:.3f} s" if m >= 0.1 else f"{m * 1000:.1f} ms"
    if r.n > 1:
        s += f" ({r.min:.3f}–{r.max:.3f})"
    return s


class Report:
    def __init__(self, run: Run):
        self.run, self.results, self.rtts = run, run.results, run.rtts

    def table(self, key: Table, title: str, extra_cols: Sequence[Column] = ()) -> List[str]:
        res = self.results.rows(key)
        out = self.part_header(key, title)
        if not res:
            out += ["not yet measured in this run", ""]
            return out
        rtts = self.rtts
        cols = ["system"] + [f"RTT {r} ms" for r in rtts] + [f"{c} @ {rtts[-1]} ms" for c, _ in extra_cols]
        out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        seeds = [f"{t.seed} (goal {t.goal})" if t else "–" for t in (BRIEF.get((key, r)) for r in rtts)]
        if any(s != "–" for s in seeds):
            out.append("| " + " | ".join(["seed 003"] + seeds + ["–"] * len(extra_cols)) + " |")
        for system, by_rtt in res.items():
            cells = []
            for r in rtts:
                row = by_rtt.get(r)
                c = fmt_t(row)
                if row and row.counts and key == Table.D:
                    c += "; " + upload_counts(row.counts)
                elif row and row.counts:
                    k = row.counts
                    c += f"; {k.gets} GET" + (f" ({k.ranged} ranged)" if k.ranged else "")
                    if key in TRAFFIC:
                        c += f", {k.bytes_down / 1e6:.1f} MB, {k.connections} conn"
                cells.append(c)
            last = by_rtt.get(rtts[-1])
            ex = [f(last) for _, f in extra_cols]
            out.append("| " + " | ".join([system] + cells + ex) + " |")
        out.append("")
        return out

    def part_header(self, key: Table, title: str, cold: bool = True) -> List[str]:
        """A table's heading, and where its cells come from if a later run
        measured them."""
        out = [f"### {title}", ""]
        part = self.run.parts.get(key)
        if part:
            out += [f"*Measured later*, on {part.measured_at} in {part.elapsed:.0f} s, by "
                    f"`python3 bench/run.py {shlex.join(part.argv)}` ({part.runs} {'cold' if cold else 'warm'} runs "
                    "per cell at most, RTT "
                    + " / ".join(map(str, part.rtts)) + " ms), and merged into the run above."
                    + (" mado is the debug build in this table." if debug_build(part.argv) else "")
                    + (f" {part.note.rstrip('.')}." if part.note else ""), ""]
        return out

    def summary(self) -> List[str]:
        """The brief's table: seed, goal and mado's figure from this run."""
        def t(row):
            return fmt_t(row).split(" (")[0] if row else "–"

        def g(row):
            return f"{row.counts.gets} GET" if row and row.counts else ""

        get, rtts, files = self.results.get, self.rtts, self.run.subtree_files
        hi = rtts[-1]
        rows = []
        for sub, label in ((Subtree.DENSE, "dense"), (Subtree.THIN, "thin (many small dirs)")):
            at = 20 if 20 in rtts else hi
            r = get(MATERIALIZE[sub], V2_MATERIALIZE, at)
            b = get(MOUNT[sub], V2_MOUNT, at)
            target = BRIEF.get((MATERIALIZE[sub], 20))
            rows.append((f"{files[sub]}-file {label} subtree, cold walk, RTT {at} ms",
                         target.seed if target else "–", target.goal if target else "–",
                         f"materialize {t(r)}, {g(r)}; mount {t(b)}, {g(b)}"))
        r = get(Table.B_DENSE300, V2_MOUNT, hi)
        target = BRIEF[(Table.B_DENSE300, 50)]
        rows.append((f"{files[Subtree.DENSE300]}-file dense walk through the mount, RTT {hi} ms",
                     target.seed, target.goal, f"{t(r)}, {g(r)}"))
        ttffs = [get(MOUNT[s], V2_MOUNT, hi) for s in Subtree]
        ttffs = [x.ttff for x in ttffs if x and x.ttff]
        rows.append((f"time to first file of a pack, RTT {hi} ms", FIRST_FILE.seed, FIRST_FILE.goal,
                     " / ".join(f"{x * 1000:.1f} ms" for x in ttffs) + " (dense / thin / dense300)" if ttffs else "–"))
        resume = [BRIEF.get((Table.C, r)) for r in rtts]
        rows.append((f"resume {self.run.ws_files} × 1 KiB, RTT " + " / ".join(map(str, rtts)) + " ms",
                     " / ".join(x.seed if x else "–" for x in resume),
                     " / ".join(x.goal if x else "–" for x in resume),
                     " / ".join(t(get(Table.C, RESUME_ROW, r)) for r in rtts)))
        d = get(Table.D, IMPORT_ROW, rtts[0])
        target = BRIEF[(Table.D, None)]
        part = self.run.parts.get(Table.D)
        debug = " (debug build)" if part and debug_build(part.argv) else ""
        rows.append((f"import-time pack build, {self.run.ws_files}-file tree", target.seed, target.goal,
                     f"{d.build_ms or 0:.0f} ms build (whole import {t(d)} at RTT {rtts[0]}){debug}" if d else "–"))
        pairs = self.import_vs_push()
        if pairs:
            rows.append((f"first import of the {self.run.ws_files}-file tree against `git push` of it, RTT "
                         + " / ".join(str(r) for r, _, _ in pairs) + " ms", IMPORT_VS_PUSH.seed, IMPORT_VS_PUSH.goal,
                         " / ".join(f"{m.median / g.median:.1f}×" for _, m, g in pairs) + " ("
                         + " / ".join(f"{t(m)} against {t(g)}" for _, m, g in pairs) + ")" + debug))
        most = [k for k in self.results.rows(Table.F_FG) if k != BASE_WRITERS]
        base = get(Table.F_FG, BASE_WRITERS, hi)
        base = base.p99_ms if base else None
        if base and most:
            top = most[-1]
            p = get(Table.F_FG, top, hi)
            p = (p.p99_ms if p else None) or 0
            target = BRIEF[(Table.F_FG, 50)]
            rows.append((f"foreground read p99 under {top}, RTT {hi} ms", target.seed, target.goal,
                         f"{p / base:.2f}× ({p:.1f} ms against {base:.1f} ms)"))
        for layout in (Layout.UNPACKED, Layout.V2):
            r = get(Table.G, materialize_row(layout), hi)
            if r:
                target = BRIEF[(Table.G, None)]
                rows.append((f"cache capped at half the working set, second pass ({layout.value}), RTT {hi} ms",
                             target.seed, target.goal,
                             f"{r.counts.gets if r.counts else '–'} GETs for W = {r.working_set} files"))
        rows += self.real_summary()
        rows += self.large_summary()
        rows += self.ck_summary()
        rows += self.l_summary()
        rows += self.virtiofs_summary()
        rows += self.work_summary()
        rows += self.fleet_summary()
        out = ["## Summary against the brief", "",
               "| case | seed 003 | goal | mado in this run |", "|---|---|---|---|"]
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
        return out + [""]

    # ---- scenario i: the real tree against its floors (issue #12) ----

    def med(self, table: Table, system: str, rtt: int) -> Optional[float]:
        r = self.results.get(table, system, rtt)
        return r.median if r and r.median is not None else None

    def real_tree(self, table: Table) -> Optional[Result]:
        """The untar row that says the tree's files and bytes."""
        for r in self.results.rows(table).get(UNTAR_ROW, {}).values():
            if r.tree_files:
                return r
        return None

    def real_ratio(self, what: str, rtt: int) -> Optional[float]:
        """One of scenario i's ratios at `rtt` (None if a cell is missing)."""
        S, W, m = Table.I_SUB, Table.I_WHOLE, self.med
        untar_rtt = lambda t: m(t, UNTAR_ROW, rtt) + 3 * rtt / 1000 if m(t, UNTAR_ROW, rtt) else None  # noqa: E731
        num, den = {
            "checkout_floor": (m(S, REAL_CHECKOUT_SUB_ROW, rtt), m(S, FLOOR_ROW, rtt)),
            "checkout_untar": (m(S, REAL_CHECKOUT_SUB_ROW, rtt), m(S, UNTAR_ROW, rtt)),
            "checkout_git": (m(S, GIT_SPARSE_ROW, rtt), m(S, REAL_CHECKOUT_SUB_ROW, rtt)),
            "git_floor": (m(S, GIT_SPARSE_ROW, rtt), m(S, FLOOR_ROW, rtt)),
            "materialize_floor": (m(S, REAL_MATERIALIZE_ROW, rtt), m(S, FLOOR_ROW, rtt)),
            "materialize_untar": (m(S, REAL_MATERIALIZE_ROW, rtt), m(S, UNTAR_ROW, rtt)),
            "mount_floor": (m(S, REAL_MOUNT_ROW, rtt), untar_rtt(S)),
            "mount_dl_floor": (m(S, REAL_MOUNT_ROW, rtt), m(S, FLOOR_ROW, rtt)),
            "whole_floor": (m(W, REAL_CHECKOUT_ROW, rtt), m(W, FLOOR_ROW, rtt)),
            "whole_untar": (m(W, REAL_CHECKOUT_ROW, rtt), m(W, UNTAR_ROW, rtt)),
            "whole_git": (m(W, REAL_CHECKOUT_ROW, rtt), m(W, GIT_CLONE_ROW, rtt)),
            "whole_floor_git": (m(W, FLOOR_ROW, rtt), m(W, GIT_CLONE_ROW, rtt)),
        }[what]
        return num / den if num is not None and den else None

    @staticmethod
    def real_goal(what: str) -> str:
        if what not in REAL_GOALS:
            return "–"
        limit, at = REAL_GOALS[what]
        return ("≥ " if what == "checkout_git" else "≤ ") + f"{limit:g}×" + (f" at RTT {at} ms" if at else "")

    def real_cell(self, what: str, rtt: int) -> str:
        x = self.real_ratio(what, rtt)
        if x is None:
            return "–"
        s = f"{x:.2f}×"
        if what in REAL_GOALS:
            limit, at = REAL_GOALS[what]
            if at is None or at == rtt:
                ok = x >= limit if what == "checkout_git" else x <= limit
                s = f"**{s}** " + ("✓" if ok else "✗")
        return s

    def real_ratio_table(self, lines: Sequence[Tuple[str, str]]) -> List[str]:
        cols = ["ratio", "goal (issue #12)"] + [f"RTT {r} ms" for r in self.rtts]
        out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for what, label in lines:
            out.append("| " + " | ".join([label, self.real_goal(what)] + [self.real_cell(what, r) for r in self.rtts])
                       + " |")
        return out + [""]

    def real_floor_text(self, table: Table) -> str:
        rows = [r for r in self.results.rows(table).get(FLOOR_ROW, {}).values() if r.get_mb_s]
        if not rows:
            return ""
        return (f"`{FLOOR_ROW}` is computed, not run: the untar row's median, plus the bytes the mado checkout "
                f"row downloaded (the proxy's bytes down, median) at {rows[0].get_mb_s:.0f} MB/s (the median of "
                "5 plain GETs of one 64 MiB object through the same proxy at RTT 0, curl, page cache dropped), "
                "plus 3 × RTT.")

    def real_tables(self) -> List[str]:
        sub, whole = self.real_tree(Table.I_SUB), self.real_tree(Table.I_WHOLE)
        size = lambda r: f"{r.tree_files:,} files, {r.tree_bytes / 1e6:.1f} MB" if r else "size unknown"  # noqa: E731
        out = self.table(Table.I_SUB, f"i. Real tree, a subtree of whole crates (`{REAL_SUB}/`: {size(sub)}): cold "
                         "checkout, materialize and mount walk against the untar floor and git (issue #12)",
                         [FIRST_FILE_COL])
        if self.results.rows(Table.I_SUB):
            text = [
                "The tree: the crate sources of this machine's cargo registry (`~/.cargo/registry/src/*/`), the "
                "crate folders in name order until 15,000 files (`--quick`: crates of at most 30 files, until 300), "
                "as one git commit " + (f"({size(whole)} in all; {whole.crates}), " if whole else "")
                + "imported packs-first (`mado import-git`, as the v2 store).",
                f"`{REAL_SUB}/` holds " + (sub.crates if sub and sub.crates else "a few whole crates")
                + "; `vendor/` the others.",
                "`untar floor`: `tar -xf` of a tar of exactly the subtree's committed files (made in setup, kept "
                "on tmpfs so that reading it costs no disk I/O) into a fresh directory, page cache dropped; no "
                "network.",
                self.real_floor_text(Table.I_SUB),
                "The mado rows are cold: a fresh cache and target directory, page cache dropped. The rows are "
                "measured interleaved (one run of each in turn, then the next round), so that each ratio "
                "compares runs made under the same conditions.",
                "`mado mount + walk-and-read` times the walk only (the mount is set up untimed, as in b).",
                "The git row clones through the git proxy (`git clone -q --depth 1 --filter=blob:none --sparse`, "
                f"then `git sparse-checkout set {REAL_SUB}`) from a repacked bare repository, and ends with the "
                "files on disk, as mado checkout does (no walk)."]
            out += [" ".join(x for x in text if x), ""]
            out += self.real_ratio_table([
                ("checkout_floor", "mado checkout / (untar + download + 3 RTT)"),
                ("checkout_untar", "mado checkout / untar"),
                ("checkout_git", "git sparse partial clone / mado checkout (mado's speed-up)"),
                ("git_floor", "git sparse partial clone / (untar + download + 3 RTT): the most any checkout "
                 "could gain on git here"),
                ("materialize_floor", "mado materialize / (untar + download + 3 RTT)"),
                ("materialize_untar", "mado materialize / untar"),
                ("mount_floor", "mado mount walk / (untar + 3 RTT)"),
                ("mount_dl_floor", "mado mount walk / (untar + download + 3 RTT)")])
        out += self.table(Table.I_WHOLE, f"i. Real tree, the whole tree ({size(whole)}): cold checkout against "
                          "the untar floor and `git clone --depth 1` (issue #12)")
        if self.results.rows(Table.I_WHOLE):
            out += ["The same tree and floors as above, for every file: `untar floor` extracts a tar of the "
                    "whole commit; " + self.real_floor_text(Table.I_WHOLE) + " `git clone "
                    "--depth 1` ends with the files on disk (no walk).", ""]
            out += self.real_ratio_table([
                ("whole_floor", "mado checkout / (untar + download + 3 RTT)"),
                ("whole_untar", "mado checkout / untar"),
                ("whole_git", "mado checkout / git clone --depth 1"),
                ("whole_floor_git", "(untar + download + 3 RTT) / git clone --depth 1: the least any checkout "
                 "could reach here")])
        return out

    def real_summary(self) -> List[Tuple[str, str, str, str]]:
        """Summary rows for scenario i, at RTT 20 (or the highest)."""
        if not self.results.rows(Table.I_SUB) and not self.results.rows(Table.I_WHOLE):
            return []
        at = 20 if 20 in self.rtts else self.rtts[-1]
        sub, whole = self.real_tree(Table.I_SUB), self.real_tree(Table.I_WHOLE)
        x = lambda what: f"{self.real_ratio(what, at):.2f}×" if self.real_ratio(what, at) else "–"  # noqa: E731
        t = lambda table, row: fmt_t(self.results.get(table, row, at)).split(" (")[0]  # noqa: E731
        n = f"{sub.tree_files:,}-file " if sub else ""
        S = Table.I_SUB
        return [
            (f"real tree, {n}subtree, cold `mado checkout`, RTT {at} ms (issue #12)", "–",
             "≤ 1.5× (untar + download + 3 RTT); ≥ 6× faster than git sparse partial clone",
             f"{t(S, REAL_CHECKOUT_SUB_ROW)}: {x('checkout_floor')} the floor; {x('checkout_git')} faster than git"),
            (f"real tree, {n}subtree, cold `mado materialize`, RTT {at} ms", "–", "≤ 1.5× (download + write once "
             "+ 3 RTT)", f"{t(S, REAL_MATERIALIZE_ROW)}: {x('materialize_floor')} the floor"),
            (f"real tree, {n}subtree, cold mount walk, RTT {at} ms", "–", "≤ 2× (untar + 3 RTT)",
             f"{t(S, REAL_MOUNT_ROW)}: {x('mount_floor')}"),
            ("real tree, whole" + (f" ({whole.tree_files:,} files)" if whole else "") + f", cold `mado checkout`, "
             f"RTT {at} ms", "–", "≤ 0.5× git clone --depth 1",
             f"{t(Table.I_WHOLE, REAL_CHECKOUT_ROW)}: {x('whole_git')} git's time"),
        ]

    # ---- scenario j: large files (issue #19) ----

    def large_sizes(self) -> List[int]:
        return sorted({r.file_bytes for by in self.results.rows(Table.J).values() for r in by.values()
                       if r.file_bytes})

    def large(self, row: str, size: int) -> Optional[Result]:
        return self.results.get(Table.J, large_system(row, size), J_ROWS[row][0])

    def large_med(self, row: str, size: int) -> Optional[float]:
        r = self.large(row, size)
        return r.median if r and r.median is not None else None

    def large_ratios(self, size: int) -> dict:
        """Issue #19's ratios at one size (None where a cell is missing)."""
        m = lambda row: self.large_med(row, size)  # noqa: E731
        div = lambda a, b: a / b if a is not None and b else None  # noqa: E731
        get8, write = m(J_GET8), m(J_WRITE)
        return {
            "mount_vs_get8": div(get8, m(J_MOUNT_COLD)),  # throughput share: >= 0.8
            "checkout_vs_floor": div(m(J_CHECKOUT_COLD), get8 + write if get8 and write else None),  # <= 1.25
            "warm_mount_vs_disk": div(m(J_MOUNT_WARM), m(J_DISK_READ)),  # <= 1.2
            "warm_checkout_vs_cp": div(m(J_CHECKOUT_WARM), m(J_CP)),  # <= 1.3
            "random_rtts": div(m(J_MOUNT_RANDOM), J_RTT / 1000),  # <= 2
            # The same two goals with the store on its own core.
            "mount_vs_get8_pinned": div(m(J_GET8_PINNED), m(J_MOUNT_COLD_PINNED)),
            "checkout_vs_floor_pinned": div(m(J_CHECKOUT_COLD_PINNED),
                                            m(J_GET8_PINNED) + write if m(J_GET8_PINNED) and write else None),
        }

    def large_cell(self, row: str, size: int) -> str:
        r = self.large(row, size)
        if not measured(r):
            return fmt_t(r)
        _, whole, bounded = J_ROWS[row]
        parts = [fmt_t(r) + (f" ({size / r.median / 1e6:.0f} MB/s)" if whole and r.median else "")]
        if r.rss_mib is not None:
            over = bounded and r.rss_mib > J_RSS_LIMIT_MIB
            rss = f"{r.rss_mib:.0f} MiB"
            parts.append("max RSS " + (f"**{rss}**" if over else rss)
                         + (" (daemon)" if row.startswith("mount") else ""))
        k = r.counts
        if k and k.requests:
            traffic = [f"{k.gets} GET" + (f" ({k.ranged} ranged)" if k.ranged else "")]
            if k.puts:
                traffic.append(f"{k.puts} PUT")
            if k.bytes_down > 1e5 or not k.puts:
                traffic.append(f"{k.bytes_down / 1e6:.1f} MB down")
            if k.bytes_up and (k.puts or k.bytes_up > 1e6):  # not the request headers alone
                traffic.append(f"{k.bytes_up / 1e6:.1f} MB up")
            if J_ROWS[row][0] == 0:
                traffic[0] = "mado's count: " + traffic[0]
            else:
                traffic.append(f"{k.connections} conn")
            parts.append(", ".join(traffic))
        return "; ".join(parts)

    def large_tables(self) -> List[str]:
        sizes = self.large_sizes()
        names = " and ".join(size_label(n) for n in sizes) or "300 MiB and 1 GiB"
        out = self.part_header(Table.J, f"j. Large files (issue #19): one file of random bytes, {names}: time "
                               "and max RSS of import, checkout, checkpoint and the mount daemon, beside the raw "
                               "GET of the same bytes and the local disk")
        if not self.results.rows(Table.J):
            return out + ["not yet measured in this run", ""]
        out += ["| case | " + " | ".join(size_label(n) for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for row in J_ROWS:
            if any(self.large(row, n) for n in sizes):
                out.append(f"| {row} | " + " | ".join(self.large_cell(row, n) for n in sizes) + " |")
        at = [self.large(J_MOUNT_RANDOM, n) for n in sizes]
        at = [r.read_at for r in at if r and r.read_at is not None]
        out += ["", " ".join([
            "A git repository holding the one large file and a tiny one, imported with `mado import-git` into "
            "the embedded store (`file://`, on this disk: local work only) and into MinIO through the proxy at "
            f"RTT {J_RTT} ms (a new store and a fresh cache each run). Checkouts are of the whole snapshot into "
            "an empty directory: cold with an empty mado cache, warm with the cache filled by an earlier "
            "checkout. The checkpoint is `mado ws checkpoint` of a plain working copy (`mado ws create --dir`) "
            "after appending 100 random bytes to the large file; its traffic is mado's own count (`--json`), "
            "as no proxy stands between mado and the embedded store. The mount rows are a read-only `mado "
            f"mount` of the MinIO store at RTT {J_RTT} ms, set up untimed (and the file looked up) before the "
            "page cache is dropped: `cat FILE > /dev/null` with an empty mado cache (cold) or one filled by an "
            "earlier mount's read (warm: that read kept a whole copy of the file in the cache, and the warm "
            "`cat` passes through to it; DESIGN.md, \"A whole copy for passthrough\"), and one 4 KiB `pread` "
            "(open, read, close) "
            + (f"at {' / '.join(f'{x / (1 << 20):g}' for x in dict.fromkeys(at))} MiB into the file" if at else
               "200 MiB into the file (half-way into a smaller one)")
            + " on a fresh mount with an empty cache, checked against the file's bytes.",
            "Max RSS is the kernel's peak resident set of the mado process (its VmHWM, which mado prints "
            "under --verbose; wait4's ru_maxrss would also count the harness's own peak); for a mount "
            "row, the daemon's VmHWM read from /proc just after the read, the daemon having served nothing "
            f"else; issue #19's bound is {J_RSS_LIMIT_MIB} MiB (bold: over it).",
            "The floors: `cp` of the file to another folder of the same disk; writing the bytes, `dd` from "
            "/dev/zero (no fsync, as a checkout); `cat` of the file from the disk; and the file as one plain "
            f"object in the same MinIO, fetched through the same proxy at RTT {J_RTT} ms by curl, in one GET or "
            "in 8 ranged GETs of equal spans in parallel (8 connections). Every timed run starts with the "
            "page cache dropped; each group of rows that a ratio compares is measured interleaved. "
            "The rows \"the store on its own core\" run MinIO and the proxy on one CPU (`taskset`) and "
            "everything else (mado, its mount daemon, curl, cat) on the other, as when the store is another "
            "machine: on two shared cores the store's CPU is taken from the reader's.",
            "`bench/run.py --only j --rtts 20` runs this scenario alone (add `--merge docs/bench-results.json` "
            "to put its table here); `--large-sizes 64M,256M` (or MADO_BENCH_LARGE_SIZES) picks other sizes "
            "for a quick look."]), ""]
        goals = [
            ("mount_vs_get8", "cold sequential read through the mount: the 8-way ranged GET's time / the mount's "
             f"(RTT {J_RTT} ms)", "≥ 80 %", lambda x: x >= 0.8, lambda x: f"{x * 100:.0f} %"),
            ("checkout_vs_floor", f"cold checkout (MinIO, RTT {J_RTT} ms) / (8-way GET + writing the bytes)",
             "≤ 1.25×", lambda x: x <= 1.25, lambda x: f"{x:.2f}×"),
            ("mount_vs_get8_pinned", "the same cold read, the store (MinIO and the proxy) on its own core",
             "≥ 80 %", lambda x: x >= 0.8, lambda x: f"{x * 100:.0f} %"),
            ("checkout_vs_floor_pinned", "the same cold checkout, the store on its own core", "≤ 1.25×",
             lambda x: x <= 1.25, lambda x: f"{x:.2f}×"),
            ("warm_mount_vs_disk", "warm read through the mount / `cat` from the local disk (page cache dropped)",
             "≤ 1.2×", lambda x: x <= 1.2, lambda x: f"{x:.2f}×"),
            ("warm_checkout_vs_cp", "warm checkout (embedded store) / `cp`", "≤ 1.3×", lambda x: x <= 1.3,
             lambda x: f"{x:.2f}×"),
            ("random_rtts", f"cold random 4 KiB read through the mount, in RTTs of {J_RTT} ms", "≤ 2 RTT",
             lambda x: x <= 2, lambda x: f"{x:.1f} RTT"),
        ]
        out += ["| goal (issue #19) | limit | " + " | ".join(size_label(n) for n in sizes) + " |",
                "|---|---|" + "---|" * len(sizes)]
        ratios = {n: self.large_ratios(n) for n in sizes}
        for what, label, limit, ok, f in goals:
            cells = []
            for n in sizes:
                x = ratios[n][what]
                cells.append("–" if x is None else f"**{f(x)}** " + ("✓" if ok(x) else "✗"))
            out.append(f"| {label} | {limit} | " + " | ".join(cells) + " |")
        for row in J_ROWS:
            if not J_ROWS[row][2]:
                continue
            cells = []
            for n in sizes:
                r = self.large(row, n)
                x = r.rss_mib if r else None
                cells.append("–" if x is None else f"**{x:.0f} MiB** " + ("✓" if x <= J_RSS_LIMIT_MIB else "✗"))
            out.append(f"| max RSS, {row} | ≤ {J_RSS_LIMIT_MIB} MiB | " + " | ".join(cells) + " |")
        return out + [""]

    # ---- scenario m: serve-virtiofs in a guest (issue #14) ----

    def virtiofs_ratios(self) -> List[Tuple[int, float]]:
        """(RTT, the guest's warm walk over its local disk's) where both ran."""
        out = []
        for r in self.rtts:
            w, d = self.med(Table.M, M_GUEST_WARM, r), self.med(Table.M, M_GUEST_DISK, r)
            if w and d:
                out.append((r, w / d))
        return out

    def virtiofs_lines(self) -> List[str]:
        x = self.virtiofs_ratios()
        if not x:
            return []
        return ["The guest is a QEMU guest (Debian 6.1 kernel, busybox; `scripts/vm-run.sh`), under KVM where "
                "/dev/kvm runs a stock kernel, else QEMU's software emulation (TCG): this machine's /dev/kvm is "
                "kvm_pvm, so its guests are emulated and their times are an emulated CPU's. Each guest time is the "
                "guest's own clock (/proc/uptime) around `find DIR -type f -exec cat {} +`, boot excluded; the cold "
                "and warm walks run in one guest (mado's cache empty, then warm with the guest's caches dropped); "
                "the local-disk walk reads a copy the guest made on an ext4 disk before dropping its caches. "
                "Counts are the proxy's over the whole guest run.", "",
                "Guest warm walk / guest local disk (goal ≤ 1.5×): "
                + ", ".join(f"RTT {r} ms: {v:.2f}×" for r, v in x), ""]

    def virtiofs_summary(self) -> List[Tuple[str, str, str, str]]:
        x = self.virtiofs_ratios()
        if not x:
            return []
        r, v = x[-1]
        return [(f"VM guest, warm walk of the dense subtree through serve-virtiofs / the guest's local disk, RTT {r} ms "
                 "(issue #14)", "–", f"≤ {M_WARM_LIMIT}×", f"{v:.2f}×")]

    # ---- scenario n: work in a workspace (issue #20) ----

    def work(self, row: str, where: str) -> Optional[Result]:
        return self.results.get(Table.N, work_system(row, where), N_RTT)

    def work_ratio(self, row: str) -> Optional[float]:
        """The mount's median over the local disk's, for one of N_ROWS."""
        a, b = self.work(row, N_LOCAL), self.work(row, N_MOUNT)
        return b.median / a.median if measured(a) and measured(b) and a.median else None

    def work_mark(self, row: str, bold: bool) -> str:
        """One row's ratio and whether its goal holds: "**1.79×** ✓"."""
        x = self.work_ratio(row)
        if x is None:
            return "–"
        return (f"**{x:.2f}×**" if bold else f"{x:.2f}×") + (" ✓" if x <= N_ROWS[row] else " ✗")

    def work_files(self) -> Optional[int]:
        return next((r.tree_files for by in self.results.rows(Table.N).values() for r in by.values()
                     if r.tree_files), None)

    @staticmethod
    def work_goals() -> str:
        """Issue #20's goals, by limit: "≤ 1.5×: git status, grep -r, …"."""
        by = {}
        for row, limit in N_ROWS.items():
            by.setdefault(limit, []).append(WORK_SHORT[row])
        return "; ".join(f"{', '.join(rows)} ≤ {limit:g}×" for limit, rows in by.items())

    def work_tables(self) -> List[str]:
        files = self.work_files()
        out = self.part_header(Table.N, "n. Work in a workspace (issue #20, part 3): git, grep, find, cat, cp -r, "
                               "rm -rf, sed -i and make on the local disk and in a read-write workspace mount of a "
                               "real tree" + (f" ({files:,} files)" if files else "") + ", warm", cold=False)
        if not self.results.rows(Table.N):
            return out + ["not yet measured in this run", ""]
        out += ["| work | local disk | workspace mount | mount / local disk | goal (issue #20) |",
                "|---|---|---|---|---|"]
        for row, limit in N_ROWS.items():
            a, b = self.work(row, N_LOCAL), self.work(row, N_MOUNT)
            if not a and not b:
                continue
            crate = (a and a.crates) or (b and b.crates)
            out.append(f"| {row}" + (f" (`{crate}`)" if crate else "") + f" | {fmt_t(a)} | {fmt_t(b)} | "
                       f"{self.work_mark(row, True)} | ≤ {limit:g}× |")
        out += ["", " ".join([
            "`bench/workspace-work.sh`: the same commands on a plain directory of the local disk and in a "
            "read-write workspace mount (`mado ws create work --from main --mount`) of the same tree, on the "
            "embedded store (`file://`, this disk: no network, no proxy), warm: every file read once through "
            "each first, and no page cache dropped between runs (as for someone at work in the tree). The tree: "
            "whole crates of this machine's cargo registry in name order until about 12,000 files "
            f"(`--quick`: {N_QUICK_FILES:,}), committed as one git commit with a generated 120-file C project, "
            "imported with `mado import-git`; the local side is a `git archive` of that commit.",
            "The git row runs once, first (`git init -q && git add -A && git commit -qm x` in each: the "
            "repository the `git status` row reads); each other row alternates a run on the local disk and "
            "one on the mount: median (min–max). `grep -r -q` of a string in no file; `find -printf %s` "
            "stats every file; `cat` of every file (`find | xargs cat`); `cp -r` of the largest top-level "
            "folder to a new one beside it; `rm -rf` of that copy (made again, untimed, before each run); "
            "`sed -i` prefixing every line of the first 500 `.rs` files that `git ls-files` lists; `make -j2` "
            "of the C project after a `make clean`. The ratio is the mount's median over the local disk's. The "
            "script times its own runs: with MADO_BENCH_QUIET_S the harness waits for a quiet machine once, "
            "before it starts (the notes count that as one timed run), not before each run.",
            "`bench/run.py --only n --rtts 0 --runs 3 --merge docs/bench-results.json` runs this scenario "
            "alone; `bench/workspace-work.sh [MADO]` (env RUNS, FILES) prints the same table by hand."]), ""]
        held = [row for row, limit in N_ROWS.items() if self.work_ratio(row) is not None
                and self.work_ratio(row) <= limit]
        out += [f"Issue #20's goals ({self.work_goals()}) hold for {len(held)} of {len(N_ROWS)} rows"
                + (": " + ", ".join(WORK_SHORT[r] for r in held) if held else "") + ".", ""]
        return out

    def work_summary(self) -> List[Tuple[str, str, str, str]]:
        if all(self.work_ratio(row) is None for row in N_ROWS):
            return []
        files = self.work_files()
        return [("work in a workspace: the workspace mount / the local disk, warm, "
                 + (f"{files:,}-file real tree " if files else "a real tree ") + "(issue #20)", "–",
                 self.work_goals(), ", ".join(f"{WORK_SHORT[row]} {self.work_mark(row, False)}" for row in N_ROWS))]

    # ---- scenario o: a fleet of agents (issue #47) ----

    def fleet(self) -> List[Result]:
        return sorted((by[O_RTT] for by in self.results.rows(Table.O).values() if by.get(O_RTT)),
                      key=lambda r: r.agents or 0)

    def fleet_goals(self) -> List[Tuple[str, bool]]:
        """Issue #47's goals this run can judge, each with whether it holds."""
        rows = self.fleet()
        if not rows:
            return []
        big, one = rows[-1], rows[0]
        f = lambda x: "–" if x is None else f"{x:.1f}"  # noqa: E731
        out = [(f"{big.agents} mounts at once, every checkpoint landed", big.landed == big.agents),
               ("ws create --mount ≤ 0.1 s on average", all(r.median is not None and r.median <= 0.1 for r in rows))]
        if big.mem_idle_mib is not None:
            out.append((f"≤ 8 MiB in use per idle workspace ({big.mem_idle_mib:.1f}; PSS "
                        f"{f(big.pss_idle_mib)})", big.mem_idle_mib <= 8 and (big.pss_idle_mib or 0) <= 8))
        if big.mem_read_mib is not None:
            out.append((f"≤ 16 MiB per workspace after reading ({big.mem_read_mib:.1f}; PSS "
                        f"{f(big.pss_read_mib)})", big.mem_read_mib <= 16 and (big.pss_read_mib or 0) <= 16))
        if big.cache_x is not None:
            out.append((f"disk cache ≤ 1.25× one workspace's ({big.cache_x:.2f}×)", big.cache_x <= 1.25))
        if big.p99_ms and one.p99_alone_ms:
            # Alone: before the loop, beside one idle workspace (N = 1's
            # row) and beside all N idle (this row's): both are reported,
            # the goal judged on the worse.
            x = big.p99_ms / one.p99_alone_ms
            x_own = big.p99_ms / big.p99_alone_ms if big.p99_alone_ms else x
            floor = ""
            if big.p99_local_ms:
                floor = f"; the same reader on the local disk beside them {big.p99_local_ms / one.p99_alone_ms:.2f}×"
            out.append((f"reader p99 at {big.agents} agents ≤ 1.5× alone ({x:.2f}× alone beside one idle "
                        f"workspace, {x_own:.2f}× beside {big.agents} idle{floor})", max(x, x_own) <= 1.5))
        return out

    def fleet_tables(self) -> List[str]:
        rows = self.fleet()
        files = next((r.tree_files for r in rows if r.tree_files), None)
        out = self.part_header(Table.O, "o. A fleet of agents (issue #47): N workspace mounts of one real tree"
                               + (f" ({files:,} files)" if files else "") + ", each agent editing, grepping "
                               "and checkpointing at once", cold=False)
        if not rows:
            return out + ["not yet measured in this run", ""]
        out += ["| agents | `ws create --mount` (avg) | MiB in use per idle ws | MiB per ws after reading | "
                "daemon private MiB per ws | daemon PSS MiB per ws, idle / after reading | cache × one ws | "
                "reader p50 ms alone / busy | reader p99 ms alone / busy | local disk p99 ms alone / busy | "
                "busy p99 × local disk's | checkpoints/s | last checkpoint has its edit |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        f = lambda x, d=1: "–" if x is None else f"{x:.{d}f}"  # noqa: E731
        for r in rows:
            out.append(f"| {r.agents} | {f(r.median, 3)} s | {f(r.mem_idle_mib)} | {f(r.mem_read_mib)} | "
                       f"{f(r.private_mib)} | {f(r.pss_idle_mib)} / {f(r.pss_read_mib)} | {f(r.cache_x, 2)}× | {f(r.p50_alone_ms, 3)} / {f(r.p50_ms, 3)} | "
                       f"{f(r.p99_alone_ms, 3)} / {f(r.p99_ms, 3)} | {f(r.p99_local_alone_ms, 3)} / {f(r.p99_local_ms, 3)} | "
                       f"{f(r.p99_ms / r.p99_local_ms if r.p99_ms and r.p99_local_ms else None, 2)} | "
                       f"{f(r.ckpt_per_s)} | {r.landed} of {r.agents} |")
        out += ["", " ".join([
            "`bench/fleet.py`: for each N, N workspaces created one after another (`mado ws create aI --from "
            "main --mount`), each a mount daemon of its own over one disk cache and the embedded store; every "
            "agent then reads the same ~3,000-file subtree (16 at a time), and all N run two rounds of: append "
            "a line to a file of their own, `grep -r` a string in no file over a directory, `mado ws "
            "checkpoint`, while a foreground reader reads 1,000 of the subtree's files in workspace 0 again "
            "and again (per-file latency: open, read, close; unbuffered, as `cat` reads: no isatty() ioctl, which FUSE "
            "would send to the daemon, docs/DESIGN.md \"Mounts\"; it makes no request to workspace 0's daemon, whose "
            "counts fleet.py prints). Alone, before the loop, the reader makes one pass to warm both page caches, "
            "then 30 measured passes (30,000 reads, so the p99 is not the luck of a few dozen); beside the agents "
            "it reads until the loop ends (about a hundred passes at N = 100). Memory in use is MemTotal − MemAvailable before "
            "and after, over N (it holds whatever the process design; other work on the machine moves it); "
            "the daemon's private memory is `mado stats --all`'s (RssAnon + swap), after reading; PSS is "
            "each daemon's proportional set size (/proc/PID/smaps_rollup: a page shared by k processes, such "
            "as the binary's text or a mapped index layer, counts 1/k), which other processes do not move. "
            "The reader is a process of its own; pass for pass it reads the same files on the local disk "
            "(the git working tree the tree was imported from), so both wait alike for a CPU: on two cores, "
            "N agents' grep and checkpoint processes and N daemons compete with them. The local disk's p99 "
            "beside the agents is the floor under the mount's. The cache is its bytes on "
            "disk against the same after the first N's workspace read the subtree. Each workspace's last "
            "checkpoint is read back with `mado cat ws/NAME` and must hold its agent's last edit.",
            "`bench/run.py --only o --rtts 0 --merge docs/bench-results.json` runs this scenario alone; "
            "`bench/fleet.py MADO [--sizes 1,10,30,100]` prints the same table by hand."]), ""]
        goals = self.fleet_goals()
        out += ["Issue #47's goals: " + "; ".join(f"{g} {'✓' if ok else '✗'}" for g, ok in goals) + ".", ""]
        return out

    def fleet_plot(self, plt, outdir: str) -> bool:
        rows = [r for r in self.fleet() if r.agents]
        if not rows:
            return False
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
        n = [r.agents for r in rows]
        for label, key in (("in use, idle", "mem_idle_mib"), ("in use, after reading", "mem_read_mib"),
                           ("daemon private", "private_mib")):
            pts = [(x, getattr(r, key)) for x, r in zip(n, rows) if getattr(r, key) is not None]
            if pts:
                a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        a.set_xlabel("agents (workspace mounts)")
        a.set_ylabel("MiB per workspace")
        a.set_xscale("log")
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
        for label, key in (("p50 busy", "p50_ms"), ("p99 busy", "p99_ms"), ("p99 alone", "p99_alone_ms"),
                           ("local disk p99 busy", "p99_local_ms")):
            pts = [(x, getattr(r, key)) for x, r in zip(n, rows) if getattr(r, key) is not None]
            if pts:
                b.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        b.set_xlabel("agents (workspace mounts)")
        b.set_ylabel("foreground read latency (ms)")
        b.set_xscale("log")
        b.set_yscale("log")
        b.grid(True, which="both", alpha=0.3)
        b.legend(fontsize=7)
        fig.suptitle("o: a fleet of agents")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "bench-o.png"), dpi=90)
        plt.close(fig)
        return True

    def fleet_summary(self) -> List[Tuple[str, str, str, str]]:
        rows = self.fleet()
        if not rows:
            return []
        big = rows[-1]
        return [(f"a fleet of {big.agents} workspace mounts on one machine (issue #47)", "–",
                 "≤ 8 MiB per idle ws, ≤ 16 MiB after reading, p99 ≤ 1.5×",
                 f"{big.mem_idle_mib:.1f} / {big.mem_read_mib:.1f} MiB, p99 {big.p99_ms:.2f} ms"
                 if big.mem_idle_mib is not None and big.mem_read_mib is not None and big.p99_ms is not None
                 else "–")]

    # ---- scenario p: a million files (issue #46) ----

    def scale_sizes(self) -> List[int]:
        return sorted({r.tree_files for by in self.results.rows(Table.P).values() for r in by.values()
                       if r.tree_files})

    def scale(self, label: str, files: int) -> Optional[Result]:
        return self.results.get(Table.P, p_system(label, files), P_RTT)

    def scale_tables(self) -> List[str]:
        sizes = self.scale_sizes()
        out = self.part_header(Table.P, "p. A million files (issue #46): time and memory against the tree's size",
                               cold=False)
        if not sizes:
            return out + ["not yet measured in this run", ""]
        out += ["| | " + " | ".join(f"{n:,} files" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for label, _, _ in P_ROWS:
            cells = []
            for n in sizes:
                r = self.scale(label, n)
                cells.append("–" if not r or r.median is None else f"{r.median:.2f} s ({r.median / n * 1e6:.1f} µs/file)")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        for label, _ in P_MEM_ROWS:
            cells = []
            for n in sizes:
                r = self.scale(label, n)
                cells.append("–" if not r or r.rss_mib is None else
                             f"{r.rss_mib:.1f} MiB ({r.rss_mib * 2**20 / n:.0f} B/file)")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        label, _ = P_UP_ROW
        cells = []
        for n in sizes:
            r = self.scale(label, n)
            cells.append("–" if not r or r.up_bytes is None else f"{r.up_bytes / 1024:.1f} KiB")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
        out += ["", " ".join([
            "`bench/scale.sh`: a synthetic monorepo of TOPS × 10 × 100 small Rust files (one git commit made "
            "with `git fast-import`), imported into the embedded store; then `mado mount` of it, `find -printf "
            "%s` over the mount and over git's own checkout with the page cache dropped before each, `mado ws "
            "create --mount`, `mado ws status` with 10 files edited, the second of two checkpoints of 10 "
            "edits each (in 10 top directories) and what it sent, and `mado ws resume --mount` of the workspace "
            "into a new folder. Memory is the import's max RSS and each daemon's private memory (RssAnon); \"once "
            "the kernel forgot\" is the read-only mount's daemon after `drop_caches` made the kernel forget the "
            "walk's inodes and its threads took requests again (400 lookups, then 10 s: a thread gives back "
            "what it freed as it takes a request). Issue #46's goals at 1M files: at most 300 bytes a file "
            "after the walk, and within 2× the figure at rest once forgotten. What "
            "should follow the change (mount, create, status, the checkpoint) must stay flat in seconds as "
            "the tree grows; what follows the tree (import, the walk) must stay flat per file.",
            "`bench/run.py --only p --rtts 0 --merge docs/bench-results.json` runs this scenario alone "
            "(10k to 1M files, about 20 minutes); `bench/scale.sh [MADO] [TOPS...]` prints its table by hand."]),
            ""]
        return out

    def scale_plot(self, plt, outdir: str) -> bool:
        sizes = self.scale_sizes()
        if not sizes:
            return False
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
        for label, _, _ in P_ROWS:
            pts = [(n, r.median / n * 1e6) for n in sizes for r in [self.scale(label, n)] if r and r.median]
            if pts:
                a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        a.set_xlabel("files in the tree")
        a.set_ylabel("µs per file")
        for ax in (a, b):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=6)
        for label, _ in P_MEM_ROWS:
            pts = [(n, r.rss_mib * 2**20 / n) for n in sizes for r in [self.scale(label, n)] if r and r.rss_mib]
            if pts:
                b.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        b.set_xlabel("files in the tree")
        b.set_ylabel("bytes per file")
        b.legend(fontsize=6)
        fig.suptitle("p: a million files")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "bench-p.png"), dpi=90)
        plt.close(fig)
        return True

    def large_summary(self) -> List[Tuple[str, str, str, str]]:
        """Summary rows for scenario j, at its largest size."""
        sizes = self.large_sizes()
        if not sizes:
            return []
        n = sizes[-1]
        rss = []
        for row in (J_IMPORT_LOCAL, J_CHECKOUT_COLD, J_CHECKPOINT, J_MOUNT_COLD):
            r = self.large(row, n)
            rss.append(f"{r.rss_mib:.0f}" if r and r.rss_mib is not None else "–")
        x = self.large_ratios(n)
        t = lambda row: fmt_t(self.large(row, n)).split(" (")[0]  # noqa: E731
        pct = f"{x['mount_vs_get8'] * 100:.0f} %" if x["mount_vs_get8"] else "–"
        r = lambda k: f"{x[k]:.2f}×" if x[k] else "–"  # noqa: E731
        label = size_label(n)
        return [
            (f"large file ({label}): max RSS of import-git / cold checkout / ws checkpoint / mount daemon "
             "(issue #19)", "–", f"≤ {J_RSS_LIMIT_MIB} MiB each", " / ".join(rss) + " MiB"),
            (f"large file ({label}): cold `cat` through the mount, RTT {J_RTT} ms", "–",
             "≥ 80 % of an 8-way ranged GET's throughput", f"{t(J_MOUNT_COLD)}: {pct}"),
            (f"large file ({label}): warm mount read / local disk; warm checkout / cp", "–", "≤ 1.2×; ≤ 1.3×",
             f"{r('warm_mount_vs_disk')}; {r('warm_checkout_vs_cp')}"),
        ]

    def large_plot(self, plt, outdir) -> bool:
        sizes = self.large_sizes()
        rows = [row for row in J_ROWS if any(self.large_med(row, n) for n in sizes)]
        if not rows:
            return False
        fig, ax = plt.subplots(figsize=(10, 0.22 * len(rows) * len(sizes) + 1.5))
        h = 0.8 / len(sizes)
        for i, n in enumerate(sizes):
            ys = [k + i * h for k in range(len(rows))]
            ax.barh(ys, [self.large_med(row, n) or 0 for row in rows], height=h, label=size_label(n))
        ax.set_yticks([k + h * (len(sizes) - 1) / 2 for k in range(len(rows))])
        ax.set_yticklabels(rows, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("wall time (s, median)")
        ax.set_title("j: large files")
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "bench-j.png"), dpi=90, bbox_inches="tight")
        plt.close(fig)
        return True

    # ---- scenario k: checkpoint after k edits (issue #18) ----

    def ck_sizes(self) -> List[int]:
        return sorted({r.tree_files for by in self.results.rows(Table.K).values() for r in by.values()
                       if r.tree_files})

    def ck_rtts(self) -> List[int]:
        return sorted({rtt for by in self.results.rows(Table.K).values() for rtt in by})

    def ck(self, row: str, files: int, rtt: int) -> Optional[Result]:
        return self.results.get(Table.K, ck_system(row, files), rtt)

    @staticmethod
    def kib(n: Optional[int]) -> str:
        return "–" if n is None else f"{n / 1024:.1f} KiB"

    def ck_cell(self, row: str, files: int, rtt: int) -> str:
        r = self.ck(row, files, rtt)
        if not measured(r):
            return fmt_t(r)
        parts = [fmt_t(r)]
        k = r.counts
        if row == K_GIT:
            if k:
                parts.append(f"{self.kib(k.bytes_up)} up (the git proxy's count), {k.connections} conn")
            return "; ".join(parts)
        if r.round_trips is not None:
            parts.append(f"{r.round_trips} round trips")
        if k and k.requests:
            parts.append(f"{k.puts} PUT, {k.gets} GET, {k.heads} HEAD")
        up = [f"**{self.kib(r.up_bytes)} up**"]
        if r.max_up_bytes and r.up_bytes and r.max_up_bytes > 1.2 * r.up_bytes:
            up.append(f"(max {self.kib(r.max_up_bytes)})")
        up.append(f"(index layer {self.kib(r.index_bytes)}, stat layer {self.kib(r.stat_bytes)}"
                  + (f"; the edited files {self.kib(r.content_bytes)}" if r.content_bytes else "") + ")")
        parts.append(" ".join(up))
        if row == K_TOUCH and r.changed is not None:
            parts.append(f"{r.changed:,} touched, {r.files_read:,} files read" if r.files_read is not None
                         else f"{r.changed:,} touched")
        return "; ".join(parts)

    def ck_values(self, files: int) -> dict:
        """Issue #18's figures at one tree size (None where a cell is missing)."""
        at = K_GOAL_RTT if K_GOAL_RTT in self.ck_rtts() else (self.ck_rtts() or [0])[-1]
        m, g, t = (self.ck(x, files, at) for x in (K_CHECKPOINT, K_GIT, K_TOUCH))
        ok = lambda r: r is not None and r.median is not None  # noqa: E731
        smallest = self.ck(K_CHECKPOINT, self.ck_sizes()[0], at)
        return {
            "at": at,
            "vs_git": m.median / g.median if ok(m) and ok(g) and g.median else None,
            "up": m.up_bytes if ok(m) else None,
            "flat": m.up_bytes / smallest.up_bytes if ok(m) and ok(smallest) and m.up_bytes is not None
            and smallest.up_bytes else None,
            "rtts": m.round_trips - K_WALK_RTTS if ok(m) and m.round_trips is not None else None,
            "heads": m.counts.heads if ok(m) and m.counts and m.counts.heads is not None else None,
            "puts": m.counts.puts if ok(m) and m.counts and m.counts.puts is not None else None,
            "touch_up": t.up_bytes if ok(t) else None,
            "touched": t.changed if ok(t) else None,
        }

    def ck_tables(self) -> List[str]:
        sizes = self.ck_sizes()
        names = " / ".join(f"{n:,}" for n in sizes) or "5,000 / 20,000 / 40,000"
        out = self.part_header(Table.K, f"k. Checkpoint after {K_EDITS} edits (issue #18): `mado ws checkpoint` of a "
                               f"plain working copy of {names} files, beside `git commit -a && git push` of the "
                               "same edit", cold=False)
        if not self.results.rows(Table.K):
            return out + ["not yet measured in this run", ""]
        rtts = self.ck_rtts()
        out += ["| case | " + " | ".join(f"{n:,} files" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for rtt in rtts:
            for row in K_ROWS:
                if any(self.ck(row, n, rtt) for n in sizes):
                    out.append(f"| {row}, RTT {rtt} ms | " + " | ".join(self.ck_cell(row, n, rtt) for n in sizes)
                               + " |")
        out += ["", " ".join([
            "The trees: synthetic source files (`fn main() {…}`, 5 to 60 short lines, about 1.3 KB), 10 per "
            "directory, under three levels of 10-way directories (`m<NN>/p<N>/d<N>/f<N>.rs`, one top-level "
            "folder per 1,000 files), committed to git, imported with `mado import-git` straight into MinIO "
            "(untimed) and checked out as a plain working copy (`mado ws create NAME --dir W`) through the S3 "
            "proxy; the same commit cloned for git, whose `origin` is a bare repository that `git daemon` "
            "serves through the git proxy (the one scenarios d and h use). Setup ends with a warm-up: one edit "
            "checkpointed and the same edit committed and pushed (the first checkpoint after an import writes "
            "whole metadata).",
            f"Each round appends one line to {K_EDITS} files, one in each of {K_EDITS} directories spread over "
            "the tree (other files each round), and times `mado ws checkpoint --dir W --json` through the S3 "
            "proxy; then the same edit in the git clone and `git commit -qam … && git push -q` through the git "
            f"proxy; then `touch` (a new mtime, the content unchanged) of {K_TOUCHES:,} files spread over the "
            "tree (half the tree when it is smaller) and a checkpoint. The three rows are measured interleaved "
            "(one run of each in turn), with the page cache warm, as for an agent that checkpoints every minute "
            "(dirty pages are flushed before each run, not dropped), and with the workspace's mado cache kept "
            "from run to run.",
            "Round trips, bytes up, the index layer and the stat layer are mado's own counts (`--json`: "
            "`remote.round_trips`, `remote.bytes_up` (bodies only), `index_bytes`, `stat_bytes`), medians over "
            "the runs; PUT, GET and HEAD are the proxy's. The bytes up include the edited files' new content "
            "(their size after the edit, beside it, before compression); git's bytes up are what the git proxy "
            "saw go up (the pack and the protocol).",
            "A checkpoint's requests: the lease GET ‖ the ref ‖ the writer lock's PUT, then the lease's conditional "
            "PUT ‖ the lock's LIST (both while the working copy is walked); then the stat layer ‖ the snapshot "
            "‖ the delta pack ‖ the index layer (a conditional PUT), the ref's compare-and-swap and the lock's "
            "DELETE (since d922150; before, an index HEAD went with the pack and the index after it). "
            "mado's counter gives a request that starts after another has completed one more round trip, so a "
            "pack whose build outlasts a round trip counts one of its own. Every 8th layer of a chain is written "
            "over the bottom index instead, holding every change since it (PACKS.md, \"Layers\"): the max beside "
            "a median is that checkpoint.",
            "`bench/run.py --only k --rtts 0,20` runs this scenario alone (add `--merge "
            "docs/bench-results.json` to put its table here); `--ck-sizes 5000,20k` (or MADO_BENCH_CK_SIZES) "
            "picks the tree sizes."]), ""]
        vals = {n: self.ck_values(n) for n in sizes}
        at = vals[sizes[0]]["at"]
        touched = [vals[n]["touched"] for n in sizes if vals[n]["touched"]]
        touch_limit = lambda n: K_META_LIMIT + K_TOUCH_PER_FILE * (vals[n]["touched"] or 0)  # noqa: E731
        goals = [
            ("vs_git", f"wall time: mado ws checkpoint / git commit -a && git push (RTT {at} ms)", f"≤ {K_VS_GIT}×",
             lambda x, n: x <= K_VS_GIT, lambda x: f"{x:.2f}×"),
            ("up", f"bytes up by a {K_EDITS}-file checkpoint, all of it (the edited files' content too, so at "
             "least its metadata)", f"≤ {K_META_LIMIT >> 10} KiB of metadata", lambda x, n: x <= K_META_LIMIT,
             self.kib),
            ("flat", "the same, over the smallest tree's", f"≤ {K_FLAT}×", lambda x, n: x <= K_FLAT,
             lambda x: f"{x:.2f}×"),
            ("rtts", f"sequential round trips after the walk (mado's count less the {K_WALK_RTTS} made while it "
             "walks: lease, ref, writer lock; the last is the lock's DELETE, after the ref moved)",
             f"≤ {K_RTTS_AFTER_WALK}", lambda x, n: x <= K_RTTS_AFTER_WALK, str),
            ("heads", f"HEADs of a {K_EDITS}-file checkpoint", "none per directory or object", None, str),
            ("puts", f"PUTs of a {K_EDITS}-file checkpoint", "–", None, str),
            ("touch_up", "bytes up after touching "
             + (f"{touched[-1]:,}" if len(set(touched)) == 1 else " / ".join(f"{x:,}" for x in touched))
             + " mtimes", f"≤ {K_META_LIMIT >> 10} KiB + {K_TOUCH_PER_FILE} B a file",
             lambda x, n: x <= touch_limit(n), self.kib),
        ]
        out += ["| goal (issue #18) | limit | " + " | ".join(f"{n:,} files" for n in sizes) + " |",
                "|---|---|" + "---|" * len(sizes)]
        for what, label, limit, ok, f in goals:
            cells = []
            for n in sizes:
                x = vals[n][what]
                if x is None or (what == "flat" and n == sizes[0]):
                    cells.append("–")
                elif ok is None:
                    cells.append(f(x))
                else:
                    cells.append(f"**{f(x)}** " + ("✓" if ok(x, n) else "✗"))
            out.append(f"| {label} | {limit} | " + " | ".join(cells) + " |")
        return out + [""]

    def ck_summary(self) -> List[Tuple[str, str, str, str]]:
        """A summary row for scenario k, at its largest tree, RTT 20."""
        sizes = self.ck_sizes()
        if not sizes:
            return []
        n = sizes[-1]
        x = self.ck_values(n)
        m = self.ck(K_CHECKPOINT, n, x["at"])
        if not m or m.median is None:
            return []
        return [(f"checkpoint after {K_EDITS} edits, {n:,}-file tree, RTT {x['at']} ms (issue #18)", "–",
                 f"≤ {K_VS_GIT}× git commit -a && git push; ≤ {K_META_LIMIT >> 10} KiB up, flat from the "
                 f"smallest tree (≤ {K_FLAT}×); ≤ {K_RTTS_AFTER_WALK} round trips after the walk",
                 fmt_t(m).split(" (")[0]
                 + (f": {x['vs_git']:.2f}× git's" if x["vs_git"] else "")
                 + f"; {self.kib(x['up'])} up" + (f" ({x['flat']:.2f}× the {sizes[0]:,}-file tree's)"
                                                   if x["flat"] and len(sizes) > 1 else "")
                 + (f"; {x['rtts']} round trips after the walk" if x["rtts"] is not None else ""))]

    def ck_plot(self, plt, outdir) -> bool:
        sizes, rtts = self.ck_sizes(), self.ck_rtts()
        if not sizes:
            return False
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        styles = ["--", "-", ":", "-."]  # by RTT; the colour is the system
        for i, rtt in enumerate(rtts):
            for row, label, colour in ((K_CHECKPOINT, "mado ws checkpoint", "C0"),
                                       (K_GIT, "git commit -a && git push", "C3")):
                pts = [(n, self.ck(row, n, rtt).median) for n in sizes
                       if self.ck(row, n, rtt) and self.ck(row, n, rtt).median is not None]
                if pts:
                    ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colour,
                             linestyle=styles[i % len(styles)], label=f"{label}, RTT {rtt} ms")
        ax1.set_xlabel("files in the tree")
        ax1.set_ylabel("wall time (s, median)")
        ax1.set_title(f"k: {K_EDITS} files edited")
        ax1.set_xscale("log")
        ax1.set_yscale("log")
        ax1.grid(True, which="both", alpha=0.3)
        ax1.legend(fontsize=7)
        at = self.ck_values(sizes[0])["at"]
        for row, field, label in ((K_CHECKPOINT, "up_bytes", f"{K_EDITS} edits: bytes up"),
                                  (K_CHECKPOINT, "index_bytes", f"{K_EDITS} edits: index layer"),
                                  (K_CHECKPOINT, "stat_bytes", f"{K_EDITS} edits: stat layer"),
                                  (K_TOUCH, "up_bytes", "mtimes touched: bytes up")):
            pts = [(n, getattr(self.ck(row, n, at), field)) for n in sizes
                   if self.ck(row, n, at) and getattr(self.ck(row, n, at), field) is not None]
            if pts:
                ax2.plot([p[0] for p in pts], [p[1] / 1024 for p in pts], marker="o", label=label)
        ax2.axhline(K_META_LIMIT / 1024, color="grey", linestyle="--", label=f"{K_META_LIMIT >> 10} KiB")
        ax2.set_xlabel("files in the tree")
        ax2.set_ylabel(f"KiB (mado's count, RTT {at} ms)")
        ax2.set_title("k: what a checkpoint uploads")
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "bench-k.png"), dpi=90, bbox_inches="tight")
        plt.close(fig)
        return True

    # ---- scenario l: import of a real tree against git push (issue #13) ----

    def l_sizes(self) -> List[int]:
        """The synthetic trees' sizes (rows `l_system(row, n)`)."""
        return sorted({r.tree_files for s, by in self.results.rows(Table.L).items() if s not in L_ROWS
                       for r in by.values() if r.tree_files})

    def l_tree(self) -> Optional[Result]:
        """A cell of the real tree's first import, which says its size."""
        for r in self.results.rows(Table.L).get(L_IMPORT, {}).values():
            if r.tree_files:
                return r
        return None

    @staticmethod
    def l_put_limit(size: int) -> int:
        return -(-size // L_PUT_BYTES) + L_PUT_EXTRA

    def l_cell(self, system: str, rtt: int) -> str:
        r = self.results.get(Table.L, system, rtt)
        if not measured(r):
            return fmt_t(r)
        parts = [fmt_t(r)]
        k = r.counts
        up = lambda n: f"{n / 1e6:.1f} MB up" if n >= 1e5 else f"{n / 1024:.1f} KiB up"  # noqa: E731
        if k and k.requests:  # the S3 proxy: mado
            parts.append(f"{k.puts} PUT, {k.heads} HEAD, {k.gets} GET, " + up(k.bytes_up or 0))
        elif k and k.bytes_up is not None:  # the git proxy
            parts.append(up(k.bytes_up) + f", {k.connections} conn")
        if r.round_trips is not None:
            parts.append(f"{r.round_trips} round trips")
        return "; ".join(parts)

    def l_ratio(self, num: str, den: str, rtt: int) -> Optional[float]:
        a, b = self.med(Table.L, num, rtt), self.med(Table.L, den, rtt)
        return a / b if a is not None and b else None

    def l_tables(self) -> List[str]:
        tree = self.l_tree()
        size = f"{tree.tree_files:,} files, {tree.tree_bytes / 1e6:.0f} MB" if tree else "about 15,000 files"
        out = self.part_header(Table.L, f"l. Import of a real tree ({size}) against `git push` of it, and of the "
                               f"next commit ({L_CHANGED} files changed) (issue #13)")
        rows = self.results.rows(Table.L)
        if not rows:
            return out + ["not yet measured in this run", ""]
        rtts = self.rtts
        out += ["| system | " + " | ".join(f"RTT {r} ms" for r in rtts) + " |", "|---|" + "---|" * len(rtts)]
        for system in rows:
            out.append(f"| {system} | " + " | ".join(self.l_cell(system, r) for r in rtts) + " |")
        sizes = self.l_sizes()
        out += ["", " ".join(x for x in [
            "The tree is scenario i's (this machine's cargo registry crate sources as one git commit). "
            "`mado import-git REPO --json` runs through the S3 proxy into a new store (its own prefix in the "
            "bucket) with an empty mado cache; `git push -q git://…/l-push.git main:main` goes through the git "
            "proxy into a fresh empty bare repository that `git daemon` serves (the transport of scenario d); "
            "the page cache is dropped before each run. The next commit appends a line to "
            f"{L_CHANGED} `.rs` files spread over the tree (`l-next`, main's child): `mado import-git REPO --rev "
            "l-next` into a store that already holds the first (imported straight into MinIO in setup, "
            "untimed), with the cache that setup import left (as on the machine that made the first import) "
            "and, in the `cold cache` row, with an empty one; `git push` of `l-next` to a bare repository that "
            "already holds main. Each group's rows are measured interleaved (one run of each in turn).",
            "PUT, HEAD and GET are the proxy's counts and the first MB up its bytes (requests and bodies); "
            "round trips are mado's own count of its longest chain of dependent requests (`--json`: "
            "`remote.round_trips`); git's MB up are what the git proxy saw go up (pack and protocol).",
            (f"The rows marked `[N files]` are synthetic source trees (scenario k's generator: 10 small files a "
             f"directory), first import and push only, at RTT {L_BIG_RTT} ms only (`--import-sizes`)."
             if sizes else ""),
            "`bench/run.py --only l --rtts 0,20,50 --runs 3 --merge docs/bench-results.json` runs this "
            "scenario alone; `--import-sizes 78k` adds a Linux-sized synthetic tree."]), ""]
        out += ["| goal (issue #13) | limit | " + " | ".join(f"RTT {r} ms" for r in rtts) + " |",
                "|---|---|" + "---|" * len(rtts)]

        def mark(x, ok, f):
            if x is None:
                return "–"
            return f"**{f(x)}** " + ("✓" if ok(x) else "✗") if ok else f(x)

        def line(label, limit, value, ok, f, only=None):
            cells = [mark(value(r), ok, f) if only is None or r == only else "–" for r in rtts]
            out.append(f"| {label} | {limit} | " + " | ".join(cells) + " |")

        ratio = lambda x: f"{x:.2f}×"  # noqa: E731
        get = lambda system, r: self.results.get(Table.L, system, r)  # noqa: E731
        line("first import: mado import-git / git push", f"≤ {L_VS_PUSH:g}×",
             lambda r: self.l_ratio(L_IMPORT, L_PUSH, r), lambda x: x <= L_VS_PUSH, ratio)
        if tree:
            limit = self.l_put_limit(tree.tree_bytes)
            line(f"first import: PUTs ({tree.tree_bytes / (1 << 20):.0f} MiB of content)",
                 f"≤ 1 per {L_PUT_BYTES >> 20} MiB + {L_PUT_EXTRA} = {limit}",
                 lambda r: get(L_IMPORT, r).counts.puts if get(L_IMPORT, r) and get(L_IMPORT, r).counts else None,
                 lambda x: x <= limit, str)
        line("first import: bytes up (mado's count, bodies) / the tree's bytes", "–",
             lambda r: get(L_IMPORT, r).up_bytes / tree.tree_bytes
             if tree and get(L_IMPORT, r) and get(L_IMPORT, r).up_bytes is not None else None, None, ratio)
        for row, what in ((L_NEXT, "next commit"), (L_NEXT_COLD, "next commit, cold cache")):
            if row not in rows:
                continue
            line(f"{what}: sequential round trips", f"≤ {L_NEXT_RTTS}",
                 lambda r, row=row: get(row, r).round_trips if get(row, r) else None, lambda x: x <= L_NEXT_RTTS,
                 str)
            line(f"{what}: bytes up (mado's count, bodies) / the changed files' bytes", "proportional to the change",
                 lambda r, row=row: get(row, r).up_bytes / get(row, r).content_bytes
                 if get(row, r) and get(row, r).up_bytes is not None and get(row, r).content_bytes else None,
                 None, lambda x: f"{x:.2f}×" if x < 10 else f"{x:,.0f}×")
            line(f"{what}: mado import-git / git push", "–", lambda r, row=row: self.l_ratio(row, L_NEXT_PUSH, r),
                 None, ratio)
        for n in sizes:
            line(f"first import of a synthetic {n:,}-file tree: mado / git push", f"≤ {L_VS_PUSH:g}× at RTT "
                 f"{L_BIG_RTT} ms", lambda r, n=n: self.l_ratio(l_system(L_IMPORT, n), l_system(L_PUSH, n), r),
                 lambda x: x <= L_VS_PUSH, ratio, only=L_BIG_RTT)
        nxt = [get(L_NEXT, r) for r in rtts if get(L_NEXT, r) and get(L_NEXT, r).content_bytes]
        if nxt:
            out += ["", f"The next commit's {L_CHANGED} changed files hold {nxt[0].content_bytes / 1024:.1f} KiB "
                    "after the change (before compression)."]
        return out + [""]

    def l_summary(self) -> List[Tuple[str, str, str, str]]:
        tree = self.l_tree()
        pairs = [(r, self.l_ratio(L_IMPORT, L_PUSH, r)) for r in self.rtts]
        pairs = [(r, x) for r, x in pairs if x is not None]
        if not tree or not pairs:
            return []
        t = lambda system, r: fmt_t(self.results.get(Table.L, system, r)).split(" (")[0]  # noqa: E731
        rows = [(f"first import of a real {tree.tree_files:,}-file tree against `git push` of it, RTT "
                 + " / ".join(str(r) for r, _ in pairs) + " ms (issue #13)", IMPORT_VS_PUSH.seed,
                 IMPORT_VS_PUSH.goal,
                 " / ".join(f"{x:.1f}×" for _, x in pairs) + " ("
                 + " / ".join(f"{t(L_IMPORT, r)} against {t(L_PUSH, r)}" for r, _ in pairs) + ")")]
        at = 20 if 20 in self.rtts else self.rtts[-1]
        n = self.results.get(Table.L, L_NEXT, at)
        if n and n.median is not None:
            rows.append((f"import of the next commit ({L_CHANGED} files changed), RTT {at} ms", "–",
                         f"≤ {L_NEXT_RTTS} round trips; bytes up proportional to the change",
                         f"{t(L_NEXT, at)}; {n.round_trips} round trips; "
                         + (f"{n.up_bytes / 1024:.0f} KiB up" if n.up_bytes is not None else "")
                         + (f" for {n.content_bytes / 1024:.1f} KiB changed" if n.content_bytes else "")))
        return rows

    def import_vs_push(self) -> List[Tuple[int, Result, Result]]:
        """(RTT, mado's import, git push) at each RTT where both were measured."""
        out = []
        for r in self.rtts:
            m, g = self.results.get(Table.D, IMPORT_ROW, r), self.results.get(Table.D, GIT_PUSH_ROW, r)
            if m and g and m.median and g.median:
                out.append((r, m, g))
        return out

    def push_ratio_line(self) -> List[str]:
        pairs = self.import_vs_push()
        if not pairs:
            return []
        return [f"mado import-git / git push (goal {IMPORT_VS_PUSH.goal}, issue #13): "
                + ", ".join(f"**{m.median / g.median:.1f}×** at RTT {r} ms" for r, m, g in pairs), ""]

    def ratios(self, sub: Subtree) -> List[str]:
        """mado v2 (mount and materialize) against the best peer, per RTT."""
        lines = []
        peers = self.results.rows(PEERS[sub])
        for r in self.rtts:
            best = None
            for system, by in peers.items():
                row = by.get(r)
                if row and row.median is not None and (best is None or row.median < best[1]):
                    best = (system, row.median)
            mine = self.results.get(MATERIALIZE[sub], V2_MATERIALIZE, r)
            mine = mine.median if mine else None
            mount = self.results.get(MOUNT[sub], V2_MOUNT, r)
            mount = mount.median if mount else None
            if best and mine:
                lines.append(f"| {sub.value} | {r} | {best[0]}: {best[1]:.3f} s | materialize {mine:.3f} s "
                             f"(**{best[1] / mine:.1f}×** faster) | mount walk "
                             + (f"{mount:.3f} s (**{best[1] / mount:.1f}×**)" if mount else "–") + " |")
        return lines

    def plots(self, outdir: str) -> List[str]:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            self.run.notes.append("matplotlib is missing: no plots (scripts/ensure-deps.sh --bench installs it)")
            return []
        made = []
        for key in self.results.tables():
            if key == Table.J:  # not against RTT: a plot of its own
                if self.large_plot(plt, outdir):
                    made.append("bench-j.png")
                continue
            if key == Table.K:  # against the tree's size
                if self.ck_plot(plt, outdir):
                    made.append("bench-k.png")
                continue
            if key == Table.N:  # one RTT (none: local work), its ratios are in its table
                continue
            if key == Table.P:  # against the tree's size
                if self.scale_plot(plt, outdir):
                    made.append("bench-p.png")
                continue
            if key == Table.O:  # against the number of agents
                if self.fleet_plot(plt, outdir):
                    made.append("bench-o.png")
                continue
            fig, ax = plt.subplots(figsize=(6, 4))
            any_line = False
            for system, by in self.results.rows(key).items():
                pts = [(r, by[r].median) for r in self.rtts if by.get(r) and by[r].median is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
                    any_line = True
            if not any_line:
                plt.close(fig)
                continue
            ax.set_xlabel("RTT (ms)")
            ax.set_ylabel("wall time (s, median)")
            ax.set_yscale("log")
            ax.set_title(key.value)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            name = f"bench-{key.value}.png"
            fig.tight_layout()
            fig.savefig(os.path.join(outdir, name), dpi=90)
            plt.close(fig)
            made.append(name)
        return made


def write(run: Run, path: str, quick: bool):
    """Writes the report to `path`, its plots and bench-results.json beside it."""
    rep = Report(run)
    files, ws = run.subtree_files, run.ws_files
    outdir = os.path.dirname(os.path.abspath(path))
    os.makedirs(outdir, exist_ok=True)
    pngs = rep.plots(outdir)
    # The run's own date (kept in the results, so --report-only keeps it).
    run.measured_at = run.measured_at or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "make bench" if not quick else "bench/run.py --quick"
    L = ["# Benchmarks", "",
         f"Produced by `{cmd}` ({' '.join(run.argv) or 'defaults'}) on {run.measured_at}, in {run.elapsed:.0f} s, "
         f"on this project's machine (2 cores, 24 GiB, a VM). Every number below comes from that one run"
         + (", except in the tables marked *measured later*: a later run of some scenarios measured them again "
            "and its cells replaced theirs (`bench/run.py --only … --merge bench-results.json`)." if run.parts
            else "."), "",
         "Latency is injected by `latency-proxy` (crates/bench) on loopback: each direction of every "
         "connection is delayed by RTT/2 and a new connection pays one more RTT (the handshake). MinIO "
         "sits behind it for mado, rclone and s3fs; `git daemon` behind another for git. Counts (GETs, "
         "ranged GETs, connections, bytes) are the proxy's. Each cell: median wall time, (min–max) over "
         f"{run.runs} cold run(s) (fresh caches, page cache dropped), then the median counts. "
         "The seed's figures (seed 003, an Intel N100) and the brief's goals are in the `seed 003` rows.", "",
         f"Data: a synthetic git repository — `dense/` ({files[Subtree.DENSE]} files in one directory), "
         f"`thin/` ({files[Subtree.THIN]} files, 4 per directory, two levels), `dense300/` "
         f"({files[Subtree.DENSE300]} files), filler in `other/` — and a workspace tree of "
         f"{ws} × 1 KiB files. Scenario i uses a real tree (this machine's cargo registry sources; see its "
         "tables), scenario j one large file of random bytes, scenario k synthetic source trees of a few "
         "thousand to tens of thousands of files, scenario l the real tree of i again (imported, against git "
         "push), scenario n a real tree of the same kind in a workspace mount (against the local disk). "
         "Whole-tree walks of other real trees (Linux 6.1, an "
         "npm node_modules) are in the last section.", ""]
    L += rep.summary()
    L += ["## mado against the best peer", "",
          "| subtree | RTT ms | best peer | mado | mado mount |", "|---|---|---|---|---|"]
    L += rep.ratios(Subtree.DENSE) + rep.ratios(Subtree.THIN) + [""]
    L += rep.table(Table.A_DENSE, "a. Cold walk-and-read, dense subtree (`mado materialize dense`)")
    L += rep.table(Table.A_THIN, "a. Cold walk-and-read, thin subtree (`mado materialize thin`)")
    L += rep.table(Table.B_DENSE, "b. Cold walk-and-read through the mount, dense subtree", [FIRST_FILE_COL])
    L += rep.table(Table.B_THIN, "b. Cold walk-and-read through the mount, thin subtree", [FIRST_FILE_COL])
    L += rep.table(Table.B_DENSE300, f"b. Cold walk through the mount, {files[Subtree.DENSE300]}-file dense "
                   "directory (seed row: 300 files; first file: seed 83 ms, goal ≤ 60 ms at 50 ms)", [FIRST_FILE_COL])
    L += rep.table(Table.C, f"c. Resume of a {ws} × 1 KiB workspace (`mado ws resume`)")
    L += rep.table(Table.D, f"d. First import of the {ws}-file tree, with its pack build (seed: 0.15 s "
                   f"build; goal ≤ 0.1 s), against `git push` of the same repository into an empty one (goal "
                   f"{IMPORT_VS_PUSH.goal})", [BUILD_COL])
    L += rep.push_ratio_line()
    L += rep.table(Table.E, "e. Warm walk-and-read of the dense subtree: mount against the local disk")
    L += rep.table(Table.F_READERS, "f. Concurrent readers of overlapping parts of the dense subtree, one cold "
                   "mount (GETs must stay flat)")
    L += rep.table(Table.F_FG, "f. Foreground reader (cold mount, dense subtree) while N workspaces write and "
                   "checkpoint (seed: p99 1.30–1.39× at 8 writers; goal ≤ 1.2×)", LATENCY_COLS)
    hi = run.rtts[-1]
    base = run.results.get(Table.F_FG, BASE_WRITERS, hi)
    if base and base.p99_ms:
        rat = [f"{k}: {((by.get(hi) and by[hi].p99_ms) or 0) / base.p99_ms:.2f}×"
               for k, by in run.results.rows(Table.F_FG).items()]
        L += ["p99 against 0 writers at the highest RTT: " + ", ".join(rat), ""]
    L += rep.table(Table.G, "g. Disk cache capped at half the dense subtree: the second pass (seed: 0.5 W GETs)")
    for sub in (Subtree.DENSE, Subtree.THIN):
        L += rep.table(PEERS[sub], f"h. Peers on the {sub.value} subtree (clone or mount, then walk and read it)")
    L += rep.real_tables()
    L += rep.large_tables()
    L += rep.ck_tables()
    L += rep.l_tables()
    L += rep.table(Table.M, "m. The dense subtree in a VM guest through `mado serve-virtiofs` (issue #14): cold and "
                   "warm walk-and-read, against the guest's local disk and `mado mount` on the host")
    L += rep.virtiofs_lines()
    L += rep.work_tables()
    L += rep.fleet_tables()
    L += rep.scale_tables()
    if pngs:
        L += ["## Plots (wall time against RTT, one line per system)", ""]
        L += [f"![{p}]({p})" for p in pngs] + [""]
    if run.notes:
        L += ["## Notes from this run", ""] + [f"- {n}" for n in run.notes] + [""]
    notes = os.path.join(ROOT, "bench", "NOTES.md")
    if os.path.exists(notes) and not quick:
        with open(notes) as f:
            L += [f.read()]
    with open(path, "w") as f:
        f.write("\n".join(L).rstrip() + "\n")
    run.save(os.path.join(outdir, "bench-results.json"))
    log("wrote", path, "and", len(pngs), "plots")
