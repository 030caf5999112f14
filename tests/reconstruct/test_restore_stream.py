"""`volfsm serve --restore-from-stream`: a lost or old log put back from JetStream, for real.

Real nats-server, real `volfsm serve` processes, real tmpfs mounts. The
relay refuses a stream that holds more of the node's events than its log;
the flag copies them back, after which the service starts as if the log
had never been lost: what it mounted is Mounted, not merely found.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from events.types import Envelope
from tests.reconstruct.test_service import EMPTY, cli, make_nats, mem_pod, serves
from tests.service.helpers import ServeProcess, expected_stream, keyless, read_stream
from volfsm.bus import NatsServer
from volfsm.node import mounts

__all__ = ["make_nats", "serves"]  # fixtures

RESTORE = "--restore-from-stream"


def history(svc: ServeProcess) -> list[Envelope]:
    log = svc.open_log()
    try:
        return list(log.read_after(0))
    finally:
        log.close()


def exits_with(svc: ServeProcess) -> tuple[int, str]:
    """Start a service that must fail to start: (exit code, its last log lines)."""
    svc.start(wait_ready=False)
    assert svc.proc is not None
    code = svc.proc.wait(60)
    return code, svc.stderr_tail(5)


def mounted_pods(svc: ServeProcess) -> dict[str, str]:
    where = ("--data-dir", str(svc.data_dir))
    items = json.loads(cli("get", "pods", "-o", "json", *where))["items"]
    return {item["uid"]: item["volumes"][0]["state"] for item in items}


def test_a_lost_log_is_put_back_from_the_stream_and_the_node_is_believed_again(
    tmp_path: Path, make_nats: Callable[[str], NatsServer], serves: list[ServeProcess]
) -> None:
    # Arrange: two tmpfs pods mounted; a copy of the log taken after the first (a backup)
    nats = make_nats("nats")
    svc = ServeProcess(tmp_path / "svc", nats_url=nats.url, args=["--desired-grace", "600"])
    (tmp_path / "svc").mkdir()
    serves.append(svc)
    where = ("--data-dir", str(svc.data_dir))
    svc.start()
    for uid in ("a", "b"):
        spec = tmp_path / f"{uid}.json"
        spec.write_text(json.dumps([mem_pod(uid)]))
        cli("apply", "-f", str(spec), *where)
        cli("wait", "pod", f"pod-{uid}", "--for", "mounted", "--timeout", "60", *where)
        if uid == "a":
            backup = tmp_path / "backup"
            backup.mkdir()
            cli("validate", *where)
            assert svc.stop() == 0
            for path in svc.data_dir.glob("volfsm.db*"):
                shutil.copy2(path, backup / path.name)
            svc.start()
    assert svc.stop() == 0
    before = history(svc)
    assert len(before) > len(history_of(backup))

    # Act: the log is lost; a start without the flag is refused, naming the flag
    for path in svc.data_dir.glob("volfsm.db*"):
        path.unlink()
    code, tail = exits_with(svc)

    # Assert
    assert code != 0
    assert "local log ends at 0" in tail and RESTORE in tail

    # Act: start with the flag
    svc.args = [*svc.args, RESTORE]
    svc.start()

    # Assert: the log is the history it lost, event for event; the stream equals the log
    after = history(svc)
    assert after[: len(before)] == before
    restored = [ln for ln in svc.log_lines() if "log restored from stream" in ln["message"]]
    assert (
        len(restored) == 1
        and f"seq 1..{len(before)} ({len(before)} events)" in (restored[-1]["message"])
    )
    # Both pods are Mounted again as the log says (confirmed by the node), not "found"
    assert mounted_pods(svc) == {"a": "Mounted", "b": "Mounted"}
    for uid in ("a", "b"):
        assert mounts.find_mount(svc.root_dir / f"pods/{uid}/volumes" / EMPTY / "mem")
    assert svc.stop() == 0
    log = svc.open_log()
    try:
        assert keyless(read_stream(nats.url)) == keyless(expected_stream(log))
    finally:
        log.close()

    # Act: the older backup is put in place and started with the flag
    for path in svc.data_dir.glob("volfsm.db*"):
        path.unlink()
    for path in backup.iterdir():
        shutil.copy2(path, svc.data_dir / path.name)
    svc.start()

    # Assert: it got its missing tail: the whole history again, pods Mounted
    full = history(svc)
    assert full[: len(after)] == after
    assert mounted_pods(svc) == {"a": "Mounted", "b": "Mounted"}
    assert svc.stop() == 0


def history_of(data_dir: Path) -> list[Envelope]:
    from events.log import EventLog

    log = EventLog(data_dir / "volfsm.db", readonly=True)
    try:
        return list(log.read_after(0))
    finally:
        log.close()


def test_another_nodes_history_under_the_same_name_is_not_taken(
    tmp_path: Path, make_nats: Callable[[str], NatsServer], serves: list[ServeProcess]
) -> None:
    # Arrange: node n1 records a history in the stream (two pods)
    nats = make_nats("nats")
    first = ServeProcess(tmp_path / "one", nats_url=nats.url)
    (tmp_path / "one").mkdir()
    serves.append(first)
    first.start()
    for uid in ("a", "b"):
        spec = tmp_path / f"{uid}.json"
        spec.write_text(json.dumps([mem_pod(uid)]))
        cli("apply", "-f", str(spec), "--data-dir", str(first.data_dir))
        cli("wait", "pod", f"pod-{uid}", "--for", "mounted", "--timeout", "60",
            "--data-dir", str(first.data_dir))  # fmt: skip
    assert first.stop() == 0

    # ...and another machine also called n1 has a shorter history of its own elsewhere
    second = ServeProcess(tmp_path / "two", nats_url=make_nats("other").url)
    (tmp_path / "two").mkdir()
    serves.append(second)
    second.start()
    cli("apply", "-f", str(tmp_path / "a.json"), "--data-dir", str(second.data_dir))
    cli("wait", "pod", "pod-a", "--for", "mounted", "--timeout", "60",
        "--data-dir", str(second.data_dir))  # fmt: skip
    assert second.stop() == 0
    own = history(second)
    assert 0 < len(own) < len(history(first))

    # Act: it is pointed at n1's stream with the flag
    second.nats_url = nats.url
    second.args = [RESTORE]
    code, tail = exits_with(second)

    # Assert: refused, its log untouched
    assert code != 0
    assert "this log is not that node's history" in tail
    assert history(second) == own
