from django.db import models


class MetricSeries(models.Model):
    """One series of a counter or histogram folded from the event log (observability/fold.py):
    its value since the series began. A histogram is kept as Prometheus exposes it: one row per
    cumulative bucket (`le` among the labels), its `_sum` and its `_count`. Written only by the
    fold, in the transaction that moves its cursors, so an event is counted exactly once and the
    figures survive restarts of every process; any server's /metrics reads the same rows."""

    name = models.CharField(max_length=100)
    # the labels as canonical JSON (sorted keys): bounded values only, never a job or lease id
    labels = models.CharField(max_length=400)
    value = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "labels"], name="one_metric_series_per_labels")
        ]

    def __str__(self):
        return f"{self.name}{self.labels} = {self.value}"


class FoldCursor(models.Model):
    """How far the fold has read one source table: every row with an id up to `high_water`,
    except `gaps` ({id: first missed at, epoch seconds}): ids below the high water not seen yet,
    from transactions still open when it read (ids are handed out before commit) or rolled
    back. A gap is looked for again on every fold until `GAP_TTL_S` has passed."""

    source = models.CharField(max_length=40, primary_key=True)
    high_water = models.BigIntegerField(default=0)
    gaps = models.JSONField(default=dict, blank=True)
    folded_at = models.DateTimeField(null=True, blank=True)
    # the latest fold's failure on this source ("" once a fold succeeds): the others went on
    error = models.CharField(max_length=500, blank=True)

    def __str__(self):
        return f"fold of {self.source} up to {self.high_water}"
