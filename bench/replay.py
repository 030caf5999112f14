"""Benchmark of `volfsm replay`: events told per second, written to /dev/null.

Run `python bench/replay.py [--events N] [--keep FILE]`. It writes a log of
about N events (default 300,000) shaped like the engine's: pods come and
go, each with a CSI volume that is attached, staged (one in five after a
NodeStage timeout and a retry), published, unpublished, unstaged and
detached, every operation with its records (written by a child process,
so the measuring process starts clean). Then it measures:

* replay_ev_s_inprocess: `run_replay` (exactly what the CLI runs) on the
  whole log, text output to /dev/null; best of 3.
* replay_json_ev_s_inprocess: the same with `-o json`.
* fold_ev_s: the plain ASW fold of the same log through `EventLog.replay`,
  GC paused as in the replay (the floor the story adds its words to);
  `story_overhead` = fold / replay.
* replay_ev_s: one real `volfsm replay --db FILE > /dev/null` subprocess,
  interpreter start-up and imports included (the figure a user sees); it
  runs the console script installed beside this interpreter (not a shell
  shim such as pyenv's, which adds ~0.3 s); startup_s is `volfsm --help`.

Absolute figures drift with the machine's load (2 cores, shared); compare
`replay_ev_s_inprocess` with `fold_ev_s` from the same run.

One human line per figure, then, last, one JSON object with every figure
and the target (replay_ev_s >= 100,000).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workdir import scratch_dir  # noqa: E402

from events.log import ANY_VERSION, EventLog  # noqa: E402
from events.streams import device_stream, pod_stream, podvol_stream  # noqa: E402
from events.types import (  # noqa: E402
    Body,
    DesiredVolume,
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodRemoved,
    VolumeMounted,
    VolumeResized,
    VolumeSource,
    VolumeUnmounted,
)
from projections.asw import Asw  # noqa: E402
from volfsm.cli.common import Output  # noqa: E402
from volfsm.cli.replay import resolve_window, run_replay  # noqa: E402

TARGET_REPLAY_EV_S = 100_000
START_US = 1_714_533_000_000_000
PLUGIN = "kubernetes.io/csi:csi.volfsm.example"
CONCURRENT_PODS = 1500


class _Clock:
    """1 ms per group commit: distinct, increasing timestamps."""

    def __init__(self) -> None:
        self.now = START_US

    def __call__(self) -> int:
        self.now += 1000
        return self.now


def _pod_script(i: int) -> list[tuple[str, list[Body]]]:
    """The appends of one pod's life, in order (each append one stream)."""
    uid = f"{i:08x}-0000-4000-8000-{i:012x}"
    vid = f"pvc-{i:08x}-1111-4222-8333-{i:012x}"
    vol = DesiredVolume(
        name="data",
        volume_id=vid,
        pv_name=vid,
        size_bytes=10 * 1024**3,
        source=VolumeSource(plugin="kubernetes.io/csi", driver="csi.volfsm.example"),
    )
    pod, dev, pv = pod_stream(uid), device_stream(vid), podvol_stream(uid, "data")
    staging = f"/var/lib/kubelet/plugins/kubernetes.io/csi/csi.volfsm.example/{vid}/globalmount"
    mount = f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/data/mount"

    def started(n: int, operation: str, reason: str) -> OperationStarted:
        return OperationStarted(
            op_id=f"{i:x}-{n}",
            operation=operation,
            volume_id=vid,
            pod_uid=uid,
            plugin=PLUGIN,
            reason=reason,
        )

    def ok(n: int, operation: str) -> OperationSucceeded:
        return OperationSucceeded(op_id=f"{i:x}-{n}", operation=operation, duration_s=0.25)

    steps: list[tuple[str, list[Body]]] = [
        (pod, [PodAdded(pod_uid=uid, namespace="bench", name=f"pod-{i}", volumes=(vol,))]),
        (pv, [started(1, "volume_mount", "desired and not mounted")]),
        (
            dev,
            [
                DeviceAttached(volume_id=vid, plugin=PLUGIN, attachable=True),
                VolumeResized(volume_id=vid, size_bytes=10 * 1024**3),
            ],
        ),
    ]
    n = 1
    if i % 5 == 0:  # NodeStage times out once; the retry stages it
        steps.append(
            (
                dev,
                [
                    DeviceMountUncertain(
                        volume_id=vid,
                        reason="stage may be in progress (DeadlineExceeded: MountDevice did "
                        "not finish within 15 s)",
                        device_mount_path=staging,
                    )
                ],
            )
        )
        steps.append(
            (
                pv,
                [
                    OperationFailed(
                        op_id=f"{i:x}-1",
                        operation="volume_mount",
                        code="DeadlineExceeded",
                        message="MountDevice did not finish within 15 s",
                        final=False,
                        backoff_s=0.5,
                        duration_s=15.0,
                    ),
                    started(2, "volume_mount", "desired and not mounted"),
                ],
            )
        )
        n = 2
    steps += [
        (dev, [DeviceMounted(volume_id=vid, device_mount_path=staging, mount_found=True)]),
        (
            pv,
            [
                VolumeMounted(
                    volume_id=vid,
                    pod_uid=uid,
                    volume_name="data",
                    mount_path=mount,
                    mount_found=True,
                ),
                ok(n, "volume_mount"),
            ],
        ),
        (pod, [PodRemoved(pod_uid=uid, namespace="bench", name=f"pod-{i}")]),
        (
            pv,
            [
                started(n + 1, "volume_unmount", "no pod wants this pod-volume any more"),
                VolumeUnmounted(
                    volume_id=vid, pod_uid=uid, volume_name="data", reason="unpublished"
                ),
                ok(n + 1, "volume_unmount"),
            ],
        ),
        (
            dev,
            [
                started(n + 2, "unmount_device", "no pod holds or wants the volume"),
                DeviceUnmounted(volume_id=vid, reason="unstaged"),
                ok(n + 2, "unmount_device"),
                DeviceDetached(volume_id=vid),
            ],
        ),
    ]
    return steps


