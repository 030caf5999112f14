# volfsm: the node service (`volfsm serve`) and its CSI driver (`volfsm-csi-driver`).
# One image for both; run privileged (mounts, loop devices). See docker-compose.yml.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends util-linux mount e2fsprogs \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY events ./events
COPY projections ./projections
COPY volfsm ./volfsm
RUN pip install --no-cache-dir . && rm -rf /src

WORKDIR /
ENTRYPOINT ["volfsm"]
CMD ["serve", "--help"]
