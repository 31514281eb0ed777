#!/usr/bin/env python3
"""Draws the panels of packaging/monitoring/dashboard.json as one PNG, with
each panel's own queries evaluated by a real Prometheus.

Grafana itself cannot be installed from the package registries this project
uses, so docs/monitoring.md's picture is made by this script instead: every
number and line in it comes from the dashboard's PromQL, run by Prometheus
over the interval given, laid out by the panels' gridPos. Only what the
dashboard uses is drawn: rows, stat panels (value and threshold colour),
tables (instant queries merged on their shared labels, renamed as the
dashboard's "organize" transformation says) and time series (legendFormat,
unit). scripts/dashboard-demo.sh makes the cluster and runs this script.

    render-dashboard.py --prometheus http://127.0.0.1:9090 --start T0 --end T1 --out docs/monitoring-dashboard.png
"""

import argparse
import json
import re
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

BACKGROUND = "#111217"
PANEL = "#181b1f"
TEXT = "#ccccdc"
MUTED = "#8e8e9e"
GRID = "#2c3235"
COLOURS = {"green": "#73bf69", "red": "#f2495c", "orange": "#ff9830", "yellow": "#fade2a"}
PALETTE = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0",
           "#508642", "#cca300", "#447ebc", "#c15c17"]
UNIT_HEIGHT = 0.36  # inches per Grafana grid row (30 px)
WIDTH = 18.0  # inches for 24 grid columns


def query(base, path, params):
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as reply:
        body = json.load(reply)
    if body.get("status") != "success":
        sys.exit(f"render-dashboard: {path} {params.get('query')}: {body}")
    return body["data"]["result"]


def expand(expr, variables):
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value).replace(f"${{{name}}}", value)
    return expr


def legend(fmt, labels):
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt or "")
    return text or json.dumps(labels)


def fmt_value(value, unit):
    if value != value:  # NaN
        return "—"
    if value == 0:
        return "0"
    if unit == "s":
        if abs(value) < 1:
            return f"{value * 1000:.3g} ms"
        return f"{value:.3g} s"
    if unit == "Bps":
        for factor, name in ((1e6, "MB/s"), (1e3, "kB/s")):
            if abs(value) >= factor:
                return f"{value / factor:.3g} {name}"
        return f"{value:.3g} B/s"
    if unit == "ops":
        return f"{value:.3g}/s"
    return f"{value:.4g}"


def threshold_colour(value, steps):
    colour = steps[0]["color"]
    for step in steps[1:]:
        if value >= step["value"]:
            colour = step["color"]
    return COLOURS.get(colour, colour)


