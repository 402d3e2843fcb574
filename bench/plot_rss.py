#!/usr/bin/env python3
"""Plots the broker's RSS as sampled by bench/run-compare.sh (backlog section)
into an SVG: one line per file of `seconds<TAB>KiB` rows, with a dashed limit.

    bench/plot_rss.py OUT.svg LIMIT_MIB "label:file.tsv" ["label:file.tsv" ...]

No dependencies beyond the standard library, so it runs on a fresh machine.
"""

import sys

W, H, PAD = 720, 360, 56
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def series(path):
    points = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                points.append((float(parts[0]), int(parts[1]) / 1024))
    return points


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, limit = sys.argv[1], float(sys.argv[2])
    lines = []
    offset = 0.0
    for arg in sys.argv[3:]:
        label, path = arg.split(":", 1)
        pts = [(t + offset, m) for t, m in series(path)]
        if pts:
            offset = pts[-1][0] + 1
        lines.append((label, pts))
    t_max = max((p[-1][0] for _, p in lines if p), default=1) or 1
    m_max = max([limit * 1.25] + [m for _, p in lines for _, m in p])
    x = lambda t: PAD + (W - 2 * PAD) * t / t_max
    y = lambda m: H - PAD - (H - 2 * PAD) * m / m_max
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<text x="{W / 2}" y="{H - 16}" text-anchor="middle">seconds</text>',
           f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">RSS, MiB</text>']
    for i in range(5):
        m = m_max * i / 4
        svg.append(f'<text x="{PAD - 6}" y="{y(m) + 4:.0f}" text-anchor="end">{m:.0f}</text>')
        t = t_max * i / 4
        svg.append(f'<text x="{x(t):.0f}" y="{H - PAD + 16}" text-anchor="middle">{t:.0f}</text>')
    svg.append(f'<line x1="{PAD}" y1="{y(limit):.1f}" x2="{W - PAD}" y2="{y(limit):.1f}" stroke="gray" stroke-dasharray="6 4"/>')
    svg.append(f'<text x="{W - PAD}" y="{y(limit) - 6:.0f}" text-anchor="end" fill="gray">{limit:.0f} MiB</text>')
    for i, (label, pts) in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x(t):.1f},{y(m):.1f}" for t, m in pts)
        svg.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        svg.append(f'<text x="{PAD + 10}" y="{PAD + 16 * i}" fill="{colour}">{label}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
