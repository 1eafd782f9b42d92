"""Engine observations: raw counters and cumulative histograms (the Gateway renders Prometheus).

The worker records; any thread may take a snapshot. Program is never called from here: the
worker publishes Program's CapacitySummary after resource transitions.
"""
from __future__ import annotations

import bisect
import threading
from collections import Counter

from ninfer.contract.program import CacheUsage, CapacitySummary
from ninfer.config import Availability, EngineMetrics, HistogramSnapshot

LATENCY_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  120.0, 300.0, 600.0)
BATCH_BOUNDS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)


class Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self._buckets = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self._buckets):
            self._buckets[i] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> HistogramSnapshot:
        cumulative, total = [], 0
        for n in self._buckets:
            total += n
            cumulative.append(total)
        return HistogramSnapshot(self.bounds, tuple(cumulative), self.sum, self.count)


class MetricsCollector:
    def __init__(self, max_concurrency: int, queue_size: int, outstanding_capacity: int):
        self._lock = threading.Lock()
        self.max_concurrency = max_concurrency
        self.queue_size = queue_size
        self.outstanding_capacity = outstanding_capacity
        self.capacity = CapacitySummary(0, 0, 0, 0, 0)
        self.running = 0
        self.waiting = 0
        self.num_speculative_tokens = 0                 # K; 0 = speculation off (`speculative`)
        self._zero_counts()
        self.cache_counts = (0, 0, 0, 0, 0, 0)          # queries, hits, hit tokens, captures, evictions, offloads
        self.cache_usage = CacheUsage(0, 0, 0, 0)

    def speculative(self, num_speculative_tokens: int) -> None:
        """Speculation is on with K drafts per round: the spec_decode counters exist (positions 0..K-1)."""
        with self._lock:
            self.num_speculative_tokens = num_speculative_tokens
            self.spec_per_pos.extend([0] * (num_speculative_tokens - len(self.spec_per_pos)))

    def _zero_counts(self) -> None:
        self.num_submitted = 0
        self.rejected: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.generation_tokens = 0
        self.finished: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.units: Counter[str] = Counter()
        self.queue_time = Histogram(LATENCY_BOUNDS)
        self.ttft = Histogram(LATENCY_BOUNDS)
        self.inter_token = Histogram(LATENCY_BOUNDS)
        self.e2e = Histogram(LATENCY_BOUNDS)
        self.batch_size = Histogram(BATCH_BOUNDS)
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.spec_per_pos = [0] * self.num_speculative_tokens

    def reset_counts(self) -> None:
        """Zero the request counters and histograms (not the gauges nor the context cache's figures):
        after the serve warmup, whose requests (and their first-use compile latencies) are not traffic."""
        with self._lock:
            self._zero_counts()

    # ---- recording (worker, except `submitted`/`rejected` from submit threads) ---------------
    def submitted(self) -> None:
        with self._lock:
            self.num_submitted += 1

    def rejected_at_submit(self, kind: str) -> None:
        with self._lock:
            self.rejected[kind] += 1

    def admitted(self, num_prompt_tokens: int, num_reused_tokens: int, queue_time: float) -> None:
        with self._lock:
            self.prompt_tokens += num_prompt_tokens
            self.reused_tokens += num_reused_tokens
            self.queue_time.observe(queue_time)

    def unit(self, kind: str, rows: int) -> None:
        with self._lock:
            self.units[kind] += 1
            if kind == "decode":
                self.batch_size.observe(rows)

    def tokens(self, n: int, ttft: float | None, inter_token: float | None) -> None:
        with self._lock:
            self.generation_tokens += n
            if ttft is not None:
                self.ttft.observe(ttft)
            if inter_token is not None:
                self.inter_token.observe(inter_token)

    def spec_round(self, drafted: int, produced: int) -> None:
        """One speculative round of a row that committed at least one token: `drafted` drafts proposed,
        `produced` tokens produced (produced - 1 drafts accepted, at positions 0..produced-2)."""
        accepted = produced - 1
        with self._lock:
            self.spec_drafts += 1
            self.spec_draft_tokens += drafted
            self.spec_accepted += accepted
            if accepted > len(self.spec_per_pos):
                self.spec_per_pos.extend([0] * (accepted - len(self.spec_per_pos)))
            for i in range(accepted):
                self.spec_per_pos[i] += 1

    def ended(self, *, reason: str | None = None, error: str | None = None, e2e: float | None = None) -> None:
        with self._lock:
            if reason is not None:
                self.finished[reason] += 1
            if error is not None:
                self.errors[error] += 1
            if e2e is not None:
                self.e2e.observe(e2e)

    def cache(self, stats, usage: CacheUsage) -> None:
        with self._lock:
            self.cache_counts = (stats.queries, stats.hits, stats.hit_tokens, stats.captures, stats.evictions,
                                 stats.offloads)
            self.cache_usage = usage

    def gauges(self, running: int, waiting: int, capacity: CapacitySummary | None) -> None:
        with self._lock:
            self.running, self.waiting = running, waiting
            if capacity is not None:
                self.capacity = capacity

    def snapshot(self, availability: Availability, outstanding: int) -> EngineMetrics:
        with self._lock:
            c = self.capacity
            return EngineMetrics(
                availability=availability, running=self.running, waiting=self.waiting,
                max_concurrency=self.max_concurrency, queue_size=self.queue_size, outstanding=outstanding,
                outstanding_capacity=self.outstanding_capacity,
                outstanding_capacity_free=self.outstanding_capacity - outstanding,
                pages_total=c.pages_total, pages_free=c.pages_free, slots_total=c.slots_total,
                slots_free=c.slots_free, page_size=c.page_size,
                num_requests_submitted=self.num_submitted, num_requests_rejected=dict(self.rejected),
                num_prompt_tokens=self.prompt_tokens, num_reused_tokens=self.reused_tokens,
                num_generation_tokens=self.generation_tokens, num_finished=dict(self.finished),
                num_errors=dict(self.errors), num_prefill_units=self.units["prefill"],
                num_decode_rounds=self.units["decode"], num_control_units=self.units["control"],
                queue_time_s=self.queue_time.snapshot(), ttft_s=self.ttft.snapshot(),
                inter_token_s=self.inter_token.snapshot(), e2e_s=self.e2e.snapshot(),
                decode_batch_size=self.batch_size.snapshot(),
                num_cache_queries=self.cache_counts[0], num_cache_hits=self.cache_counts[1],
                num_cache_hit_tokens=self.cache_counts[2], num_cache_captures=self.cache_counts[3],
                num_cache_evictions=self.cache_counts[4], num_cache_offloads=self.cache_counts[5],
                num_checkpoints_device=self.cache_usage.num_device, num_checkpoints_host=self.cache_usage.num_host,
                checkpoint_device_bytes=self.cache_usage.device_bytes,
                checkpoint_host_bytes=self.cache_usage.host_bytes,
                num_speculative_tokens=self.num_speculative_tokens, num_spec_drafts=self.spec_drafts,
                num_spec_draft_tokens=self.spec_draft_tokens, num_spec_accepted_tokens=self.spec_accepted,
                num_spec_accepted_per_pos=tuple(self.spec_per_pos))
