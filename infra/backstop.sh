#!/usr/bin/env bash
# The node backstop: this node ends by itself, with no AWS right, no Ray and no laptop (docs/aws.md, Backstop),
# FIRST_BOOT_MINUTES from now unless its Ray comes up, and HOURS after the last time its Ray came up.
# cluster/aws.yaml runs it first of initialization_commands on every node:
#
#   bash /tmp/ray_tmp_mount/pong/tmp/pong-build/infra/backstop.sh 4 40   # make up MAX_NODE_HOURS=4; 40 minutes
#
# Two stages. Now, the short one: the node ends FIRST_BOOT_MINUTES from now, so a node whose `ray up` fails
# after its launch (a head setup that fails, an image refused, a token missing) ends within that, not HOURS
# later. Then a watcher (started here, in the background, replacing one an earlier run started) waits for the
# node's Ray: each time the node's `ray start` succeeds, aws.yaml's start commands touch MARKER from inside
# the container (docker's run_options mount MARKS there: the container cannot power off its host), and the
# watcher schedules the end again, HOURS from then. Ray runs the start commands at every `ray up` (even one
# that changes nothing, which skips initialization_commands) and when its autoscaler restarts a worker, so
# each of those moves the end later; a job started after a `ray up` has HOURS. `ray up --no-restart` (make
# run) runs none on a cluster already up: make run then touches MARKER on every node itself (infra/rearm.py).
#
# On a node the end is `sudo shutdown -P +MINUTES` (a power-off from the OS; `halt` would not do), which EC2
# turns into a termination because aws.yaml launches every node with InstanceInitiatedShutdownBehavior:
# terminate. logind keeps a single scheduled shutdown, so each schedule replaces the one before (the first
# boot's, from EC2 UserData, included).
#
# A test host (tests/test_aws_hosts.py) must not power off the machine it runs on: there the file STAND_IN
# holds a command that this runs in its place, in the background, after the same delay (in seconds, so a
# test can use a few), and a later schedule replaces a pending one as shutdown's does. Its state, `pid=N due=T`
# (T in epoch seconds), is in STATE.
#
# Prints one line: `backstop stage=first_boot hours=4 first_boot_minutes=40 seconds=2400 at=2026-01-01T00:40:00Z
# by=shutdown` (by=stand_in on a test host); the watcher writes a line of stage=ray_up (seconds=14400) to LOG
# each time it schedules the end again. A bad HOURS or FIRST_BOOT_MINUTES is one line and exit 2; a shutdown
# that cannot be scheduled, exit 1: a node without its backstop must not join the cluster.
set -eu -o pipefail

STAND_IN=/etc/pong-backstop-stand-in
STATE=/tmp/pong-backstop-stand-in.state
# The host folder the node's container signals in (cluster/aws.yaml's run_options mount it), its marker, the
# watcher's pid and its lines.
MARKS=/tmp/pong-backstop
MARKER="$MARKS/ray-up"
WATCHER="$MARKS/watcher.pid"
LOG="$MARKS/backstop.log"
# How often the watcher looks at MARKER.
POLL_S=5
# The container's user: Ray's image user, ray, uid 1000 (ubuntu on Canonical's AMI is uid 1000 too).
CONTAINER_UID=1000

# Whole seconds of a count of units (3600 for hours, 60 for minutes), at least one; a bad count is exit 2.
# awk, not bash: the count may have a fraction.
seconds_of() {
  awk -v n="$1" -v unit="$2" 'BEGIN { if (n !~ /^[0-9]*\.?[0-9]+$/ || n * unit < 1) exit 1; printf "%d", n * unit + 0.5 }' ||
    { echo "backstop: $3 must be a number of at least 1/$2 (a second), not '$1'" >&2; exit 2; }
}

# Schedules the node's end SECONDS from now, replacing the one pending; prints `seconds=.. at=.. by=..`.
schedule() {
  local seconds="$1" why="$2" now due by
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
    local minutes=$(((seconds + 59) / 60)) said
    due=$((now + 60 * minutes))
    said="$(sudo shutdown -P "+$minutes" "pong backstop: $why" 2>&1)" ||
      { echo "backstop: cannot schedule the node's shutdown: $(echo "$said" | tr '\n' ' ')" >&2; return 1; }
    by=shutdown
  fi
  echo "seconds=$((due - now)) at=$(date -u -d "@$due" +%Y-%m-%dT%H:%M:%SZ) by=$by"
}

# The watcher: each new mtime of MARKER (the node's Ray came up) schedules the end HOURS from then.
watch() {
  local hours="$1" seconds seen="" mtime said
  seconds="$(seconds_of "$hours" 3600 hours)"
  echo $$ >"$WATCHER"
  while sleep "$POLL_S"; do
    mtime="$(stat -c %Y "$MARKER" 2>/dev/null)" || continue
    [[ "$mtime" != "$seen" ]] || continue
    seen="$mtime"
    if said="$(schedule "$seconds" "this node ends $hours hours after its Ray last came up (MAX_NODE_HOURS)")"; then
      echo "backstop stage=ray_up hours=$hours $said"
    fi
  done
}

if [[ "${1:-}" == --watch ]]; then
  watch "${2:-}"
  exit
fi

hours="${1:-}"
first_boot_minutes="${2:-}"
seconds_of "$hours" 3600 hours >/dev/null
first_boot="$(seconds_of "$first_boot_minutes" 60 first_boot_minutes)"

# The folder the container touches MARKER in: the login user's, and writable by the container's user.
mkdir -p "$MARKS"
[[ -O "$MARKS" ]] || sudo chown "$(id -u):$(id -g)" "$MARKS"  # one `docker run -v` made before this ran
[[ "$(stat -c %u "$MARKS")" == "$CONTAINER_UID" ]] || setfacl -m "u:$CONTAINER_UID:rwx" "$MARKS"
rm -f "$MARKER"
said="$(schedule "$first_boot" "this node ends $first_boot_minutes minutes from its setup unless its Ray comes up")" ||
  exit 1
line="backstop stage=first_boot hours=$hours first_boot_minutes=$first_boot_minutes $said"
# The watcher of an earlier run first, then this one's, out of the launcher's SSH session as the stand-in is.
old="$(cat "$WATCHER" 2>/dev/null)" || true
! grep -qs -- --watch "/proc/${old:-0}/cmdline" || kill "$old" 2>/dev/null || true
echo "$line" >>"$LOG"
setsid nohup bash "$(readlink -f "${BASH_SOURCE[0]}")" --watch "$hours" </dev/null >>"$LOG" 2>&1 &
echo "$line"
