"""report.md: one table per workload from results.jsonl.

Rows are (variant, target); each metric shows the median with min-max over the
repetitions and the ratio of medians to kernel btrfs. N/A cells point to a footnote
with the reason, so a table never hides why a target has no number.
"""

import os
import statistics

from . import workloads as W

BASELINE = "btrfs"


def summarize(recs):
    """{(workload, variant, target): {"ok": [rec], "na": [rec], "error": [rec]}}"""
    groups = {}
    for r in recs:
        g = groups.setdefault((r["workload"], r.get("variant"), r["target"]),
                              {"ok": [], "na": [], "error": []})
        g[r["status"] if r["status"] in g else "error"].append(r)
    return groups


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values), len(values)


def fmt(x):
    if x is None:
        return "—"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def ordered(items, order):
    pos = {n: i for i, n in enumerate(order)}
    return sorted(items, key=lambda x: (pos.get(x, len(order)), str(x)))


def workload_table(wcls, groups, target_order):
    keys = [k for k in groups if k[0] == wcls.name]
    if not keys:
        return ""
    variants = []
    for k in keys:
        if k[1] not in variants:
            variants.append(k[1])
    targets = ordered({k[2] for k in keys}, target_order)
    metrics = list(wcls.metrics)
    # fs_mark: one column per loop as well, since the seed reports files/s per loop
    extra = sorted({m for k in keys for r in groups[k]["ok"] for m in r["metrics"]
                    if m.startswith("loop") and m.endswith("_files_per_s")},
                   key=lambda m: int(m[4:].split("_")[0]))
    metrics += [W.Metric(m, f"loop {m[4:].split('_')[0]} files/s") for m in extra]
    has_rss = any(r.get("peak_rss_kib") for k in keys for r in groups[k]["ok"])

    head = ["target"] + ([wcls.variant_name] if wcls.variant_name else [])
    for m in metrics:
        head += [m.label + ("" if m.higher else " (lower is better)"), f"×{BASELINE}"]
    if has_rss:
        head.append("daemon peak RSS MiB")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = {}

    def note(text):
        if text not in notes:
            notes[text] = len(notes) + 1
        return f"[{notes[text]}]"

    for v in variants:
        base = groups.get((wcls.name, v, BASELINE), {"ok": []})["ok"]
        for t in targets:
            g = groups.get((wcls.name, v, t))
            if g is None:
                continue
            row = [t] + ([v.split("=", 1)[1] if v else ""] if wcls.variant_name else [])
            ok = g["ok"]
            if not ok:
                bad = (g["error"] + g["na"])[0]
                label = "error" if g["error"] else "N/A"
                row += [f"{label} {note(t + ': ' + str(bad['reason']))}", ""]
                row += ["", ""] * (len(metrics) - 1)
            else:
                for m in metrics:
                    s = stats(r["metrics"].get(m.key) for r in ok)
                    b = stats(r["metrics"].get(m.key) for r in base)
                    if s is None:
                        row += ["—", ""]
                        continue
                    med, lo, hi, n = s
                    cell = fmt(med) if n == 1 else f"{fmt(med)} ({fmt(lo)}–{fmt(hi)})"
                    ratio = f"{med / b[0]:.2f}" if b and b[0] else ""
                    row += [cell, ratio]
                missing = g["na"] + g["error"]
                if missing:
                    why = note(t + ": " + str(missing[0]["reason"]))
                    row[-2] += f" {len(ok)}/{len(ok) + len(missing)} ok {why}"
                warned = [w for r in ok for w in (r.get("teardown") or {}).get("warnings", [])]
                if warned:
                    row[-2] += " " + note(f"{t}: at teardown: {warned[0]}")
            if has_rss:
                rss = stats(r.get("peak_rss_kib") for r in ok)
                row.append(fmt(rss[0] / 1024) if rss else "")
            lines.append("| " + " | ".join(row) + " |")
    out = "\n".join(lines) + "\n"
    goal = goal_lines(wcls, groups)
    if goal:
        out += "\n" + "\n".join(goal) + "\n"
    if notes:
        out += "\n" + "\n".join(f"[{n}] {_md(text)}  " for text, n in notes.items()) + "\n"
    return out


