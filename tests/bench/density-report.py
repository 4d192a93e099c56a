#!/usr/bin/env python3
"""tests/bench/density-report.py OUT: DENSITY.md from OUT/density.csv and OUT/meta.env.

Per guest, for each arrangement:
- ours: the guest's own daemon;
- peer: the guest's virtiofsd plus its share of the one ceph-fuse: at rest ceph-fuse / N; a
  walking guest also carries ceph-fuse's growth since rest divided by the guests that walked
  so far (the growth is theirs).
"""

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
meta = dict(
    line.rstrip("\n").split("=", 1)
    for line in (out / "meta.env").read_text().splitlines()
    if "=" in line
)
rows = list(csv.DictReader((out / "density.csv").open()))
n = int(meta["n"])
walkers = int(meta["walkers"])
repeats = int(meta["walk_repeats"])

# data[variant][phase][guest] = row
# ceph-fuse is sampled right after each walking guest's phase: that sample is keyed
# "fuseK" for guest K (the CSV has it on the line after the guest's); at rest it is "fuse".
data = defaultdict(lambda: defaultdict(dict))
prev = None
for r in rows:
    for k in ("vmrss_kib", "rss_anon_kib", "rss_shmem_kib", "threads", "mds_sessions", "caps"):
        r[k] = int(r[k])
    guest = r["guest"]
    if guest == "fuse" and r["phase"] != "rest" and prev is not None:
        guest = f"fuse{prev}"
    prev = r["guest"]
    data[r["variant"]][r["phase"]][guest] = r


def mib(kib):
    return kib / 1024.0


def fmt_mib(v):
    return "–" if v is None else f"{v:.1f} MiB"


def med(v):
    return statistics.median(v) if v else None


def per_guest_rest(variant):
    """(rss MiB per guest: median, max; anon median; threads median; sessions; caps) at rest."""
    rest = data[variant]["rest"]
    guests = [rest[str(k)] for k in range(n) if str(k) in rest]
    if not guests:
        return None
    if variant == "ours":
        rss = [mib(g["vmrss_kib"]) for g in guests]
        anon = [mib(g["rss_anon_kib"]) for g in guests]
        threads = [g["threads"] for g in guests]
        sessions = sum(g["mds_sessions"] for g in guests) / n
        caps = sum(g["caps"] for g in guests) / n
        total = sum(g["vmrss_kib"] for g in guests)
        return dict(rss=med(rss), rss_max=max(rss), anon=med(anon), threads=med(threads),
                    sessions=sessions, caps=caps, total=mib(total))
    fuse = rest.get("fuse")
    fuse_kib = fuse["vmrss_kib"] if fuse else 0
    fuse_anon = fuse["rss_anon_kib"] if fuse else 0
    rss = [mib(g["vmrss_kib"] + fuse_kib / n) for g in guests]
    anon = [mib(g["rss_anon_kib"] + fuse_anon / n) for g in guests]
    threads = [g["threads"] + (fuse["threads"] if fuse else 0) / n for g in guests]
    total = sum(g["vmrss_kib"] for g in guests) + fuse_kib
    return dict(rss=med(rss), rss_max=max(rss), anon=med(anon), threads=med(threads),
                sessions=(fuse["mds_sessions"] if fuse else 0) / n,
                caps=(fuse["caps"] if fuse else 0) / n, total=mib(total),
                fuse=mib(fuse_kib), fuse_threads=fuse["threads"] if fuse else 0)


def walker(variant, phase, k):
    """(rss MiB, anon MiB, caps) charged to walking guest k after `phase`, or None."""
    r = data[variant][phase].get(str(k))
    if r is None:
        return None
    if variant == "ours":
        return mib(r["vmrss_kib"]), mib(r["rss_anon_kib"]), r["caps"], r["threads"]
    f = data[variant][phase].get(f"fuse{k}")
    f0 = data[variant]["rest"].get("fuse")
    if f is None or f0 is None:
        return mib(r["vmrss_kib"]), mib(r["rss_anon_kib"]), 0, r["threads"]
    share = f0["vmrss_kib"] / n + (f["vmrss_kib"] - f0["vmrss_kib"]) / (k + 1)
    share_anon = f0["rss_anon_kib"] / n + (f["rss_anon_kib"] - f0["rss_anon_kib"]) / (k + 1)
    return (mib(r["vmrss_kib"] + share), mib(r["rss_anon_kib"] + share_anon),
            f["caps"] / (k + 1), r["threads"] + f["threads"] / n)


def phase_row(variant, phase):
    v = [walker(variant, phase, k) for k in range(walkers)]
    v = [x for x in v if x is not None]
    if not v:
        return None
    return dict(rss=med([x[0] for x in v]), rss_max=max(x[0] for x in v),
                anon=med([x[1] for x in v]), caps=med([x[2] for x in v]),
                threads=med([x[3] for x in v]))


