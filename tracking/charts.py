"""A Run's metric series as SVG charts (the drawing is jobs.charts'; this module reads tracking's tables).

A series may hold hundreds of thousands of points, so it is downsampled in the database, in one query for
all the Run's series: the step axis is cut into as many buckets as the chart has pixel columns, and each
bucket gives its lowest and its highest value (min/max per pixel column: spikes stay visible, and the SVG
holds at most two points per column). NaN and ±inf points (MLflow allows them) are not drawn.

A series logged without steps (MLflow's log_metric without `step`: every point at step 0) would put every
point at one x; such a series (all points at one step, logged at different times) is drawn against time
instead: x is the time since its first point, ticks read 0s, 30s, 2m, 1h."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from django.db.models import Count, ExpressionWrapper, F, FloatField, IntegerField, Max, Min, OuterRef, Subquery, Value
from django.db.models.functions import Cast, Floor, Least
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from jobs import charts as drawing
from tracking.models import LatestMetric, Metric, point_value

# Pixel columns of the plot area of jobs.charts' charts; ≤ jobs.charts.MAX_POINTS / 2, so its own
# thinning never runs again on what this module hands it.
COLUMNS = min(drawing.WIDTH - drawing.LEFT - drawing.RIGHT, drawing.MAX_POINTS // 2)
COLORS = ("#2457c5", "#d1495b", "#2a9d5c", "#e39b1b", "#7b4fbf")  # one per compared Run (2–5)

_INFINITE = (math.inf, -math.inf)
STEP, TIME = "step", "time"   # what a series' x is: its steps, or milliseconds since its first point
TIME_SPACINGS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000,
                    120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000,
                    43_200_000, 86_400_000)


@dataclass
class Series:
    key: str
    points: list[tuple[int, float]] = field(default_factory=list)   # downsampled, in x order
    count: int = 0            # points logged (finite ones)
    last_step: int = 0
    last_value: float = 0.0
    axis: str = STEP          # TIME: x is ms since the first point (the series has one step, `step`)
    step: int = 0             # the lowest step; a TIME series' only one

    def on_steps(self) -> list[tuple[int, float]]:
        """The points against steps, to share a step axis with other series (a TIME series collapses)."""
        return self.points if self.axis == STEP else [(self.step, value) for _x, value in self.points]


def run_series(run_ids: list[str], keys: list[str] | None = None, *, columns: int = COLUMNS) -> dict:
    """{run_id: {key: Series}}: every series of these Runs (or only `keys`), min/max per bucket.

    Written with the ORM so that it runs on PostgreSQL and on the demo's SQLite alike: one query for every
    series' bounds and latest point, then one grouped query per series (a Run has a handful of series)."""
    result: dict[str, dict[str, Series]] = {run_id: {} for run_id in run_ids}
    if not run_ids:
        return result
    drawn = Metric.objects.filter(is_nan=False).exclude(value__in=_INFINITE)
    for bound in _bounds(run_ids, keys, drawn):
        axis = TIME if bound["lo"] == bound["hi"] and bound["t_lo"] < bound["t_hi"] else STEP
        series = result[bound["run_id"]][bound["key"]] = Series(
            key=bound["key"], axis=axis, step=bound["lo"], last_step=bound["step"],
            last_value=point_value(bound["value"], bound["is_nan"]))
        column, lo, hi = ("timestamp", bound["t_lo"], bound["t_hi"]) if axis == TIME else ("step", bound["lo"],
                                                                                         bound["hi"])
        span = max(hi - lo, 1)
        offset = ExpressionWrapper((Cast(F(column), FloatField()) - float(lo)) * float(columns) / float(span),
                                   output_field=FloatField())
        bucket = Least(Cast(Floor(offset), IntegerField()), Value(columns - 1), output_field=IntegerField())
        # Count("*"), not of id: every column read is then in the unique index, so the series of a Run
        # that autovacuum has visited is read from the index alone.
        rows = (drawn.filter(run_id=bound["run_id"], key=bound["key"]).annotate(bucket=bucket)
                .values("bucket").annotate(lo_x=Min(column), hi_x=Max(column), low=Min("value"),
                                           high=Max("value"), count=Count("*")).order_by())
        origin = lo if axis == TIME else 0
        # Sorted here, not by the database: PostgreSQL guesses far more groups than the ≤ COLUMNS there
        # are, and would sort every row of the series first (spilling to disk at 100,000 points).
        for row in sorted(rows, key=lambda row: row["bucket"]):
            series.count += row["count"]
            _add_bucket(series, row["lo_x"] - origin, row["hi_x"] - origin, row["low"], row["high"], row["count"])
    return result


