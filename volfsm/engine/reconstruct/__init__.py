"""Reconstruction at start: the log's beliefs checked against the node, once, before reconciling.

`VolumeEngine.start()` folds the log into the ASW, DSW and index, then runs
`Reconstructor.run()` before the reconciler's first pass. The work is split
by step, each in its own module, all adding to one `plan.Plan` that is
recorded only once it is complete:

* `scan` - read mountinfo, walk the pod volume dirs and every plugin's
  global dirs;
* `specs` - recover specs through the plugins: each entry goes to the plugin
  owning its dir (`volfsm.plugins.base.SpecConstructor`, the kubelet's
  ConstructVolumeSpec); the engine reads no plugin's files;
* `interrupted` - 1. operations the process died in;
* `against_node` - 2. the log against the node: what the log says is
  staged or Mounted and the node lacks;
* `found` - 3. the node against the log: entries the log does not hold
  become Uncertain ("found on node, not in the log"), or orphans;
* `held` - 4. held entries without a spec get one from their volume id;
  5. held entries the log never recorded creating keep their files at
  teardown;
* `orphans` - what cannot be reconstructed, cleaned up once, directories
  only, when the desired state is complete and no desired pod wants it;
* `report` - what was found and done (`/readyz`, `volfsm get`, the log);
* `reconstructor` - `Reconstructor`, the orchestrator.

Every entry marked in steps 1-3 carries ``reconstructed=True``, as the
kubelet's IsVolumeReconstructed does for every volume after a restart: a
final error on the retry leaves it Uncertain rather than Unmounted, because
a NodePublish killed after it mounted is still mounted, and an Unmounted
entry is never unpublished when its pod goes.

Fault points (`volfsm.faultpoints`): ``reconstruct.start`` before anything
is marked, ``reconstruct.mid`` after the first mark is appended (reached
only when there is something to mark).

Difference from the kubelet (reference §4): the kubelet forgets
everything, rebuilds every volume from directory names as Uncertain and
loses Mounted vs Uncertain, the full spec, in-flight operations, backoffs
and history. volfsm keeps its log: entries the log knows and the node
confirms stay Mounted with their full spec; only what the log cannot vouch
for (interrupted operations, mounts that vanished, entries the log does
not know) becomes Uncertain, each with its reason. Like the kubelet, the
kubelet-style directory scan is what finds volumes the log lost; unlike
it, the plugins' global dirs (CSI staging dirs) are scanned too, and orphan
cleanup failures are recorded instead of logged forever ("orphaned pod ...
volume paths are still present", #60987).
"""

from __future__ import annotations

from volfsm.engine.reconstruct.found import REASON_FOUND
from volfsm.engine.reconstruct.interrupted import INTERRUPTED
from volfsm.engine.reconstruct.orphans import ORPHAN_CLEANUP, Orphan
from volfsm.engine.reconstruct.reconstructor import Reconstructor
from volfsm.engine.reconstruct.report import ReconstructionReport
from volfsm.engine.reconstruct.scan import NodeScan, entry_of, scan_node

__all__ = [
    "INTERRUPTED",
    "ORPHAN_CLEANUP",
    "REASON_FOUND",
    "NodeScan",
    "Orphan",
    "ReconstructionReport",
    "Reconstructor",
    "entry_of",
    "scan_node",
]
