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
import re
import shlex
import socket
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import msgspec
from cryptography import x509

from events.subjects import SubjectError, check_token
from volfsm import faultpoints
from volfsm.bus.urls import split_servers
from volfsm.desired.quantity import parse_quantity
from volfsm.desired.validate_kinds import pem_bundle_problem
from volfsm.paths import DEFAULT_DATA_DIR, LOG_FILENAME
from volfsm.service.datadir import (
    NATS_URL_FILENAME,
    NODE_FILENAME,
    ConfigError,
    saved_nats_url,
    saved_node,
)

__all__ = [
    "NATS_URL_FILENAME",
    "NODE_FILENAME",
    "ConfigError",
    "Layered",
    "ServeConfig",
    "Settings",
    "load_config",
    "resolve",
    "saved_nats_url",
    "saved_node",
    "settings_from",
]

ENV_PREFIX = "VOLFSM_"
CONFIG_ENV = "VOLFSM_CONFIG"
DEFAULT_MAX_COMMAND_BYTES = 4 << 20
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")

PANEL_NATS = "NATS"
PANEL_ENGINE = "Engine"


def option(
    help_text: str,
    *,
    panel: str | None = None,
    metavar: str | None = None,
    **constraints: Any,
) -> msgspec.Meta:
    """One option's declaration: its help (also its documentation), help panel and checks.

    `ServeConfig` is the only place a `volfsm serve` option is declared: the
    field gives its name (`--csi-timeout`, `VOLFSM_CSI_TIMEOUT`, TOML
    `csi_timeout`), type, default and checks, and this metadata its help;
    `volfsm.cli.serve` builds the command line from it.
    """
    extra = {k: v for k, v in (("panel", panel), ("metavar", metavar)) if v is not None}
    return msgspec.Meta(description=help_text, extra=extra, **constraints)


class ServeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every `volfsm serve` option, declared once; empty strings mean "not set"."""

    node: Annotated[str, option("Node name. Default: the data dir's, else the host name.")] = ""
    data_dir: Annotated[
        str, option("Data dir: the event log, embedded NATS store. Default /var/lib/volfsm.")
    ] = str(DEFAULT_DATA_DIR)
    root_dir: Annotated[
        str,
        option(
            "Kubelet-style root dir (pods/, plugins/), locked and marked as this node's. "
            "Default <data-dir>/root. Never a kubelet's."
        ),
    ] = ""
    nats: Annotated[
        str,
        option(
            "NATS URL(s), comma-separated. Default: start an embedded JetStream server on "
            "loopback.",
            panel=PANEL_NATS,
        ),
    ] = ""
    nats_user: Annotated[str, option("NATS user (with --nats-password).", panel=PANEL_NATS)] = ""
    nats_password: Annotated[str, option("NATS password.", panel=PANEL_NATS)] = ""
    nats_token: Annotated[str, option("NATS token.", panel=PANEL_NATS)] = ""
    nats_creds: Annotated[
        str, option("NATS .creds file (JWT + NKey seed).", panel=PANEL_NATS, metavar="FILE")
    ] = ""
    nats_tls_ca: Annotated[
        str, option("CA bundle for NATS TLS.", panel=PANEL_NATS, metavar="FILE")
    ] = ""
    nats_tls_cert: Annotated[
        str, option("Client certificate for NATS TLS.", panel=PANEL_NATS, metavar="FILE")
    ] = ""
    nats_tls_key: Annotated[
        str, option("Client key for NATS TLS.", panel=PANEL_NATS, metavar="FILE")
    ] = ""
    stream: Annotated[
        str, option("JetStream stream for the events. Default VOLFSM.", panel=PANEL_NATS)
    ] = "VOLFSM"
    stream_replicas: Annotated[
        int, option("Replicas of the stream. Default 1.", panel=PANEL_NATS, ge=1, le=5)
    ] = 1
    duplicate_window: Annotated[
        float, option("Stream duplicate window, seconds. Default 120.", panel=PANEL_NATS, gt=0)
    ] = 120.0
    stream_setup: Annotated[
        Literal["create", "check"],
        option(
            "create: create the stream if missing and update its settings (needs "
            "stream-management rights); check: the node role, only check it (`volfsm stream "
            "create` makes it). Default create; with --nats only.",
            panel=PANEL_NATS,
            metavar="create|check",
        ),
    ] = "create"
    max_command_bytes: Annotated[
        int,
        option("Largest command accepted, bytes. Default 4 MiB.", panel=PANEL_NATS, ge=1024),
    ] = DEFAULT_MAX_COMMAND_BYTES
    csi: Annotated[
        list[str],
        option("A CSI driver as NAME=unix:///PATH.sock (repeat for more).", panel=PANEL_ENGINE),
    ] = []
    csi_timeout: Annotated[
        float, option("Seconds each CSI call may take. Default 120.", panel=PANEL_ENGINE, gt=0)
    ] = 120.0
    backoff_initial: Annotated[
        float,
        option("Backoff after a first failure, seconds. Default 0.5.", panel=PANEL_ENGINE, gt=0),
    ] = 0.5
    backoff_max: Annotated[
        float, option("Backoff cap, seconds. Default 122.", panel=PANEL_ENGINE, gt=0)
    ] = 122.0
    reconcile_period: Annotated[
        float,
        option("Seconds between reconcile passes. Default 0.1.", panel=PANEL_ENGINE, gt=0),
    ] = 0.1
    drain_grace: Annotated[
        float,
        option(
            "On SIGTERM: seconds for running operations and the relay flush. Default 10.",
            panel=PANEL_ENGINE,
            ge=0,
        ),
    ] = 10.0
    desired_grace: Annotated[
        float,
        option(
            "Seconds after start before unmounts may start unless told earlier with "
            "`volfsm apply --complete`; only with an intact log (after a lost log only "
            "`apply --complete` lets them start). Default 30; 0: at once.",
            panel=PANEL_ENGINE,
            ge=0,
        ),
    ] = 30.0
    volume_stats_agg_period: Annotated[
        str,
        option(
            "How often each pod's PVC-backed volumes are measured for /metrics and `volfsm get`"
            " (kubelet's flag): a duration like 1m, 30s, 1m30s, or seconds; 0 turns it off."
            " Default 1m.",
            panel=PANEL_ENGINE,
            metavar="DURATION",
        ),
    ] = "1m"
    http: Annotated[str, option("HOST:PORT for /metrics, /healthz, /readyz. Default: off.")] = ""
    log_level: Annotated[str, option("TRACE..CRITICAL. Default INFO.")] = "INFO"
    restore_from_stream: Annotated[
        bool,
        option(
            "The log was lost or is an older backup: first copy this node's events it lacks "
            "back from the JetStream stream.",
            panel=PANEL_ENGINE,
        ),
    ] = False
    adopt_root_dir: Annotated[
        bool,
        option(
            "Claim a root dir that has no volfsm mark of this node (its pods unknown to the "
            "log): handled as after a lost log, nothing in it is unmounted or removed until "
            "`volfsm apply --complete`. Never for a root dir a kubelet uses.",
            panel=PANEL_ENGINE,
        ),
    ] = False
    token_command: Annotated[
        str,
        option(
            "Service-account tokens for projected volumes: run CMD with NAMESPACE "
            "SERVICE_ACCOUNT AUDIENCE EXPIRATION_SECONDS appended; its stdout is the token. "
            "Default: a node-local signer (well-formed JWTs no API server accepts).",
            panel=PANEL_ENGINE,
            metavar="CMD",
        ),
    ] = ""
    cert_command: Annotated[
        str,
        option(
            "Certificates for projected podCertificate sources: run CMD with the request in "
            "VOLFSM_* environment variables and the node-generated public key (PEM) on stdin; "
            "its stdout is the PEM certificate chain, leaf first. Default: a node-local CA "
            "(trusted by no one else).",
            panel=PANEL_ENGINE,
            metavar="CMD",
        ),
    ] = ""
    token_max_ttl: Annotated[
        int,
        option(
            "Testing: cap every service-account token's lifetime at N seconds (refreshed "
            "after 80 percent of it). Default 0: the requested expirationSeconds.",
            panel=PANEL_ENGINE,
            ge=0,
        ),
    ] = 0
    root_ca_file: Annotated[
        str,
        option(
            "PEM certificates (the cluster's CA bundle) for the kube-root-ca.crt ConfigMap "
            "volfsm publishes in a namespace whose pods need one and that has none applied. "
            "Default: the node-local CA's certificate (trusted by no one else).",
            panel=PANEL_ENGINE,
            metavar="PEM",
        ),
    ] = ""
    node_labels: Annotated[
        str,
        option(
            "This node's labels besides kubernetes.io/hostname (the node name), as "
            "zone=a,disk=ssd: a local PersistentVolume's nodeAffinity must match them.",
            panel=PANEL_ENGINE,
            metavar="KEY=VALUE,...",
        ),
    ] = ""
    csi_republish_period: Annotated[
        int,
        option(
            "Seconds between NodePublish calls again for the mounted volumes of CSI drivers "
            "whose CSIDriver object sets requiresRepublish (the kubelet republishes at each "
            "pod sync, about every minute).",
            panel=PANEL_ENGINE,
            ge=1,
        ),
    ] = 60
    node_allocatable: Annotated[
        str,
        option(
            "What downwardAPI resourceFieldRef gives for an unset limit, as "
            "cpu=4,memory=8Gi,ephemeral-storage=100Gi. Default: every CPU, MemTotal and the "
            "root dir's filesystem size.",
            panel=PANEL_ENGINE,
            metavar="NAME=QTY,...",
        ),
    ] = ""
    fault_point: Annotated[
        str,
        option(
            "Crash testing: SIGKILL this process at a fault point, e.g. driver.after/set_up, "
            "append.after/OperationSucceeded@2, driver.during+0.5 (see the README). "
            "Default: off.",
            panel=PANEL_ENGINE,
        ),
    ] = ""


FIELDS: dict[str, Any] = {f.name: f.type for f in msgspec.structs.fields(ServeConfig)}
"""Each option's type, with its `option` metadata (checks, help)."""
LIST_FIELDS = frozenset(name for name, tp in FIELDS.items() if get_args(tp)[0] == list[str])


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
    volume_stats_period: float = 60.0
    """Seconds between volume stats gatherings of a pod (0: none)."""
    token_command: str = ""
    """The token command ("": the node-local signer)."""
    cert_command: str = ""
    """The podCertificate command ("": the node-local CA)."""
    token_max_ttl: int = 0
    """Cap on token lifetimes in seconds (0: none; for tests)."""
    root_ca_file: str = ""
    """--root-ca-file ("": the node-local CA's certificate)."""
    root_ca_pem: str = ""
    """The text of --root-ca-file, checked to be PEM certificates ("" without it)."""
    csi_republish_period: int = 60
    """Seconds between republishes of requiresRepublish CSI volumes."""
    node_labels: dict[str, str] = field(default_factory=dict)
    """This node's labels (kubernetes.io/hostname is added: the node name)."""
    node_allocatable: dict[str, str] = field(default_factory=dict)
    """Resource name -> quantity overriding the node's own (downwardAPI defaults)."""

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


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds of a Go-style duration ('1m', '1m30s', '500ms', '-1s') or a plain number.

    ValueError for anything else.
    """
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    try:
        return sign * float(body)
    except ValueError:
        pass
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"not a duration: {text!r} (e.g. 1m, 30s, 1m30s, 500ms)")
    return sign * sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def _duration(layered: Layered, key: str) -> float:
    try:
        return parse_duration(getattr(layered.config, key))
    except ValueError as exc:
        raise ConfigError(f"{layered.where(key)}: {exc}") from None


def _command(layered: Layered, key: str) -> str:
    """A command option as given, once it splits like a shell line ("" stays "")."""
    text: str = getattr(layered.config, key)
    try:
        if text and not shlex.split(text):
            raise ValueError("no command in it")
    except ValueError as exc:
        raise ConfigError(f"{layered.where(key)}: not a command line ({exc}): {text!r}") from None
    return text


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
        volume_stats_period=_duration(layered, "volume_stats_agg_period"),
        token_command=_command(layered, "token_command"),
        cert_command=_command(layered, "cert_command"),
        token_max_ttl=cfg.token_max_ttl,
        root_ca_file=cfg.root_ca_file,
        root_ca_pem=_root_ca(layered),
        csi_republish_period=cfg.csi_republish_period,
        node_labels=_labels(layered),
        node_allocatable=_allocatable(layered),
    )


def _root_ca(layered: Layered) -> str:
    """The text of --root-ca-file ("" without it); ConfigError naming the option unless it
    holds PEM certificates and nothing but certificates in PEM blocks."""
    path = layered.config.root_ca_file
    if not path:
        return ""
    where = layered.where("root_ca_file")
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read {path!r}: {exc}") from None
    problem = _pem_certificates_problem(text)
    if problem:
        raise ConfigError(f"{where}: {path!r} {problem}")
    return text


def _pem_certificates_problem(text: str) -> str | None:
    """Why `text` is not PEM CERTIFICATE blocks that parse (as X.509), or None."""
    problem = pem_bundle_problem(text)
    if problem is not None:
        return problem
    try:
        x509.load_pem_x509_certificates(text.encode())
    except ValueError as exc:
        return f"holds a certificate that does not parse: {exc}"
    return None


def _allocatable(layered: Layered) -> dict[str, str]:
    """--node-allocatable as resource -> quantity; ConfigError naming a bad entry."""
    text = layered.config.node_allocatable
    found: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        name, sep, value = entry.partition("=")
        try:
            if not sep or not name:
                raise ValueError("expected NAME=QUANTITY")
            parse_quantity(value)
        except ValueError as exc:
            raise ConfigError(f"{layered.where('node_allocatable')}: {entry!r}: {exc}") from None
        found[name.strip()] = value.strip()
    return found


def _labels(layered: Layered) -> dict[str, str]:
    """--node-labels as key -> value; ConfigError naming a bad entry."""
    found: dict[str, str] = {}
    for entry in (e.strip() for e in layered.config.node_labels.split(",") if e.strip()):
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{layered.where('node_labels')}: {entry!r}: expected KEY=VALUE")
        found[key.strip()] = value.strip()
    return found


def settings_from(
    cli: Mapping[str, Any],
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """`load_config` then `resolve`."""
    return resolve(load_config(cli, config_file=config_file, environ=environ))
