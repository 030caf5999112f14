#!/usr/bin/env bash
# Check that the committed CSI stubs in volfsm/csi/v1 match what
# scripts/gen_csi.sh generates from csi.proto now. Exit 1 on any difference.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

bash "$root/scripts/gen_csi.sh" "$tmp"

status=0
for f in __init__.py csi_pb2.py csi_pb2.pyi csi_pb2_grpc.py; do
    if ! diff -u "$root/volfsm/csi/v1/$f" "$tmp/$f"; then
        status=1
    fi
done
extra="$(cd "$root/volfsm/csi/v1" && ls -A | grep -vxE '__init__.py|csi_pb2.py|csi_pb2.pyi|csi_pb2_grpc.py|__pycache__' || true)"
if [ -n "$extra" ]; then
    echo "check_csi_stubs.sh: unexpected files in volfsm/csi/v1: $extra" >&2
    status=1
fi
if [ "$status" -ne 0 ]; then
    echo "check_csi_stubs.sh: stubs are stale; run scripts/gen_csi.sh and commit" >&2
    exit 1
fi
echo "check_csi_stubs.sh: CSI stubs are up to date"
