"""The node service: `volfsm serve` and the client the CLI uses to talk to it.

Modules: `config` (settings from defaults, a TOML file, `VOLFSM_*` env and
the command line), `logging` (loguru: flat JSON lines or human text),
`intake` (NATS request/reply commands), `metrics` (the Prometheus
collector), `serve` (the service's lifecycle; /metrics, /healthz and
/readyz on `volfsm.web`) and `client` (finding and calling a running
service).
"""
