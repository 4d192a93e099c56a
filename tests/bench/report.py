#!/usr/bin/python3
"""Renders OUT/RESULTS.md and OUT/ratios.gp (a gnuplot script for OUT/ratios.png) from the
bench's OUT/bench.json, OUT/bench.log and OUT/meta.env. Called by tests/bench/run.
Only the Python standard library is used."""

import json
import statistics
import sys
from pathlib import Path

OUT = Path(sys.argv[1])
data = json.loads((OUT / "bench.json").read_text())
log = (OUT / "bench.log").read_text().splitlines()
meta = dict(
    line.split("=", 1) for line in (OUT / "meta.env").read_text().splitlines() if "=" in line
)

BW = {"randwrite4k", "seqwrite1m", "seqread1m"}


class Target:
    """What a workload must reach: at least `peer`× the peer (main pass), at least `floor`×
    the floor (the floor pass's paired median when it ran), no MDS request per operation, a
    p50 latency of ours at most `p50_us` (the floor pass's when it ran)."""

    def __init__(self, peer=None, floor=None, no_mds=False, p50_us=None):
        self.peer, self.floor, self.no_mds, self.p50_us = peer, floor, no_mds, p50_us

    def label(self):
        parts = []
        if self.peer is not None:
            parts.append(f"≥ {self.peer:g}× peer")
        if self.floor is not None:
            parts.append(f"≥ {self.floor:g}× floor")
        if self.no_mds:
            parts.append("0 MDS req/op")
        if self.p50_us is not None:
            parts.append(f"p50 ≤ {self.p50_us:g} µs")
        return ", ".join(parts)

    def met(self, peer_ratio, floor_ratio, mds, p50, floor_only=False):
        """Whether every part is met; `floor_only` judges the parts the floor pass measures."""
        checks = []
        if self.peer is not None and not floor_only:
            checks.append(peer_ratio is not None and peer_ratio >= self.peer)
        if self.floor is not None:
            checks.append(floor_ratio is not None and floor_ratio >= self.floor)
        if self.no_mds:
            checks.append(mds == 0)
        if self.p50_us is not None:
            checks.append(p50 is not None and p50 <= self.p50_us)
        return all(checks)

    def judged_by_floor_pass(self):
        return self.floor is not None or self.p50_us is not None


# The cached metadata rows: far ahead of the peer and at least half the floor (the daemon's
# round trip through the virtqueues on top of the same libcephfs call); a cached GETATTR
# within a microsecond. The data rows: within 10 % of the floor.
TARGETS = {
    "walk48": Target(peer=5, floor=0.5),
    "walk5": Target(peer=5, floor=0.5),
    "open-close": Target(peer=5, floor=0.5),
    "stat-storm-1": Target(floor=0.5, p50_us=1.0),
    "create-unlink": Target(floor=0.9),
    "randwrite4k": Target(floor=0.9, no_mds=True),
    "seqwrite1m": Target(floor=0.9),
    "seqread1m": Target(floor=0.9),
}

def summary_of(d):
    """(workload, target) -> summary row, and the workloads in the order they ran."""
    summary, workloads = {}, []
    for r in d["summary"]:
        summary[(r["workload"], r["target"])] = r
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
    return summary, workloads


rows, order = summary_of(data)


def rounds_of(d):
    """(workload, target) -> {round: throughput of that round}."""
    out = {}
    for r in d.get("rounds", []):
        wall = r["wall_s"] or 1e-9
        v = r["bytes"] / 1048576 / wall if r["workload"] in BW else r["ops"] / wall
        out.setdefault((r["workload"], r["target"]), {})[r["round"]] = v
    return out


per_round = rounds_of(data)


def pairs(w, a, b, rounds=per_round):
    """Ratios a/b of the rounds both ran: within a round they run next to each other."""
    ra, rb = rounds.get((w, a), {}), rounds.get((w, b), {})
    return [ra[k] / rb[k] for k in sorted(ra) if k in rb and rb[k]]


