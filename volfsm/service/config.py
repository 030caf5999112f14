"""`volfsm serve` settings: defaults < TOML file < `VOLFSM_*` env < command line.

`ServeConfig` is the raw, typed option set (one field per option, checked
with msgspec as each layer is read, so an error names the option and where
its value came from). `load_config` layers the sources; `resolve` turns the
result into `Settings`: paths, the node name, parsed CSI endpoints, the HTTP
address and the NATS connect options, with the checks that span options.

Every option `--csi-timeout` is also env `VOLFSM_CSI_TIMEOUT` and the TOML
key `csi_timeout` (or `csi-timeout`). List options (`--csi`) take a TOML
array or a comma-separated env value.
"""

from __future__ import annotations

import os
import socket
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from events.subjects import SubjectError, check_token
from volfsm import faultpoints
from volfsm.bus.connect import split_servers
from volfsm.errors import VolfsmError
from volfsm.paths import DEFAULT_DATA_DIR, LOG_FILENAME

ENV_PREFIX = "VOLFSM_"
CONFIG_ENV = "VOLFSM_CONFIG"
NODE_FILENAME = "node"
"""File in the data dir holding the node name the service runs as (read by the CLI)."""
NATS_URL_FILENAME = "nats.url"
"""File in the data dir holding the NATS URL the service uses (read by the CLI)."""
DEFAULT_MAX_COMMAND_BYTES = 4 << 20
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")

Positive = Annotated[float, msgspec.Meta(gt=0)]


class ConfigError(VolfsmError):
    """A setting is missing, malformed or inconsistent; the message names the option."""


class ServeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every `volfsm serve` option; empty strings mean "not set" (defaults apply)."""

    node: str = ""
    """Node name (a NATS subject token). Default: the host name."""
    data_dir: str = str(DEFAULT_DATA_DIR)
    """Directory of the event log, the embedded NATS store, nats.url and node files."""
    root_dir: str = ""
    """Kubelet-style root dir (pods/, plugins/). Default: <data-dir>/root."""
    nats: str = ""
    """NATS server URL(s), comma-separated. Default: an embedded JetStream server."""
    nats_user: str = ""
    nats_password: str = ""
    nats_token: str = ""
    nats_creds: str = ""
    """A NATS .creds file (JWT + NKey seed)."""
    nats_tls_ca: str = ""
    nats_tls_cert: str = ""
    nats_tls_key: str = ""
    csi: list[str] = []
    """CSI drivers as NAME=unix:///PATH.sock."""
    http: str = ""
    """HOST:PORT for /metrics, /healthz and /readyz. Default: no HTTP server."""
    csi_timeout: Positive = 120.0
    """Seconds each plugin call (CSI RPC) may take."""
    backoff_initial: Positive = 0.5
    backoff_max: Positive = 122.0
    reconcile_period: Positive = 0.1
    stream: str = "VOLFSM"
    """JetStream stream that receives the events."""
    stream_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    duplicate_window: Positive = 120.0
    """The stream's duplicate window in seconds."""
    stream_setup: Literal["create", "check"] = "create"
    """create: create the stream if missing and update its settings (needs stream-management
    rights, as with the embedded server); check: the `node` role, only check it and change
    nothing (`volfsm stream create` with the admin credential makes it)."""
    drain_grace: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    """Seconds running operations may take to finish on SIGTERM, and the relay to flush."""
    desired_grace: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    """Seconds after start before unmounts may start if nobody ran `apply --complete`.

    The kubelet unmounts nothing until its pod sources are synced (a few
    seconds after start); volfsm's pods come from whoever drives it, which
    must reconnect to NATS and re-send them. 30 s covers that on a loaded
    node. Only with an intact log: after a lost log, an adopted root dir, or
    when reconstruction finds volumes the log does not know, only `apply
    --complete` opens the gate. 0: at once.
    """
    max_command_bytes: Annotated[int, msgspec.Meta(ge=1024)] = DEFAULT_MAX_COMMAND_BYTES
    """Largest command payload accepted; bigger ones get a PayloadTooLarge reply."""
    log_level: str = "INFO"
    fault_point: str = ""
    """Crash testing: SIGKILL this process at POINT[/QUALIFIER...][@N][+SECONDS] (off)."""
    restore_from_stream: bool = False
    """Put back the events the log lacks from the JetStream stream before starting."""
    adopt_root_dir: bool = False
    """Claim a root dir volfsm cannot prove is its own (no mark, another node's mark).

    Without it such a root dir is refused (`volfsm.node.rootdir`). With it the root
    dir is marked as this node's and handled as after a lost log: nothing
    found in it is unmounted or removed until `volfsm apply --complete`.
    """


