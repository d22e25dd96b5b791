"""A Run's metric series as SVG charts (the drawing is jobs.charts'; this module reads tracking's tables).

A series may hold hundreds of thousands of points, so it is downsampled in the database, in one query for
all the Run's series: the step axis is cut into as many buckets as the chart has pixel columns, and each
bucket gives its lowest and its highest value (min/max per pixel column: spikes stay visible, and the SVG
holds at most two points per column). NaN and ±inf points (MLflow allows them) are not drawn."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from django.db.models import Count, ExpressionWrapper, F, FloatField, IntegerField, Max, Min, Value
from django.db.models.functions import Cast, Floor, Least
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from jobs import charts as drawing
from tracking.models import Metric, point_value

# Pixel columns of the plot area of jobs.charts' charts; ≤ jobs.charts.MAX_POINTS / 2, so its own
# thinning never runs again on what this module hands it.
COLUMNS = min(drawing.WIDTH - drawing.LEFT - drawing.RIGHT, drawing.MAX_POINTS // 2)
COLORS = ("#2457c5", "#d1495b", "#2a9d5c", "#e39b1b", "#7b4fbf")  # one per compared Run (2–5)

_INFINITE = (math.inf, -math.inf)


@dataclass
class Series:
    key: str
    points: list[tuple[int, float]] = field(default_factory=list)   # downsampled, in step order
    count: int = 0            # points logged (finite ones)
    last_step: int = 0
    last_value: float = 0.0


def run_series(run_ids: list[str], keys: list[str] | None = None, *, columns: int = COLUMNS) -> dict:
    """{run_id: {key: Series}}: every series of these Runs (or only `keys`), min/max per bucket.

    Written with the ORM so that it runs on PostgreSQL and on the demo's SQLite alike: one query for the
    bounds of every series, then one grouped query per series (a Run has a handful of series)."""
    result: dict[str, dict[str, Series]] = {run_id: {} for run_id in run_ids}
    if not run_ids:
        return result
    drawn = Metric.objects.filter(run_id__in=list(run_ids), is_nan=False).exclude(value__in=_INFINITE)
    if keys is not None:
        drawn = drawn.filter(key__in=list(keys))
    bounds = drawn.values("run_id", "key").annotate(lo=Min("step"), hi=Max("step"), n=Count("id"))
    for bound in bounds.order_by("run_id", "key"):
        series = result[bound["run_id"]].setdefault(bound["key"], Series(key=bound["key"], count=bound["n"]))
        span = max(bound["hi"] - bound["lo"], 1)
        offset = ExpressionWrapper((Cast(F("step"), FloatField()) - float(bound["lo"])) * float(columns) / float(span),
                                   output_field=FloatField())
        bucket = Least(Cast(Floor(offset), IntegerField()), Value(columns - 1), output_field=IntegerField())
        rows = (drawn.filter(run_id=bound["run_id"], key=bound["key"]).annotate(bucket=bucket)
                .values("bucket").annotate(lo_step=Min("step"), hi_step=Max("step"), low=Min("value"),
                                           high=Max("value"), count=Count("id")).order_by("bucket"))
        for row in rows:
            _add_bucket(series, row["lo_step"], row["hi_step"], row["low"], row["high"], row["count"])
    _latest(result, keys)
    return result


def _add_bucket(series: Series, lo_step: int, hi_step: int, low: float, high: float, count: int) -> None:
    if count == 1 or low == high:
        series.points.append((hi_step, high))
        return
    # Both extremes lie in one pixel column: start with the one nearer the line so far.
    previous = series.points[-1][1] if series.points else low
    pair = [(lo_step, low), (hi_step, high)]
    if abs(previous - high) < abs(previous - low):
        pair = [(lo_step, high), (hi_step, low)]
    series.points.extend(pair)


def _latest(result: dict, keys) -> None:
    """Each series' latest point (LatestMetric, as MLflow defines it) for the captions."""
    from tracking.models import LatestMetric

    latest = LatestMetric.objects.filter(run_id__in=list(result))
    if keys is not None:
        latest = latest.filter(key__in=keys)
    for run_id, key, step, value, is_nan in latest.values_list("run_id", "key", "step", "value", "is_nan"):
        series = result[run_id].get(key)
        if series is not None:
            series.last_step, series.last_value = step, point_value(value, is_nan)


def run_charts(run) -> list[dict]:
    """The Run's charts in key order: {key, svg, count, last_step, last_label}."""
    charts = []
    for key, series in sorted(run_series([run.run_id])[run.run_id].items()):
        charts.append({"key": key, "svg": drawing.line_chart(key, series.points), "count": series.count,
                       "last_step": series.last_step, "last_label": drawing._number(series.last_value)})
    return charts


def overlay_chart(key: str, lines: list[tuple[str, list[tuple[int, float]]]], *, width: int = drawing.WIDTH,
                  height: int = drawing.HEIGHT) -> SafeString:
    """One metric of several Runs on shared axes, one color each (COLORS, in the order given)."""
    drawn = [(label, points, COLORS[i % len(COLORS)]) for i, (label, points) in enumerate(lines) if points]
    steps = [s for _l, points, _c in drawn for s, _v in points] or [0]
    values = [v for _l, points, _c in drawn for _s, v in points] or [0.0]
    x_low, x_high, y_low, y_high = min(steps), max(steps), min(values), max(values)
    if x_low == x_high:
        x_low, x_high = x_low - 1, x_high + 1
    if y_low == y_high:
        pad = abs(y_low) * 0.1 or 1.0
        y_low, y_high = y_low - pad, y_high + pad
    left, right, top, bottom = drawing.LEFT, drawing.RIGHT, drawing.TOP, drawing.BOTTOM
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(step: float) -> float:
        return left + (step - x_low) / (x_high - x_low) * plot_w

    def y(value: float) -> float:
        return top + (1 - (value - y_low) / (y_high - y_low)) * plot_h

    label = escape(key)
    parts = [f'<svg class="chart overlay" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'role="img" aria-label="{label}" xmlns="http://www.w3.org/2000/svg"><title>{label}</title>']
    for i in range(5):
        value = y_low + (y_high - y_low) * i / 4
        gy = y(value)
        parts.append(f'<line class="grid" stroke="#e3e6ec" x1="{left}" y1="{gy:.1f}" x2="{width - right}" '
                     f'y2="{gy:.1f}"/><text class="tick" font-size="12" fill="#5b6475" x="{left - 6}" '
                     f'y="{gy + 4:.1f}" text-anchor="end">{drawing._number(value)}</text>')
    for step in drawing.step_ticks(x_low, x_high):
        parts.append(f'<text class="tick" font-size="12" fill="#5b6475" x="{x(step):.1f}" y="{height - 8}" '
                     f'text-anchor="middle">{step}</text>')
    parts.append(f'<line class="axis" stroke="#9aa3b2" x1="{left}" y1="{top + plot_h}" x2="{width - right}" '
                 f'y2="{top + plot_h}"/><line class="axis" stroke="#9aa3b2" x1="{left}" y1="{top}" x2="{left}" '
                 f'y2="{top + plot_h}"/>')
    for run_label, points, color in drawn:
        coordinates = " ".join(f"{x(s):.2f},{y(v):.2f}" for s, v in points)
        parts.append(f'<polyline class="series" data-run="{escape(run_label)}" fill="none" stroke="{color}" '
                     f'stroke-width="2" stroke-linejoin="round" points="{coordinates}"><title>{escape(run_label)}'
                     f'</title></polyline>')
    parts.append("</svg>")
    return mark_safe("".join(parts))
