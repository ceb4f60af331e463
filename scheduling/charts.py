"""Server-rendered SVG charts for the operators' pages: geometry only, the templates draw it
(templates/ops/_line.html, _bar.html). No charting library, nothing fetched at run time; every
chart has its numbers as text beside it, so colour is never the only carrier."""

from __future__ import annotations

WIDTH, HEIGHT = 300, 60


def line(values, *, width: int = WIDTH, height: int = HEIGHT, top: float | None = None) -> dict:
    """A polyline of `values` scaled into width × height (0 at the bottom, `top` at the top:
    the largest value unless given, e.g. 100 for percentages)."""
    values = [float(v or 0) for v in values]
    top = top if top is not None else max(values, default=0.0)
    top = top or 1.0
    step = width / max(len(values) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{height - min(v, top) / top * height:.1f}" for i, v in enumerate(values)
    )
    return {
        "points": points,
        "width": width,
        "height": height,
        "top": top,
        "last": values[-1] if values else 0.0,
        "peak": max(values, default=0.0),
    }


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