FIELDS: dict[str, Any] = {f.name: f.type for f in msgspec.structs.fields(ServeConfig)}
LIST_FIELDS = frozenset(name for name, tp in FIELDS.items() if tp == list[str])


def option_name(key: str) -> str:
    """'csi_timeout' -> '--csi-timeout'."""
    return "--" + key.replace("_", "-")


def env_name(key: str) -> str:
    """'csi_timeout' -> 'VOLFSM_CSI_TIMEOUT'."""
    return ENV_PREFIX + key.upper()


@dataclass
class Layered:
    """A config and, per option that was set, where its value came from."""

    config: ServeConfig
    origins: dict[str, str] = field(default_factory=dict)

    def where(self, key: str) -> str:
        """'--csi-timeout (from env VOLFSM_CSI_TIMEOUT)' or '--csi-timeout (default)'."""
        return f"{option_name(key)} (from {self.origins.get(key, 'the default')})"


def _convert(key: str, value: Any, origin: str) -> Any:
    """`value` as the type of option `key`, or ConfigError naming it and its origin."""
    if key in LIST_FIELDS and isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    try:
        return msgspec.convert(value, FIELDS[key], strict=False)
    except msgspec.ValidationError as exc:
        text = str(exc).removesuffix(" - at `$`").replace("`", "").split(", got ")[0]
        text = text[:1].lower() + text[1:]
        raise ConfigError(f"{option_name(key)} (from {origin}): {text}, got {value!r}") from None


def file_values(path: Path) -> dict[str, Any]:
    """Options from a TOML file (keys with '_' or '-'); ConfigError for unknown keys."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if key not in FIELDS:
            known = ", ".join(sorted(FIELDS))
            raise ConfigError(f"--config {path}: unknown option {raw_key!r} (known: {known})")
        values[key] = _convert(key, value, f"{path} key {raw_key}")
    return values


def env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """Options from `VOLFSM_<NAME>` variables (empty ones are ignored)."""
    values: dict[str, Any] = {}
    for key in FIELDS:
        raw = environ.get(env_name(key))
        if raw is None or raw == "":
            continue
        values[key] = _convert(key, raw, f"env {env_name(key)}")
    return values


def load_config(
    cli: Mapping[str, Any],
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Layered:
    """Layer defaults < `config_file` (or `$VOLFSM_CONFIG`) < env < `cli` (None = not given)."""
    env = os.environ if environ is None else environ
    if config_file is None and env.get(CONFIG_ENV):
        config_file = Path(env[CONFIG_ENV])
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if config_file is not None:
        for key, value in file_values(config_file).items():
            merged[key], origins[key] = value, f"{config_file}"
    for key, value in env_values(env).items():
        merged[key], origins[key] = value, f"env {env_name(key)}"
    for key, value in cli.items():
        if key not in FIELDS:
            raise ConfigError(f"unknown option {key!r}")
        if value is None or (key in LIST_FIELDS and not value):
            continue
        merged[key], origins[key] = _convert(key, value, "the command line"), "the command line"
    return Layered(ServeConfig(**merged), origins)


# ---------------------------------------------------------------- resolved


@dataclass(frozen=True)
class CsiDriver:
    """One CSI driver the service talks to."""

    name: str
    endpoint: str


@dataclass(frozen=True)
class HttpAddress:
    """Where the HTTP server listens."""

    host: str
    port: int


@dataclass(frozen=True)
class Settings:
    """Resolved, checked settings of one `volfsm serve`."""

    node: str
    data_dir: Path
    root_dir: Path
    nats_url: str | None
    """None: start an embedded JetStream server."""
    nats_options: dict[str, Any]
    """Keyword arguments for `nats.connect` (credentials, TLS)."""
    csi: tuple[CsiDriver, ...]
    http: HttpAddress | None
    csi_timeout: float
    backoff_initial: float
    backoff_max: float
    reconcile_period: float
    stream: str
    stream_replicas: int
    duplicate_window: float
    drain_grace: float
    desired_grace: float
    max_command_bytes: int
    log_level: str
    fault_point: str = ""
    """The armed fault point spec (`volfsm.faultpoints`), "" when off."""
    restore_from_stream: bool = False
    """Copy this node's events the log lacks back from the stream (`volfsm.service.restore`)."""
    adopt_root_dir: bool = False
    """Claim a root dir without this node's mark (`volfsm.node.rootdir`): as after a lost log."""
    stream_setup: str = "create"
    """"create" the stream / update its settings, or only "check" it (the `node` role)."""

    @property
    def log_path(self) -> Path:
        """The event log file."""
        return self.data_dir / LOG_FILENAME