def _bounds(run_ids: list[str], keys: list[str] | None, drawn):
    """Per series (a LatestMetric row: its latest point for the caption): the lowest and highest step of
    its drawn points and the times of the first and the last of them, each read from the end of the
    unique index on (run, key, step, timestamp, …) rather than by aggregating every row. A series whose
    steps are all one has its first and last times there too. Series with nothing to draw are left out."""
    series = drawn.filter(run_id=OuterRef("run_id"), key=OuterRef("key"))

    def first(column: str, *order: str):
        return Subquery(series.order_by(*order).values(column)[:1])

    latest = LatestMetric.objects.filter(run_id__in=list(run_ids))
    if keys is not None:
        latest = latest.filter(key__in=list(keys))
    latest = latest.annotate(lo=first("step", "step"), hi=first("step", "-step"),
                             t_lo=first("timestamp", "step", "timestamp"),
                             t_hi=first("timestamp", "-step", "-timestamp"))
    return [bound for bound in latest.values("run_id", "key", "step", "value", "is_nan", "lo", "hi", "t_lo", "t_hi")
            .order_by("run_id", "key") if bound["lo"] is not None]


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


def run_charts(run) -> list[dict]:
    """The Run's charts in key order: {key, svg, count, last_step, last_label, x_axis}."""
    charts = []
    for key, series in sorted(run_series([run.run_id])[run.run_id].items()):
        svg = (time_chart(key, series.points) if series.axis == TIME
               else drawing.line_chart(key, series.points))
        charts.append({"key": key, "svg": svg, "count": series.count, "x_axis": series.axis,
                       "last_step": series.last_step, "last_label": drawing._number(series.last_value)})
    return charts


def compare_lines(key: str, labelled: list[tuple[str, Series | None]]) -> tuple[list, bool]:
    """The lines of one metric of compared Runs, and whether they share a time axis: only when every Run
    logged it without steps (time since each Run's first point); otherwise all go on the step axis."""
    present = [series for _label, series in labelled if series is not None]
    on_time = bool(present) and all(series.axis == TIME for series in present)
    lines = [(label, [] if series is None else series.points if on_time else series.on_steps())
             for label, series in labelled]
    return lines, on_time


