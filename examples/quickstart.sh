#!/usr/bin/env bash
# volfsm in one go (Linux, as root, after `pip install .`):
#
#   bash examples/quickstart.sh          start volfsm's CSI driver and `volfsm serve`
#                                        (embedded NATS JetStream) in the background,
#                                        create the demo volume, apply examples/, wait
#                                        until everything is mounted, show the pods and
#                                        the events in the JetStream stream
#   bash examples/quickstart.sh stop     delete the example pods (volumes unmounted),
#                                        then stop the service (it drains) and the driver
#
# Everything lives under $VOLFSM_QUICKSTART_DIR (default /tmp/volfsm-quickstart):
# data/ (event log, embedded NATS store, root dir with the mounts), csi-state/,
# serve.log, csi-driver.log and the pid files. Running it again restarts both.
# Options (env): VOLFSM_QUICKSTART_HTTP (default 127.0.0.1:9780, or a free port if
# that one is taken), PYTHON (the interpreter volfsm was installed into).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=${VOLFSM_QUICKSTART_DIR:-/tmp/volfsm-quickstart}
this="bash $here/quickstart.sh"
[ -z "${VOLFSM_QUICKSTART_DIR:-}" ] || this="VOLFSM_QUICKSTART_DIR=$dir $this"
# Settings of the user's own volfsm (VOLFSM_NATS, VOLFSM_CONFIG, ...) do not apply here.
for var in $(compgen -e | grep '^VOLFSM_' | grep -v '^VOLFSM_QUICKSTART_' || true); do
    unset "$var"
done
data="$dir/data"
sock="$dir/csi/csi.sock"
csi_name=csi.volfsm.dev
node=node-1
web_uid=6f1c2a4e-0000-4000-8000-00000000c51a

if [ -t 1 ]; then
    say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
else
    say() { printf '==> %s\n' "$*"; }
fi
fail() { echo "quickstart: $*" >&2; exit 1; }

running() {  # running PID: the process exists and has not exited (is not a zombie)
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    case ${stat##*) } in Z*) return 1 ;; esac
}

alive() {  # alive PIDFILE: the pid in it runs a volfsm process (not a reused pid)
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1")
    running "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q volfsm
}

stop_one() {  # stop_one NAME: SIGTERM the process in NAME.pid, wait until it is gone
    local file="$dir/$1.pid" pid
    if alive "$file"; then
        pid=$(cat "$file")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 600); do
            alive "$file" || break
            sleep 0.1
        done
        if alive "$file"; then
            echo "quickstart: $1 (pid $pid) did not stop in 60s; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        echo "stopped $1 (pid $pid)"
    fi
    rm -f "$file"
}

if [ "${1:-}" = stop ]; then
    export VOLFSM_DATA_DIR="$data"
    if alive "$dir/serve.pid"; then
        for pod in default/web default/scratch; do
            volfsm delete pod "$pod" >/dev/null 2>&1 || true
        done
        for pod in default/web default/scratch; do
            volfsm wait pod "$pod" --for unmounted --timeout 120 || true
        done
    fi
    stop_one serve
    stop_one csi-driver
    echo "volfsm quickstart stopped; the event log stays in $data (volfsm history, timeline, ...)"
    exit 0
