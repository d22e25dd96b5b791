"""The figures of /metrics, read from the database at each scrape (docs/monitoring.md).

Every figure is an aggregate over the rows as they are, not a count kept in a process: each gunicorn
process, and a restarted one, answers the same, and no multiprocess directory is needed. A scrape is
a fixed handful of aggregate queries (one per family below, eight in all) whatever the number of jobs,
workers or computers; tests/monitoring pins it."""
from __future__ import annotations

from collections import Counter
from datetime import timedelta

from django.db.models import BigIntegerField, Count, DurationField, ExpressionWrapper, F, Func, Min, Q, Sum
from django.db.models.lookups import LessThanOrEqual
from django.utils import timezone
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from jobs.choices import JobStatus
from jobs.models import Artifact, GpuReservation, Job, JobEvent, LogChunk
from notifications.models import Delivery
from workers.models import Worker

# Seconds. A job may wait from under a second (a free GPU and a waiting worker) to days (a full lab),
# so the buckets run from 0.1 s to three days.
BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600,
           86400, 3 * 86400)

# (metric name, help, the timestamp that ends the interval; every interval starts at created_at)
LATENCIES = (
    ("mado_job_dispatch_latency_seconds",
     "From a job's creation to its claim by a worker or a site (created_at to claimed_at).", "claimed_at"),
    ("mado_job_queue_wait_seconds",
     "From a job's creation to the start of its code (created_at to started_at).", "started_at"),
)


class OctetLength(Func):
    """Bytes of a text column in UTF-8, what the agent sent (append_logs measures chunks the same way)."""

    function = "OCTET_LENGTH"
    output_field = BigIntegerField()

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra_context)


class DatabaseCollector(Collector):
    def collect(self):
        now = timezone.now()
        yield from jobs_by_status(now)
        yield from latency_histograms()
        yield claims()
        yield from workers(now)
        yield gpu_reservations()
        yield from bytes_received()
        yield notification_deliveries()


def jobs_by_status(now):
    jobs = GaugeMetricFamily("mado_jobs", "Jobs by status and computer (all kept jobs, ended ones included).",
                             labels=["status", "computer"])
    oldest = GaugeMetricFamily(
        "mado_queue_oldest_job_age_seconds",
        "Age of the oldest queued job of each computer that has queued jobs.", labels=["computer"])
    rows = (Job.objects.order_by().values("status", "target__name")
            .annotate(n=Count("pk"), first=Min("created_at")))
    for row in rows:
        jobs.add_metric([row["status"], row["target__name"]], row["n"])
        if row["status"] == JobStatus.QUEUED:
            oldest.add_metric([row["target__name"]], max((now - row["first"]).total_seconds(), 0.0))
    return jobs, oldest


def latency_histograms():
    """Both histograms in one query: per computer, for each bucket, the jobs whose interval is at most
    its bound (a job whose end has not come yet has a NULL interval and counts nowhere)."""
    aggregates = {}
    for name, _help, end in LATENCIES:
        interval = ExpressionWrapper(F(end) - F("created_at"), output_field=DurationField())
        aggregates[f"{name}:count"] = Count("pk", filter=Q(**{f"{end}__isnull": False}))
        aggregates[f"{name}:sum"] = Sum(interval)
        for i, bound in enumerate(BUCKETS):
            aggregates[f"{name}:{i}"] = Count("pk", filter=LessThanOrEqual(interval, timedelta(seconds=bound)))
    rows = list(Job.objects.order_by().values("target__name").annotate(**aggregates))
    for name, help_text, _end in LATENCIES:
        family = HistogramMetricFamily(name, help_text, labels=["computer"])
        for row in rows:
            if not row[f"{name}:count"]:
                continue
            buckets = [(floatToGoString(bound), row[f"{name}:{i}"]) for i, bound in enumerate(BUCKETS)]
            buckets.append(("+Inf", row[f"{name}:count"]))
            family.add_metric([row["target__name"]], buckets, sum_value=row[f"{name}:sum"].total_seconds())
        yield family


def claims():
    """Every claim leaves a `claimed` event on the job's timeline (a worker's claim, a launcher's, a
    `mado-tracking submit`), a requeued job's second claim too: their count only grows."""
    family = CounterMetricFamily("mado_job_claims", "Claims of jobs by workers and sites, by computer.",
                                 labels=["computer"])
    rows = (JobEvent.objects.order_by().filter(kind="claimed").values("job__target__name")
            .annotate(n=Count("pk")))
    for row in rows:
        family.add_metric([row["job__target__name"]], row["n"])
    return family


def workers(now):
    online_by_project = GaugeMetricFamily("mado_workers_online", "Workers online, by project.", labels=["project"])
    labels = ["project", "worker", "host", "id"]
    online = GaugeMetricFamily("mado_worker_online", "1 while the worker is online (seen within 120 s and not "
                               "stopped), else 0.", labels=labels)
    stopped = GaugeMetricFamily("mado_worker_stopped", "1 when the worker said goodbye (stopped on purpose) "
                                "and has not said hello since, else 0.", labels=labels)
    last_seen = GaugeMetricFamily("mado_worker_last_seen_timestamp_seconds",
                                  "When the worker was last seen (Unix time).", labels=labels)
    count = Counter()
    for worker in Worker.objects.select_related("project").only(
            "worker_id", "hostname", "last_seen_at", "stopped_at", "project__slug"):
        values = [worker.project.slug, worker.worker_id, worker.hostname, str(worker.pk)]
        count[worker.project.slug] += worker.is_online
        online.add_metric(values, int(worker.is_online))
        stopped.add_metric(values, int(worker.stopped_at is not None))
        last_seen.add_metric(values, worker.last_seen_at.timestamp())
    for project, n in sorted(count.items()):
        online_by_project.add_metric([project], n)
    return online_by_project, online, stopped, last_seen


def gpu_reservations():
    family = GaugeMetricFamily("mado_gpu_reservations", "GPUs held by jobs, by computer.", labels=["computer"])
    for row in GpuReservation.objects.order_by().values("target__name").annotate(n=Count("pk")):
        family.add_metric([row["target__name"]], row["n"])
    return family


def bytes_received():
    logs = CounterMetricFamily("mado_log_bytes_received", "Bytes of job logs stored (UTF-8), by stream.",
                               labels=["stream"])
    for row in LogChunk.objects.order_by().values("stream").annotate(n=Sum(OctetLength("data"))):
        logs.add_metric([row["stream"]], row["n"] or 0)
    received = Artifact.objects.aggregate(n=Sum("received_bytes"))["n"] or 0
    artifacts = CounterMetricFamily("mado_artifact_bytes_received",
                                    "Bytes of job artifacts received, unfinished uploads included.", value=received)
    return logs, artifacts


def notification_deliveries():
    family = GaugeMetricFamily(
        "mado_notification_deliveries",
        "Notification deliveries by result (pending, delivered, failed: given up) and channel.",
        labels=["result", "channel"])
    for row in Delivery.objects.order_by().values("status", "rule__channel").annotate(n=Count("pk")):
        family.add_metric([row["status"], row["rule__channel"]], row["n"])
    return family


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(DatabaseCollector())
