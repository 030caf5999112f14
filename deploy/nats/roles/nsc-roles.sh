#!/bin/sh
# volfsm's roles as NATS users in operator mode (user JWTs and .creds files), made with nsc.
#
#   sh nsc-roles.sh ACCOUNT [NODE...]
#
# adds to ACCOUNT the users volfsm-admin, volfsm-aggregator, volfsm-client and one
# volfsm-node-<NODE> per node, with the permissions of `volfsm.bus.roles` (the same lists as
# users.conf). VOLFSM_STREAM (default VOLFSM) and VOLFSM_DURABLE (default volfsm-analytics)
# name the stream and the aggregator's durable consumer.
#
# The account needs JetStream, e.g.:
#   nsc add account --name VOLFSM
#   nsc edit account --name VOLFSM --js-mem-storage -1 --js-disk-storage -1 \
#       --js-streams -1 --js-consumer -1
# Afterwards push the account to the resolver (nsc push) and give each side its creds file:
#   nsc generate creds --account VOLFSM --name volfsm-node-n1 > n1.creds
#   volfsm serve --node n1 --nats nats://HOST:4222 --nats-creds n1.creds --stream-setup check
set -eu

if [ $# -lt 1 ]; then
  echo "usage: $0 ACCOUNT [NODE...]" >&2
  exit 2
fi
account=$1
shift
stream=${VOLFSM_STREAM:-VOLFSM}
durable=${VOLFSM_DURABLE:-volfsm-analytics}

# admin: the only role that may create, update, purge or delete the stream
nsc add user --account "$account" --name volfsm-admin \
  --allow-pub '$JS.API.>' \
  --allow-sub '_INBOX.>'

# aggregator: its own durable consumer, read-only (no purge, no message or stream delete)
nsc add user --account "$account" --name volfsm-aggregator \
  --allow-pub '$JS.API.STREAM.NAMES' \
  --allow-pub "\$JS.API.CONSUMER.INFO.$stream.$durable" \
  --allow-pub "\$JS.API.CONSUMER.DURABLE.CREATE.$stream.$durable" \
  --allow-pub "\$JS.API.CONSUMER.DELETE.$stream.$durable" \
  --allow-pub "\$JS.API.CONSUMER.MSG.NEXT.$stream.$durable" \
  --allow-pub "\$JS.ACK.$stream.$durable.>" \
  --allow-sub '_INBOX.aggregator.>'

# client: commands to every node (list volfsm.<node>.cmd.> per node to narrow it), and
# `volfsm events`: a pull consumer named volfsm_events_0..7, filtered on node events
events_rights=""
for k in 0 1 2 3 4 5 6 7; do
  events_rights="$events_rights --allow-pub \$JS.API.CONSUMER.CREATE.$stream.volfsm_events_$k.volfsm.*.events.>"
  events_rights="$events_rights --allow-pub \$JS.API.CONSUMER.MSG.NEXT.$stream.volfsm_events_$k"
  events_rights="$events_rights --allow-pub \$JS.API.CONSUMER.DELETE.$stream.volfsm_events_$k"
done
set -f  # the subjects' * and > are not file patterns
# shellcheck disable=SC2086
nsc add user --account "$account" --name volfsm-client \
  --allow-pub 'volfsm.*.cmd.>' \
  $events_rights \
  --allow-sub '_INBOX.client.>'
set +f

# node: its own events and commands; JetStream calls scoped to its own subjects
for node in "$@"; do
  nsc add user --account "$account" --name "volfsm-node-$node" \
    --allow-pub "volfsm.$node.events.>" \
    --allow-pub "\$JS.API.STREAM.INFO.$stream" \
    --allow-pub "\$JS.API.DIRECT.GET.$stream.volfsm.$node.events.>" \
    --allow-pub "\$JS.API.CONSUMER.CREATE.$stream.volfsm_history_$node.volfsm.$node.events.>" \
    --allow-pub "\$JS.API.CONSUMER.MSG.NEXT.$stream.volfsm_history_$node" \
    --allow-pub "\$JS.API.CONSUMER.DELETE.$stream.volfsm_history_$node" \
    --allow-sub "volfsm.$node.cmd.>" \
    --allow-sub "_INBOX.node.$node.>" \
    --allow-pub-response
done
