"""Benchmark of the command line's start-up: how long a user waits for `volfsm` to answer.

Run `python bench/cli.py [--runs N]`. In one run, against the same bare
interpreter start (`python -c pass`, the peer), it measures the best of N
(default 15) wall times of:

* help_s: `volfsm --help`;
* get_s: `volfsm get pods` against a real `volfsm serve` started here (an
  embedded NATS server, no CSI driver, an empty root dir of its own under
  a scratch dir), one pod with an emptyDir applied and mounted first;
* history_s: `volfsm history` on the sample log (`volfsm demo`, ~70 events);
* history_help_s: `volfsm history --help` (one command's module imported).

Each runs as `python -m volfsm.cli ...` with this interpreter (the console
script is the same code; a pyenv shim in front of it would add its own
~0.3 s). `help_ratio` = help_s / pass_s (target <= 4) and `get_ratio` =
get_s / pass_s (target <= 6): ratios, because absolute times drift with the
load of the (shared, 2-core) machine. The service needs root (tmpfs).

One human line per figure, then one JSON object with every figure and the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workdir import scratch  # noqa: E402

TARGETS = {"help_ratio": 4.0, "get_ratio": 6.0}
POD = """apiVersion: v1
kind: Pod
metadata: {name: bench-0, namespace: default, uid: 5b1e0c1a-0000-4000-8000-00000000be0c}
spec:
  volumes: [{name: scratch, emptyDir: {}}]
"""


def best_of(argv: Sequence[str], runs: int, env: dict[str, str]) -> float:
    """The shortest wall time of `runs` runs of `argv` (each must exit 0)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, env=env, cwd=ROOT)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()}")
    return min(times)


def volfsm(*args: str) -> list[str]:
    """The command line of `volfsm ARGS` with this interpreter."""
    return [sys.executable, "-m", "volfsm.cli", *args]


def start_service(work: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`volfsm serve` on an embedded NATS server; returns once it is ready and the pod mounted."""
    data = work / "data"
    proc = subprocess.Popen(
        volfsm("serve", "--node", "bench", "--data-dir", str(data), "--log-format", "json"),
        stdout=subprocess.DEVNULL,
        stderr=(work / "serve.log").open("wb"),
        env=env,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while not (data / "nats.url").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"volfsm serve did not start: {(work / 'serve.log').read_text()}")
        time.sleep(0.1)
    pod = work / "pod.yaml"
    pod.write_text(POD)
    for args in (
        ("apply", "-f", str(pod)),
        ("wait", "pod", "default/bench-0", "--for", "mounted", "--timeout", "60"),
    ):
        subprocess.run(volfsm(*args, "--data-dir", str(data)), check=True, env=env, cwd=ROOT)
    return proc


def stop_service(proc: subprocess.Popen[bytes], data: Path, env: dict[str, str]) -> None:
    """Delete the pod (no tmpfs stays mounted), then SIGTERM the service."""
    subprocess.run(
        volfsm("delete", "pod", "default/bench-0", "--data-dir", str(data)), env=env, cwd=ROOT
    )
    subprocess.run(
        volfsm("wait", "pod", "default/bench-0", "--for", "unmounted", "--data-dir", str(data)),
        env=env,
        cwd=ROOT,
    )
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> None:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    figures: dict[str, float] = {}
    with scratch("volfsm-bench-cli-") as work:
        demo = work / "demo"
        subprocess.run(volfsm("demo", "--data-dir", str(demo)), check=True, env=env, cwd=ROOT)
        proc = start_service(work, env)
        data = work / "data"
        try:
            figures["pass_s"] = best_of([sys.executable, "-c", "pass"], runs, env)
            figures["help_s"] = best_of(volfsm("--help"), runs, env)
            figures["get_s"] = best_of(volfsm("get", "pods", "--data-dir", str(data)), runs, env)
            figures["history_s"] = best_of(volfsm("history", "--data-dir", str(demo)), runs, env)
            figures["history_help_s"] = best_of(volfsm("history", "--help"), runs, env)
        finally:
            stop_service(proc, data, env)
    base = figures["pass_s"]
    for name in ("help", "get", "history", "history_help"):
        figures[f"{name}_ratio"] = round(figures[f"{name}_s"] / base, 2)
    for name, value in figures.items():
        if name.endswith("_s"):
            figures[name] = round(value, 4)
            print(f"{name:16} {value * 1000:8.1f} ms")
    for name in ("help_ratio", "get_ratio", "history_ratio", "history_help_ratio"):
        target = TARGETS.get(name)
        mark = ""
        if target is not None:
            mark = f" (target <= {target:g}: {'met' if figures[name] <= target else 'MISSED'})"
        print(f"{name:16} {figures[name]:8.2f} x python -c pass{mark}")
    print(json.dumps({**figures, "targets": TARGETS}))


if __name__ == "__main__":
    main()
