"""Metrics as server-rendered SVG line charts: one chart per metric name, steps on x. No JavaScript;
long series are thinned to the minimum and maximum of each bucket so spikes stay visible."""
from __future__ import annotations

import math
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 480, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 12, 26
MAX_POINTS = 800          # drawn per chart; more would not show on 480 pixels anyway
MAX_ROWS = 100_000        # loaded per job page


@dataclass
class Chart:
    name: str
    svg: SafeString
    points: int
    last_step: int
    last_value: float

    @property
    def last_label(self) -> str:
        return _number(self.last_value)


def job_charts(job) -> tuple[list[Chart], bool]:
    """The job's charts in name order, and whether some points were left out for size."""
    rows = list(job.metrics.order_by("name", "step", "id").values_list("name", "step", "value")[:MAX_ROWS + 1])
    truncated = len(rows) > MAX_ROWS
    series: dict[str, list[tuple[int, float]]] = {}
    for name, step, value in rows[:MAX_ROWS]:
        series.setdefault(name, []).append((step, value))
    charts = [Chart(name=name, svg=line_chart(name, points), points=len(points), last_step=points[-1][0],
                    last_value=points[-1][1]) for name, points in series.items()]
    return charts, truncated


def thin(points: list[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    """At most `limit` points: per bucket the lowest and the highest value, in step order."""
    if len(points) <= limit:
        return points
    buckets = limit // 2
    size = len(points) / buckets
    kept: list[tuple[int, float]] = []
    for b in range(buckets):
        bucket = points[int(b * size):int((b + 1) * size)]
        if not bucket:
            continue
        low = min(bucket, key=lambda p: p[1])
        high = max(bucket, key=lambda p: p[1])
        kept.extend(sorted({low, high}, key=lambda p: p[0]))
    return kept


def step_ticks(low: int, high: int, most: int = 5) -> list[int]:
    """Ticks of the step axis: whole numbers (steps are integers) at the smallest round spacing (1, 2 or
    5 times a power of ten) that gives at most `most` of them between `low` and `high`."""
    low, high = math.ceil(low), math.floor(high)
    if high <= low:
        return [low]
    spacing = 1
    for spacing in (m * magnitude for magnitude in (10 ** e for e in range(19)) for m in (1, 2, 5)):
        if high // spacing - -(-low // spacing) + 1 <= most:
            break
    first = -(-low // spacing) * spacing
    return list(range(first, high + 1, spacing))


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4g}"


def line_chart(name: str, points: list[tuple[int, float]], *, width: int = WIDTH, height: int = HEIGHT) -> SafeString:
    drawn = thin(points)
    steps = [p[0] for p in drawn]
    values = [p[1] for p in drawn]
    x_low, x_high = min(steps), max(steps)
    y_low, y_high = min(values), max(values)
    if x_low == x_high:
        x_low, x_high = x_low - 1, x_high + 1
    if y_low == y_high:
        pad = abs(y_low) * 0.1 or 1.0
        y_low, y_high = y_low - pad, y_high + pad
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + (step - x_low) / (x_high - x_low) * plot_w

    def y(value: float) -> float:
        return TOP + (1 - (value - y_low) / (y_high - y_low)) * plot_h

    label = escape(name)
    parts = [(f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
              f'aria-label="{label}" xmlns="http://www.w3.org/2000/svg"><title>{label}</title>')]
    for i in range(5):  # horizontal grid with values
        value = y_low + (y_high - y_low) * i / 4
        gy = y(value)
        parts.append(f'<line class="grid" stroke="#e3e6ec" x1="{LEFT}" y1="{gy:.1f}" x2="{width - RIGHT}" y2="{gy:.1f}"/>'
                     f'<text class="tick" font-size="12" fill="#5b6475" x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">{_number(value)}</text>')
    for step in step_ticks(x_low, x_high):
        parts.append(f'<text class="tick" font-size="12" fill="#5b6475" x="{x(step):.1f}" y="{height - 8}" text-anchor="middle">{step}</text>')
    parts.append(f'<line class="axis" stroke="#9aa3b2" x1="{LEFT}" y1="{TOP + plot_h}" x2="{width - RIGHT}" y2="{TOP + plot_h}"/>'
                 f'<line class="axis" stroke="#9aa3b2" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}"/>')
    coordinates = " ".join(f"{x(s):.2f},{y(v):.2f}" for s, v in drawn)
    parts.append(f'<polyline class="series" fill="none" stroke="#2457c5" stroke-width="2" stroke-linejoin="round" points="{coordinates}"/>')
    last_step, last_value = drawn[-1]
    parts.append(f'<circle class="last" fill="#2457c5" cx="{x(last_step):.2f}" cy="{y(last_value):.2f}" r="3"/>')
    parts.append("</svg>")
    return mark_safe("".join(parts))
