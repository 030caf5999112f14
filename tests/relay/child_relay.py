"""A relay in its own process, for the crash test: `python -m tests.relay.child_relay ...`.

Arguments: LOG_PATH NATS_URL CURSOR_LIMIT. Publishes the whole log; cursor
writes above CURSOR_LIMIT are silently dropped, as if the process always
died between the PubAck and the cursor write. Prints `ACKED <seq>` once
JetStream acknowledged everything, then waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys

from events.log import EventLog
from tests.relay.helpers import NODE
from volfsm.bus.relay import Relay, RelayConfig


async def main(log_path: str, url: str, cursor_limit: int) -> None:
    log = EventLog(log_path, node=NODE)
    real_set_cursor = log.set_cursor

    def set_cursor(name: str, seq: int) -> None:
        if seq <= cursor_limit:
            real_set_cursor(name, seq)

    log.set_cursor = set_cursor  # type: ignore[method-assign]
    relay = Relay(log, url, NODE, RelayConfig(duplicate_window_s=1.0))
    await relay.start()
    last = log.last_seq()
    while relay.acked_seq < last:
        await asyncio.sleep(0.01)
    print(f"ACKED {relay.acked_seq}", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
