#!/usr/bin/env python3
"""A Python app traced with the OpenTelemetry SDK and profiled continuously by pyroscope-io,
whose samples pyroscope-otel's span processor tags with the span they ran in: the set-up
Pyroscope documents for traces to profiles in Python. Nothing here is Smolder's: the profiles
go out as pyroscope-io sends them.

Usage: span_app.py <server url> <seconds> [tenant]

Runs root spans `alpha` (CPU-bound work in `alpha_work`) and `beta` (different CPU-bound work
in `beta_work`) one after the other for about <seconds>, each span about 150 ms and followed by
200 ms asleep, then shuts the profiler down, which uploads what is left. Prints one JSON
object: the span ids (16 hex digits) of each span name, and the run's start and end in Unix
milliseconds.

The sleep is for pyroscope-io, not for Smolder: its sampler thread reads a stack first and
applies the thread's tags (pyroscope-otel's span id) when it processes the sample, later, so on
a loaded machine a sample taken at the very end of one span can get the next span's id. Asleep,
the thread is off CPU and not sampled, so a late sample can only get the tags of no span.
"""

import json
import sys
import time

import pyroscope
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from pyroscope.otel import PyroscopeSpanProcessor

SPAN_SECONDS = 0.15
GAP_SECONDS = 0.2


def alpha_work(deadline):
    """Sums squares until the deadline."""
    total = 0
    while time.monotonic() < deadline:
        for i in range(2_000):
            total += i * i
    return total


def beta_work(deadline):
    """Builds and sorts strings until the deadline: other code than alpha_work's."""
    words = []
    while time.monotonic() < deadline:
        words = sorted(str(i * 7919 % 10_007) for i in range(2_000))
    return len(words)


def main():
    url, seconds = sys.argv[1], float(sys.argv[2])
    tenant = sys.argv[3] if len(sys.argv) > 3 else ""
    pyroscope.configure(
        application_name="spanapp",
        server_address=url,
        sample_rate=100,
        upload_interval=2,
        tenant_id=tenant,
        tags={"env": "test"},
    )
    provider = TracerProvider()
    provider.add_span_processor(PyroscopeSpanProcessor())
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("span_app")

    spans = {"alpha": [], "beta": []}
    start = time.time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, work in (("alpha", alpha_work), ("beta", beta_work)):
            with tracer.start_as_current_span(name) as span:
                spans[name].append(format(span.get_span_context().span_id, "016x"))
                work(time.monotonic() + SPAN_SECONDS)
            time.sleep(GAP_SECONDS)
    finished = time.time()
    if not pyroscope.shutdown():
        sys.exit("pyroscope-io failed to shut down")
    print(json.dumps({
        "spans": spans,
        "start_ms": int(start * 1000),
        "end_ms": int(finished * 1000) + 1,
    }))


if __name__ == "__main__":
    main()