# The floor pass (tests/bench/run --floor-rounds): ours and the floor alone, more rounds.
floor_file = OUT / "bench-floor.json"
floor_data = json.loads(floor_file.read_text()) if floor_file.exists() else None
floor_rounds = rounds_of(floor_data) if floor_data else {}
floor_rows, floor_order = summary_of(floor_data) if floor_data else ({}, [])


def paired_floor(w):
    """Median of the floor pass's per-round ours/floor ratios, or None."""
    pr = pairs(w, "ours", "floor", floor_rounds)
    return statistics.median(pr) if pr else None


def thr(w, t, summary=rows):
    r = summary.get((w, t))
    if r is None:
        return None
    return r["mib_per_s"] if w in BW else r["ops_per_s"]


def p50_of(w, summary, t="ours"):
    r = summary.get((w, t))
    return None if r is None else r.get("p50_us")


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_thr(w, v):
    if v is None:
        return "–"
    if w in BW:
        return f"{v:,.1f} MiB/s"
    return f"{v:,.2f}/s" if v < 10 else f"{v:,.0f}/s"


def fmt_us(v):
    return "–" if v is None else f"{v:.1f}"


def fmt_r(v):
    return "–" if v is None else f"{v:.2f}×"


def fmt_mds(w, t):
    r = rows.get((w, t))
    if r is None or r.get("mds_per_op") is None:
        return "–"
    v = r["mds_per_op"]
    return "0" if v == 0 else (f"{v:.4f}" if v < 0.01 else f"{v:.2f}")


md = []
md.append("# ceph-virtiofsd benchmark results\n")
md.append(
    "Measured from the host by `ceph-virtiofsd-bench` (a vhost-user-fs frontend playing a Linux "
    "6.1 guest: FUSE requests over virtqueues in shared memfd memory), against a throwaway "
    "loopback Ceph cluster (1 mon, 1 memstore OSD, 1 MDS). Variants: **ours** "
    "(`ceph-virtiofsd`, libcephfs), **peer** (stock `virtiofsd` sharing a host ceph-fuse mount "
    "of the same cluster: what users run today), **floor** (the same operations called "
    "directly through libcephfs in the bench process: no FUSE, no daemon). Workloads run as "
    "uid 1000; within a round each workload runs on the variants in turn, in ABBA order (ours, "
    "floor, peer, then back), so that ours and the floor run next to each other. Throughput is "
    "the median over rounds, latency percentiles pool all rounds' samples.\n"
)
md.append(f"- date: {meta.get('date', '?')}")
md.append(f"- command: `{meta.get('cmdline', '?')}`"
          + (f" (ours started with `{meta['ours_opts']}`)" if meta.get("ours_opts") else ""))
md.append(f"- machine: {meta.get('cpu', '?')}, {meta.get('mem', '?')}, Linux {meta.get('kernel', '?')}")
md.append(f"- software: {meta.get('ceph', '?')}; cluster {meta.get('cluster', '?')}; {meta.get('virtiofsd', '?')}; ceph-virtiofsd commit {meta.get('commit', '?')}")
md.append(f"- rounds: {meta.get('rounds', '?')}" + (" (quick sizes)" if meta.get("quick") == "1" else ""))
md.append("")
md.append("## Headline: ours vs the peer and vs the libcephfs floor\n")
md.append("| workload | ours | peer | floor | ours/peer | ours/floor | MDS req/op ours · peer · floor | target | met |")
md.append("|---|---:|---:|---:|---:|---:|---:|---|---|")
plot = []
for w in order:
    o, p, f = thr(w, "ours"), thr(w, "peer"), thr(w, "floor")
    rp, rf = ratio(o, p), ratio(o, f)
    mds_o = rows.get((w, "ours"), {}).get("mds_per_op")
    target = TARGETS.get(w)
    tgt = target.label() if target else ""
    judged = paired_floor(w) if target and target.judged_by_floor_pass() else None
    p50 = p50_of(w, floor_rows) if judged is not None else p50_of(w, rows)
    if target is None:
        met = ""
    elif judged is not None:
        ok = target.met(rp, judged, mds_o, p50)
        met = f"{'yes' if ok else '**no**'} ({judged:.2f}× paired"
        met += f", p50 {p50:.1f} µs)" if target.p50_us is not None and p50 is not None else ")"
    else:
        met = "yes" if target.met(rp, rf, mds_o, p50) else "**no**"

    md.append(
        f"| {w} | {fmt_thr(w, o)} | {fmt_thr(w, p)} | {fmt_thr(w, f)} | {fmt_r(rp)} | {fmt_r(rf)} | "
        f"{fmt_mds(w, 'ours')} · {fmt_mds(w, 'peer')} · {fmt_mds(w, 'floor')} | {tgt} | {met} |"
    )
    plot.append((w, rp, rf))

