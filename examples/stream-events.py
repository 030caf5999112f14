"""Print a node's events as the JetStream stream holds them (what other services consume).

    python3 examples/stream-events.py [--data-dir DIR] [--last N]

The NATS URL and node name come from the data dir of a running `volfsm serve`
(`nats.url`, `node`), or from --nats / --node. Each line: the stream sequence,
the event's time, its Nats-Msg-Id (<node>:<log seq>), type and log stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.js.api import DeliverPolicy

from events.subjects import node_events_filter
from volfsm.paths import DEFAULT_DATA_DIR
from volfsm.service.config import saved_nats_url, saved_node


def describe(event: dict[str, Any]) -> str:
    """A few words about an event body."""
    body = event.get("body") or {}
    if event.get("type", "").startswith("Operation"):
        words = [str(body.get("operation", ""))]
        if body.get("code"):
            words.append(f"{body['code']}: {body.get('message', '')}")
        return " ".join(words)
    if event.get("type") == "PodAdded":
        return f"{body.get('namespace', '')}/{body.get('name', '')}"
    return ""


async def show(url: str, node: str, stream: str, last: int) -> int:
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1)
    try:
        js = nc.jetstream()
        subject = node_events_filter(node)
        info = await js.stream_info(stream, subjects_filter=subject)
        total = sum((info.state.subjects or {}).values())
        sub = await js.subscribe(
            subject, stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        tail: deque[str] = deque(maxlen=last)
        try:
            for _ in range(total):
                msg = await sub.next_msg(timeout=10)
                event = json.loads(msg.data)
                when = datetime.fromtimestamp(event["ts"] / 1e6, UTC).strftime("%H:%M:%S.%f")[:-3]
                tail.append(
                    f"{msg.metadata.sequence.stream:>6}  {when}  "
                    f"{(msg.headers or {}).get('Nats-Msg-Id', ''):<12} {event['type']:<22} "
                    f"{event['stream']}  {describe(event)}".rstrip()
                )
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()
    print(
        f"JetStream stream {stream} holds {total} events of node {node} ({subject}); last {last}:"
    )
    print("\n".join(tail))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("VOLFSM_DATA_DIR") or DEFAULT_DATA_DIR),
    )
    parser.add_argument("--nats", help="NATS URL (default: <data-dir>/nats.url)")
    parser.add_argument("--node", help="node name (default: <data-dir>/node)")
    parser.add_argument("--stream", default="VOLFSM")
    parser.add_argument("--last", type=int, default=15, help="how many of the newest to show")
    args = parser.parse_args()
    url = args.nats or saved_nats_url(args.data_dir)
    node = args.node or saved_node(args.data_dir)
    if not url or not node:
        print(
            f"no running volfsm serve found in {args.data_dir}; pass --nats and --node",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(show(url, node, args.stream, max(args.last, 1)))


if __name__ == "__main__":
    sys.exit(main())
