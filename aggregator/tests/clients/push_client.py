#!/usr/bin/env python3
"""The scale-out test's push client: pushes `pushed.cpu` ten times a second, each push to the
next aggregator in turn, with a bearer token, through Python's own HTTP client.

Usage: push_client.py <token> <host:port> [<host:port> ...]

Each line read from standard input names the phase the test is in; later pushes are tagged with
it. Standard input closing stops the client after the push under way. Prints one JSON object
per push: its number `i`, its `value` (the samples of its one stack `main;push;p<i>`), the
aggregator it went to, the `phase`, how long the answer took in seconds, and its `outcome`:

- `acked`: answered 200, so stored;
- `refused`: answered with another status, or never sent (the connection was refused): not
  stored;
- `unanswered`: sent, or maybe sent, but no answer came (a kill mid-request, a timeout): stored
  at most once.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

PHASE = {"name": "steady", "stopped": False}


def follow_phases():
    """Reads phase names from standard input until it closes."""
    for line in sys.stdin:
        if line.strip():
            PHASE["name"] = line.strip()
    PHASE["stopped"] = True


def push(token, addr, i, value):
    """One push; its outcome."""
    until = int(time.time())
    query = urllib.parse.urlencode(
        {"name": "pushed.cpu", "from": until - 10, "until": until}
    )
    request = urllib.request.Request(
        f"http://{addr}/ingest?{query}",
        data=f"main;push;p{i} {value}\n".encode(),
        headers={"Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()
            return "acked" if answer.status == 200 else "refused"
    except urllib.error.HTTPError:
        return "refused"
    except urllib.error.URLError as err:
        # Raised while connecting or sending: only a refused connection surely sent nothing.
        if isinstance(err.reason, ConnectionRefusedError):
            return "refused"
        return "unanswered"
    except OSError:
        # Raised while waiting for the answer: the request went out.
        return "unanswered"


def main():
    token, addrs = sys.argv[1], sys.argv[2:]
    threading.Thread(target=follow_phases, daemon=True).start()
    i = 0
    while not PHASE["stopped"]:
        addr = addrs[i % len(addrs)]
        value = i % 3 + 1
        phase = PHASE["name"]
        started = time.monotonic()
        outcome = push(token, addr, i, value)
        took = time.monotonic() - started
        print(
            json.dumps(
                {
                    "i": i,
                    "value": value,
                    "addr": addr,
                    "phase": phase,
                    "seconds": took,
                    "outcome": outcome,
                }
            ),
            flush=True,
        )
        i += 1
        time.sleep(0.1)


if __name__ == "__main__":
    main()
