#!/usr/bin/env bash
# volfsm in one go (Linux, as root, after `pip install .`): start volfsm's CSI
# driver and `volfsm serve` (embedded NATS JetStream) in the background, create
# the demo volume in the driver, apply the examples and wait until they mount.
#
# Everything lives under $VOLFSM_QUICKSTART_DIR (default /tmp/volfsm-quickstart).
# Stop it with:  kill $(cat /tmp/volfsm-quickstart/*.pid)   (the service drains)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=${VOLFSM_QUICKSTART_DIR:-/tmp/volfsm-quickstart}
http=${VOLFSM_QUICKSTART_HTTP:-127.0.0.1:9780}
python=${PYTHON:-python3}
sock="$dir/csi/csi.sock"
mkdir -p "$dir"
export VOLFSM_DATA_DIR="$dir/data"

volfsm-csi-driver --endpoint "unix://$sock" --node-id node-1 --state-dir "$dir/csi-state" \
    </dev/null >"$dir/csi-driver.log" 2>&1 &
echo $! >"$dir/csi-driver.pid"
volfsm serve --node node-1 --csi "csi.volfsm.dev=unix://$sock" --http "$http" \
    --log-format json </dev/null >/dev/null 2>"$dir/serve.log" &
echo $! >"$dir/serve.pid"

# The service writes <data-dir>/nats.url once it is ready.
for _ in $(seq 300); do
    [ -s "$VOLFSM_DATA_DIR/nats.url" ] && break
    sleep 0.1
done
[ -s "$VOLFSM_DATA_DIR/nats.url" ] || { echo "volfsm serve is not ready: see $dir/serve.log" >&2; exit 1; }

# The PV in examples/csi names volume demo-vol-1: create it (CSI CreateVolume, 64 MiB).
"$python" - "unix://$sock" <<'PY'
import sys
import grpc
from volfsm.csi.v1 import csi_pb2 as pb, csi_pb2_grpc as rpc

cap = pb.VolumeCapability(
    mount=pb.VolumeCapability.MountVolume(fs_type="ext4"),
    access_mode=pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER),
)
with grpc.insecure_channel(sys.argv[1], options=[("grpc.default_authority", "localhost")]) as ch:
    rpc.ControllerStub(ch).CreateVolume(
        pb.CreateVolumeRequest(name="demo-vol-1", volume_capabilities=[cap],
                               capacity_range=pb.CapacityRange(required_bytes=64 << 20)),
        timeout=30,
    )
PY

volfsm apply -f "$here" -f "$here/csi"
volfsm wait pod default/scratch --for mounted --timeout 60
volfsm wait pod default/web --for mounted --timeout 60
volfsm get pods
echo
echo "Next: volfsm get volumes | volfsm delete pod default/web | volfsm history --data-dir $VOLFSM_DATA_DIR"
echo "      curl -s http://$http/metrics | grep volume_manager | kill \$(cat $dir/*.pid)"
