"""A parsed Prometheus text page and the sums ``status`` reads from it. Pure.

Parsing is prometheus_client's (``prometheus_client.parser.text_string_to_metric_families``);
a sample keeps its exposition name (``vllm:prompt_tokens_by_source_total``, ``..._bucket``,
``..._count``, ``..._sum``), so the names here are the ones on vLLM's page and in PromQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


class PageError(ValueError):
    """The text is not a Prometheus exposition page (the parser's own message)."""


@dataclass(frozen=True)
class Sample:
    """One sample line: exposition ``name``, ``labels`` and ``value``."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Page:
    """The samples of one ``/metrics`` page."""

    samples: tuple[Sample, ...]

    @classmethod
    def parse(cls, text: str) -> "Page":
        """Parse ``text`` (Prometheus text format 0.0.4). Raises :class:`PageError` when
        the parser refuses it (an HTML error page, a truncated line)."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            out = tuple(Sample(s.name, dict(s.labels), float(s.value))
                        for fam in text_string_to_metric_families(text) for s in fam.samples)
        except (ValueError, TypeError, IndexError, KeyError) as e:
            raise PageError(f"not a Prometheus text page: {type(e).__name__}: {e}") from e
        return cls(out)

    def select(self, name: str, stage: str | None = None, **labels: str) -> list[Sample]:
        """The samples called ``name`` carrying every label of ``labels``; with ``stage``
        only those labelled ``stage="<stage>"`` (a vllm-omni server's page holds every
        stage's series)."""
        return [s for s in self.samples
                if s.name == name and (stage is None or s.labels.get("stage") == stage)
                and all(s.labels.get(k) == v for k, v in labels.items())]

    def has(self, name: str, stage: str | None = None) -> bool:
        """True when at least one sample called ``name`` (of ``stage``) is on the page."""
        return bool(self.select(name, stage))

    def total(self, name: str, stage: str | None = None, **labels: str) -> float | None:
        """Sum of :meth:`select`'s values; None when no such sample is on the page (the
        release or the configuration does not export it)."""
        found = self.select(name, stage, **labels)
        return sum(s.value for s in found) if found else None

    def buckets(self, name: str, stage: str | None = None) -> dict[float, float]:
        """``le -> cumulative count`` of histogram ``name`` (without ``_bucket``), summed
        over every series (engines, replicas) of ``stage``; ``{}`` when absent."""
        out: dict[float, float] = {}
        for s in self.select(name + "_bucket", stage):
            le = float(s.labels.get("le", "+Inf"))
            out[le] = out.get(le, 0.0) + s.value
        return out

    def label_values(self, name: str, label: str) -> list[str]:
        """The distinct values of ``label`` among the samples called ``name``, sorted."""
        return sorted({s.labels[label] for s in self.samples if s.name == name and label in s.labels})


def counter_delta(before: float | None, after: float | None) -> float | None:
    """``after - before`` of a counter; ``after`` when the counter went down (the process
    restarted and counted from zero, as PromQL's ``increase`` reads a reset); None when
    ``after`` is unknown, ``after`` when ``before`` is."""
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The ``q`` quantile (0..1) of cumulative histogram ``buckets`` (``le -> count``),
    interpolated linearly inside the bucket as PromQL's ``histogram_quantile`` does
    (the lowest bucket from 0; a quantile in the ``+Inf`` bucket is the highest finite
    bound). None when the histogram counted nothing."""
    if not buckets:
        return None
    les = sorted(buckets)
    total = buckets[les[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if le == float("inf"):
                finite = [x for x in les if x != float("inf")]
                return finite[-1] if finite else None
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return None


def bucket_delta(before: Mapping[float, float], after: Mapping[float, float]) -> dict[float, float]:
    """Per-bucket :func:`counter_delta` of two cumulative histograms (a reset anywhere reads
    the whole ``after``)."""
    if any(after.get(le, 0.0) < v for le, v in before.items()):
        return dict(after)
    return {le: v - before.get(le, 0.0) for le, v in after.items()}


def sum_opt(values: Iterable[float | None]) -> float | None:
    """Sum of the known values; None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None
