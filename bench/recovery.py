"""Benchmark of recovery: start to ready with 100,000 / 1,000,000 logged events, and replay.

Run `python bench/recovery.py` (`--quick`: 20,000 / 200,000 events; `--keep DIR`
reuses the logs built there). Last line: one JSON object.

The logs. A template is recorded by the real engine: pods with one or two
PersistentVolume claims (a scripted CSI driver, attachable and
device-mountable, that now and then fails a NodePublish with a non-final
error or a NodeStage with a final one) and an emptyDir each come and go
over 40 volumes, until about 12,000 events are logged, some pods still
mounted at the end. The template is then replayed R times into a new log
with every identifier renamed per replica (pod uids, PV names and the
volume ids, paths and op ids made of them), R replicas interleaved in
group commits, so the log has the engine's own event shapes and mix, R x 40
volumes (thousands for 1,000,000 events) and R times the template's live
pods at the end. The result is checked with `projections.validate` (a
legal story) and its fold (R times the template's Mounted pod-volumes).

Snapshots are written by the engine itself: all but the last ~50,000 events
(`SnapshotPolicy.every_events`, the most a crash can leave after the newest
periodic snapshot) are written first, an engine is started on that log,
settles and stops (writing its snapshot at stop), then the remaining
replicas are appended: the crash case, a snapshot a full policy interval
behind. A copy of the final log gets another engine start and stop: the
clean-stop case (`ready_s_1m_clean_stop`, nothing to replay). The engine's
snapshot is its live state, so the deleted pods it already cleaned up are
not in it (a full fold still carries them until the first pass).

Measured, each start in a fresh child process on a fresh copy of the log
(the start appends to it), engine with the scripted driver and emptyDir on
an empty root dir (the node has none of the log's mounts: reconstruction
marks them Uncertain and the first pass starts their remounts):

* ready_s_*: in-process, from opening the log to `VolumeEngine.start()`
  returned (snapshot restore or replay, reconstruction) and the first
  reconcile pass done (what /readyz waits for). Interpreter start-up and
  imports are excluded; they are measured apart (`interpreter_imports_s`).
  Median of `--runs` starts; the breakdown is printed per start.
* raw_read_1m_s: a plain sqlite3 SELECT of every row of the same 1M log
  (all columns): the floor of any replay. Ratio printed.
* replay_ev_s: `volfsm replay --db LOG > /dev/null` as a subprocess
  (interpreter start-up included), events / wall time; peer: the engine's
  fold alone (`fold_ev_s_1m`, as the engine folds: the pod-volume part in a
  child process) and the same fold in one process (`fold_ev_s_1m_one_process`,
  the peer of the split: `split_gain`).
* snapshot figures for the 1M state: size, encode time (the event-loop
  stall when the engine takes one), compress + write time (worker thread).

Targets: ready_s_1m <= 1.0, ready_s_1m_nosnapshot <= 4.0, replay_ev_s >= 100,000.
Absolute figures move with the machine's load (2 shared cores); compare
with the peers measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
from workdir import scratch_dir  # noqa: E402

from events.log import ANY_VERSION, EventLog  # noqa: E402
from events.types import Body, Event, OperationStarted  # noqa: E402
from projections.validate import validate  # noqa: E402
from volfsm.engine import EngineConfig, VolumeEngine  # noqa: E402
from volfsm.engine.snapshot import (  # noqa: E402
    KIND,
    SnapshotPolicy,
    fold_log,
)
from volfsm.engine.splitfold import SPLIT_OVER  # noqa: E402
from volfsm.node.layout import RootLayout  # noqa: E402
from volfsm.plugins.catalog import PluginCatalog  # noqa: E402
from volfsm.plugins.emptydir import EmptyDirPlugin  # noqa: E402
from volfsm.plugins.scripted import ScriptedPlugin, final, nonfinal  # noqa: E402

TARGETS = {"ready_s_1m": 1.0, "ready_s_1m_nosnapshot": 4.0, "replay_ev_s": 100_000}
DRIVER = "tpl.volfsm.io"
NAMESPACE = "bench"
TEMPLATE_EVENTS = 12_000
TEMPLATE_VOLUMES = 40
LIVE_PODS = 24
START_US = 1_750_000_000_000_000
CONFIG = EngineConfig(
    reconcile_period=0.01,
    full_resync_period=60.0,
    backoff_initial=0.01,
    backoff_max=0.05,
    operation_timeout=5.0,
    wait_for_attach_timeout=5.0,
)


class StepClock:
    """1 ms per group commit: distinct, increasing timestamps."""

    def __init__(self) -> None:
        self.now = START_US

    def __call__(self) -> int:
        self.now += 1000
        return self.now


def catalog(root: Path) -> tuple[PluginCatalog, ScriptedPlugin]:
    plugin = ScriptedPlugin(driver=DRIVER, attachable=True, device_mountable=True)
    cat = PluginCatalog()
    cat.register_csi_driver(DRIVER, plugin)
    cat.register(EmptyDirPlugin(RootLayout(root)))
    return cat, plugin


# ------------------------------------------------------------------ template


def _pv(i: int) -> list[dict[str, Any]]:
    name = f"tplpv{i:04d}"
    return [
        {
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "csi": {"driver": DRIVER, "volumeHandle": f"handle-{name}"},
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
            },
        },
        {
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"volumeName": name},
            "status": {"phase": "Bound"},
        },
    ]


def _pod(n: int, claims: list[int]) -> dict[str, Any]:
    uid = f"tpluid{n:06d}"
    vols: list[dict[str, Any]] = [
        {"name": f"data{k}", "persistentVolumeClaim": {"claimName": f"tplpv{c:04d}"}}
        for k, c in enumerate(claims)
    ]
    vols.append({"name": "scratch", "emptyDir": {}})
    return {
        "kind": "Pod",
        "metadata": {"name": f"web-{uid}", "namespace": NAMESPACE, "uid": uid},
        "spec": {"volumes": vols},
    }


async def record_template(path: Path, root: Path) -> dict[str, Any]:
    """Run the real engine over a churning workload; what it logged is the template."""
    log = EventLog(path, node="bench-node", clock=StepClock())
    cat, plugin = catalog(root)
    engine = VolumeEngine(log, root, cat, CONFIG)
    await engine.start()
    rnd = random.Random(7)
    try:
        await engine.apply([o for i in range(TEMPLATE_VOLUMES) for o in _pv(i)])
        live: list[str] = []
        n = 0
        while log.last_seq() < TEMPLATE_EVENTS:
            batch = []
            for _ in range(6):
                claims = rnd.sample(range(TEMPLATE_VOLUMES), rnd.randint(1, 2))
                batch.append(_pod(n, claims))
                live.append(f"tpluid{n:06d}")
                n += 1
                if rnd.random() < 0.15:
                    plugin.script("set_up", nonfinal("Unavailable", "driver busy"))
                if rnd.random() < 0.05:
                    plugin.script("mount_device", final("Internal", "stage failed"))
            await engine.apply(batch)
            while len(live) > LIVE_PODS:
                await engine.delete_pod(uid=live.pop(0))
            await engine.settle(timeout=60)
        for uid in live:
            await engine.wait_pod(uid, "mounted", timeout=60)
        await engine.settle(timeout=60)
        mounted = sum(1 for pv in engine.asw.podvols.values() if pv.state == "Mounted")
    finally:
        await engine.stop(grace_s=2.0)
        events = log.last_seq()
        log.close()
        plugin.cleanup()
    return {"events": events, "pods": n, "live_pods": len(live), "mounted": mounted}


# ------------------------------------------------------------------ replicas


_IDS = re.compile(r"tpl(uid|pv)(\d+)")


class Template:
    """The template's appends, as (stream, JSON bodies) runs, ready to rename."""

    def __init__(self, path: Path) -> None:
        self.appends: list[tuple[str, list[bytes]]] = []
        enc = msgspec.json.Encoder()
        op_prefix = ""
        last: tuple[str, int] | None = None
        with EventLog(path, readonly=True) as log:
            self.template_events = log.last_seq()
            for env in log.read_after(0):
                if not op_prefix and hasattr(env.body, "op_id"):
                    op_prefix = str(env.body.op_id).split("-")[0]
                key = (env.stream, env.ts)
                data = enc.encode(env.body)
                if key == last:
                    self.appends[-1][1].append(data)
                else:
                    self.appends.append((env.stream, [data]))
                    last = key
        self.op_prefix = op_prefix.encode()
        self.events = sum(len(b) for _, b in self.appends)

    def replica(self, r: int) -> list[tuple[str, list[Body]]]:
        """The appends with every identifier renamed for replica `r`."""
        tag = f"r{r:04d}"
        op_tag = f"{r:04x}{self.op_prefix.decode()[4:]}".encode()
        dec = msgspec.json.Decoder(Event)
        out: list[tuple[str, list[Body]]] = []
        for stream, datas in self.appends:
            bodies: list[Body] = []
            for data in datas:
                text = _IDS.sub(lambda m: f"{tag}{m.group(1)}{m.group(2)}", data.decode())
                raw = text.encode()
                if self.op_prefix:
                    raw = raw.replace(self.op_prefix, op_tag)
                bodies.append(dec.decode(raw))
            out.append((_IDS.sub(lambda m: f"{tag}{m.group(1)}{m.group(2)}", stream), bodies))
        return out


