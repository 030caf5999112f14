"""The NATS credential options of every command that connects, declared once.

`volfsm` service commands, `volfsm stream` and `volfsm analytics` all take the
same seven options (user, password, token, .creds, TLS CA/cert/key). They are
declared here, outside `volfsm.cli`, because `volfsm.analytics` never imports
the main CLI. `with_credentials` adds them to a Typer command and hands the
command one `NatsCredentials`; `NatsCredentials.connect_options` turns them
into `nats.connect` keyword arguments or a `ConfigError` naming what is wrong.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Annotated, Any

import typer

PANEL = "NATS credentials"


def _option(name: str, env: str, help_text: str) -> Any:
    return typer.Option(name, envvar=env, help=help_text, rich_help_panel=PANEL, show_default=False)


UserOpt = Annotated[str | None, _option("--nats-user", "VOLFSM_NATS_USER", "NATS user.")]
PasswordOpt = Annotated[
    str | None, _option("--nats-password", "VOLFSM_NATS_PASSWORD", "NATS password.")
]
TokenOpt = Annotated[str | None, _option("--nats-token", "VOLFSM_NATS_TOKEN", "NATS token.")]
CredsOpt = Annotated[str | None, _option("--nats-creds", "VOLFSM_NATS_CREDS", "NATS .creds file.")]
CaOpt = Annotated[str | None, _option("--nats-tls-ca", "VOLFSM_NATS_TLS_CA", "CA for NATS TLS.")]
CertOpt = Annotated[
    str | None, _option("--nats-tls-cert", "VOLFSM_NATS_TLS_CERT", "Client cert for NATS TLS.")
]
KeyOpt = Annotated[
    str | None, _option("--nats-tls-key", "VOLFSM_NATS_TLS_KEY", "Client key for NATS TLS.")
]


@dataclass(frozen=True)
class NatsCredentials:
    """The credential options one command was given (None: not given)."""

    nats_user: str | None = None
    nats_password: str | None = None
    nats_token: str | None = None
    nats_creds: str | None = None
    nats_tls_ca: str | None = None
    nats_tls_cert: str | None = None
    nats_tls_key: str | None = None

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> NatsCredentials:
        """The credential options among a command's parameters."""
        return cls(**{f.name: params[f.name] for f in fields(cls)})

    def connect_options(self) -> dict[str, Any]:
        """`nats.connect` options for these credentials (ConfigError when they do not fit)."""
        from volfsm.service.target import auth_options  # the config layer: only when used

        return auth_options(
            user=self.nats_user,
            password=self.nats_password,
            token=self.nats_token,
            creds=self.nats_creds,
            tls_ca=self.nats_tls_ca,
            tls_cert=self.nats_tls_cert,
            tls_key=self.nats_tls_key,
        )


CREDENTIAL_PARAMETERS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=None)
    for name, annotation in (
        ("nats_user", UserOpt),
        ("nats_password", PasswordOpt),
        ("nats_token", TokenOpt),
        ("nats_creds", CredsOpt),
        ("nats_tls_ca", CaOpt),
        ("nats_tls_cert", CertOpt),
        ("nats_tls_key", KeyOpt),
    )
]
"""One Typer parameter per `NatsCredentials` field."""


def with_credentials(command: Callable[..., None]) -> Callable[..., None]:
    """Give a Typer `command` the credential options; it receives them as `credentials`.

    Typer reads options from the signature: the wrapper's is the command's own
    parameters (without `credentials`) followed by `CREDENTIAL_PARAMETERS`.
    """
    own = [
        p
        for p in inspect.signature(command, eval_str=True).parameters.values()
        if p.name != "credentials"
    ]
    names = {p.name for p in CREDENTIAL_PARAMETERS}

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        credentials = NatsCredentials.of(kwargs)
        command(credentials=credentials, **{k: v for k, v in kwargs.items() if k not in names})

    parameters = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own
    ] + CREDENTIAL_PARAMETERS
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    setattr(wrapper, "__signature__", inspect.Signature(parameters, return_annotation=None))  # noqa: B010
    return wrapper