def requests_table(wcls, groups, target_order):
    """FUSE requests per operation (issue 41), for the targets whose records have
    `fuse_requests`: one row per (variant, target), one column per opcode seen at 0.01 per
    operation or more in some row (the rest summed as "others"), and the total; medians
    over the repetitions."""
    keys = [k for k in groups if k[0] == wcls.name
            and any(r.get("fuse_requests") for r in groups[k]["ok"])]
    if not keys:
        return ""
    unit = next(r["fuse_requests"]["operation"] for k in keys for r in groups[k]["ok"]
                if r.get("fuse_requests"))
    rows = {}
    for k in keys:
        recs = [r["fuse_requests"] for r in groups[k]["ok"] if r.get("fuse_requests")]
        names = {n for q in recs for n in q["per_op"]}
        med = {n: statistics.median(q["per_op"].get(n, 0.0) for q in recs) for n in names}
        med["total"] = statistics.median(q["total_per_op"] for q in recs)
        timed = [q["server_us_per_op"] for q in recs if "server_us_per_op" in q]
        med["server_us"] = statistics.median(timed) if timed else None
        rows[k] = (med, len(recs))
    extra = ("total", "server_us")
    timed = any(med["server_us"] is not None for med, _ in rows.values())
    shown = sorted({n for med, _ in rows.values() for n, v in med.items()
                    if n not in extra and v >= 0.01},
                   key=lambda n: (-max(med.get(n, 0) for med, _ in rows.values()), n))
    head = ["target"] + ([wcls.variant_name] if wcls.variant_name else []) + shown
    head += ["others", "total"] + (["server µs per op"] if timed else [])
    lines = [f"FUSE requests per {unit}, by opcode (median of the repetitions; the transport's "
             "counts over the measured phase" + ("; server µs: the server's own time on "
                                                 "them, parse to reply" if timed else "")
             + "):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    variants = []
    for k in keys:
        if k[1] not in variants:
            variants.append(k[1])
    for v in variants:
        for t in ordered({k[2] for k in keys if k[1] == v}, target_order):
            med, _ = rows[(wcls.name, v, t)]
            row = [t] + ([v.split("=", 1)[1] if v else ""] if wcls.variant_name else [])
            row += [f"{med.get(n, 0):.2f}" for n in shown]
            others = sum(x for n, x in med.items() if n not in extra and n not in shown)
            row += [f"{others:.2f}", f"{med['total']:.2f}"]
            if timed:
                row.append("" if med["server_us"] is None else f"{med['server_us']:.1f}")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def goal_lines(wcls, groups):
    """The workload's stated goal (e.g. oleo >= 0.7x kernel btrfs), checked per
    variant on the medians."""
    goal = getattr(wcls, "goal", None)
    if not goal:
        return []
    target, key, ratio = goal[:3]
    absolute = goal[3:] == ("absolute",)   # the median itself, not a ratio to the baseline
    label = next((m.label for m in wcls.metrics if m.key == key), key)
    out = []
    for (w, v, t), g in groups.items():
        if w != wcls.name or t != target:
            continue
        s = stats(r["metrics"].get(key) for r in g["ok"])
        where = f" ({v})" if v else ""
        if absolute:
            verdict = ("not measured" if s is None else
                       f"{s[0]:.2f} — {'met' if s[0] >= ratio else 'NOT met'}")
            out.append(f"Goal{where}: {target} {label} ≥ {ratio:.2f}: {verdict}.")
            continue
        b = stats(r["metrics"].get(key) for r in groups.get((w, v, BASELINE), {"ok": []})["ok"])
        if s is None or not b or not b[0]:
            verdict = "not measured"
        else:
            got = s[0] / b[0]
            verdict = f"{got:.2f}× — {'met' if got >= ratio else 'NOT met'}"
        out.append(f"Goal{where}: {target} ≥ {ratio:.2f}× {BASELINE} on {label}: {verdict}.")
    return sorted(out)


def _md(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(recs, meta):
    groups = summarize(recs)
    target_order = meta.get("targets") or []
    out = ["# oleo benchmark results", ""]
    if meta:
        out.append(f"Run {meta.get('run_id', '?')}, scale `{meta.get('scale', '?')}`, "
                   f"{meta.get('reps', '?')} repetition(s); "
                   f"{meta.get('machine', {}).get('cpus', '?')} CPUs, "
                   f"{meta.get('machine', {}).get('mem_GiB', '?')} GiB.")
        v = meta.get("versions", {})
        out.append("")
        out.append("Versions: " + ", ".join(f"{k} {v[k]}" for k in sorted(v) if v[k]) + ".")
        out.append("")
    out.append(f"Median (min–max) over repetitions; ×{BASELINE} is the ratio of medians to "
               "kernel btrfs. Cold cache for the read workloads. Every measurement ran on a "
               "fresh filesystem.")
    out.append("")
    for wcls in W.ALL:
        table = workload_table(wcls, groups, target_order)
        if table:
            seed = f" (seed {wcls.seed})" if wcls.seed else ""
            out += [f"## {wcls.name}{seed}", "", table]
            reqs = requests_table(wcls, groups, target_order)
            if reqs:
                out += [reqs]
    return "\n".join(out)


def write(results_dir, recs, meta):
    path = os.path.join(results_dir, "report.md")
    with open(path, "w") as f:
        f.write(render(recs, meta))
    return path
