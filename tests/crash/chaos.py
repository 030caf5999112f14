"""Randomised crash testing: random fault points over a random mixed workload, seeded.

`Chaos.run(crashes)` repeats episodes until that many crashes happened:

* start the service armed with a random spec (a random point, often with
  a random qualifier, a random `@N`; for `driver.during` a random delay and
  sometimes a CSI driver rule holding that RPC);
* tell it the desired state again, then act at random (apply a new pod of
  1-2 random volume kinds, delete a pod, wait a little) until it kills
  itself (an armed point that is not reached within the episode is let go:
  the service is stopped and the episode counts as "not reached");
* while it is down, sometimes delete a pod or create one (it learns on the
  next start, like a kubelet re-listing the API server), and, half the
  time after a killed CSI call, make the restarted service's retry of that
  call fail once with a final error (`scenarios.retry_fails`).

Every few crashes, and at the end, the service is started without a fault
and must converge (`CrashNode.converge`: mounts, loop devices, directories,
`volfsm validate`, stream == log) and drain cleanly.

Everything random comes from one `random.Random(seed)`; the seed and the
crash history are in every failure message. Timing still varies (the
machine, the driver), so a seed replays the same choices, not always the
very same interleaving.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.crash.harness import CrashNode, CrashTestError
from tests.crash.scenarios import DURING_HOLD_S, RPC_OF_CALL, retry_fails
from tests.crash.workload import Pod
from volfsm.faultpoints import FAULT_POINTS

REPO_ROOT = Path(__file__).resolve().parents[2]

CALLS = tuple(RPC_OF_CALL)
OPERATIONS = (
    "volume_mount",
    "map_volume",
    "volume_unmount",
    "unmap_volume",
    "unmount_device",
    "unmap_device",
)
EVENTS = (
    "OperationStarted",
    "OperationSucceeded",
    "DeviceAttached",
    "DeviceMounted",
    "VolumeMounted",
    "VolumeUnmounted",
    "DeviceUnmounted",
    "DeviceDetached",
)
KIND_WEIGHTS = {"fs": 3, "block": 2, "emptydir": 1, "tmpfs": 2}
MAX_PODS = 4
MAX_ACTIONS = 5
"""Actions per episode before an armed point that never fired is given up."""


def wired_points() -> tuple[str, ...]:
    """The fault points some code calls `hit` with (reconstruct.* once reconstruction has them)."""
    points = [p for p in FAULT_POINTS if not p.startswith("reconstruct.")]
    package = REPO_ROOT / "volfsm" / "engine" / "reconstruct"
    text = "".join(source.read_text() for source in sorted(package.glob("*.py")))
    points += [p for p in FAULT_POINTS if p.startswith("reconstruct.") and f'"{p}"' in text]
    return tuple(points)


POINT_WEIGHTS = {
    "driver.before": 4,
    "driver.during": 4,
    "driver.after": 4,
    "append.after": 5,
    "relay.before_publish": 2,
    "relay.before_cursor": 2,
    "reconstruct.start": 1,
    "reconstruct.mid": 1,  # reached only when a restart has something to mark
}


@dataclass(frozen=True)
class Hint:
    """Which path (mount/unmount) and volume kinds an armed qualifier needs to be reached."""

    path: str = ""
    kinds: frozenset[str] = frozenset()


_BLOCK = frozenset({"block"})
_FS = frozenset({"fs"})
_EMPTY = frozenset({"emptydir", "tmpfs"})
_HINTS = {
    "mount_device": Hint("mount", _FS),
    "set_up": Hint("mount"),
    "set_up_device": Hint("mount", _BLOCK),
    "map_pod_device": Hint("mount", _BLOCK),
    "tear_down": Hint("unmount"),
    "unmap_pod_device": Hint("unmount", _BLOCK),
    "unmount_device": Hint("unmount", _FS),
    "tear_down_device": Hint("unmount", _BLOCK),
    "volume_mount": Hint("mount"),
    "map_volume": Hint("mount", _BLOCK),
    "volume_unmount": Hint("unmount"),
    "unmap_volume": Hint("unmount", _BLOCK),
    "unmap_device": Hint("unmount", _BLOCK),
    "csi": Hint("", _FS | _BLOCK),
    "empty-dir": Hint("", _EMPTY),
    "DeviceMounted": Hint("mount", _FS | _BLOCK),
    "VolumeMounted": Hint("mount"),
    "DeviceAttached": Hint("mount"),
    "VolumeUnmounted": Hint("unmount"),
    "DeviceUnmounted": Hint("unmount", _FS | _BLOCK),
    "DeviceDetached": Hint("unmount"),
}


def hint_of(qualifier: str) -> Hint:
    """What the workload should do for `qualifier` to be reached."""
    return _HINTS.get(qualifier, Hint())


def point_of(spec: str) -> str:
    """The point a spec names."""
    return re.split(r"[/@+]", spec, maxsplit=1)[0]


@dataclass
class ChaosStats:
    """What a run did."""

    seed: int
    crashes: int = 0
    not_reached: int = 0
    starts: int = 0
    checks: int = 0
    pods_created: int = 0
    pods_deleted: int = 0
    by_point: Counter[str] = field(default_factory=Counter)
    specs: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures."""
        return {
            "seed": self.seed,
            "crashes": self.crashes,
            "not_reached": self.not_reached,
            "starts": self.starts,
            "convergence_checks": self.checks,
            "pods_created": self.pods_created,
            "pods_deleted": self.pods_deleted,
            "by_point": dict(sorted(self.by_point.items())),
            "duration_s": round(self.duration_s, 2),
            "s_per_crash": round(self.duration_s / self.crashes, 3) if self.crashes else None,
        }


