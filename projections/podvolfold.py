"""The pod-volume entries of the ASW, folded on their own (the child half of a split replay).

A pod-volume entry depends only on the events of its own stream and on
`PodCleanedUp` (which forgets Unmounted entries of a cleaned-up pod), so
those rows alone fold to exactly the `podvols` a full fold builds, in the
same order. `volfsm.engine.splitfold` runs this in a second process while
it folds everything else: `python -m projections.podvolfold LOG AFTER UNTIL`
writes that ASW's entries (and its `last_seq` and `last_ts`, those of the
last row it folded) to stdout as `projections.snapshot.encode_podvol_part`
chunks, which the parent decodes one at a time.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

from events.log import EventLog
from events.streams import PODVOL_PREFIX
from projections.asw import Asw
from projections.snapshot import encode_podvol_part

CLEANUP_TYPES = ("PodCleanedUp",)
"""Events outside the pod-volume streams that change pod-volume entries."""


def fold_podvols(log: EventLog, after: int, until: int) -> Asw:
    """An ASW holding the pod-volume entries (and last seq/ts of their rows) in (after, until]."""
    asw = Asw()
    with log.scan_fold(after, until, prefix=PODVOL_PREFIX, also_types=CLEANUP_TYPES) as rows:
        asw.fold_rows(rows)
    return asw


def main(argv: list[str]) -> int:
    """Child entry point: LOG AFTER UNTIL; the part on stdout, exit 0."""
    if len(argv) != 3:
        print("usage: python -m projections.podvolfold LOG AFTER UNTIL", file=sys.stderr)
        return 2
    gc.disable()
    with EventLog(Path(argv[0]), readonly=True) as log:
        data = encode_podvol_part(fold_podvols(log, int(argv[1]), int(argv[2])))
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
