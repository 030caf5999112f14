"""The one web layer of `volfsm serve` and `volfsm analytics serve`.

`http`: a small asyncio HTTP/1.1 server of fixed GET/HEAD routes (and
static files). `exposition`: Prometheus metrics through `prometheus_client`
(custom collectors that read state at scrape time, a private registry, the
library's text format and content type).
"""
