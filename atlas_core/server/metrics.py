"""Prometheus metrics of one server, in a registry of its own (several apps per process are fine).

Counters and histograms are updated as requests run; engine gauges (running and waiting
sequences, KV-cache usage, prefix-cache hit rate, preemptions) and the decode-step histogram and
floor fraction are read from ``engine.stats()`` when ``/metrics`` is scraped.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from atlas_core.engine.agent_guards import GUARD_NAMES
from atlas_core.parsers.markup_scrub import num_scrubbed

CONTENT_TYPE = "text/plain; version=0.0.4"  # litestar appends "; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
KNOWN_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/messages",
               "/v1/messages/count_tokens", "/v1/responses", "/tokenize", "/detokenize",
               "/health", "/health/ready", "/health/live", "/metrics"}


def stat(stats, name: str) -> float:
    """``stats.<name>`` of an ``EngineStats`` (0 when absent)."""
    return getattr(stats, name, None) or 0


def kv_blocks(stats) -> tuple[int, int]:
    """``(used, total)`` KV blocks from an ``EngineStats``."""
    return int(stat(stats, "num_kv_blocks_used")), int(stat(stats, "num_kv_blocks_total"))


class _EngineCollector:
    def __init__(self, get_stats):
        self.get_stats = get_stats

    def collect(self):
        stats = self.get_stats()
        if stats is None:
            return
        used, total = kv_blocks(stats)
        queries = stat(stats, "prefix_cache_queries")
        hits = stat(stats, "prefix_cache_hits")
        gauges = {
            "atlas_num_requests_running": ("Sequences running in the engine",
                                           stat(stats, "num_running")),
            "atlas_num_requests_waiting": ("Sequences waiting for a slot",
                                           stat(stats, "num_waiting")),
            "atlas_kv_cache_blocks_used": ("KV-cache blocks in use", used),
            "atlas_kv_cache_blocks_total": ("KV-cache blocks in the pool", total),
            "atlas_kv_cache_usage_ratio": ("Fraction of KV-cache blocks in use",
                                           used / total if total else 0.0),
            "atlas_prefix_cache_hit_rate": ("Prefix-cache hits / queries (tokens)",
                                            hits / queries if queries else 0.0),
            "atlas_engine_alive": ("1 while the engine loop runs, 0 once it has died",
                                   1.0 if getattr(stats, "is_alive", True) else 0.0),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily("atlas_num_preemptions", "Sequences preempted so far",
                                  value=stat(stats, "num_preemptions"))
        yield CounterMetricFamily("atlas_prefix_cache_queries", "Prefix-cache lookups (tokens)",
                                  value=queries)
        yield CounterMetricFamily("atlas_prefix_cache_hits", "Prefix-cache hits (tokens)",
                                  value=hits)
        yield CounterMetricFamily("atlas_failed_requests",
                                  "Requests the engine failed alone (it went on serving)",
                                  value=stat(stats, "num_failed_requests"))
        yield from _decode_metrics(getattr(stats, "decode_steps", None))
        yield from _kv_tier_metrics(getattr(stats, "kv_tiers", None))
        yield from _spec_metrics(getattr(stats, "speculative", None))


def _decode_metrics(steps):
    """Decode step histogram and floor fraction from a ``DecodeStepSnapshot`` (if any)."""
    if steps is None:
        return
    buckets = [("+Inf" if b == float("inf") else str(b), n) for b, n in steps.buckets]
    yield HistogramMetricFamily("atlas_decode_step_seconds",
                                "Interval between consecutive decode-only engine steps",
                                buckets=buckets, sum_value=steps.total_seconds)
    if steps.floor_fraction is not None:
        yield GaugeMetricFamily("atlas_decode_floor_fraction",
                                "Decode floor time (bytes read per step / memory bandwidth) over "
                                "measured step time, last 64 decode steps",
                                value=steps.floor_fraction)


def _spec_metrics(spec):
    # Speculative decoding (engine/spec): drafts verified, and what they bought.
    if spec is None:
        return
    drafted, accepted, steps = spec.num_draft_tokens, spec.num_accepted_tokens, spec.num_drafts
    yield CounterMetricFamily("atlas_spec_decode_draft_tokens", "Draft tokens verified",
                              value=drafted)
    yield CounterMetricFamily("atlas_spec_decode_accepted_tokens", "Draft tokens accepted",
                              value=accepted)
    yield CounterMetricFamily("atlas_spec_decode_drafts",
                              "Sequence steps that verified drafts", value=steps)
    yield GaugeMetricFamily("atlas_spec_decode_acceptance_rate",
                            "Accepted / drafted tokens so far",
                            value=accepted / drafted if drafted else 0.0)
    yield GaugeMetricFamily("atlas_spec_decode_mean_accepted_length",
                            "Tokens emitted per sequence step with drafts (accepted + 1)",
                            value=(accepted + steps) / steps if steps else 0.0)


def _kv_tier_metrics(tiers):
    """Hits, misses and bytes of each KV tier (host memory, disk), labelled by tier."""
    if not tiers:
        return
    counters = {"hits": "Prefix-cache blocks restored from the tier",
                "misses": "Prefix lookups that went past the device cache and found no block",
                "bytes_read": "Bytes restored from the tier",
                "bytes_written": "Bytes written to the tier",
                "corrupt": "Stored blocks that failed their checks (counted, never served)",
                "write_failures": "Writes to the tier that failed (counted, the server goes on)",
                "skipped_blocks": "Prompt blocks the tier held but were recomputed, reading them "
                                  "back being estimated slower (--kv-disk-restore)"}
    for name, doc in counters.items():
        family = CounterMetricFamily(f"atlas_kv_tier_{name}", doc, labels=["tier"])
        for tier, values in tiers.items():
            if name in values:
                family.add_metric([tier], values[name])
        yield family
    for name, doc in (("used_bytes", "Bytes held by the tier"),
                      ("capacity_bytes", "Most bytes the tier holds")):
        family = GaugeMetricFamily(f"atlas_kv_tier_{name}", doc, labels=["tier"])
        for tier, values in tiers.items():
            family.add_metric([tier], values.get(name, 0))
        yield family
    rates = {tier: v["read_bytes_per_s"] for tier, v in tiers.items() if "read_bytes_per_s" in v}
    if rates:
        family = GaugeMetricFamily("atlas_kv_tier_read_bytes_per_second",
                                   "Measured read rate of the tier while reads were in flight",
                                   labels=["tier"])
        for tier, rate in rates.items():
            family.add_metric([tier], rate)
        yield family


class _ScrubCollector:
    def collect(self):
        yield CounterMetricFamily("atlas_tool_markup_scrubbed",
                                  "Tool-call markup fragments removed from content (process)",
                                  value=num_scrubbed())


class Metrics:
    """The metrics of one app. ``get_stats`` returns ``engine.stats()`` or ``None``."""

    def __init__(self, get_stats):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("atlas_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("atlas_prompt_tokens", "Prompt tokens processed",
                                     registry=r)
        self.generation_tokens = Counter("atlas_generation_tokens", "Tokens generated",
                                         registry=r)
        self.ttft = Histogram("atlas_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("atlas_time_per_output_token_seconds",
                              "Mean time between output tokens of a request",
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("atlas_e2e_request_latency_seconds", "End-to-end request latency",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.guard_stops = Counter("atlas_agent_guard_stops",
                                   "Generations stopped by an agent-loop guard", ["guard"],
                                   registry=r)
        for name in GUARD_NAMES:
            self.guard_stops.labels(guard=name)
        r.register(_EngineCollector(get_stats))
        r.register(_ScrubCollector())

    def on_first_token(self, stream, choice) -> None:
        self.ttft.observe(choice.first_token_time - stream.start_time)

    def on_finish(self, stream, choice) -> None:
        now = time.monotonic()
        self.e2e.observe(now - stream.start_time)
        self.prompt_tokens.inc(len(choice.prompt_ids))
        self.generation_tokens.inc(len(choice.token_ids))
        reason = choice.stop_reason
        if isinstance(reason, str) and reason.startswith("agent_guard:"):
            self.guard_stops.labels(guard=reason.split(":", 1)[1]).inc()
        if choice.first_token_time is not None and len(choice.token_ids) > 1:
            self.tpot.observe((now - choice.first_token_time) / (len(choice.token_ids) - 1))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def middleware(self, app):
        """ASGI middleware counting requests by endpoint and final status."""
        async def counting_app(scope, receive, send):
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            status = [500]

            async def send_status(message):
                if message["type"] == "http.response.start":
                    status[0] = message["status"]
                await send(message)
            try:
                await app(scope, receive, send_status)
            finally:
                path = scope["path"]
                if path.startswith("/v1/models/"):
                    path = "/v1/models/{id}"
                elif path.startswith("/v1/responses/"):
                    path = "/v1/responses/{id}"
                elif path not in KNOWN_PATHS:
                    path = "other"
                self.requests.labels(endpoint=path, status=str(status[0])).inc()
        return counting_app
