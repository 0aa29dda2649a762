"""The benchmark report: docs/BENCHMARKS.md, its plots and bench-results.json.

Owns the wording and layout of the report: the summary against seed 003's
figures and the brief's goals (results.BRIEF), mado against the best peer,
one table per scenario, the plots (matplotlib, optional), the notes, and
bench/NOTES.md (the hand-run sections) appended to a full run's report.
It only reads a `Run`; it measures nothing.
"""
import datetime, os
from typing import Callable, List, Optional, Sequence, Tuple

from harness import ROOT, log
from results import (BRIEF, FIRST_FILE, GIT_PUSH_ROW, IMPORT_ROW, IMPORT_VS_PUSH, MATERIALIZE, MOUNT, PEERS,
                     RESUME_ROW, Counts, Layout, Result, Run, Subtree, Table, materialize_row, mount_row,
                     writers_row)

# Their cells also give the bytes and connections: the cold walks and the peers.
TRAFFIC = {Table.A_DENSE, Table.A_THIN, Table.B_DENSE, Table.B_THIN, Table.B_DENSE300, Table.H_DENSE, Table.H_THIN}
V2_MATERIALIZE, V2_MOUNT = materialize_row(Layout.V2), mount_row(Layout.V2)
BASE_WRITERS = writers_row(0)

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


def fmt_t(r: Optional[Result]) -> str:
    if not r:
        return "–"
    if r.median is None:
        return r.note or "–"
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
        out = [f"### {title}", ""]
        part = self.run.parts.get(key)
        if part:
            out += [f"*Measured later*, on {part.measured_at} in {part.elapsed:.0f} s, by "
                    f"`python3 bench/run.py {' '.join(part.argv)}` ({part.runs} cold runs per cell at most, RTT "
                    + " / ".join(map(str, part.rtts)) + " ms), and merged into the run above."
                    + (" mado is the debug build in this table." if debug_build(part.argv) else ""), ""]
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
        out = ["## Summary against the brief", "",
               "| case | seed 003 | goal | mado in this run |", "|---|---|---|---|"]
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
        return out + [""]

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
         f"{ws} × 1 KiB files. Whole-tree walks of real trees (Linux 6.1, an npm node_modules) "
         "are in the last section.", ""]
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
