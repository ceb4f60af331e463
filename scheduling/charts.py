"""Server-rendered SVG charts for the operators' pages: geometry only, the templates draw it
(templates/ops/_timeseries.html, the capacity bars). No charting library, nothing fetched at run
time; every chart has its numbers as text beside it and a table of its points, so colour is
never the only carrier. A time series (`timeseries`) has axes with units and times, and a
focusable point per step (its value in its label and <title>; static/js/charts.js moves between
them with the arrow keys and shows the one under the pointer or focus)."""

from __future__ import annotations

import math

from django.utils import timezone

WIDTH = 300  # the capacity and share bars' width (viewBox units)


def stacked(parts: list[tuple[str, str, float]], total: float, *, width: int = WIDTH) -> list:
    """Segments (label, css class, value) laid side by side over `total`, each with its x,
    width and percent; empty segments are left out."""
    segments, x = [], 0.0
    for label, css, value in parts:
        if value <= 0 or total <= 0:
            continue
        w = value / total * width
        segments.append(
            {"label": label, "css": css, "value": value, "x": x, "w": w, "pct": 100 * value / total}
        )
        x += w
    return segments


# A time series' frame: the plot area inside margins for the axes' labels (viewBox units).
TS_WIDTH, TS_HEIGHT = 560, 180
MARGIN = {"left": 48, "right": 12, "top": 10, "bottom": 24}


def nice_top(peak: float, floor: float = 0.0) -> float:
    """The axis top: a round number (1, 2, 2.5, 5 × 10^k) at or above `peak` and `floor`."""
    peak = max(peak, floor)
    if peak <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(peak))
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= peak * (1 - 1e-9):
            return m * magnitude
    return 10 * magnitude


def fmt(value, unit: str = "") -> str:
    """A value as the charts print it: at most two decimals, its unit after it."""
    if value is None:
        return "no data"
    text = f"{value:,.2f}".rstrip("0").rstrip(".") if value % 1 else f"{value:,.0f}"
    return f"{text}{(' ' + unit) if unit and unit != '%' else unit}"


def _time_label(at, span_s: float) -> str:
    local = timezone.localtime(at)
    return local.strftime("%a %H:%M") if span_s > 86400 else local.strftime("%H:%M")


def timeseries(
    points: list[dict],
    series: list[tuple[str, str, str]],
    *,
    unit: str = "",
    top: float | None = None,
    floor: float = 0.0,
    ticks: int = 4,
) -> dict:
    """A time series chart of `points` ([{"at": datetime, key: value or None, …}]) drawn as one
    line per `series` (key, label, css class): x and y axes with their tick labels (times;
    values with `unit`), one polyline per series (a gap where a value is None), and one point
    per step and series with its label ("14:05 requested 42 %"). `top`: the y axis' top (else
    a round number over the peak, at least `floor`, e.g. 100 for percentages)."""
    left, right = MARGIN["left"], TS_WIDTH - MARGIN["right"]
    plot_top, bottom = MARGIN["top"], TS_HEIGHT - MARGIN["bottom"]
    values = [p.get(key) for p in points for key, _, _ in series]
    peak = max((v for v in values if v is not None), default=0.0)
    top = top if top is not None else nice_top(peak, floor)
    n = len(points)
    step = (right - left) / max(n - 1, 1)

    def x(i):
        return left + i * step

    def y(v):
        return bottom - min(max(v, 0), top) / top * (bottom - plot_top)

    span_s = (points[-1]["at"] - points[0]["at"]).total_seconds() if n > 1 else 0
    y_ticks = [
        {"y": y(top * i / ticks), "label": fmt(top * i / ticks, unit)} for i in range(ticks + 1)
    ]
    x_every = max(1, round(n / 5))
    x_ticks = [
        {"x": x(i), "label": _time_label(points[i]["at"], span_s)}
        for i in range(0, n, x_every)
        if x(i) <= right - 20 or i == n - 1
    ]
    lines, dots = [], []
    for key, label, css in series:
        runs, run = [], []
        for i, p in enumerate(points):
            v = p.get(key)
            if v is None:
                if run:
                    runs.append(run)
                run = []
                continue
            run.append(f"{x(i):.1f},{y(v):.1f}")
        if run:
            runs.append(run)
        lines.append({"key": key, "label": label, "css": css, "runs": [" ".join(r) for r in runs]})
    for i, p in enumerate(points):
        when = timezone.localtime(p["at"]).strftime("%Y-%m-%d %H:%M")
        parts = [f"{label} {fmt(p.get(key), unit)}" for key, label, _ in series]
        present = [p.get(key) for key, _, _ in series if p.get(key) is not None]
        dots.append(
            {
                "i": i,
                "x": x(i),
                "y": y(max(present)) if present else bottom,
                "empty": not present,
                "label": f"{when}: " + ", ".join(parts),
            }
        )
    return {
        "width": TS_WIDTH,
        "height": TS_HEIGHT,
        "left": left,
        "right": right,
        "top_y": plot_top,
        "bottom": bottom,
        "top": top,
        "unit": unit,
        "y_ticks": y_ticks,
        "x_ticks": x_ticks,
        "lines": lines,
        "dots": dots,
        "series": [{"key": k, "label": lab, "css": css} for k, lab, css in series],
        "rows": [
            {
                "at": p["at"],
                "values": [fmt(p.get(key), unit) for key, _, _ in series],
            }
            for p in points
        ],
    }