def parse_csi(text: str, where: str) -> CsiDriver:
    """'NAME=unix:///PATH.sock' as a CsiDriver; ConfigError naming `where` otherwise."""
    name, sep, endpoint = text.partition("=")
    name, endpoint = name.strip(), endpoint.strip()
    if not sep or not name or not endpoint:
        raise ConfigError(f"{where}: expected NAME=unix:///PATH.sock, got {text!r}")
    if not endpoint.startswith("unix://") or len(endpoint) <= len("unix://"):
        raise ConfigError(
            f"{where}: driver {name}: endpoint must be unix:///PATH, got {endpoint!r}"
        )
    path = endpoint.removeprefix("unix://")
    if not path.startswith("/"):
        raise ConfigError(f"{where}: driver {name}: socket path must be absolute, got {path!r}")
    if len(path.encode()) > 107:
        raise ConfigError(f"{where}: driver {name}: socket path longer than 107 bytes")
    return CsiDriver(name, endpoint)


def parse_http(text: str, where: str) -> HttpAddress:
    """'HOST:PORT' (or '[v6]:PORT', ':PORT' for all interfaces) as an HttpAddress."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(f"{where}: expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(f"{where}: port {port} is out of range")
    host = host.removeprefix("[").removesuffix("]") or "0.0.0.0"
    return HttpAddress(host, port)


def _check_file(layered: Layered, key: str) -> str:
    value: str = getattr(layered.config, key)
    if value and not Path(value).is_file():
        raise ConfigError(f"{layered.where(key)}: {value}: no such file")
    return value


def nats_options(layered: Layered) -> dict[str, Any]:
    """`nats.connect` keyword arguments for the credentials and TLS settings."""
    cfg = layered.config
    opts: dict[str, Any] = {}
    if bool(cfg.nats_user) != bool(cfg.nats_password):
        given_key, missing = (
            ("nats_user", "nats_password") if cfg.nats_user else ("nats_password", "nats_user")
        )
        raise ConfigError(f"{option_name(missing)} is required with {layered.where(given_key)}")
    given = [k for k in ("nats_user", "nats_token", "nats_creds") if getattr(cfg, k)]
    if len(given) > 1:
        raise ConfigError(
            "give one NATS authentication: " + " or ".join(layered.where(k) for k in given)
        )
    if cfg.nats_user:
        opts["user"], opts["password"] = cfg.nats_user, cfg.nats_password
    if cfg.nats_token:
        opts["token"] = cfg.nats_token
    if _check_file(layered, "nats_creds"):
        opts["user_credentials"] = cfg.nats_creds
    ca = _check_file(layered, "nats_tls_ca")
    cert = _check_file(layered, "nats_tls_cert")
    key = _check_file(layered, "nats_tls_key")
    if bool(cert) != bool(key):
        raise ConfigError(
            f"{option_name('nats_tls_cert')} and {option_name('nats_tls_key')} go together"
        )
    if ca or cert:
        opts["tls"] = tls_context(ca, cert, key)
    return opts


def tls_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """A client TLS context trusting `ca` (or the system CAs) with an optional client cert."""
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
        if cert:
            ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"NATS TLS files cannot be loaded: {exc}") from None
    return ctx


def saved_node(data_dir: Path) -> str:
    """The node name a service last ran as with this data dir ('' if none)."""
    try:
        return (data_dir / NODE_FILENAME).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def saved_nats_url(data_dir: Path) -> str:
    """The NATS URL a service with this data dir uses ('' if none)."""
    try:
        return (data_dir / NATS_URL_FILENAME).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def resolve(layered: Layered) -> Settings:
    """Check the options together and resolve defaults; ConfigError names the option.

    The node defaults to the name saved in the data dir by an earlier run,
    then to the host name.
    """
    cfg = layered.config
    data_dir = Path(cfg.data_dir).absolute()
    node = cfg.node or saved_node(data_dir) or socket.gethostname().split(".")[0]
    try:
        check_token(node, "node")
        check_token(cfg.stream, "stream name")
    except SubjectError as exc:
        key = "stream" if "stream" in str(exc) else "node"
        raise ConfigError(f"{layered.where(key)}: {exc}") from None
    if cfg.backoff_max < cfg.backoff_initial:
        raise ConfigError(
            f"{layered.where('backoff_max')} = {cfg.backoff_max:g} is less than "
            f"{layered.where('backoff_initial')} = {cfg.backoff_initial:g}"
        )
    level = cfg.log_level.upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"{layered.where('log_level')}: one of {', '.join(LOG_LEVELS)}")
    drivers: dict[str, CsiDriver] = {}
    for text in cfg.csi:
        drv = parse_csi(text, layered.where("csi"))
        if drv.name in drivers:
            raise ConfigError(f"{layered.where('csi')}: driver {drv.name} given twice")
        drivers[drv.name] = drv
    nats_url = cfg.nats.strip() or None
    if nats_url is not None:
        try:
            split_servers(nats_url)
        except ValueError as exc:
            raise ConfigError(f"{layered.where('nats')}: {exc}") from None
    fault_point = cfg.fault_point.strip()
    if fault_point:
        try:
            faultpoints.parse(fault_point)
        except faultpoints.FaultSpecError as exc:
            raise ConfigError(f"{layered.where('fault_point')}: {exc}") from None
    opts = nats_options(layered)
    if nats_url is None and opts:
        raise ConfigError(
            "NATS credentials or TLS options need --nats URL (the embedded server has no auth)"
        )
    if nats_url is None and cfg.stream_setup == "check":
        raise ConfigError(
            f"{layered.where('stream_setup')} needs --nats URL (with the embedded server the "
            "service creates its stream)"
        )
    return Settings(
        node=node,
        data_dir=data_dir,
        root_dir=Path(cfg.root_dir).absolute() if cfg.root_dir else data_dir / "root",
        nats_url=nats_url,
        nats_options=opts,
        csi=tuple(drivers.values()),
        http=parse_http(cfg.http, layered.where("http")) if cfg.http else None,
        csi_timeout=cfg.csi_timeout,
        backoff_initial=cfg.backoff_initial,
        backoff_max=cfg.backoff_max,
        reconcile_period=cfg.reconcile_period,
        stream=cfg.stream,
        stream_replicas=cfg.stream_replicas,
        duplicate_window=cfg.duplicate_window,
        drain_grace=cfg.drain_grace,
        desired_grace=cfg.desired_grace,
        max_command_bytes=cfg.max_command_bytes,
        log_level=level,
        fault_point=fault_point,
        restore_from_stream=cfg.restore_from_stream,
        adopt_root_dir=cfg.adopt_root_dir,
        stream_setup=cfg.stream_setup,
    )


def settings_from(
    cli: Mapping[str, Any],
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """`load_config` then `resolve`."""
    return resolve(load_config(cli, config_file=config_file, environ=environ))