if floor_data:
    md.append("")
    md.append("Targets relative to the floor are judged on the floor pass below (\"paired\": the "
              "median of its per-round ours/floor ratios); the ours/floor column is the ratio of "
              "this run's medians.")
md.append("")
md.append("ours/floor round by round (within a round the two run next to each other, so each "
          "ratio compares runs seconds apart; the table above compares medians over rounds):\n")
md.append("| workload | ours/floor per round | median |")
md.append("|---|---|---:|")
for w in order:
    pr = pairs(w, "ours", "floor")
    if pr:
        md.append(f"| {w} | {', '.join(f'{x:.2f}' for x in pr)} | {fmt_r(statistics.median(pr))} |")

storm = [w for w in order if w.startswith("stat-storm-")]
if storm:
    md.append("")
    md.append("Stat-storm scaling (GETATTR/s relative to 1 stream; the machine has "
              f"{meta.get('cpu', '?').rsplit('(', 1)[-1].rstrip(')')}, shared by the bench and the daemon):\n")
    md.append("| streams | " + " | ".join(["ours", "peer", "floor"]) + " |")
    md.append("|---:|---:|---:|---:|")
    for w in storm:
        cells = []
        for t in ["ours", "peer", "floor"]:
            base = thr("stat-storm-1", t)
            cells.append(f"{fmt_thr(w, thr(w, t))} ({fmt_r(ratio(thr(w, t), base))})")
        md.append(f"| {w.rsplit('-', 1)[-1]} | " + " | ".join(cells) + " |")

mq_file = OUT / "bench-mq.json"
if mq_file.exists():
    mq, _ = summary_of(json.loads(mq_file.read_text()))
    mq_storm = sorted({w for (w, _) in mq if w.startswith("stat-storm-")},
                      key=lambda w: int(w.rsplit("-", 1)[-1]))

    n = meta.get("mq", "?")
    md.append("")
    md.append(f"The same storm with {n} request queues (`tests/bench/run --mq {n}`: ours started "
              f"with `--queues {n}`, the bench spreading its streams over the queues as a Linux "
              f"≥ 6.11 guest with {n} vCPUs does; the stock virtiofsd offers one queue, so the "
              "peer sits this pass out; `bench-mq.log`):\n")
    md.append("| streams | ours | floor | ours/floor |")
    md.append("|---:|---:|---:|---:|")
    for w in mq_storm:
        o, f = thr(w, "ours", mq), thr(w, "floor", mq)
        cells = [f"{fmt_thr(w, v)} ({fmt_r(ratio(v, thr('stat-storm-1', t, mq)))})"
                 for v, t in ((o, "ours"), (f, "floor"))]
        md.append(f"| {w.rsplit('-', 1)[-1]} | {cells[0]} | {cells[1]} | {fmt_r(ratio(o, f))} |")

md.append("")
md.append("Caveats: the bench, the daemons and the cluster share the machine's cores (and, on a "
          "team machine, other jobs: compare ratios within one run, not absolute figures across "
          "runs). ours and the floor start a fresh libcephfs client per round; the peer's "
          "ceph-fuse mount stays up for the whole run (as it would on a host). Each variant "
          "works in its own subtree (/ours, /peer, /floor), populated the same way by the "
          "bench's setup.")