variants = [v for v in ("ours", "peer") if v in data]
last = f"walk{repeats}"
lines = []
lines.append("# Density: one host, many guests")
lines.append("")
lines.append(
    f"`{meta.get('cmdline', '')}` on {meta.get('cpu', '?')}, {meta.get('mem', '?')}, "
    f"kernel {meta.get('kernel', '?')}; {meta.get('ceph', '')}, cluster {meta.get('cluster', '')}; "
    f"{meta.get('virtiofsd', '') or 'no peer'}; ceph-virtiofsd {meta.get('commit', '?')}"
    + (f" with `{meta['ours_opts']}`" if meta.get("ours_opts") else "")
    + f"; {meta.get('date', '')}."
)
lines.append("")
lines.append(
    f"{n} guests, each with its own daemon (ours: its own export and cephx id; peer: its own "
    f"virtiofsd over a subdirectory of one host ceph-fuse mount). {walkers} of them then, one "
    f"after the other, walk a tree of {int(meta['tree_inodes']):,} inodes with READDIRPLUS keeping "
    f"every entry (walk 1), stream {meta['stream_mib']} MiB through one file (written, fsynced, "
    f"read back), and walk the tree {repeats - 1} more times, each step measured "
    f"{meta.get('settle_secs', '0')} s after it ended. RSS is VmRSS per guest (median over "
    "the guests measured; max in brackets); the peer's guest carries its share of ceph-fuse "
    "(see tests/bench/density-report.py). Anon is RssAnon (VmRSS less the guest memory the "
    "daemon touched and its mapped files)."
)
lines.append("")
hdr = "| per guest | " + " | ".join(variants) + " |"
lines.append(hdr)
lines.append("|---|" + "---:|" * len(variants))


def cell(d, key, f):
    return "–" if d is None or d.get(key) is None else f(d[key])


rest = {v: per_guest_rest(v) for v in variants}
lines.append("| RSS at rest | " + " | ".join(
    cell(rest[v], "rss", lambda x, v=v: f"{x:.1f} MiB ({rest[v]['rss_max']:.1f})") for v in variants) + " |")
lines.append("| anon at rest | " + " | ".join(cell(rest[v], "anon", fmt_mib) for v in variants) + " |")
lines.append("| threads at rest | " + " | ".join(cell(rest[v], "threads", lambda x: f"{x:.1f}") for v in variants) + " |")
lines.append("| MDS sessions | " + " | ".join(cell(rest[v], "sessions", lambda x: f"{x:.2f}") for v in variants) + " |")
lines.append("| caps at rest | " + " | ".join(cell(rest[v], "caps", lambda x: f"{x:.1f}") for v in variants) + " |")
for phase, label in (("walk1", "after the walk"), ("stream", f"after {meta['stream_mib']} MiB"),
                     (last, f"after {repeats} walks")):
    rows_ = {v: phase_row(v, phase) for v in variants}
    lines.append(f"| RSS {label} | " + " | ".join(
        cell(rows_[v], "rss", lambda x, v=v: f"{x:.1f} MiB ({rows_[v]['rss_max']:.1f})") for v in variants) + " |")
    lines.append(f"| anon {label} | " + " | ".join(cell(rows_[v], "anon", fmt_mib) for v in variants) + " |")
    lines.append(f"| caps {label} | " + " | ".join(cell(rows_[v], "caps", lambda x: f"{x:,.0f}") for v in variants) + " |")
    lines.append(f"| threads {label} | " + " | ".join(cell(rows_[v], "threads", lambda x: f"{x:.0f}") for v in variants) + " |")
lines.append("")
lines.append("Host totals at rest: " + "; ".join(
    f"{v} {rest[v]['total']:.0f} MiB for {n} guests"
    + (f" (ceph-fuse {rest[v]['fuse']:.0f} MiB, {rest[v]['fuse_threads']} threads)" if v == "peer" else "")
    for v in variants if rest[v]) + ".")
lines.append("")
lines.append(f"Growth over the walks (RSS per walking guest after walk 2, 3, ... {repeats}; "
             "walk 2 is the first after the stream):")
lines.append("")
for v in variants:
    for k in range(walkers):
        series = [walker(v, f"walk{r}", k) for r in range(1, repeats + 1)]
        series = [f"{x[0]:.1f}" for x in series if x is not None]
        if series:
            lines.append(f"- {v}, guest {k}: walk 1 {series[0]}; walks 2.. " + ", ".join(series[1:]) + " MiB")
lines.append("")
(out / "DENSITY.md").write_text("\n".join(lines) + "\n")
