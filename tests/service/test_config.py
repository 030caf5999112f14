"""`volfsm serve` settings: layering, validation errors that name the option and its source."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from volfsm.service.config import (
    DEFAULT_MAX_COMMAND_BYTES,
    ConfigError,
    CsiDriver,
    HttpAddress,
    load_config,
    settings_from,
)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    s = settings_from({"data_dir": str(tmp_path), "node": "n1"}, environ={})
    assert s.node == "n1"
    assert s.data_dir == tmp_path
    assert s.root_dir == tmp_path / "root"
    assert s.nats_url is None and s.nats_options == {}
    assert s.csi == () and s.http is None
    assert (s.csi_timeout, s.backoff_initial, s.backoff_max) == (120.0, 0.5, 122.0)
    assert (s.reconcile_period, s.stream, s.stream_replicas) == (0.1, "VOLFSM", 1)
    assert s.max_command_bytes == DEFAULT_MAX_COMMAND_BYTES
    assert s.log_path == tmp_path / "volfsm.db"


def test_command_line_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    conf = write(
        tmp_path / "volfsm.toml",
        'csi_timeout = 7\nbackoff-max = 9.5\nstream = "FROMFILE"\nnode = "file-node"\n'
        'csi = ["a=unix:///run/a.sock"]\n',
    )
    env = {"VOLFSM_CSI_TIMEOUT": "8", "VOLFSM_STREAM": "FROMENV", "VOLFSM_CONFIG": str(conf)}
    layered = load_config({"stream": "FROMCLI", "node": None}, environ=env)
    cfg = layered.config
    assert cfg.stream == "FROMCLI"  # all three set it
    assert cfg.csi_timeout == 8.0  # env over file
    assert cfg.backoff_max == 9.5  # file only, dashed key
    assert cfg.backoff_initial == 0.5  # default
    assert cfg.node == "file-node"  # None on the command line = not given
    assert layered.origins["stream"] == "the command line"
    assert layered.origins["csi_timeout"] == "env VOLFSM_CSI_TIMEOUT"
    assert layered.origins["backoff_max"] == str(conf)
    s = settings_from({}, config_file=conf, environ={})
    assert s.csi == (CsiDriver("a", "unix:///run/a.sock"),)


def test_env_lists_are_comma_separated(tmp_path: Path) -> None:
    env = {"VOLFSM_CSI": "a=unix:///a.sock, b=unix:///b.sock", "VOLFSM_NODE": "n"}
    s = settings_from({"data_dir": str(tmp_path)}, environ=env)
    assert [d.name for d in s.csi] == ["a", "b"]


@pytest.mark.parametrize(
    ("cli", "env", "message"),
    [
        ({}, {"VOLFSM_CSI_TIMEOUT": "soon"}, "--csi-timeout (from env VOLFSM_CSI_TIMEOUT)"),
        ({"csi_timeout": -1}, {}, "--csi-timeout (from the command line): expected float > 0"),
        (
            {"stream_replicas": 9},
            {},
            "--stream-replicas (from the command line): expected int <= 5",
        ),
        ({"max_command_bytes": 10}, {}, "--max-command-bytes"),
        ({"csi": ["nodriver"]}, {}, "--csi (from the command line): expected NAME=unix:///"),
        ({"csi": ["a=tcp://x:1"]}, {}, "endpoint must be unix:///PATH"),
        ({"csi": ["a=unix://rel.sock"]}, {}, "socket path must be absolute"),
        ({"csi": ["a=unix:///x", "a=unix:///y"]}, {}, "driver a given twice"),
        ({"http": "localhost"}, {}, "--http (from the command line): expected HOST:PORT"),
        ({"http": ":99999"}, {}, "port 99999 is out of range"),
        ({"node": "a.b"}, {}, "--node (from the command line): node 'a.b' is not a valid"),
        ({"stream": "A B"}, {}, "--stream (from the command line)"),
        ({"backoff_max": 0.1}, {}, "--backoff-max (from the command line) = 0.1 is less than"),
        ({"log_level": "LOUD"}, {}, "--log-level"),
        ({"nats": "nats://x:4222", "nats_user": "u"}, {}, "--nats-password is required"),
        (
            {"nats": "nats://x", "nats_user": "u", "nats_password": "p", "nats_token": "t"},
            {},
            "give one NATS authentication",
        ),
        ({"nats": "nats://x", "nats_creds": "/no/such.creds"}, {}, "/no/such.creds: no such file"),
        ({"nats_token": "t"}, {}, "need --nats URL"),
        ({"nats": "nats://x", "nats_tls_cert": __file__}, {}, "go together"),
        (
            {},
            {"VOLFSM_FAULT_POINT": "driver.afterwards"},
            "--fault-point (from env VOLFSM_FAULT_POINT): unknown fault point 'driver.afterwards'",
        ),
        ({"fault_point": "append.after@0"}, {}, "--fault-point (from the command line): fault"),
        (
            {},
            {"VOLFSM_RESTORE_FROM_STREAM": "maybe"},
            "--restore-from-stream (from env VOLFSM_RESTORE_FROM_STREAM): expected bool",
        ),
    ],
)
def test_errors_name_the_option_and_where_it_came_from(
    tmp_path: Path, cli: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        settings_from({"data_dir": str(tmp_path), **cli}, environ=env)
    assert message in str(err.value)


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        settings_from({}, config_file=tmp_path / "missing.toml", environ={})
    bad = write(tmp_path / "bad.toml", "csi_timeout = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        settings_from({}, config_file=bad, environ={})
    unknown = write(tmp_path / "unknown.toml", "csi_timout = 3\n")
    with pytest.raises(ConfigError, match=r"unknown option 'csi_timout' \(known: "):
        settings_from({}, config_file=unknown, environ={})
    typed = write(tmp_path / "typed.toml", 'stream_replicas = "many"\n')
    with pytest.raises(ConfigError, match=r"--stream-replicas \(from .*typed.toml key"):
        settings_from({}, config_file=typed, environ={})


def test_node_defaults_to_the_data_dirs_then_the_host(tmp_path: Path) -> None:
    (tmp_path / "node").write_text("saved-node\n")
    assert settings_from({"data_dir": str(tmp_path)}, environ={}).node == "saved-node"
    other = tmp_path / "other"
    assert settings_from({"data_dir": str(other)}, environ={}).node  # the host name


def test_http_and_nats_options(tmp_path: Path) -> None:
    s = settings_from(
        {
            "data_dir": str(tmp_path),
            "node": "n",
            "http": "127.0.0.1:9780",
            "nats": "nats://h:4222",
            "nats_user": "u",
            "nats_password": "p",
        },
        environ={},
    )
    assert s.http == HttpAddress("127.0.0.1", 9780)
    assert s.nats_options == {"user": "u", "password": "p"}
    assert settings_from({"http": ":9780", "node": "n"}, environ={}).http == HttpAddress(
        "0.0.0.0", 9780
    )


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key (openssl)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_tls_files_make_a_context_and_bad_ones_are_named(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    base = {"node": "n", "nats": "tls://h:4222", "data_dir": str(tmp_path)}
    s = settings_from(
        {**base, "nats_tls_ca": str(cert), "nats_tls_cert": str(cert), "nats_tls_key": str(key)},
        environ={},
    )
    assert isinstance(s.nats_options["tls"], ssl.SSLContext)
    garbage = write(tmp_path / "garbage.pem", "not a certificate")
    with pytest.raises(ConfigError, match="NATS TLS files cannot be loaded"):
        settings_from({**base, "nats_tls_ca": str(garbage)}, environ={})


def test_a_fault_point_is_off_by_default_and_taken_from_the_option_or_env(tmp_path: Path) -> None:
    base = {"node": "n", "data_dir": str(tmp_path)}
    assert settings_from(base, environ={}).fault_point == ""
    env = {"VOLFSM_FAULT_POINT": "driver.before/set_up@2"}
    assert settings_from(base, environ=env).fault_point == "driver.before/set_up@2"
    cli = {**base, "fault_point": " reconstruct.mid "}
    assert settings_from(cli, environ=env).fault_point == "reconstruct.mid"


def test_serve_refuses_a_bad_fault_point_with_one_line_and_nothing_started(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    done = subprocess.run(
        [sys.executable, "-m", "volfsm.cli", "serve", "--data-dir", str(tmp_path),
         "--fault-point", "driver.during+soon"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "volfsm: error: --fault-point (from the command line): delay 'soon' in"
        " 'driver.during+soon' is not a number\n"
    )
    assert not (tmp_path / "volfsm.db").exists()


def test_restore_from_stream_is_off_unless_asked(tmp_path: Path) -> None:
    base = {"node": "n", "data_dir": str(tmp_path)}
    assert settings_from(base, environ={}).restore_from_stream is False
    env = {"VOLFSM_RESTORE_FROM_STREAM": "1"}
    assert settings_from(base, environ=env).restore_from_stream is True
    assert settings_from({**base, "restore_from_stream": True}, environ={}).restore_from_stream


def test_adopt_root_dir_is_off_unless_asked(tmp_path: Path) -> None:
    base = {"node": "n", "data_dir": str(tmp_path)}
    assert settings_from(base, environ={}).adopt_root_dir is False
    env = {"VOLFSM_ADOPT_ROOT_DIR": "true"}
    assert settings_from(base, environ=env).adopt_root_dir is True
    toml = tmp_path / "serve.toml"
    toml.write_text("adopt_root_dir = true\n")
    assert settings_from(base, config_file=toml, environ={}).adopt_root_dir is True
    assert settings_from({**base, "adopt_root_dir": True}, environ={}).adopt_root_dir is True


def test_every_option_is_declared_once_and_reaches_the_command_line() -> None:
    """Each `ServeConfig` field is a `volfsm serve` option with its declared help."""
    import typer.main

    from volfsm.cli import app
    from volfsm.service.config import FIELDS, option_name

    root = typer.main.get_command(app)
    command = root.get_command(typer._click.Context(root), "serve")  # type: ignore[attr-defined]
    assert command is not None
    options = {opt: param for param in command.params for opt in param.opts}
    for key, declared in FIELDS.items():
        meta = declared.__metadata__[0]
        assert meta.description, f"{key} has no help"
        param = options[option_name(key)]
        assert param.help == meta.description
        assert param.default is None  # unset on the command line: env, file, default apply


def test_volume_stats_agg_period_takes_durations_as_the_kubelet_flag_does(tmp_path: Path) -> None:
    base = {"data_dir": str(tmp_path), "node": "n1"}
    assert settings_from(base, environ={}).volume_stats_period == 60.0  # kubelet's 1m
    for text, seconds in (("1m30s", 90.0), ("500ms", 0.5), ("2", 2.0), ("0", 0.0), ("-1s", -1.0)):
        cli = {**base, "volume_stats_agg_period": text}
        assert settings_from(cli, environ={}).volume_stats_period == seconds
    env = {"VOLFSM_VOLUME_STATS_AGG_PERIOD": "2m"}
    assert settings_from(base, environ=env).volume_stats_period == 120.0
    with pytest.raises(ConfigError, match=r"--volume-stats-agg-period \(from env .*not a duration"):
        settings_from(base, environ={"VOLFSM_VOLUME_STATS_AGG_PERIOD": "1 min"})