if floor_data:
    n = meta.get("floor_rounds", "?")
    md.append("")
    md.append(f"## ours against the floor alone, {n} rounds\n")
    md.append("The workloads whose target is a ratio to the floor or a latency, run again on ours and the "
              f"floor only (`tests/bench/run --floor-rounds {n}`, `bench-floor.log`). The two "
              "alternate which goes first from round to round, and each round gives one paired "
              "ratio: a burst of load on the shared machine, or the cluster's state, hits both "
              "sides of a pair and not the next pair. On this kind of machine one pass swings by "
              "20–30 %, more than the 10 % the target is about; the median of the paired ratios "
              "is what the headline judges, the middle half shows the spread.\n")
    md.append("| workload | ours | floor | ours/floor per round | median | middle half | p50 ours / floor | target | met |")
    md.append("|---|---:|---:|---|---:|---|---|---|---|")
    for w in floor_order:
        pr = pairs(w, "ours", "floor", floor_rounds)
        if not pr:
            continue
        med = statistics.median(pr)
        q = statistics.quantiles(pr, n=4) if len(pr) >= 2 else [med, med, med]
        mds_o = floor_rows.get((w, "ours"), {}).get("mds_per_op")
        target = TARGETS.get(w)
        tgt = target.label() if target else ""
        ok = target and target.met(None, med, mds_o, p50_of(w, floor_rows), floor_only=True)
        met = "" if target is None else ("yes" if ok else "**no**")
        md.append(f"| {w} | {fmt_thr(w, thr(w, 'ours', floor_rows))} | "
                  f"{fmt_thr(w, thr(w, 'floor', floor_rows))} | "
                  f"{', '.join(f'{x:.2f}' for x in pr)} | {fmt_r(med)} | "
                  f"{q[0]:.2f}–{q[2]:.2f}× | {fmt_us(p50_of(w, floor_rows))} / "
                  f"{fmt_us(p50_of(w, floor_rows, 'floor'))} µs | {tgt} | {met} |")

md.append("")
md.append("## Full table\n")
md.append("Latencies in µs (from placing a request on the avail ring to taking it off the used "
          "ring; for the floor, the libcephfs call). One op: walk = LOOKUP per component + "
          "GETATTR of the leaf; open-close = OPEN+RELEASE; create-unlink = CREATE+RELEASE+UNLINK; "
          "readdir5000 = OPENDIR + READDIRPLUS pages + RELEASEDIR; randwrite4k = one 4 KiB O_DIRECT WRITE "
          "(64 in flight, FUSE_WRITE_KILL_SUIDGID); seq = one 1 MiB WRITE (buffered; the pass ends with an FSYNC, counted in its throughput, not in the latencies) / READ (O_DIRECT); stat-storm-N = one "
          "GETATTR, N streams. MDS req/op: libcephfs perf counter `client.reply` (one per MDS "
          "reply to a metadata request of that client) read through the client's admin socket, "
          "per operation; pipelined workloads count only their timed part.\n")
md.extend(line for line in log if line.startswith("|"))
notes = [line for line in log if line.startswith("- ") or line.startswith("# ")]
if notes:
    md.append("")
    md.append("## Notes printed by the bench\n")
    md.append("```")
    md.extend(notes)
    md.append("```")
md.append("")
md.append("![ratios](ratios.png)")
md.append("")
md.append("Raw numbers per round: `bench.json`; the run's output: `bench.log`.")
(OUT / "RESULTS.md").write_text("\n".join(md) + "\n")

dat = OUT / "ratios.dat"
with dat.open("w") as fh:
    fh.write("# workload ours/peer ours/floor\n")
    for w, rp, rf in plot:
        fh.write(f"{w} {rp if rp is not None else 'NaN'} {rf if rf is not None else 'NaN'}\n")
(OUT / "ratios.gp").write_text(f"""set terminal pngcairo size 1000,500 noenhanced font ",10"
set output "{OUT / 'ratios.png'}"
set title "ceph-virtiofsd throughput relative to the peer (virtiofsd + ceph-fuse) and the libcephfs floor"
set style data histograms
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set logscale y 2
set yrange [0.125:512]
set ylabel "ratio (log scale, higher is better)"
set grid ytics
set xtics rotate by -30
set key outside bottom center horizontal
f(x) = 1
plot "{dat}" using 2:xtic(1) title "ours / peer", "" using 3 title "ours / floor", 1 with lines lw 2 dt 2 lc rgb "black" title "1x"
""")
