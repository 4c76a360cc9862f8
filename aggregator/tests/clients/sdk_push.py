#!/usr/bin/env python3
"""Pushes profiles with pyroscope-io (Pyroscope's Python SDK, pinned in scripts/test) as an app
configured for an aggregator that asks for credentials: a bearer token in the Authorization
header (pyroscope-io 1.x has no auth-token option of its own; Pyroscope documents
`http_headers` for it), or HTTP basic auth (`basic_auth_username`, `basic_auth_password`).
Nothing here is Smolder's: the profiles go out as pyroscope-io sends them.

Usage: sdk_push.py <server url> <app> token <token>
       sdk_push.py <server url> <app> basic <user> <password>

Burns CPU in `busy_work` for about 4 s with uploads every second, then shuts the profiler down,
which uploads what is left. Prints one JSON object: the run's start and end in Unix seconds.
"""

import json
import sys
import time

import pyroscope


def busy_work(deadline):
    """Sums squares until the deadline."""
    total = 0
    while time.monotonic() < deadline:
        for i in range(2_000):
            total += i * i
    return total


def main():
    url, app, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    auth = {}
    if mode == "token":
        auth["http_headers"] = {"Authorization": f"Bearer {sys.argv[4]}"}
    elif mode == "basic":
        auth["basic_auth_username"] = sys.argv[4]
        auth["basic_auth_password"] = sys.argv[5]
    else:
        sys.exit(f"unknown mode {mode}")
    pyroscope.configure(
        application_name=app,
        server_address=url,
        sample_rate=100,
        upload_interval=1,
        **auth,
    )
    start = time.time()
    busy_work(time.monotonic() + 4)
    if not pyroscope.shutdown():
        sys.exit("pyroscope-io failed to shut down")
    print(json.dumps({"start": int(start), "end": int(time.time()) + 1}))


if __name__ == "__main__":
    main()