async def write_replicas(path: Path, template: Template, replicas: range) -> int:
    """Replicas (appended to the log), interleaved, each in its own order, in group commits."""
    clock = StepClock()
    if path.exists():
        with EventLog(path, readonly=True) as old:
            rows = list(old.rows_after(max(0, old.last_seq() - 1)))
            clock.now = max(clock.now, rows[-1][5] if rows else 0)
    log = EventLog(path, node="bench-node", clock=clock)
    try:

        async def one(r: int) -> None:
            for stream, bodies in template.replica(r):
                await log.append_async(stream, ANY_VERSION, bodies)

        await asyncio.gather(*(one(r) for r in replicas))
        return log.last_seq()
    finally:
        log.close()


def check_log(path: Path) -> dict[str, Any]:
    """A legal story (SystemExit if not), and what its fold holds."""
    from projections.asw import Asw
    from volfsm.desired.dsw import DesiredStateOfWorld
    from volfsm.engine.index import EngineIndex

    with EventLog(path, readonly=True) as log:
        report = validate(log.read_after(0))
        if not report.ok:
            raise SystemExit(f"{path}: generated log does not validate: {report.violation}")
        asw = Asw()
        dsw = DesiredStateOfWorld(lambda s, m: None)
        index = EngineIndex(dsw)
        fold_log(log, asw, dsw, index)
    mounted = sum(1 for pv in asw.podvols.values() if pv.state == "Mounted")
    return {
        "events": report.events,
        "streams": report.streams,
        "devices": len(asw.devices),
        "podvols": len(asw.podvols),
        "mounted": mounted,
        "desired_pods": len(dsw.pods),
    }