def write_log(path: Path, events: int) -> int:
    """Write about `events` events (whole pod lives) to a new log; the count written."""
    per_pod = (
        sum(len(b) for _, b in _pod_script(1)) * 0.8 + sum(len(b) for _, b in _pod_script(0)) * 0.2
    )
    pods = max(1, round(events / per_pod))

    async def one_pod(log: EventLog, i: int) -> None:
        for stream, bodies in _pod_script(i):
            await log.append_async(stream, ANY_VERSION, bodies)

    async def main() -> None:
        log = EventLog(path, node="bench-node", clock=_Clock())
        try:
            for first in range(0, pods, CONCURRENT_PODS):
                last = min(pods, first + CONCURRENT_PODS)
                await asyncio.gather(*(one_pod(log, i) for i in range(first, last)))
        finally:
            log.close()

    asyncio.run(main())
    with EventLog(path, readonly=True) as log:
        return log.last_seq()


def _best(runs: int, fn: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(path: Path, events: int) -> dict[str, Any]:
    """Every figure, on the log at `path` holding `events` events."""
    r: dict[str, Any] = {"events": events}
    with EventLog(path, readonly=True) as log, open(os.devnull, "w") as devnull:
        window = resolve_window(log, None, None)

        def text() -> None:
            run_replay(log, window, Output.table, out=devnull)

        def as_json() -> None:
            run_replay(log, window, Output.json, out=devnull)

        def fold() -> None:  # under the same GC pause as run_replay
            gc.disable()
            try:
                log.replay(Asw().apply)
            finally:
                gc.enable()

        r["replay_s_inprocess"] = round(_best(3, text), 3)
        r["replay_json_s_inprocess"] = round(_best(2, as_json), 3)
        r["fold_s"] = round(_best(3, fold), 3)
    r["replay_ev_s_inprocess"] = round(events / r["replay_s_inprocess"])
    r["replay_json_ev_s_inprocess"] = round(events / r["replay_json_s_inprocess"])
    r["fold_ev_s"] = round(events / r["fold_s"])
    r["story_overhead"] = round(r["fold_ev_s"] / r["replay_ev_s_inprocess"], 2)
    # The console script of this interpreter (not a shell shim that may be first on PATH).
    script = Path(sys.executable).with_name("volfsm")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "volfsm.cli"]
    r["cli"] = " ".join(cli)
    t0 = time.perf_counter()
    subprocess.run([*cli, "--help"], stdout=subprocess.DEVNULL, check=True)
    r["startup_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    subprocess.run(
        [*cli, "replay", "--db", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    r["replay_s"] = round(time.perf_counter() - t0, 3)
    r["replay_ev_s"] = round(events / r["replay_s"])
    r["target_replay_ev_s"] = TARGET_REPLAY_EV_S
    r["replay_ev_s_ok"] = r["replay_ev_s"] >= TARGET_REPLAY_EV_S
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000, help="about this many events")
    parser.add_argument(
        "--keep", type=Path, help="write the log here and keep it (reused if there)"
    )
    parser.add_argument("--write-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_only is not None:  # the child that writes the log (see below)
        print(write_log(args.write_only, args.events))
        return
    tmp = scratch_dir("volfsm-bench-replay-")
    try:
        path = args.keep if args.keep is not None else tmp / "volfsm.db"
        t0 = time.perf_counter()
        if path.exists():
            with EventLog(path, readonly=True) as log:
                events = log.last_seq()
        else:
            # Written by a child process, so the measuring process starts clean.
            child = subprocess.run(
                [sys.executable, __file__, "--write-only", str(path), "--events", str(args.events)],
                check=True,
                capture_output=True,
                text=True,
            )
            events = int(child.stdout.split()[-1])
        print(f"log: {events} events in {time.perf_counter() - t0:.1f}s ({path})", flush=True)
        r = measure(path, events)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"replay (in-process, text): {r['replay_ev_s_inprocess']:,} ev/s", flush=True)
    print(f"replay (in-process, json): {r['replay_json_ev_s_inprocess']:,} ev/s", flush=True)
    print(f"plain ASW fold:            {r['fold_ev_s']:,} ev/s", flush=True)
    print(f"volfsm start-up (--help):  {r['startup_s']}s", flush=True)
    print(
        f"volfsm replay subprocess:  {r['replay_ev_s']:,} ev/s ({r['replay_s']}s, "
        f"target >= {TARGET_REPLAY_EV_S:,})",
        flush=True,
    )
    print(json.dumps(r, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