class Box:
    """A panel's place in the figure, in inches from the bottom left."""

    def __init__(self, fig, panel, rows_total):
        pos = panel["gridPos"]
        self.fig = fig
        self.left = pos["x"] * WIDTH / 24 + 0.04
        self.width = pos["w"] * WIDTH / 24 - 0.08
        self.height = pos["h"] * UNIT_HEIGHT - 0.08
        self.bottom = (rows_total - pos["y"] - pos["h"]) * UNIT_HEIGHT + 0.04
        frame = self.axes(0, 0, 0, 0)
        frame.set_facecolor(PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for spine in frame.spines.values():
            spine.set_color(GRID)
        frame.text(0.1 / self.width, 1 - 0.2 / self.height, panel["title"], transform=frame.transAxes,
                   color=TEXT, fontsize=9, fontweight="bold", va="center")

    def rect(self, left, right, top, bottom):
        """The figure fraction of the box less margins (inches)."""
        fig_w, fig_h = self.fig.get_size_inches()
        return [(self.left + left) / fig_w, (self.bottom + bottom) / fig_h,
                (self.width - left - right) / fig_w, (self.height - top - bottom) / fig_h]

    def axes(self, left, right, top, bottom):
        return self.fig.add_axes(self.rect(left, right, top, bottom))


def draw_stat(box, panel, args, variables):
    ax = box.axes(0.1, 0.1, 0.4, 0.1)
    ax.axis("off")
    target = panel["targets"][0]
    result = query(args.prometheus, "query", {"query": expand(target["expr"], variables), "time": args.end})
    value = float(result[0]["value"][1]) if result else float("nan")
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    colour = threshold_colour(value, steps) if value == value else GRID
    ax.add_patch(FancyBboxPatch((0.0, 0.0), 1.0, 1.0, boxstyle="round,pad=0.01", color=colour,
                                transform=ax.transAxes))
    ax.text(0.5, 0.5, fmt_value(value, "none"), transform=ax.transAxes, ha="center", va="center",
            color="white", fontsize=22, fontweight="bold")


def draw_table(box, panel, args, variables):
    ax = box.axes(0.1, 0.1, 0.4, 0.1)
    ax.axis("off")
    tables = []
    for target in panel["targets"]:
        result = query(args.prometheus, "query", {"query": expand(target["expr"], variables), "time": args.end})
        tables.append([r["metric"] for r in result])
    # Grafana's "merge": rows of every query joined on the labels they share.
    merged = tables[0]
    for rows in tables[1:]:
        joined = []
        for left in merged:
            for right in rows:
                shared = set(left) & set(right)
                if all(left[k] == right[k] for k in shared):
                    joined.append({**left, **right})
        merged = joined
    organize = next((t["options"] for t in panel.get("transformations", []) if t["id"] == "organize"), {})
    names = organize.get("renameByName", {})
    columns = [c for c in names if any(c in row for row in merged)]
    cells = [[row.get(c, "") for c in columns] for row in sorted(merged, key=lambda r: [r.get(c, "") for c in columns])]
    if not cells:
        ax.text(0.5, 0.5, "No data", color=MUTED, ha="center", transform=ax.transAxes)
        return
    table = ax.table(cellText=cells, colLabels=[names[c] for c in columns], loc="upper center",
                     cellLoc="left", colLoc="left", bbox=[0.0, 0.0, 1.0, 1.0])
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for (row, _), cell in table.get_celld().items():
        cell.set_edgecolor(GRID)
        cell.set_facecolor(PANEL if row else "#22252b")
        cell.get_text().set_color(TEXT)


def draw_timeseries(box, panel, args, variables):
    defaults = panel["fieldConfig"]["defaults"]
    unit = defaults.get("unit", "none")
    lines = []
    for target in panel["targets"]:
        result = query(args.prometheus, "query_range", {
            "query": expand(target["expr"], variables), "start": args.start, "end": args.end, "step": args.step})
        for series in result:
            times = [(float(t) - args.start) / 60 for t, _ in series["values"]]
            values = [float(v) for _, v in series["values"]]
            lines.append((times, values, legend(target.get("legendFormat"), series["metric"])))
    # The legend goes below the plot, as Grafana puts it: three to a row.
    n_cols = 3 if box.width > 6 else 2
    legend_rows = -(-len(lines) // n_cols)
    ax = box.axes(0.75, 0.15, 0.35, 0.35 + 0.15 * legend_rows)
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    for n, (times, values, label) in enumerate(lines):
        ax.plot(times, values, color=PALETTE[n % len(PALETTE)], linewidth=1.2, label=label)
    ax.tick_params(colors=MUTED, labelsize=7)
    ax.grid(color=GRID, linewidth=0.5)
    ax.set_xlim(0, (args.end - args.start) / 60)
    ax.set_ylim(bottom=defaults.get("min"), top=defaults.get("max"))
    if all(max(values, default=0) <= 0 for _, values, _ in lines) and defaults.get("max") is None:
        ax.set_ylim(bottom=0, top=1)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g} min"))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: fmt_value(v, unit)))
    if lines:
        box.fig.legend(handles=ax.get_lines(), loc="upper left", ncol=n_cols, fontsize=6.5, frameon=False,
                       labelcolor=TEXT, bbox_to_anchor=box.rect(0.75, 0.15, 0, 0.13 + 0.15 * legend_rows)[:2],
                       bbox_transform=box.fig.transFigure, borderaxespad=0, handlelength=1.5)
    else:
        ax.text(0.5, 0.5, "No data", color=MUTED, ha="center", transform=ax.transAxes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--dashboard", default="packaging/monitoring/dashboard.json")
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--end", type=float, required=True)
    parser.add_argument("--step", type=float, default=5)
    parser.add_argument("--rate-interval", default="1m", help="what Grafana's $__rate_interval stands for")
    parser.add_argument("--job", default="salt-keysync")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dashboard = json.load(open(args.dashboard))
    variables = {"__rate_interval": args.rate_interval, "job": args.job, "instance": ".+"}
    panels = dashboard["panels"]
    rows_total = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(WIDTH, rows_total * UNIT_HEIGHT), facecolor=BACKGROUND)
    for panel in panels:
        if panel["type"] == "row":
            pos = panel["gridPos"]
            fig.text(0.005, 1 - (pos["y"] + 0.7) / rows_total, panel["title"], color=TEXT, fontsize=11,
                     fontweight="bold")
            continue
        box = Box(fig, panel, rows_total)
        {"stat": draw_stat, "table": draw_table, "timeseries": draw_timeseries}[panel["type"]](box, panel, args, variables)
    fig.savefig(args.out, dpi=80, facecolor=BACKGROUND)
    print(f"render-dashboard: {len(panels)} panels → {args.out}")


if __name__ == "__main__":
    main()