class Chaos:
    """Random crashes over a random workload on one node (see the module docstring)."""

    def __init__(
        self, node: CrashNode, seed: int, trace: Callable[[str], None] | None = None
    ) -> None:
        self.node = node
        self.trace = trace
        self.seed = seed
        self.rng = random.Random(seed)
        self.points = wired_points()
        self.stats = ChaosStats(seed)
        self.hint = Hint()
        self.retry_rules: list[dict[str, Any]] = []
        """Driver rules for the next start (a killed CSI call's retry failing finally)."""
        self._pods = 0

    # ------------------------------------------------------------ choices

    def spec(self) -> tuple[str, list[dict[str, Any]]]:
        """A random spec, and the CSI driver rules that go with it."""
        rng = self.rng
        point = rng.choices(self.points, [POINT_WEIGHTS[p] for p in self.points])[0]
        quals: list[str] = []
        rules: list[dict[str, Any]] = []
        if point.startswith("driver.") and rng.random() < 0.7:
            quals.append(rng.choice((*CALLS, *OPERATIONS, "csi", "empty-dir")))
        elif point == "append.after" and rng.random() < 0.7:
            quals.append(rng.choice((*EVENTS, *OPERATIONS)))
        elif point == "relay.before_publish" and rng.random() < 0.5:
            quals.append(rng.choice(EVENTS))
        spec = "/".join((point, *quals))
        if point.startswith("reconstruct."):
            n = 1  # reached once per start at most
        elif quals:
            n = rng.choices((1, 2), (3, 1))[0]
        else:
            n = rng.choices((1, 2, 3, 4), (4, 3, 2, 1))[0]
        if n > 1:
            spec += f"@{n}"
        if point == "driver.during":
            spec += f"+{rng.choice((0, 0.05, 0.2, 0.4))}"
            if quals and quals[0] in RPC_OF_CALL and rng.random() < 0.6:
                rules.append(
                    {
                        "rpc": RPC_OF_CALL[quals[0]],
                        "action": "delay",
                        "seconds": DURING_HOLD_S,
                        "when": rng.choice(("before", "after")),
                        "times": 1,
                    }
                )
        self.hint = hint_of(quals[0] if quals else "")
        return spec, rules

    def new_pod(self) -> Pod:
        """Make a new pod desired (the caller sends it, or the next resync does).

        One or two random kinds; the armed point's kind (`hint`) among them.
        """
        self._pods += 1
        kinds = list(KIND_WEIGHTS)
        chosen = self.rng.choices(kinds, list(KIND_WEIGHTS.values()), k=self.rng.choice((1, 2)))
        if self.hint.kinds and not set(chosen) & self.hint.kinds:
            chosen[0] = self.rng.choice(sorted(self.hint.kinds))
        pod = self.node.new_pod(f"p{self._pods}", chosen)
        self.node.desired[pod.uid] = pod
        self.stats.pods_created += 1
        return pod

    def act(self) -> bool:
        """One random action against the running service; False if it died meanwhile.

        Deletes are likelier when the armed point is on the unmount path.
        """
        node, rng = self.node, self.rng
        roll = rng.random()
        delete_below = {"unmount": 0.7, "mount": 0.15}.get(self.hint.path, 0.4)
        if self.hint.kinds:
            candidates = sorted(
                uid for uid, pod in node.desired.items() if set(pod.kinds) & self.hint.kinds
            )
        else:
            candidates = sorted(node.desired)
        if candidates and (len(node.desired) >= MAX_PODS or roll < delete_below):
            self.stats.pods_deleted += 1
            return node.delete(rng.choice(candidates))
        if len(node.desired) >= MAX_PODS:
            self.stats.pods_deleted += 1
            return node.delete(rng.choice(sorted(node.desired)))
        if roll < 0.9:
            return node.apply(self.new_pod())
        time.sleep(rng.uniform(0.05, 0.3))
        return True

    def while_down(self) -> None:
        """Sometimes change the desired state while the service is down."""
        node, rng = self.node, self.rng
        if node.desired and rng.random() < 0.3:
            node.forget(rng.choice(sorted(node.desired)))
            self.stats.pods_deleted += 1
        if len(node.desired) < MAX_PODS and rng.random() < 0.3:
            self.new_pod()

    # ------------------------------------------------------------ episodes

    def _trace(self, began: float, what: str) -> None:
        if self.trace is not None:
            self.trace(f"[seed {self.seed} +{time.monotonic() - began:6.2f}s] {what}")

    def episode(self) -> bool:
        """Start armed, act until the crash; True if it crashed."""
        began = time.monotonic()
        crashed = self._episode()
        crash = self.node.starts[-1].crash
        self._trace(began, f"{self.stats.specs[-1]}: {crash.line if crash else 'not reached'}")
        return crashed

    def _episode(self) -> bool:
        node = self.node
        spec, rules = self.spec()
        self.stats.specs.append(spec)
        node.driver.set_faults(self.retry_rules + rules)
        self.retry_rules = []
        self.stats.starts += 1
        crashed = not node.start(spec) or not node.resync()
        for _ in range(MAX_ACTIONS):
            if crashed:
                break
            crashed = not self.act()
            if not crashed:
                crashed = node.wait_crash(self.rng.uniform(0.1, 0.6)) is not None
        if not crashed:
            crashed = node.wait_crash(1.0) is not None
        if not crashed:
            node.stop()
            self.stats.not_reached += 1
            return False
        crash = node.starts[-1].crash or node.wait_crash()  # resync/act saw it die: reap it
        if crash is None:
            raise CrashTestError(f"the service stopped answering but runs\n{node.diagnostics()}")
        self.stats.crashes += 1
        self.stats.by_point[point_of(crash.spec)] += 1
        if self.rng.random() < 0.5:
            self.retry_rules = retry_fails(crash)
        self.while_down()
        return True

    def check(self) -> None:
        """Start without a fault: converge, check everything, drain cleanly."""
        began = time.monotonic()
        self._check()
        self._trace(began, f"converged with {len(self.node.desired)} pods desired")

    def _check(self) -> None:
        node = self.node
        node.driver.clear_faults()
        self.stats.starts += 1
        self.stats.checks += 1
        if not node.start() or not node.resync():
            raise CrashTestError(f"the unarmed service died\n{node.diagnostics()}")
        node.converge()
        code = node.stop()
        if code != 0:
            raise CrashTestError(f"drain exited {code}\n{node.diagnostics()}")

    def run(self, crashes: int, *, check_every: tuple[int, int] = (2, 5)) -> ChaosStats:
        """Episodes until `crashes` crashes, with convergence checks in between and at the end."""
        began = time.monotonic()
        try:
            for _ in range(self.rng.choice((1, 2))):
                self.new_pod()
            next_check = self.rng.randint(*check_every)
            since = 0
            while self.stats.crashes < crashes:
                if self.stats.not_reached > 3 * crashes + 10:
                    raise CrashTestError("too many fault points were never reached")
                if self.episode():
                    since += 1
                if since >= next_check:
                    self.check()
                    since, next_check = 0, self.rng.randint(*check_every)
            self.check()
        except Exception as exc:
            history = "\n".join(f"  {s}" for s in self.stats.specs)
            raise CrashTestError(
                f"chaos seed {self.seed} failed after {self.stats.crashes} crashes "
                f"(rerun: VOLFSM_CRASH_SEED={self.seed}); specs so far:\n{history}\n{exc}"
            ) from exc
        finally:
            self.stats.duration_s = time.monotonic() - began
        return self.stats
