#!/usr/bin/env python3
"""Markdown tables from a bench/run-compare.sh results directory.

    python3 bench/summarize.py bench/results/<run>

Every figure is a median over the runs of one scenario (ciphermq-bench's
`summary`); ratios are CipherMQ divided by the peer, measured in the same
invocation. Only the standard library is used.
"""

import json
import re
import sys
from pathlib import Path

TARGETS = ("ciphermq", "rabbitmq", "nats")


def load(path):
    with open(path) as f:
        return json.load(f)


def n(x):
    return f"{x:,.0f}"


def ms(x):
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def med(xs):
    """The median of the runs (the upper middle one for an even count)."""
    return sorted(xs)[len(xs) // 2]


def ratio(a, b):
    return f"{a / b:.2f}x" if b else "-"


def body(size):
    """A body size as the tables write it: 64 B, 1 KiB, 16 KiB."""
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def throughput(out, lines):
    rows = []
    for p in sorted(out.glob("throughput-*.json")):
        m = re.match(r"throughput-(\w+)-s(\d+)-b(\d+)-p(\d+)(?:-c(\d+))?\.json", p.name)
        if not m:
            continue
        storage, shards, size, pubs = m.group(1), *map(int, m.groups()[1:4])
        consumers = int(m.group(5) or 1)
        rows.append((storage, shards, size, pubs, load(p), consumers))
    if not rows:
        return
    rows.sort(key=lambda r: (r[0] != "memory", r[1], r[2], r[3], r[5]))

    compared = [r for r in rows if {"rabbitmq", "nats"} <= set(r[4]["summary"])]
    if compared:
        lines.append("### CipherMQ vs RabbitMQ vs NATS JetStream (same run)\n")
        lines.append(
            "| CipherMQ storage, shards | body | publishers | consumers "
            "| CipherMQ publish/s | RabbitMQ publish/s | NATS publish/s | vs RabbitMQ | vs NATS "
            "| CipherMQ consume/s | RabbitMQ consume/s | NATS consume/s | vs RabbitMQ | vs NATS "
            "| load generator CPU µs/msg: CipherMQ / RabbitMQ / NATS | CipherMQ broker CPU µs/msg |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for storage, shards, size, pubs, r, consumers in compared:
            s = r["summary"]
            c, q, j = s["ciphermq"], s["rabbitmq"], s["nats"]
            cpu = lambda x, key="client_cpu_us_per_msg": f"{x[key]:.1f}" if x.get(key) else "-"
            lines.append(
                f"| {storage}, {shards} | {body(size)} | {pubs} | {consumers} "
                f"| {n(c['publish_msgs_per_sec'])} | {n(q['publish_msgs_per_sec'])} | {n(j['publish_msgs_per_sec'])} "
                f"| {ratio(c['publish_msgs_per_sec'], q['publish_msgs_per_sec'])} "
                f"| {ratio(c['publish_msgs_per_sec'], j['publish_msgs_per_sec'])} "
                f"| {n(c['consume_msgs_per_sec'])} | {n(q['consume_msgs_per_sec'])} | {n(j['consume_msgs_per_sec'])} "
                f"| {ratio(c['consume_msgs_per_sec'], q['consume_msgs_per_sec'])} "
                f"| {ratio(c['consume_msgs_per_sec'], j['consume_msgs_per_sec'])} "
                f"| {cpu(c)} / {cpu(q)} / {cpu(j)} | {cpu(c, 'broker_cpu_us_per_msg')} |"
            )
        lines.append("")

    lines.append("### CipherMQ by configuration\n")
    lines.append(
        "| storage | shards | body | publishers | consumers | publish msg/s | publish MB/s | consume msg/s "
        "| publish→ACK p50 / p99 ms | publish→delivery p50 / p99 ms | complete |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for storage, shards, size, pubs, r, consumers in rows:
        c = r["summary"].get("ciphermq")
        if not c:
            continue
        a, e = c["publish_to_ack"], c["publish_to_delivery"]
        lines.append(
            f"| {storage} | {shards} | {body(size)} | {pubs} | {consumers} | {n(c['publish_msgs_per_sec'])} "
            f"| {c['publish_mb_per_sec']:.1f} | {n(c['consume_msgs_per_sec'])} "
            f"| {ms(a['p50_ms'])} / {ms(a['p99_ms'])} | {ms(e['p50_ms'])} / {ms(e['p99_ms'])} "
            f"| {'yes' if c['complete'] else 'NO'} |"
        )
    lines.append("")


def drain(out, lines):
    """Consume-only: a backlog published first, then drained by one consumer."""
    rows = []
    for p in sorted(out.glob("drain-*.json")):
        m = re.match(r"drain-(\w+)-s(\d+)-b(\d+)\.json", p.name)
        if m:
            rows.append((int(m.group(3)), load(p)))
    if not rows:
        return
    lines.append("### Consume-only: draining a backlog (same run)\n")
    lines.append(
        "| body | queued | CipherMQ consume/s | RabbitMQ consume/s | NATS consume/s | vs RabbitMQ | vs NATS "
        "| load generator CPU µs/msg: CipherMQ / RabbitMQ / NATS | CipherMQ broker CPU µs/msg (publish and drain) | complete |"
    )
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for size, r in sorted(rows, key=lambda x: x[0]):
        s = r["summary"]
        c, q, j = s.get("ciphermq"), s.get("rabbitmq"), s.get("nats")
        if not c:
            continue
        rate = lambda x: x["consume_msgs_per_sec"] if x else 0
        cpu = lambda x, key="client_cpu_us_per_msg": f"{x[key]:.1f}" if x and x.get(key) else "-"
        done = all(x["complete"] for x in (c, q, j) if x)
        queued = n(r["runs"][0]["acked"]) if r.get("runs") else "-"
        lines.append(
            f"| {body(size)} | {queued} | {n(rate(c))} | {n(rate(q))} | {n(rate(j))} "
            f"| {ratio(rate(c), rate(q))} | {ratio(rate(c), rate(j))} "
            f"| {cpu(c)} / {cpu(q)} / {cpu(j)} | {cpu(c, 'broker_cpu_us_per_msg')} | {'yes' if done else 'NO'} |"
        )
    lines.append("")


def latency(out, lines):
    files = sorted(out.glob("latency-*.json"))
    if not files:
        return
    lines.append("### Latency at a fixed rate (from the scheduled send time)\n")
    lines.append(
        "| scenario | broker | rate msg/s | publish→ACK p50 / p90 / p99 / p99.9 / max ms "
        "| publish→delivery p50 / p90 / p99 / p99.9 / max ms | complete |"
    )
    lines.append("|---|---|---:|---:|---:|---|")
    for p in files:
        r = load(p)
        for t in TARGETS:
            s = r["summary"].get(t)
            if not s:
                continue
            q = lambda x: " / ".join(ms(x[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"))
            lines.append(
                f"| {r['scenario']['label']} | {t} | {n(r['scenario']['rate'])} "
                f"| {q(s['publish_to_ack'])} | {q(s['publish_to_delivery'])} "
                f"| {'yes' if s['complete'] else 'NO'} |"
            )
    lines.append("")


def load_levels(out, lines):
    """The load section: latency at 50% and 80% of peak, and the soak."""
    files = [out / f"load-{pct}.json" for pct in (50, 80)] + [out / "soak.json"]
    files = [f for f in files if f.exists()]
    if not files:
        return
    peak = out / "load-peak.txt"
    lines.append("### Latency under load (from the scheduled send time)\n")
    if peak.exists():
        lines.append(f"Sustainable peak: {peak.read_text().strip()} (median of the lower of publish and consume rates).\n")
    lines.append(
        "| scenario | runs | publish→ACK p50 / p99 / p99.9 / max ms (medians) | worst run's p99 / max ms "
        "| publish→delivery p50 / p99 / p99.9 ms | sent late p99 ms (median; per run) | broker waited for a CPU, s/s (median) | windows over 50 ms | RSS after warm-up → end MiB (slope MiB/min) |"
    )
    lines.append("|---|---:|---|---|---|---|---:|---:|---|")
    for p in files:
        r = load(p)
        floor = out / p.name.replace(".json", "-floor.json")
        if floor.exists():
            f = load(floor)
            runs, q, worst, stalls = ack_cells(floor_runs(f))
            lines.append(f"| disk floor at {n(f['rate'])} msg/s (no broker) | {runs} | {q} | {worst} | - | - | - | {stalls} | - |")
        s = r["summary"]["ciphermq"]
        runs = [x for x in r["runs"] if x["target"] == "ciphermq"]
        q = lambda x: " / ".join(ms(x[k]) for k in ("p50_ms", "p99_ms", "p999_ms"))
        worst = f"{ms(max(x['publish_to_ack']['p99_ms'] for x in runs))} / {ms(max(x['publish_to_ack']['max_ms'] for x in runs))}"
        stalls = sum(len(x["ack_timeline"]["stalls"]) + len(x["delivery_timeline"]["stalls"]) for x in runs)
        trend = [x["rss_trend"] for x in runs if x.get("rss_trend")]
        rss = "; ".join(f"{ms(t['after_warm_up_mib'])} → {ms(t['end_mib'])} ({t['slope_mib_per_min']:+.2f})" for t in trend) if p.name == "soak.json" else "-"
        lags = [x["publish_send_lag"]["p99_ms"] for x in runs if x.get("publish_send_lag")]
        late = f"{ms(med(lags))}; {', '.join(ms(l) for l in lags)}" if lags else "-"
        waits = [x["broker_cpu_wait_per_sec"] for x in runs if x.get("broker_cpu_wait_per_sec") is not None]
        waited = f"{med(waits):.2f}" if waits else "-"
        lines.append(
            f"| {r['scenario']['label']} | {len(runs)} | {q(s['publish_to_ack'])} / {ms(s['publish_to_ack']['max_ms'])} | {worst} "
            f"| {q(s['publish_to_delivery'])} | {late} | {waited} | {stalls} | {rss} |"
        )
    lines.append("")


def floor_runs(r):
    """A disk-floor file's runs as (median ACK quantiles, each run's ACK
    quantiles, windows over 50 ms)."""
    runs = r["runs"]
    stalls = sum(len(x["timeline"]["stalls"]) for x in runs)
    return r["median"]["publish_to_ack"], [x["publish_to_ack"] for x in runs], stalls


def broker_runs(r):
    """The same for CipherMQ's runs of a load-generator file (ACK windows)."""
    runs = [x for x in r["runs"] if x["target"] == "ciphermq"]
    stalls = sum(len(x["ack_timeline"]["stalls"]) for x in runs)
    return r["summary"]["ciphermq"]["publish_to_ack"], [x["publish_to_ack"] for x in runs], stalls


def ack_cells(runs):
    """Table cells: runs, publish→ACK p50 / p99 / p99.9 / max (medians),
    the worst run's p99 / max, windows over 50 ms."""
    median, qs, stalls = runs
    q = " / ".join(ms(median[k]) for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms"))
    worst = f"{ms(max(x['p99_ms'] for x in qs))} / {ms(max(x['max_ms'] for x in qs))}"
    return [str(len(qs)), q, worst, str(stalls)]


def tail(out, lines):
    """The tail section: the broker at 5,000 msg/s next to the disk's own
    floor (ciphermq-bench disk-floor) measured right before and after it."""
    p = out / "tail-durable-5000.json"
    if not p.exists():
        return
    lines.append("### Durable tail at 5,000 msg/s, next to the disk's floor\n")
    lines.append(
        "| measured | runs | publish→ACK p50 / p99 / p99.9 / max ms (medians) | worst run's p99 / max ms | windows over 50 ms |"
    )
    lines.append("|---|---:|---|---|---:|")
    rows = [
        ("disk floor, before", out / "tail-floor-before.json", floor_runs),
        ("broker", p, broker_runs),
        ("disk floor, after", out / "tail-floor-after.json", floor_runs),
    ]
    for label, f, read in rows:
        if f.exists():
            lines.append(f"| {label} | {' | '.join(ack_cells(read(load(f))))} |")
    lines.append("")


BROKER_HISTOGRAMS = (
    ("fsync", "ciphermq_fsync_seconds"),
    ("commit round", "ciphermq_commit_round_seconds"),
    ("commit wake", "ciphermq_commit_wake_seconds"),
    ("publish→ACK", "ciphermq_publish_ack_seconds"),
    ("loop lag", "ciphermq_shard_loop_lag_seconds"),
)


def histogram_buckets(path, family):
    """Cumulative bucket counts of one /metrics histogram, summed over
    shards, keyed by upper bound (seconds; `+Inf` as infinity)."""
    buckets = {}
    pattern = re.compile(rf'^{family}_bucket{{.*le="([^"]+)"}} (\d+)$')
    for line in path.read_text().splitlines():
        m = pattern.match(line)
        if m:
            le = float("inf") if m[1] == "+Inf" else float(m[1])
            buckets[le] = buckets.get(le, 0) + int(m[2])
    return buckets


def bucket_quantile(buckets, q):
    """The smallest bucket bound holding quantile `q`, as "≤ x ms"."""
    total = buckets.get(float("inf"), 0)
    if total <= 0:
        return "-"
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return "> last bound" if le == float("inf") else f"≤ {ms(le * 1000)}"
    return "-"


def share_above(buckets, bound):
    """The share of observations above `bound` seconds (a bucket bound), as
    a percentage: finer than a bucket-bound quantile for comparing runs."""
    total = buckets.get(float("inf"), 0)
    if total <= 0 or bound not in buckets:
        return "-"
    return f"{100 * (total - buckets[bound]) / total:.2f}%"


def broker_histograms(out, lines):
    """The broker's own latency histograms over each latency section's runs:
    /metrics taken before and after them (run-compare.sh), differenced."""
    rows = []
    for name in ("tail-durable-5000", "load-50", "load-80"):
        before, after = out / f"{name}-metrics-before.txt", out / f"{name}-metrics-after.txt"
        if not (before.exists() and after.exists()):
            continue
        cells = []
        for _, family in BROKER_HISTOGRAMS:
            b, a = histogram_buckets(before, family), histogram_buckets(after, family)
            diff = {le: a[le] - b.get(le, 0) for le in a}
            cells.append(" / ".join(bucket_quantile(diff, q) for q in (0.5, 0.99)))
            if family == "ciphermq_publish_ack_seconds":
                over = share_above(diff, 0.01)
        rows.append(f"| {name} | {' | '.join(cells)} | {over} |")
    if not rows:
        return
    lines.append("### The broker's own histograms over those runs (bucket bounds, ms: p50 / p99)\n")
    lines.append("| section | " + " | ".join(label for label, _ in BROKER_HISTOGRAMS) + " | publish→ACK over 10 ms |")
    lines.append("|---|" + "---|" * (len(BROKER_HISTOGRAMS) + 1))
    lines.extend(rows)
    lines.append("")


def memory(out, lines):
    rss = sorted(out.glob("rss-*.json"))
    idle = out / "idle.json"
    if not rss and not idle.exists():
        return
    lines.append("### Broker memory\n")
    lines.append("| case | RSS before | RSS after | payload held | RSS ÷ payload |")
    lines.append("|---|---:|---:|---:|---:|")
    for p in rss:
        r = load(p)
        storage = p.stem.split("-", 1)[1]
        text = (out / f"rss-{storage}.txt").read_text() if (out / f"rss-{storage}.txt").exists() else ""
        kib = lambda tag: int(re.search(rf"{tag}:\s+VmRSS:\s+(\d+)", text).group(1)) if re.search(rf"{tag}:\s+VmRSS:\s+(\d+)", text) else None
        before, after = kib("before"), kib("queued")
        run = r["runs"][0]
        held = run["acked"] * r["scenario"]["size_bytes"]
        if before is None or after is None:
            continue
        lines.append(
            f"| {storage}: {n(run['acked'])} queued {r['scenario']['size_bytes']} B messages "
            f"| {before / 1024:.0f} MiB | {after / 1024:.0f} MiB | {held / 2**20:.0f} MiB "
            f"| {after * 1024 / held:.2f} |"
        )
    if idle.exists():
        r = load(idle)
        b, d = r.get("broker_before"), r.get("broker_with_connections")
        if b and d:
            lines.append(
                f"| {n(r['connections'])} idle mTLS connections | {b['rss_mib']:.0f} MiB | {d['rss_mib']:.0f} MiB "
                f"| - | {r['broker_kib_per_connection']:.1f} KiB per connection |"
            )
    lines.append("")


def pgbridge(out, lines):
    runs = {}
    for p in sorted(out.glob("pgbridge-*-r*.json")):
        m = re.match(r"pgbridge-(durable|postgres)-r(\d+)\.json", p.name)
        if m:
            s = load(p)["summary"].get("ciphermq")
            if s:
                runs.setdefault(m.group(1), []).append(s)
    if not runs:
        return
    lines.append("### Postgres bridge (durable, 1 KiB, 1 shard, 1 publisher, 1 consumer)\n")
    lines.append("| metadata mirror | runs | publish msg/s | consume msg/s | publish→ACK p99 ms |")
    lines.append("|---|---:|---:|---:|---:|")
    for mode in ("durable", "postgres"):
        rs = runs.get(mode, [])
        if rs:
            lines.append(
                f"| {'off (embedded)' if mode == 'durable' else 'on (postgres)'} | {len(rs)} "
                f"| {n(med([r['publish_msgs_per_sec'] for r in rs]))} "
                f"| {n(med([r['consume_msgs_per_sec'] for r in rs]))} "
                f"| {ms(med([r['publish_to_ack']['p99_ms'] for r in rs]))} |"
            )
    if runs.get("durable") and runs.get("postgres"):
        on = med([r["publish_msgs_per_sec"] for r in runs["postgres"]])
        off = med([r["publish_msgs_per_sec"] for r in runs["durable"]])
        lines.append(f"\nOn ÷ off (publish): {ratio(on, off)}.\n")
    for p in sorted(out.glob("pgbridge-rows-r*.txt")):
        lines.append(f"- {p.stem}: `{p.read_text().strip()}`")
    lag = out / "pgbridge-lag.txt"
    if lag.exists():
        lines.append(f"- lag at 50% of peak: `{lag.read_text().strip()}`")
    lines.append("")


def paired_runs(out, section, sides):
    """CipherMQ summaries of `{section}-{side}-p{publishers}-r{run}.json`,
    as {(publishers, run): {side: summary}}."""
    pattern = re.compile(rf"{section}-({'|'.join(sides)})-p(\d+)-r(\d+)\.json")
    pairs = {}
    for p in sorted(out.glob(f"{section}-*-p*-r*.json")):
        m = pattern.fullmatch(p.name)
        if m:
            s = load(p)["summary"].get("ciphermq")
            if s:
                pairs.setdefault((int(m.group(2)), int(m.group(3))), {})[m.group(1)] = s
    return pairs


def durability(out, lines):
    """Durable ÷ in-memory publish rate within each adjacent pair of runs."""
    pairs = paired_runs(out, "durability", ("durable", "memory"))
    if not pairs:
        return
    lines.append("### Price of durability (1 KiB, 1 shard, 1 consumer; durable run, then in-memory run)\n")
    lines.append(
        "| publishers | pairs | durable ÷ in-memory, median (range) | durable publish/s | in-memory publish/s "
        "| durable ACK p99 ms | fsyncs/s | all pairs complete |"
    )
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---|")
    for pubs in sorted({k[0] for k in pairs}):
        runs = [v | {"run": k[1]} for k, v in sorted(pairs.items()) if k[0] == pubs and len(v) == 2]
        if not runs:
            continue
        ratios = [r["durable"]["publish_msgs_per_sec"] / r["memory"]["publish_msgs_per_sec"] for r in runs]
        fsyncs = []
        for r in runs:
            f = out / f"durability-fsyncs-p{pubs}-r{r['run']}.txt"
            m = re.search(r"fsyncs_per_s=(\d+)", f.read_text()) if f.exists() else None
            if m:
                fsyncs.append(int(m.group(1)))
        complete = all(r[mode]["complete"] for r in runs for mode in ("durable", "memory"))
        lines.append(
            f"| {pubs} | {len(runs)} | **{med(ratios):.0%}** ({min(ratios):.0%}–{max(ratios):.0%}) "
            f"| {n(med([r['durable']['publish_msgs_per_sec'] for r in runs]))} "
            f"| {n(med([r['memory']['publish_msgs_per_sec'] for r in runs]))} "
            f"| {ms(med([r['durable']['publish_to_ack']['p99_ms'] for r in runs]))} "
            f"| {n(med(fsyncs)) if fsyncs else '-'} | {'yes' if complete else 'NO'} |"
        )
    lines.append("")


def ab(out, lines):
    """This tree's broker ÷ the base broker within each adjacent pair."""
    pairs = paired_runs(out, "ab", ("base", "new"))
    if not pairs:
        return
    # CPU per message is kept per run, not in the summaries.
    for (pubs, run), sides in pairs.items():
        for side, s in sides.items():
            f = out / f"ab-{side}-p{pubs}-r{run}.json"
            rs = [r for r in load(f)["runs"] if r.get("target") == "ciphermq"]
            for key in ("broker_cpu_us_per_msg", "client_cpu_us_per_msg"):
                s[key] = rs[0].get(key) if rs else None
    label = load(out / f"ab-base-p{min(k[0] for k in pairs)}-r1.json").get("scenario", {}).get("label", "")
    lines.append(f"### Before/after ({label.removeprefix('base, ') or 'durable, 1 shard'}; base run, then new run)\n")
    lines.append(
        "| publishers | pairs | publish new ÷ base, median (range) | consume new ÷ base, median (range) "
        "| base publish/s | new publish/s | base / new broker CPU µs/msg | base / new client CPU µs/msg "
        "| base / new ACK p99 ms | base / new ACK max ms | all complete |"
    )
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for pubs in sorted({k[0] for k in pairs}):
        runs = [v for k, v in sorted(pairs.items()) if k[0] == pubs and len(v) == 2]
        if not runs:
            continue

        def spread(key):
            rs = [r["new"][key] / r["base"][key] for r in runs if r["base"][key]]
            return f"**{med(rs):.0%}** ({min(rs):.0%}–{max(rs):.0%})" if rs else "-"

        def both(f):
            return f"{ms(med([f(r['base']) for r in runs]))} / {ms(med([f(r['new']) for r in runs]))}"

        def cpu(key):
            sides = [[r[side][key] for r in runs if r[side].get(key)] for side in ("base", "new")]
            return " / ".join(f"{med(v):.2f}" if v else "-" for v in sides)

        complete = all(r[side]["complete"] for r in runs for side in ("base", "new"))
        lines.append(
            f"| {pubs} | {len(runs)} | {spread('publish_msgs_per_sec')} | {spread('consume_msgs_per_sec')} "
            f"| {n(med([r['base']['publish_msgs_per_sec'] for r in runs]))} "
            f"| {n(med([r['new']['publish_msgs_per_sec'] for r in runs]))} "
            f"| {cpu('broker_cpu_us_per_msg')} | {cpu('client_cpu_us_per_msg')} "
            f"| {both(lambda s: s['publish_to_ack']['p99_ms'])} "
            f"| {both(lambda s: s['publish_to_ack']['max_ms'])} | {'yes' if complete else 'NO'} |"
        )
    lines.append("")


def cluster(out, lines):
    """A 1-node cluster ÷ a broker on its own within each adjacent pair."""
    pairs = paired_runs(out, "cluster", ("alone", "node"))
    if not pairs:
        return
    # Broker CPU per message is kept per run, not in the summaries.
    for (pubs, run), sides in pairs.items():
        for side, s in sides.items():
            f = out / f"cluster-{side}-p{pubs}-r{run}.json"
            cpu = [r.get("broker_cpu_us_per_msg") for r in load(f)["runs"] if r.get("target") == "ciphermq"]
            s["broker_cpu_us_per_msg"] = cpu[0] if cpu and cpu[0] else None
    lines.append(
        "### A 1-node cluster vs a broker on its own (durable + Postgres backend, 1 KiB, 1 shard, "
        "1 consumer; alone, then node)\n"
    )
    lines.append(
        "| publishers | pairs | publish node ÷ alone, median (range) | consume node ÷ alone, median (range) "
        "| broker CPU per message node ÷ alone | alone / node publish/s | alone / node ACK p99 ms "
        "| alone / node ACK max ms | all complete |"
    )
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for pubs in sorted({k[0] for k in pairs}):
        runs = [v for k, v in sorted(pairs.items()) if k[0] == pubs and len(v) == 2]
        if not runs:
            continue

        def spread(key):
            rs = [r["node"][key] / r["alone"][key] for r in runs if r["alone"].get(key) and r["node"].get(key)]
            return f"**{med(rs):.0%}** ({min(rs):.0%}–{max(rs):.0%})" if rs else "-"

        def both(f):
            return f"{ms(med([f(r['alone']) for r in runs]))} / {ms(med([f(r['node']) for r in runs]))}"

        complete = all(r[side]["complete"] for r in runs for side in ("alone", "node"))
        lines.append(
            f"| {pubs} | {len(runs)} | {spread('publish_msgs_per_sec')} | {spread('consume_msgs_per_sec')} "
            f"| {spread('broker_cpu_us_per_msg')} "
            f"| {n(med([r['alone']['publish_msgs_per_sec'] for r in runs]))} / "
            f"{n(med([r['node']['publish_msgs_per_sec'] for r in runs]))} "
            f"| {both(lambda s: s['publish_to_ack']['p99_ms'])} "
            f"| {both(lambda s: s['publish_to_ack']['max_ms'])} | {'yes' if complete else 'NO'} |"
        )
    lines.append("")


def scaleout(out, lines):
    """Two streams' summed rates: a 2-node cluster ÷ one node with 2 shards."""
    pattern = re.compile(r"scaleout-(one|two)-s([12])-r(\d+)\.json")
    runs = {}
    for p in sorted(out.glob("scaleout-*.json")):
        m = pattern.fullmatch(p.name)
        if m:
            s = load(p)["summary"].get("ciphermq")
            if s:
                runs.setdefault(int(m.group(3)), {}).setdefault(m.group(1), {})[m.group(2)] = s
    pairs = [r for _, r in sorted(runs.items()) if all(len(r.get(side, {})) == 2 for side in ("one", "two"))]
    if not pairs:
        return
    lines.append(
        "### 2 nodes × 1 shard vs 1 node × 2 shards (two streams at once, durable + Postgres, 1 KiB; "
        "one node, then the cluster)\n"
    )
    lines.append(
        "| pairs | publish two nodes ÷ one node, median (range) | consume, median (range) "
        "| one node publish/s (sum) | two nodes publish/s (sum) | all complete |"
    )
    lines.append("|---:|---:|---:|---:|---:|---|")

    def total(side, r, key):
        return sum(r[side][s][key] for s in ("1", "2"))

    def spread(key):
        rs = [total("two", r, key) / total("one", r, key) for r in pairs if total("one", r, key)]
        return f"**{med(rs):.0%}** ({min(rs):.0%}–{max(rs):.0%})" if rs else "-"

    complete = all(r[side][s]["complete"] for r in pairs for side in ("one", "two") for s in ("1", "2"))
    lines.append(
        f"| {len(pairs)} | {spread('publish_msgs_per_sec')} | {spread('consume_msgs_per_sec')} "
        f"| {n(med([total('one', r, 'publish_msgs_per_sec') for r in pairs]))} "
        f"| {n(med([total('two', r, 'publish_msgs_per_sec') for r in pairs]))} | {'yes' if complete else 'NO'} |"
    )
    lines.append("")


def mixed(out, lines):
    """Publish-only ÷ one publisher + one consumer within each adjacent pair,
    then one consumer behind 4 and 16 publishers."""
    pattern = re.compile(r"mixed-p1-c([01])-r(\d+)\.json")
    pairs = {}
    for p in sorted(out.glob("mixed-p1-c*-r*.json")):
        m = pattern.fullmatch(p.name)
        if m:
            pairs.setdefault(int(m.group(2)), {})[int(m.group(1))] = load(p)
    runs = [v for _, v in sorted(pairs.items()) if len(v) == 2]
    if not runs:
        return
    lines.append("### Mixed load (durable, 1 KiB, 1 shard, max rate; publish-only run, then 1 publisher + 1 consumer)\n")
    lines.append("| pair | publish-only publish/s | 1 + 1 publish/s | 1 + 1 ÷ publish-only | broker CPU µs/msg (publish-only / 1 + 1) |")
    lines.append("|---:|---:|---:|---:|---|")
    ratios = []
    for i, r in enumerate(runs, 1):
        alone, mixed_run = r[0], r[1]
        ratios.append(mixed_run["publish_msgs_per_sec"] / alone["publish_msgs_per_sec"])
        cpu = " / ".join(
            f"{x['broker_cpu_us_per_msg']:.1f}" if x.get("broker_cpu_us_per_msg") else "-"
            for x in (alone, mixed_run)
        )
        lines.append(
            f"| {i} | {n(alone['publish_msgs_per_sec'])} | {n(mixed_run['publish_msgs_per_sec'])} "
            f"| {ratios[-1]:.2f} | {cpu} |"
        )
    lines.append(f"\nMedian 1 + 1 ÷ publish-only: **{med(ratios):.2f}** (the target is 0.90).\n")
    more = []
    for name, label in (
        ("mixed-p4-c1", "4 publishers"),
        ("mixed-p16-c1", "16 publishers"),
        ("mixed-p16-c1-prefetch10000", "16 publishers, prefetch 10,000"),
    ):
        p = out / f"{name}.json"
        if not p.exists():
            continue
        d = load(p)
        per_run = ", ".join(
            f"{n(r['publish_msgs_per_sec'])} / {n(r['consume_msgs_per_sec'])}" for r in d["runs"]
        )
        s = d["summary"]["ciphermq"]
        more.append(
            f"| {label} | {per_run} | {ms(s['publish_to_delivery']['p99_ms'])} "
            f"| {'yes' if s['complete'] else 'NO'} |"
        )
    if more:
        lines.append("| one consumer behind | published / consumed msg/s per run | e2e p99 ms (median) | keeps up (all delivered) |")
        lines.append("|---|---|---:|---|")
        lines.extend(more)
        lines.append("")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    lines = []
    machine = out / "machine.txt"
    if machine.exists():
        lines.append("```\n" + machine.read_text().strip() + "\n```\n")
    throughput(out, lines)
    drain(out, lines)
    latency(out, lines)
    durability(out, lines)
    ab(out, lines)
    cluster(out, lines)
    scaleout(out, lines)
    mixed(out, lines)
    tail(out, lines)
    load_levels(out, lines)
    broker_histograms(out, lines)
    memory(out, lines)
    pgbridge(out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
