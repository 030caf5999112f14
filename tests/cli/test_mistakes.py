"""Command-line mistakes: one line on stderr, the documented exit code, nothing on stdout.

The exact lines are golden (tests/data/golden/cli_mistakes.txt; regenerate
with VOLFSM_UPDATE_GOLDEN=1 after an intended change and review the diff).
Each mistake runs through `python -m volfsm.cli` as a user runs it, so the
one-line errors are those of the real entry point, not of the test runner.
No service is needed: the ones that would talk to one stop before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay.golden import check_golden

REPO = Path(__file__).resolve().parents[2]
INCIDENT = REPO / "tests" / "data" / "incident.db"
NOWHERE = "nats://127.0.0.1:1"

MISTAKES: list[tuple[str, list[str], dict[str, str]]] = [
    ("unknown command", ["nope"], {}),
    ("unknown get kind", ["get", "nodes", "--nats", NOWHERE], {}),
    ("bad --nats", ["get", "pods", "--nats", "nats//127.0.0.1:4222"], {}),
    ("bad VOLFSM_NATS", ["get", "pods"], {"VOLFSM_NATS": "nats://127.0.0.1:99999"}),
    ("bad --nats for delete", ["delete", "pod", "a/b", "--nats", "http://h:1"], {}),
    ("bad --nats for wait", ["wait", "pod", "a/b", "--for", "mounted", "--nats", "h:1"], {}),
    ("bad --nats for events", ["events", "--nats", "nats://a b"], {}),
    ("bad --nats for analytics", ["analytics", "serve", "--nats", "nats//x", "--db", "d"], {}),
    ("wait without --for", ["wait", "pod", "shop/web-0", "--nats", NOWHERE], {}),
    ("pod with two slashes", ["delete", "pod", "a/b/c", "--nats", NOWHERE], {}),
    ("unknown pod in history", ["history", "--db", str(INCIDENT), "--pod", "shop/web-9"], {}),
    ("unknown pod by name", ["history", "--db", str(INCIDENT), "--pod", "web-0"], {}),
    ("unknown pod in timeline", ["timeline", "--db", str(INCIDENT), "--pod", "shop/x"], {}),
    ("unknown pod in explain", ["explain", "pod", "ci/builder-8", "--db", str(INCIDENT)], {}),
    ("unknown volume", ["history", "--db", str(INCIDENT), "--volume", "pvc-nope"], {}),
    ("unknown stream", ["history", "--db", str(INCIDENT), "--stream", "device/x"], {}),
    ("bad time", ["replay", "--db", str(INCIDENT), "--since", "yesterday"], {}),
    ("until before since", ["diff", "--db", str(INCIDENT), "--since", "-1m", "--until", "-2m"], {}),
    ("export format", ["export", "--db", str(INCIDENT), "-o", "csv", "--out-file", "x"], {}),
    ("html without a file", ["timeline", "--db", str(INCIDENT), "-o", "html"], {}),
    ("bad stats period", ["serve", "--volume-stats-agg-period", "1 min", "--data-dir", "d"], {}),
    ("bad cert command", ["serve", "--cert-command", "'sign", "--data-dir", "d"], {}),
    ("negative timeout", ["wait", "pod", "a/b", "--for", "mounted", "--timeout", "-1"], {}),
    ("user without password", ["get", "pods", "--nats", NOWHERE, "--nats-user", "u"], {}),
    ("missing TLS cert", ["stream", "check", "--nats", NOWHERE, "--nats-tls-cert", "nope"], {}),
    (
        "missing creds file in env",
        ["analytics", "partition", "--nats", NOWHERE, "--partitions", "2"],
        {"VOLFSM_NATS_CREDS": "nope.creds"},
    ),
]


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    return subprocess.run(
        [sys.executable, "-m", "volfsm.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**base, "PYTHONPATH": str(REPO), **env, "COLUMNS": "200"},
    )


def test_each_mistake_is_one_line_and_exit_2(tmp_path: Path) -> None:
    blocks = []
    for title, args, env in MISTAKES:
        done = run(args, env, tmp_path)
        assert done.returncode == 2, (title, done.stderr)
        assert done.stdout == "", title
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("volfsm: error: "), (title, done.stderr)
        shown = " ".join(args).replace(str(INCIDENT), "incident.db")
        where = " ".join(f"{k}={v}" for k, v in env.items())
        blocks.append(f"# {title}\n$ {where + ' ' if where else ''}volfsm {shown}\n{lines[0]}\n")
    check_golden("cli_mistakes.txt", "\n".join(blocks).replace(str(INCIDENT), "incident.db"))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            ["replay", "--from", "2024-05-01T03:11:00Z"],
            ["replay", "--since", "2024-05-01T03:11:00Z"],
        ),
        (
            ["diff", "--from", "2024-05-01T03:10:50Z", "--to", "2024-05-01T03:11:10Z"],
            ["diff", "--since", "2024-05-01T03:10:50Z", "--until", "2024-05-01T03:11:10Z"],
        ),
        (["diagram", "--markdown"], ["diagram", "-o", "markdown"]),
        (["export", "--format", "ndjson"], ["export", "-o", "ndjson"]),
    ],
)
def test_old_option_names_still_work(tmp_path: Path, old: list[str], new: list[str]) -> None:
    db = [] if old[0] == "diagram" else ["--db", str(INCIDENT)]
    before, after = run([*old, *db], {}, tmp_path), run([*new, *db], {}, tmp_path)
    assert before.returncode == after.returncode == 0, before.stderr
    assert before.stdout == after.stdout and before.stdout


def test_pod_by_name_and_by_uid_give_the_same_events(tmp_path: Path) -> None:
    uid = "8c2e5d71-1a4f-4c3b-b6e2-9d0f3a7c5e18"
    for command in (["history"], ["timeline", "-o", "json"], ["explain", "pod"]):
        flag = [] if command[0] == "explain" else ["--pod"]
        by_name = run([*command, *flag, "shop/web-0", "--db", str(INCIDENT)], {}, tmp_path)
        by_uid = run([*command, *flag, uid, "--db", str(INCIDENT)], {}, tmp_path)
        assert by_name.returncode == by_uid.returncode == 0, by_name.stderr
        assert by_name.stdout == by_uid.stdout and uid in by_name.stdout


def test_help_of_a_client_command_says_a_pod_is_name_or_uid(tmp_path: Path) -> None:
    for command in (["get"], ["delete", "pod"], ["wait", "pod"], ["history"], ["timeline"]):
        out = run([*command, "--help"], {}, tmp_path).stdout
        assert "uid" in out and "NAMESPACE/NAME" in out, command