async def stop_child(db: Path, root: Path) -> dict[str, Any]:
    """Start an engine on the log, let it settle, stop it: it writes its snapshot at stop."""
    log = EventLog(db, node="bench-node")
    cat, plugin = catalog(root)
    engine = VolumeEngine(log, root, cat, CONFIG)
    await engine.start()
    while engine.reconciler.passes < 1:
        await asyncio.sleep(0.001)
    await engine.settle(timeout=600)
    t0 = time.perf_counter()
    await engine.stop(grace_s=5.0)
    stop_s = time.perf_counter() - t0
    stats = engine.snapshots.stats
    out = {
        "snapshot_seq": stats.last_seq,
        "last_seq": log.last_seq(),
        "snapshot_bytes": stats.last_bytes,
        "snapshot_encode_s": round(stats.last_encode_s, 3),
        "stop_s": round(stop_s, 3),
        "written": stats.written,
        "entries": len(engine.asw.devices) + len(engine.asw.podvols),
        "removed_pods_kept": len(engine.index.removed_pods),
        "error": stats.last_error,
    }
    log.close()
    plugin.cleanup()
    return out


def engine_snapshot(db: Path, work: Path) -> dict[str, Any]:
    """Run `stop_child` on `db` itself (in a child process, on an empty root dir)."""
    root = Path(tempfile.mkdtemp(prefix="stop-root-", dir=work))
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child-stop", str(db), str(root)],
            check=True,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    result = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    if not result["written"] or result["snapshot_seq"] != result["last_seq"]:
        raise SystemExit(f"{db}: the engine did not write its snapshot at stop: {result}")
    return result


