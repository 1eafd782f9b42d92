"""`GET /metrics`: the Engine's published metrics snapshot in Prometheus text format.

Names are prefixed `ninfer:` and modelled on vLLM's (`vllm:num_requests_running`, ...). Values
come from one `EngineMetrics` snapshot per scrape (the Engine owns the facts; the Gateway only
renders them), so gauges and counters of one scrape are consistent with each other.
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ninfer.config import EngineMetrics, HistogramSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Engine finish-reason values -> the OpenAI/vLLM names used in the `finished_reason` label.
_FINISHED = {"cancelled": "abort"}


class EngineCollector:
    """A prometheus_client collector reading `snapshot()` (None while no Engine exists yet)."""

    def __init__(self, snapshot: Callable[[], EngineMetrics | None], model_name: str,
                 availability: Callable[[], tuple[str, bool]]):
        self._snapshot = snapshot
        self._model = model_name
        self._availability = availability

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self._model], float(value))
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self._model], float(value))
        return c

    def _histogram(self, name: str, doc: str, h: HistogramSnapshot) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=["model_name"])
        buckets = [(repr(float(b)), int(c)) for b, c in zip(h.bounds, h.counts)]
        buckets.append(("+Inf", int(h.count)))
        fam.add_metric([self._model], buckets, float(h.sum))
        return fam

    def collect(self):
        state, ready = self._availability()
        g = GaugeMetricFamily("ninfer:engine_ready", "1 when the engine accepts requests, else 0",
                              labels=["model_name", "state"])
        g.add_metric([self._model, state], 1.0 if ready else 0.0)
        yield g
        m = self._snapshot()
        if m is None:
            return
        yield self._gauge("ninfer:num_requests_running", "Requests holding an active lane", m.running)
        yield self._gauge("ninfer:num_requests_waiting", "Requests waiting in the FIFO queue", m.waiting)
        yield self._gauge("ninfer:max_concurrency", "Active lanes (max_concurrency)", m.max_concurrency)
        yield self._gauge("ninfer:queue_size", "Capacity of the waiting queue", m.queue_size)
        yield self._gauge("ninfer:request_capacity", "Outstanding request capacity (lanes + queue)",
                          m.outstanding_capacity)
        yield self._gauge("ninfer:request_capacity_free", "Free outstanding request capacity",
                          m.outstanding_capacity_free)
        yield self._gauge("ninfer:kv_cache_usage_perc", "Fraction of KV pages in use (0..1)",
                          (1.0 - m.pages_free / m.pages_total) if m.pages_total else 0.0)
        yield self._gauge("ninfer:kv_cache_pages_total", "KV pages", m.pages_total)
        yield self._gauge("ninfer:kv_cache_pages_free", "Free KV pages", m.pages_free)
        yield self._gauge("ninfer:state_slot_usage_perc", "Fraction of recurrent-state slots in use (0..1)",
                          (1.0 - m.slots_free / m.slots_total) if m.slots_total else 0.0)
        yield self._gauge("ninfer:state_slots_total", "Recurrent-state (StateImage) slots", m.slots_total)
        yield self._gauge("ninfer:state_slots_free", "Free recurrent-state slots", m.slots_free)
        yield self._counter("ninfer:prompt_tokens", "Prompt tokens of admitted requests", m.num_prompt_tokens)
        yield self._counter("ninfer:prompt_tokens_cached", "Prompt tokens reused from cached prefixes",
                            m.num_reused_tokens)
        yield self._counter("ninfer:generation_tokens", "Generated (committed) tokens", m.num_generation_tokens)
        yield self._counter("ninfer:prefix_cache_queries", "Admissions that looked up the context cache",
                            m.num_cache_queries)
        yield self._counter("ninfer:prefix_cache_hits", "Admissions that reused a checkpoint", m.num_cache_hits)
        yield self._counter("ninfer:prefix_cache_hit_tokens", "Prompt tokens reused from checkpoints",
                            m.num_cache_hit_tokens)
        yield self._counter("ninfer:prefix_cache_captures", "Checkpoints captured inside prompts",
                            m.num_cache_captures)
        yield self._counter("ninfer:prefix_cache_evictions", "Inactive checkpoints deleted", m.num_cache_evictions)
        yield self._counter("ninfer:prefix_cache_offloads", "Inactive checkpoints moved to host memory",
                            m.num_cache_offloads)
        yield self._gauge("ninfer:prefix_cache_checkpoints", "Inactive checkpoints on the device",
                          m.num_checkpoints_device)
        yield self._gauge("ninfer:prefix_cache_host_checkpoints", "Inactive checkpoints in host memory",
                          m.num_checkpoints_host)
        yield self._gauge("ninfer:prefix_cache_device_bytes", "Device bytes held only by inactive checkpoints",
                          m.checkpoint_device_bytes)
        yield self._gauge("ninfer:prefix_cache_host_bytes", "Host bytes of checkpoint replicas",
                          m.checkpoint_host_bytes)
        yield self._counter("ninfer:request_submitted", "Requests accepted at submit", m.num_requests_submitted)
        fin = CounterMetricFamily("ninfer:request_success", "Finished requests by finish reason",
                                  labels=["model_name", "finished_reason"])
        for reason, n in sorted(m.num_finished.items()):
            fin.add_metric([self._model, _FINISHED.get(reason, reason)], float(n))
        yield fin
        err = CounterMetricFamily("ninfer:request_failure", "Requests that ended with an error, by kind",
                                  labels=["model_name", "kind"])
        for kind, n in sorted(m.num_errors.items()):
            err.add_metric([self._model, kind], float(n))
        yield err
        rej = CounterMetricFamily("ninfer:request_rejected", "Requests refused at submit, by kind",
                                  labels=["model_name", "kind"])
        for kind, n in sorted(m.num_requests_rejected.items()):
            rej.add_metric([self._model, kind], float(n))
        yield rej
        yield self._histogram("ninfer:time_to_first_token_seconds", "Time to first token", m.ttft_s)
        yield self._histogram("ninfer:inter_token_latency_seconds", "Time between output tokens", m.inter_token_s)
        yield self._histogram("ninfer:e2e_request_latency_seconds", "End-to-end request latency", m.e2e_s)
        yield self._histogram("ninfer:request_queue_time_seconds", "Time spent waiting in the queue",
                              m.queue_time_s)
        yield self._histogram("ninfer:decode_batch_size", "Rows per decode round", m.decode_batch_size)
        if m.num_speculative_tokens:
            yield from self._spec_decode(m)

    def _spec_decode(self, m: EngineMetrics):
        """vLLM's spec_decode counters (present only with speculative decoding on): per round of a row
        that committed a token, one draft of K tokens, produced - 1 of them accepted, position i counted
        when the draft at i was accepted. Mean acceptance length = 1 + accepted / drafts."""
        yield self._counter("ninfer:spec_decode_num_drafts", "Speculative rounds (one per row and round)",
                            m.num_spec_drafts)
        yield self._counter("ninfer:spec_decode_num_draft_tokens", "Draft tokens proposed",
                            m.num_spec_draft_tokens)
        yield self._counter("ninfer:spec_decode_num_accepted_tokens", "Draft tokens accepted",
                            m.num_spec_accepted_tokens)
        pos = CounterMetricFamily("ninfer:spec_decode_num_accepted_tokens_per_pos",
                                  "Draft tokens accepted at each draft position", labels=["model_name", "position"])
        for i, n in enumerate(m.num_spec_accepted_per_pos):
            pos.add_metric([self._model, str(i)], float(n))
        yield pos


def make_registry(collector: EngineCollector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
