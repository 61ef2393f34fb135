#!/usr/bin/env bash
# First boot's wait: on a fresh Ubuntu AMI, cloud-init, then apt-daily or unattended-upgrades, hold apt's locks in
# the node's first minutes, and `apt-get update` fails at once on the lists lock (`-o DPkg::Lock::Timeout` waits for
# dpkg's lock, not for /var/lib/apt/lists/lock: docker/docker-install#366). cluster/aws.yaml runs this on every node
# before its apt step (initialization_commands):
#
#   bash /tmp/ray_tmp_mount/pong/tmp/pong-build/infra/first-boot-wait.sh
#
# It waits, WAIT_S (600) seconds at most in all, for cloud-init to finish (where it is installed) and then until no
# process holds a lock on any of LOCKS (apt and dpkg take fcntl locks, flock(1) takes flock locks: /proc/locks
# lists both), then prints one line: `first_boot step=apt_wait waited_s=31 cloud_init=done held_by=unattended-upgr`
# (held_by=none when nothing held them). At the bound: one line that names the lock and its holder, and exit 1 (the
# node does not join; apt would fail anyway). PONG_APT_LOCKS (files, space-separated) and PONG_APT_WAIT_S replace
# LOCKS and WAIT_S (tests/test_first_boot.py).
set -eu -o pipefail

LOCKS=${PONG_APT_LOCKS:-/var/lib/apt/lists/lock /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock}
WAIT_S=${PONG_APT_WAIT_S:-600}
started=$SECONDS

# The pid of a process holding a lock on file $1 (none: nothing), from /proc/locks: "1: POSIX ADVISORY WRITE
# PID MAJ:MIN:INODE ..." (MAJ and MIN in hex); a waiter's line ("1: -> POSIX ...") holds nothing.
holder() {
    [ -e "$1" ] || return 0
    local dev ino
    dev=$(stat -L -c %d "$1")
    ino=$(stat -L -c %i "$1")
    awk -v id="$(printf '%02x:%02x:%d' $(((dev >> 8) & 0xfff)) $(((dev & 0xff) | ((dev >> 12) & 0xfff00))) "$ino")" \
        '$2 != "->" && $6 == id { print $5; exit }' /proc/locks
}

cloud_init=absent
if command -v cloud-init >/dev/null; then
    # 0 done, 1 error, 2 degraded: all finished; 124: still running at the bound.
    rc=0
    timeout "$WAIT_S" cloud-init status --wait >/dev/null 2>&1 || rc=$?
    if [ "$rc" = 124 ]; then
        echo "first-boot-wait: cloud-init still running after ${WAIT_S}s; see /var/log/cloud-init-output.log on the node" >&2
        exit 1
    fi
    cloud_init=done
fi

held_by=none
while :; do
    held=
    for lock in $LOCKS; do
        pid=$(holder "$lock")
        [ -z "$pid" ] || { held=$lock; break; }
    done
    [ -n "$held" ] || break
    name=$(cat "/proc/$pid/comm" 2>/dev/null || echo "pid$pid")
    [ "$held_by" != none ] || held_by=$name
    if [ $((SECONDS - started)) -ge "$WAIT_S" ]; then
        echo "first-boot-wait: $held still held after ${WAIT_S}s by $name (pid $pid); apt cannot run on this node" >&2
        exit 1
    fi
    sleep 1
done
echo "first_boot step=apt_wait waited_s=$((SECONDS - started)) cloud_init=$cloud_init held_by=$held_by"
