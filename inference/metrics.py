"""Prometheus metrics of the worker (served at GET /metrics).

One registry per app, so tests that start several workers in one process do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10)
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge("omni_sessions_active", "Open realtime sessions", registry=r)
        self.sessions_total = Counter("omni_sessions_total", "Realtime sessions accepted", registry=r)
        self.sessions_rejected = Counter(
            "omni_sessions_rejected_total", "Connections refused before the upgrade", ["reason"], registry=r)
        self.slow_clients_dropped = Counter(
            "omni_slow_clients_dropped_total", "Sessions dropped because the client stopped reading", registry=r)
        self.paced_reads = Counter(
            "omni_paced_reads_total", "Client events after which a session waited: the client sent faster than "
            "client_bytes_per_s", registry=r)
        self.connections_evicted = Counter(
            "omni_connections_evicted_total", "Connections without a session closed to make room for new ones",
            registry=r)
        self.responses = Counter("omni_responses_total", "Responses by final status", ["status"], registry=r)
        self.cancels = Counter("omni_response_cancels_total", "Responses cancelled", ["reason"], registry=r)
        self.errors = Counter("omni_errors_total", "Error events sent, by code", ["code"], registry=r)
        self.time_to_first_audio = Histogram(
            "omni_time_to_first_audio_seconds", "response.create to the first audio delta sent",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "omni_queue_wait_seconds", "Time a response waited for an engine slot",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.realtime_factor = Histogram(
            "omni_realtime_factor", "Generation time / seconds of audio produced (below 1 is faster than real time)",
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, 10, 30), registry=r)
        self.gateway_delta_latency = Histogram(
            "omni_gateway_delta_seconds", "Engine delta to its event written on the socket",
            buckets=_FAST_BUCKETS, registry=r)
        self.output_audio_seconds = Counter(
            "omni_output_audio_seconds_total", "Seconds of audio sent to clients", registry=r)
        self.input_images = Counter(
            "omni_input_images_total", "Pictures added to conversations (input_image parts accepted)", registry=r)
        self.input_image_tokens = Counter(
            "omni_input_image_tokens_total",
            "Image tokens in finished responses' prompts; cached: read from the prefix cache", ["cached"], registry=r)
        self.input_video_tokens = Counter(
            "omni_input_video_tokens_total",
            "Video tokens (turns sent with camera frames) in finished responses' prompts; cached: read from the "
            "prefix cache", ["cached"], registry=r)
        self.context_truncations = Counter(
            "omni_context_truncations_total",
            "Responses for which the oldest conversation items left the model's context (truncation)", registry=r)
