#!/usr/bin/env bash
# Generate the Python stubs for volfsm/csi/proto/csi.proto.
#
# Usage: scripts/gen_csi.sh [OUTDIR]   (default: volfsm/csi/v1)
#
# Writes csi_pb2.py, csi_pb2.pyi, csi_pb2_grpc.py and __init__.py into OUTDIR.
# protoc emits a top-level "import csi_pb2"; it is rewritten to the package
# import "from volfsm.csi.v1 import csi_pb2" so the stubs live in the package.
# Output depends only on csi.proto and the grpcio-tools version.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/volfsm/csi/v1}"
python="${PYTHON:-python3}"
proto_dir="$root/volfsm/csi/proto"

mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m grpc_tools.protoc \
    -I "$proto_dir" \
    --python_out="$work" \
    --pyi_out="$work" \
    --grpc_python_out="$work" \
    "$proto_dir/csi.proto"

sed -i -E 's/^import csi_pb2 as csi__pb2$/from volfsm.csi.v1 import csi_pb2 as csi__pb2/' \
    "$work/csi_pb2_grpc.py"
if grep -qE '^import csi_pb2' "$work/csi_pb2_grpc.py" "$work/csi_pb2.py" "$work/csi_pb2.pyi"; then
    echo "gen_csi.sh: a top-level 'import csi_pb2' is left after rewriting" >&2
    exit 1
fi

cat > "$work/__init__.py" <<'PY'
"""Generated CSI v1 stubs (protobuf messages and gRPC services).

Do not edit: regenerate with scripts/gen_csi.sh from volfsm/csi/proto/csi.proto.
"""
PY

for f in __init__.py csi_pb2.py csi_pb2.pyi csi_pb2_grpc.py; do
    cp "$work/$f" "$out/$f"
done