def snapshot_body_size(db: Path) -> int:
    """Uncompressed size of the newest engine snapshot."""
    from projections.asw import Asw
    from volfsm.desired.dsw import DesiredStateOfWorld
    from volfsm.engine.index import EngineIndex
    from volfsm.engine.snapshot import decode_state, install_state

    with EventLog(db, readonly=True) as log:
        header = log.snapshots.headers(KIND)[0]
        body = log.snapshots.load(header)
    dsw = DesiredStateOfWorld(lambda s, m: None)
    install_state(decode_state(body), Asw(), dsw, EngineIndex(dsw))  # it decodes
    return len(zlib.decompress(body))


def variant(src: Path, dst: Path, keep_newest_below: int | None) -> Path:
    """A copy of `src` whose snapshots are all (None) or those at or below a seq."""
    shutil.copyfile(src, dst)
    conn = sqlite3.connect(dst)
    with conn:
        if keep_newest_below is None:
            conn.execute("DELETE FROM snapshots")
        else:
            conn.execute("DELETE FROM snapshots WHERE seq > ?", (keep_newest_below,))
        conn.execute(
            "DELETE FROM snapshot_chunks WHERE snapshot_id NOT IN (SELECT id FROM snapshots)"
        )
    conn.execute("VACUUM")
    conn.close()
    return dst


# ------------------------------------------------------------------ measuring


async def ready_child(db: Path, root: Path) -> dict[str, Any]:
    """Open the log, start the engine, wait for the first reconcile pass (in this process)."""
    gc.collect()
    t0 = time.perf_counter()
    log = EventLog(db, node="bench-node")
    t_open = time.perf_counter()
    cat, _plugin = catalog(root)
    engine = VolumeEngine(log, root, cat, CONFIG)
    await engine.start()
    t_started = time.perf_counter()
    while engine.reconciler.passes < 1:
        await asyncio.sleep(0.0005)
    t_ready = time.perf_counter()
    startup = engine.snapshots.startup
    assert startup is not None
    recon = getattr(engine, "reconstruction", None)
    recon_dict = recon.as_dict() if recon is not None and hasattr(recon, "as_dict") else None
    return {
        "ready_s": t_ready - t0,
        "open_s": t_open - t0,
        "start_s": t_started - t_open,
        "restore_s": startup.seconds,
        "first_pass_s": t_ready - t_started,
        "summary": engine.snapshots.summary,
        "events_replayed": startup.events_replayed,
        "operations_running": engine.executor.running,
        "events_since_start": log.last_seq() - startup.last_seq,
        "reconstruction": _short(recon_dict),
    }


def _short(d: Any) -> Any:
    """Counts instead of long lists (the reconstruction report of thousands of entries)."""
    if isinstance(d, dict):
        return {k: (len(v) if isinstance(v, list | tuple) else _short(v)) for k, v in d.items()}
    return d