def time_ticks(low: float, high: float, most: int = 5) -> list[int]:
    """Ticks of a time axis in ms: the smallest round spacing (1 ms … 30 s, 1, 2, 5, 10, 15, 30 min,
    1, 2, 3, 6, 12 h, whole days) that gives at most `most` of them between `low` and `high`."""
    low, high = math.ceil(low), math.floor(high)
    if high <= low:
        return [low]
    day = TIME_SPACINGS_MS[-1]
    for spacing in TIME_SPACINGS_MS:
        if high // spacing - -(-low // spacing) + 1 <= most:
            break
    else:  # longer than days: whole days, as many as step_ticks would put on a step axis
        return [day * d for d in drawing.step_ticks(-(-low // day), high // day, most)]
    first = -(-low // spacing) * spacing
    return list(range(first, high + 1, spacing))


def elapsed_label(ms: int) -> str:
    """0s, 0.25s, 30s, 1m30s, 2h, 1h05m, 3d: compact, as the ticks of a time axis."""
    if ms < 1_000 and ms % 1_000:
        return f"{ms / 1000:g}s"
    seconds = ms // 1000
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d" + (f"{hours:02d}h" if hours else "")
    if hours:
        return f"{hours}h" + (f"{minutes:02d}m" if minutes else "")
    if minutes:
        return f"{minutes}m" + (f"{secs:02d}s" if secs else "")
    return f"{seconds}s"


def time_chart(key: str, points: list[tuple[int, float]]) -> SafeString:
    """One series against time (x: ms since its first point), drawn as jobs.charts draws a series."""
    return _chart(key, [("", points, COLORS[0])], time_axis=True, single=True)


def overlay_chart(key: str, lines: list[tuple[str, list[tuple[int, float]]]], *, time_axis: bool = False,
                  width: int = drawing.WIDTH, height: int = drawing.HEIGHT) -> SafeString:
    """One metric of several Runs on shared axes, one color each (COLORS, in the order given)."""
    drawn = [(label, points, COLORS[i % len(COLORS)]) for i, (label, points) in enumerate(lines) if points]
    return _chart(key, drawn, time_axis=time_axis, width=width, height=height)


def _chart(key: str, drawn: list[tuple[str, list[tuple[int, float]], str]], *, time_axis: bool,
           single: bool = False, width: int = drawing.WIDTH, height: int = drawing.HEIGHT) -> SafeString:
    xs = [at for _l, points, _c in drawn for at, _v in points] or [0]
    values = [v for _l, points, _c in drawn for _s, v in points] or [0.0]
    x_low, x_high, y_low, y_high = min(xs), max(xs), min(values), max(values)
    if x_low == x_high:
        x_low, x_high = x_low - 1, x_high + 1
    if y_low == y_high:
        pad = abs(y_low) * 0.1 or 1.0
        y_low, y_high = y_low - pad, y_high + pad
    left, right, top, bottom = drawing.LEFT, drawing.RIGHT, drawing.TOP, drawing.BOTTOM
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(at: float) -> float:
        return left + (at - x_low) / (x_high - x_low) * plot_w

    def y(value: float) -> float:
        return top + (1 - (value - y_low) / (y_high - y_low)) * plot_h

    label = escape(key)
    css = "chart" if single else "chart overlay"
    axis = TIME if time_axis else STEP
    parts = [f'<svg class="{css}" data-x-axis="{axis}" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{label}" xmlns="http://www.w3.org/2000/svg">'
             f'<title>{label}</title>']
    for i in range(5):
        value = y_low + (y_high - y_low) * i / 4
        gy = y(value)
        parts.append(f'<line class="grid" stroke="#e3e6ec" x1="{left}" y1="{gy:.1f}" x2="{width - right}" '
                     f'y2="{gy:.1f}"/><text class="tick" font-size="12" fill="#5b6475" x="{left - 6}" '
                     f'y="{gy + 4:.1f}" text-anchor="end">{drawing._number(value)}</text>')
    ticks = ([(t, elapsed_label(t)) for t in time_ticks(x_low, x_high)] if time_axis
             else [(s, str(s)) for s in drawing.step_ticks(x_low, x_high)])
    for at, text in ticks:
        parts.append(f'<text class="tick" font-size="12" fill="#5b6475" x="{x(at):.1f}" y="{height - 8}" '
                     f'text-anchor="middle">{text}</text>')
    parts.append(f'<line class="axis" stroke="#9aa3b2" x1="{left}" y1="{top + plot_h}" x2="{width - right}" '
                 f'y2="{top + plot_h}"/><line class="axis" stroke="#9aa3b2" x1="{left}" y1="{top}" x2="{left}" '
                 f'y2="{top + plot_h}"/>')
    for run_label, points, color in drawn:
        coordinates = " ".join(f"{x(s):.2f},{y(v):.2f}" for s, v in points)
        if single:
            parts.append(f'<polyline class="series" fill="none" stroke="{color}" stroke-width="2" '
                         f'stroke-linejoin="round" points="{coordinates}"/>')
            last_x, last_value = points[-1]
            parts.append(f'<circle class="last" fill="{color}" cx="{x(last_x):.2f}" cy="{y(last_value):.2f}" r="3"/>')
            continue
        parts.append(f'<polyline class="series" data-run="{escape(run_label)}" fill="none" stroke="{color}" '
                     f'stroke-width="2" stroke-linejoin="round" points="{coordinates}"><title>{escape(run_label)}'
                     f'</title></polyline>')
    parts.append("</svg>")
    return mark_safe("".join(parts))