fi
[ $# -eq 0 ] || fail "usage: $0 [stop]"

# ------------------------------------------------------------------ checks
[ "$(id -u)" -eq 0 ] || fail "run as root (the CSI driver attaches loop devices and mounts)"
for tool in volfsm volfsm-csi-driver; do
    command -v "$tool" >/dev/null || fail "$tool not found on PATH: run 'pip install .' first"
done
for tool in losetup mkfs.ext4 mount umount; do
    command -v "$tool" >/dev/null || fail "$tool not found: install util-linux and e2fsprogs"
done
python=${PYTHON:-}
if [ -z "$python" ]; then  # the interpreter volfsm was installed into
    for candidate in "$(head -n1 "$(command -v volfsm)" | sed -n 's/^#! *//p')" python3; do
        if [ -n "$candidate" ] && $candidate -c 'import volfsm, nats' 2>/dev/null; then
            python=$candidate
            break
        fi
    done
    [ -n "$python" ] || fail "no Python with volfsm installed found: set PYTHON=..."
fi
if [ -n "${VOLFSM_QUICKSTART_HTTP:-}" ]; then
    http=$VOLFSM_QUICKSTART_HTTP
elif (exec 3<>/dev/tcp/127.0.0.1/9780) 2>/dev/null && ! alive "$dir/serve.pid"; then
    http="127.0.0.1:$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
else
    http=127.0.0.1:9780
fi

# An earlier quickstart from this directory: stop it (the service drains), start afresh.
if alive "$dir/serve.pid" || alive "$dir/csi-driver.pid"; then
    say "stopping the quickstart that is already running in $dir"
    stop_one serve
    stop_one csi-driver
fi

mkdir -p "$dir/csi" "$data"
export VOLFSM_DATA_DIR="$data"
rm -f "$data/nats.url" "$sock"  # written afresh by the service / the driver

# If anything below fails: show the logs and stop what was started.
started=0
on_exit() {
    local code=$?
    if [ "$code" -ne 0 ] && [ "$started" -eq 1 ]; then
        echo >&2
        echo "quickstart failed; last lines of $dir/serve.log and $dir/csi-driver.log:" >&2
        tail -n 15 "$dir/serve.log" "$dir/csi-driver.log" >&2 2>/dev/null || true
        stop_one serve >&2
        stop_one csi-driver >&2
    fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# Each in a session of its own (setsid): the terminal's Ctrl-C and hangup do not reach them.
setsid=$(command -v setsid || true)

# ------------------------------------------------------------------ start
say "starting volfsm's CSI driver ($csi_name) on unix://$sock"
started=1
$setsid volfsm-csi-driver --endpoint "unix://$sock" --node-id "$node" \
    --state-dir "$dir/csi-state" --name "$csi_name" \
    </dev/null >"$dir/csi-driver.log" 2>&1 &
driver_pid=$!
echo "$driver_pid" >"$dir/csi-driver.pid"

say "starting volfsm serve (node $node, embedded NATS JetStream, HTTP $http)"
$setsid volfsm serve --node "$node" --data-dir "$data" --csi "$csi_name=unix://$sock" \
    --http "$http" --log-format json \
    </dev/null >/dev/null 2>"$dir/serve.log" &
serve_pid=$!
echo "$serve_pid" >"$dir/serve.pid"

# The service writes <data-dir>/nats.url once it is ready (log rebuilt, first reconcile done).
for _ in $(seq 600); do
    [ -s "$data/nats.url" ] && break
    running "$serve_pid" || fail "volfsm serve exited while starting: see $dir/serve.log"
    running "$driver_pid" || fail "the CSI driver exited: see $dir/csi-driver.log"
    sleep 0.1
done
[ -s "$data/nats.url" ] || fail "volfsm serve is not ready after 60s: see $dir/serve.log"

# The PV in examples/csi names the volume demo-vol-1: create it in the driver
# (CSI CreateVolume, 64 MiB; creating it again on a re-run is not an error).
say "creating volume demo-vol-1 (64Mi) in the CSI driver"
volume=$(volfsm-csi-driver create-volume demo-vol-1 --size 64Mi --endpoint "unix://$sock" --wait 30)
[ "$volume" = demo-vol-1 ] || fail "the driver named the volume '$volume', examples/csi/pv.yaml says demo-vol-1"

say "applying examples/ (a pod with two emptyDirs; a CSI PV, PVC and pod)"
# --complete: this is the node's whole desired state, so a restarted service need not
# wait out its grace period before it may unmount anything (see "The unmount gate").
volfsm apply --complete -f "$here/emptydir-pod.yaml" -f "$here/csi"
volfsm wait pod default/scratch --for mounted --timeout 120
volfsm wait pod default/web --for mounted --timeout 120

say "volfsm get pods"
volfsm get pods

say "the events, as the JetStream stream holds them"
"$python" "$here/stream-events.py" --data-dir "$data" --last 12

trap - EXIT
cat <<EOF

volfsm is running in the background:
  volfsm serve       pid $serve_pid, log $dir/serve.log, NATS $(cat "$data/nats.url")
  volfsm-csi-driver  pid $driver_pid, log $dir/csi-driver.log
  mounts             under $data/root/pods/

Try next:
  export VOLFSM_DATA_DIR=$data
  volfsm get volumes                     # devices and pod volumes, states, last operation
  volfsm explain pod default/web         # why each of its volumes is (not) mounted
  volfsm timeline --pod $web_uid
  volfsm history --type OperationSucceeded
  volfsm delete pod default/web && volfsm wait pod default/web --for unmounted --timeout 60
  $python $here/stream-events.py
  curl -s http://$http/metrics | grep volume_manager_total_volumes

Stop it (deletes the example pods, then the service drains and stops, then the driver):
  $this stop
EOF
