#!/usr/bin/env bash
# The node backstop: this node ends HOURS from now by itself, with no AWS right, no Ray and no laptop
# (docs/aws.md, Backstop). cluster/aws.yaml runs it first of initialization_commands on every node:
#
#   bash /tmp/ray_tmp_mount/pong/tmp/pong-build/infra/backstop.sh 4     # make up MAX_NODE_HOURS=4
#
# On a node it schedules `sudo shutdown -P +MINUTES` (a power-off from the OS; `halt` would not do), which
# EC2 turns into a termination because aws.yaml launches every node with InstanceInitiatedShutdownBehavior:
# terminate. logind keeps a single scheduled shutdown, so running this again (every `ray up` re-runs
# initialization_commands) replaces it: the count starts again from then.
#
# A test host (tests/test_aws_hosts.py) must not power off the machine it runs on: there the file STAND_IN
# holds a command that this runs in its place, in the background, after the same delay (in seconds, so a
# test can use a few), and a later run replaces a pending one as shutdown's does. Its state, `pid=N due=T`
# (T in epoch seconds), is in STATE.
#
# Prints one line: `backstop hours=4 seconds=14400 at=2026-01-01T04:00:00Z by=shutdown` (by=stand_in on a
# test host). A bad HOURS is one line and exit 2; a shutdown that cannot be scheduled, exit 1: a node
# without its backstop must not join the cluster.
set -eu -o pipefail

STAND_IN=/etc/pong-backstop-stand-in
STATE=/tmp/pong-backstop-stand-in.state

hours="${1:-}"
# Whole seconds, at least one. awk, not bash: the hours may have a fraction.
seconds="$(awk -v h="$hours" 'BEGIN { if (h !~ /^[0-9]*\.?[0-9]+$/ || h * 3600 < 1) exit 1; printf "%d", h * 3600 + 0.5 }')" ||
  { echo "backstop: hours must be a number of at least 1/3600 (a second), not '$hours'" >&2; exit 2; }
now="$(date +%s)"

if [[ -f "$STAND_IN" ]]; then
  if [[ -f "$STATE" ]]; then
    # The pending stand-in's shell, asleep: killed before it runs its command, as a new shutdown replaces the old.
    kill "$(sed -n 's/^pid=\([0-9]*\) .*/\1/p' "$STATE")" 2>/dev/null || true
  fi
  due=$((now + seconds))
  # Out of the launcher's SSH session (setsid, every stream closed), so `ray up` does not wait for it.
  setsid nohup bash -c 'echo "pid=$$ due=$1" >"$2"; sleep "$3"; bash -c "$4"' backstop "$due" "$STATE" "$seconds" \
    "$(cat "$STAND_IN")" </dev/null >/dev/null 2>&1 &
  by=stand_in
else
  minutes=$(((seconds + 59) / 60))
  due=$((now + 60 * minutes))
  said="$(sudo shutdown -P "+$minutes" "pong backstop: this node ends after $hours hours (MAX_NODE_HOURS)" 2>&1)" ||
    { echo "backstop: cannot schedule the node's shutdown: $(echo "$said" | tr '\n' ' ')" >&2; exit 1; }
  by=shutdown
fi
echo "backstop hours=$hours seconds=$((due - now)) at=$(date -u -d "@$due" +%Y-%m-%dT%H:%M:%SZ) by=$by"