def run_ready(db: Path, work: Path, tag: str) -> dict[str, Any]:
    """One start in a fresh child process, on a fresh copy of `db`."""
    run = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=work))
    try:
        copy = run / "volfsm.db"
        shutil.copyfile(db, copy)
        (run / "root").mkdir()
        out = subprocess.run(
            [sys.executable, __file__, "--child-ready", str(copy), str(run / "root")],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        subprocess.run(["rm", "-rf", str(run)], check=False)


def measure_ready(db: Path, work: Path, tag: str, runs: int) -> dict[str, Any]:
    results = [run_ready(db, work, tag) for _ in range(runs)]
    for r in results:
        print(
            f"  {tag}: ready {r['ready_s']:.3f} s = open {r['open_s']:.3f} + start "
            f"{r['start_s']:.3f} (restore {r['restore_s']:.3f}) + first pass "
            f"{r['first_pass_s']:.3f}; {r['summary']}; first pass left "
            f"{r['operations_running']} operations running",
            flush=True,
        )
    best = sorted(results, key=lambda r: r["ready_s"])[len(results) // 2]
    return best


def raw_read(db: Path) -> float:
    gc.collect()
    t0 = time.perf_counter()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    for _row in conn.execute(
        "SELECT seq, stream, version, type, schema, ts, node, body FROM events ORDER BY seq"
    ):
        pass
    conn.close()
    return time.perf_counter() - t0


def fold_rate(db: Path, split_over: int | None = SPLIT_OVER) -> float:
    from projections.asw import Asw
    from volfsm.desired.dsw import DesiredStateOfWorld
    from volfsm.engine.index import EngineIndex

    with EventLog(db, readonly=True) as log:
        asw = Asw()
        dsw = DesiredStateOfWorld(lambda s, m: None)
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            _, count = fold_log(log, asw, dsw, EngineIndex(dsw), split_over=split_over)
            return count / (time.perf_counter() - t0)
        finally:
            gc.enable()


def append_latency_during_save(db: Path, work: Path) -> dict[str, float]:
    """Durable one-event appends, alone and while the 1m state's snapshot is being saved."""
    from projections.asw import Asw
    from volfsm.desired.dsw import DesiredStateOfWorld
    from volfsm.engine.index import EngineIndex
    from volfsm.engine.snapshot import encode_state, restore, save_state

    copy = work / "v_latency.db"
    shutil.copyfile(db, copy)
    out: dict[str, float] = {}
    with EventLog(copy, node="bench-node") as log:
        asw = Asw()
        dsw = DesiredStateOfWorld(lambda s, m: None)
        index = EngineIndex(dsw)
        restore(log, asw, dsw, index)
        data = encode_state(asw, dsw, index, log.last_seq())
        body = OperationStarted(op_id="lat", operation="noop", volume_id="lat")

        def appends(stop: threading.Event | None, count: int) -> list[float]:
            lat: list[float] = []
            while (stop is None and len(lat) < count) or (stop is not None and not stop.is_set()):
                t0 = time.perf_counter()
                log.append("device/latency-probe", ANY_VERSION, [body])
                lat.append(time.perf_counter() - t0)
            return lat

        alone = appends(None, 300)
        done = threading.Event()
        saves: list[float] = []

        def saver() -> None:
            for _ in range(3):
                t0 = time.perf_counter()
                save_state(log, log.last_seq(), data)
                saves.append(time.perf_counter() - t0)
            done.set()

        thread = threading.Thread(target=saver)
        thread.start()
        during = appends(done, 0)
        thread.join()
    copy.unlink()
    for name, lat in (("alone", alone), ("during_save", during)):
        lat.sort()
        out[f"append_ms_p50_{name}"] = round(1000 * lat[len(lat) // 2], 2)
        out[f"append_ms_p99_{name}"] = round(1000 * lat[int(len(lat) * 0.99)], 2)
        out[f"append_ms_max_{name}"] = round(1000 * lat[-1], 2)
    out["appends_during_save"] = len(during)
    out["snapshot_save_s_1m"] = round(min(saves), 3)
    return out


def cli() -> list[str]:
    script = Path(sys.executable).with_name("volfsm")
    return [str(script)] if script.exists() else [sys.executable, "-m", "volfsm.cli"]


def replay_subprocess(db: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the checkout, installed or not
    t0 = time.perf_counter()
    subprocess.run(
        [*cli(), "replay", "--db", str(db)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=True,
        env=env,
    )
    return time.perf_counter() - t0


def interpreter_imports() -> float:
    code = (
        "import events.log, volfsm.engine, volfsm.plugins.scripted, volfsm.plugins.emptydir, "
        "volfsm.engine.snapshot"
    )
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        best = min(best, time.perf_counter() - t0)
    return best


# ------------------------------------------------------------------ main


def build(work: Path, sizes: dict[str, int]) -> dict[str, Any]:
    info: dict[str, Any] = {}
    template_db = work / "template.db"
    if not template_db.exists():
        root = work / "template-root"
        root.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        tinfo = asyncio.run(record_template(template_db, root))
        shutil.rmtree(root, ignore_errors=True)
        print(
            f"template: {tinfo['events']} events from the real engine in "
            f"{time.perf_counter() - t0:.1f} s ({tinfo['pods']} pods, {tinfo['live_pods']} "
            f"live at the end, {tinfo['mounted']} pod-volumes Mounted)",
            flush=True,
        )
        (work / "template.json").write_text(json.dumps(tinfo))
    tinfo = json.loads((work / "template.json").read_text())
    template = Template(template_db)
    policy = SnapshotPolicy()
    for tag, events in sizes.items():
        db = work / f"log_{tag}.db"
        clean = work / f"log_{tag}_clean.db"
        replicas = max(2, round(events / template.events))
        tail_reps = min(replicas - 1, max(1, round(policy.every_events / template.events)))
        if not clean.exists():
            for p in (db, clean):
                p.unlink(missing_ok=True)
            t0 = time.perf_counter()
            asyncio.run(write_replicas(db, template, range(replicas - tail_reps)))
            crash = engine_snapshot(db, work)  # a node that stopped once, then ...
            written = asyncio.run(
                write_replicas(db, template, range(replicas - tail_reps, replicas))
            )
            checked = check_log(db)  # ... logged more, then crashed: snapshot is a tail behind
            shutil.copyfile(db, clean)
            stopped = engine_snapshot(clean, work)  # the same log after a clean stop
            meta = {
                **checked,
                "tail_events": written - crash["snapshot_seq"],
                "crash_snapshot": crash,
                "clean_snapshot": stopped,
                "snapshot_raw_bytes": snapshot_body_size(clean),
            }
            (work / f"log_{tag}.json").write_text(json.dumps(meta))
            print(
                f"log {tag}: {written} events, {replicas} replicas, built, validated and "
                f"snapshotted by the engine in {time.perf_counter() - t0:.1f} s",
                flush=True,
            )
        meta = json.loads((work / f"log_{tag}.json").read_text())
        snap = meta["clean_snapshot"]
        print(
            f"log {tag}: {meta['events']} events, {meta['streams']} streams, "
            f"{meta['devices']} devices, {meta['podvols']} pod-volumes ({meta['mounted']} "
            f"Mounted), {meta['desired_pods']} desired pods; engine snapshot at stop "
            f"{snap['snapshot_bytes'] / 1e6:.1f} MB (msgpack {meta['snapshot_raw_bytes'] / 1e6:.1f}"
            f" MB, {snap['entries']} ASW entries, encoded in {snap['snapshot_encode_s']} s); "
            f"crash case: newest snapshot {meta['tail_events']} events before the end",
            flush=True,
        )
        info[tag] = {"db": db, "clean": clean, "meta": meta, "replicas": replicas}
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 / 200,000 events")
    parser.add_argument("--keep", type=Path, help="build the logs here and keep them (reused)")
    parser.add_argument("--runs", type=int, default=3, help="starts per figure (median)")
    parser.add_argument("--child-ready", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--child-stop", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_stop:
        result = asyncio.run(stop_child(Path(args.child_stop[0]), Path(args.child_stop[1])))
        print(json.dumps(result), flush=True)
        return
    if args.child_ready:
        result = asyncio.run(ready_child(Path(args.child_ready[0]), Path(args.child_ready[1])))
        print(json.dumps(result), flush=True)
        os._exit(0)  # the copy is thrown away: no need to drain what the first pass started
    small, large = (20_000, 200_000) if args.quick else (100_000, 1_000_000)
    work = args.keep or scratch_dir("volfsm-bench-recovery-")
    work.mkdir(parents=True, exist_ok=True)
    r: dict[str, Any] = {"events_small": small, "events_large": large}
    try:
        info = build(work, {"100k": small, "1m": large})
        last_large = info["1m"]["meta"]["events"]
        tail = info["1m"]["meta"]["tail_events"]
        crash_large = info["1m"]["db"]
        crash_small = info["100k"]["db"]
        nosnap_large = variant(info["1m"]["db"], work / "v_1m_nosnap.db", None)
        print("start to ready (in-process; interpreter start-up and imports excluded):")
        s100 = measure_ready(crash_small, work, "100k", args.runs)
        s1m = measure_ready(crash_large, work, "1m", args.runs)
        clean = measure_ready(info["1m"]["clean"], work, "1m-clean-stop", args.runs)
        nosnap = measure_ready(nosnap_large, work, "1m-nosnapshot", args.runs)
        r["ready_s_100k"] = round(s100["ready_s"], 3)
        r["ready_s_1m"] = round(s1m["ready_s"], 3)
        r["ready_s_1m_clean_stop"] = round(clean["ready_s"], 3)
        r["ready_s_1m_nosnapshot"] = round(nosnap["ready_s"], 3)
        r["ready_breakdown_1m"] = {k: v for k, v in s1m.items() if k != "summary"}
        r["ready_breakdown_1m_nosnapshot"] = {k: v for k, v in nosnap.items() if k != "summary"}
        r["startup_1m"] = s1m["summary"]
        r["startup_1m_nosnapshot"] = nosnap["summary"]
        r["snapshot_tail_events_1m"] = tail
        r["snapshot_tail_events_100k"] = info["100k"]["meta"]["tail_events"]
        snap = info["1m"]["meta"]["clean_snapshot"]
        r["snapshot_bytes_1m"] = snap["snapshot_bytes"]
        r["snapshot_raw_bytes_1m"] = info["1m"]["meta"]["snapshot_raw_bytes"]
        r["snapshot_encode_s_1m"] = snap["snapshot_encode_s"]
        r["engine_stop_s_1m"] = snap["stop_s"]
        r["state_entries_1m"] = snap["entries"]
        r["raw_read_1m_s"] = round(min(raw_read(nosnap_large) for _ in range(3)), 3)
        r["ready_1m_nosnapshot_over_raw_read"] = round(
            r["ready_s_1m_nosnapshot"] / r["raw_read_1m_s"], 2
        )
        r["ready_1m_over_raw_read"] = round(r["ready_s_1m"] / r["raw_read_1m_s"], 2)
        r["fold_ev_s_1m"] = round(max(fold_rate(nosnap_large) for _ in range(2)))
        r["fold_ev_s_1m_one_process"] = round(
            max(fold_rate(nosnap_large, split_over=None) for _ in range(2))
        )
        r["split_gain"] = round(r["fold_ev_s_1m"] / r["fold_ev_s_1m_one_process"], 2)
        replay_s = min(replay_subprocess(nosnap_large) for _ in range(2))
        r["replay_s_1m"] = round(replay_s, 3)
        r["replay_ev_s"] = round(last_large / replay_s)
        r["replay_over_fold"] = round(r["fold_ev_s_1m"] / r["replay_ev_s"], 2)
        r["interpreter_imports_s"] = round(interpreter_imports(), 3)
        r.update(append_latency_during_save(info["1m"]["clean"], work))
        r["targets"] = {
            "ready_s_1m<=1.0": r["ready_s_1m"] <= TARGETS["ready_s_1m"],
            "ready_s_1m_nosnapshot<=4.0": r["ready_s_1m_nosnapshot"]
            <= TARGETS["ready_s_1m_nosnapshot"],
            "replay_ev_s>=100000": r["replay_ev_s"] >= TARGETS["replay_ev_s"],
        }
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            for p in work.glob("v_*.db*"):
                p.unlink()
    small_tail = info["100k"]["meta"]["tail_events"]
    print(f"ready 100k (snapshot {small_tail} events old):          {r['ready_s_100k']} s")
    print(f"ready 1m   (snapshot {tail} events old):           {r['ready_s_1m']} s (target <= 1.0)")
    print(f"ready 1m   (clean stop, snapshot at the end):      {r['ready_s_1m_clean_stop']} s")
    print(
        f"ready 1m   without snapshot (full replay):          {r['ready_s_1m_nosnapshot']} s "
        f"(target <= 4.0); raw SELECT of the same rows {r['raw_read_1m_s']} s, ratio "
        f"{r['ready_1m_nosnapshot_over_raw_read']}"
    )
    print(
        f"snapshot of the 1m state: {r['snapshot_bytes_1m'] / 1e6:.1f} MB zlib "
        f"({r['snapshot_raw_bytes_1m'] / 1e6:.1f} MB msgpack, {r['state_entries_1m']} ASW entries),"
        f" encoded in {r['snapshot_encode_s_1m']} s on the loop; the stop that wrote it took "
        f"{r['engine_stop_s_1m']} s"
    )
    print(
        f"volfsm replay > /dev/null: {r['replay_ev_s']:,} ev/s ({r['replay_s_1m']} s, target >= "
        f"100,000); engine fold alone {r['fold_ev_s_1m']:,} ev/s (one process "
        f"{r['fold_ev_s_1m_one_process']:,}, split gain {r['split_gain']}x); interpreter + imports "
        f"{r['interpreter_imports_s']} s"
    )
    print(
        f"durable 1-event appends: p99 {r['append_ms_p99_alone']} ms alone, "
        f"{r['append_ms_p99_during_save']} ms (max {r['append_ms_max_during_save']} ms) while "
        f"the 1m snapshot is saved ({r['snapshot_save_s_1m']} s per save, worker thread)"
    )
    print(json.dumps(r, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
