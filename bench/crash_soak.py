"""Crash soak: many random fault points over a random mixed workload, checked after each few.

Run as root: `python bench/crash_soak.py --rounds 200 --seed 7`. It starts
its own nats-server and volfsm's CSI driver (files in a temporary
directory, removed at the end unless `--keep` or a failure), then runs
`tests.crash.chaos.Chaos` (see its docstring) on one node after another
(`--crashes-per-node`, so logs grow long but not unbounded) until
`--rounds` crashes happened. Every crash is followed, every 2-5 crashes,
by a fault-free start that must converge: desired pods Mounted, deleted
pods without a mount, loop device or directory left, `volfsm validate`
passing, the JetStream stream equal to the log.

It prints one line per crash with `--verbose`, a line per figure, and,
last, one JSON object: crashes, per-point counts, restarts, convergence
checks, failures (0, or the first failure with its seed: the soak stops
there and keeps the node's dirs for `volfsm replay --db`), and timings
(restart to ready after a crash, p50 / p95 / max; seconds per crash).
Exit code 0 when no check failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.crash.chaos import Chaos, ChaosStats  # noqa: E402
from tests.crash.harness import CrashNode, cleanup_node  # noqa: E402
from tests.helpers.csidriver import DriverProcess, cleanup_under, leftovers_under  # noqa: E402
from volfsm.bus import NatsServer  # noqa: E402


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of `values`, or None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def main(argv: list[str] | None = None) -> int:
    """Run the soak; 0 if every check passed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200, help="crashes to cause (default 200)")
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    p.add_argument("--crashes-per-node", type=int, default=50)
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    p.add_argument("--verbose", action="store_true", help="a line per crash and check")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="volfsm-crash-soak-"))
    nats = NatsServer(work / "nats").start()
    driver = DriverProcess(work / "driver", node_id="soak")
    driver.workdir.mkdir()
    driver.start()
    began = time.monotonic()
    runs: list[ChaosStats] = []
    ready: list[float] = []
    failure: dict[str, Any] | None = None
    node_no = 0
    try:
        while sum(r.crashes for r in runs) < args.rounds and failure is None:
            node_no += 1
            seed = args.seed * 1000 + node_no
            node = CrashNode(work / f"node{node_no}", nats.url, driver, f"soak{node_no}")
            chaos = Chaos(node, seed, trace=print if args.verbose else None)
            want = min(args.crashes_per_node, args.rounds - sum(r.crashes for r in runs))
            try:
                runs.append(chaos.run(want))
            except Exception as exc:
                runs.append(chaos.stats)
                failure = {
                    "seed": seed,
                    "node_dir": str(node.workdir),
                    "error": str(exc.__cause__ or exc).splitlines()[0],
                }
                traceback.print_exc()
            finally:
                ready += [
                    s.ready_s
                    for prev, s in zip(node.starts, node.starts[1:], strict=False)
                    if prev.crash is not None and s.ready_s is not None
                ]
                cleanup_node(node)
    finally:
        driver.close()
        cleanup_under(work)
        left = leftovers_under(work)
        nats.stop()
        if failure is None and not args.keep and left.empty:
            shutil.rmtree(work, ignore_errors=True)
    duration = time.monotonic() - began
    by_point: Counter[str] = Counter()
    for r in runs:
        by_point.update(r.by_point)
    crashes = sum(r.crashes for r in runs)
    summary = {
        "seed": args.seed,
        "rounds": args.rounds,
        "crashes": crashes,
        "not_reached": sum(r.not_reached for r in runs),
        "nodes": node_no,
        "starts": sum(r.starts for r in runs),
        "convergence_checks": sum(r.checks for r in runs),
        "pods_created": sum(r.pods_created for r in runs),
        "pods_deleted": sum(r.pods_deleted for r in runs),
        "by_point": dict(sorted(by_point.items())),
        "failures": 0 if failure is None else 1,
        "failure": failure,
        "leftovers": None if left.empty else str(left),
        "ready_after_crash_s_p50": percentile(ready, 0.5),
        "ready_after_crash_s_p95": percentile(ready, 0.95),
        "ready_after_crash_s_max": round(max(ready), 3) if ready else None,
        "ready_after_crash_s_mean": round(statistics.fmean(ready), 3) if ready else None,
        "duration_s": round(duration, 1),
        "s_per_crash": round(duration / crashes, 3) if crashes else None,
        "work_dir": str(work) if (failure is not None or args.keep) else None,
    }
    print(f"crashes: {crashes} ({summary['not_reached']} armed points not reached)")
    print(f"convergence checks: {summary['convergence_checks']}, failures: {summary['failures']}")
    print(f"restart to ready after a crash: p50 {summary['ready_after_crash_s_p50']} s")
    print(f"seconds per crash: {summary['s_per_crash']}")
    print(json.dumps(summary, sort_keys=True))
    return 0 if failure is None and left.empty else 1


if __name__ == "__main__":
    raise SystemExit(main())
