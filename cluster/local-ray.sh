#!/usr/bin/env bash
# A one-machine Ray cluster for trying jobs before paying for a cloud one.
#
#   cluster/local-ray.sh up       start a head on this machine unless one already answers
#   cluster/local-ray.sh status   say whether it runs, then `ray status`
#   cluster/local-ray.sh down     stop the head `up` started from this folder, and nothing else
#
# The Makefile calls this as `make local-up`, `make local-status`, `make local-down`.
#
# Ports are Ray's defaults, so every Ray command (and the Makefile's RAY_ADDRESS
# default) finds this head without flags. The tests start their own clusters on free
# ports, so they never collide with this one.
#   6379   GCS, the address other nodes join:  ray start --address=<this host>:6379
#   8265   dashboard and Jobs API, bound to 127.0.0.1 only
#   10001  Ray Client server
#
# The head's Ray label pong/cluster=local-up names it as this machine's: `make submit`, `make logs` and
# `make status` say which cluster they reach (a launched one says its cluster_name).
#
# Token authentication is always on (RAY_AUTH_MODE=token). The token is the file
# ~/.ray/auth_token (or $RAY_AUTH_TOKEN_PATH); `up` generates one if it is missing.
# The thread presets of infra/threads.env go into the environment of every Ray process.
#
# `down` does not use `ray stop`, which stops every Ray process of the user on the
# machine (another cluster, a test's, a long training run). `up` puts a mark of its own,
# PONG_LOCAL_HEAD=<random id>, in the environment of `ray start`; every process of that
# head inherits it (daemons, workers, job drivers). `down` stops exactly the processes
# that carry the mark recorded in .cache/local-ray/head.
set -eu -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="${VENV:-$repo/.venv}"
case "$venv" in /*) ;; *) venv="$repo/$venv" ;; esac
ray="$venv/bin/ray"
python="$venv/bin/python"
# Jobs run `python -m ...`: the head must find the venv's python (the one with Ray) first.
export PATH="$venv/bin:$PATH"
port=6379
dashboard_port=8265
dashboard="http://127.0.0.1:$dashboard_port"
# The mark of the head that `up` started from this folder (LOCAL_RAY_MARK: tests only).
mark_file="${LOCAL_RAY_MARK:-$repo/.cache/local-ray/head}"

say() { echo "local-ray: $*"; }
die() { echo "local-ray: $*" >&2; exit 1; }

[[ -x "$ray" ]] || die "no Ray in $venv; run \`make setup\` first"

export RAY_AUTH_MODE=token
set -a
# shellcheck source=../infra/threads.env
source "$repo/infra/threads.env"
set +a

# Prints the dashboard's authentication mode ("token", "disabled") or nothing if no
# dashboard answers. /api/authentication_mode needs no token.
auth_mode() {
    "$python" - "$dashboard" <<'PY' 2>/dev/null || true
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/api/authentication_mode", timeout=3) as r:
    print(json.load(r).get("authentication_mode", ""))
PY
}

# True once the Jobs API accepts our token; a fresh head needs a few seconds.
jobs_api_ready() {
    "$python" - "$dashboard" <<'PY' >/dev/null 2>&1
import os, pathlib, sys, urllib.request
token = os.environ.get("RAY_AUTH_TOKEN") or pathlib.Path(
    os.environ.get("RAY_AUTH_TOKEN_PATH") or pathlib.Path.home() / ".ray" / "auth_token"
).read_text().strip()
request = urllib.request.Request(sys.argv[1] + "/api/jobs/")
request.add_header("Authorization", "Bearer " + token)
urllib.request.urlopen(request, timeout=3)
PY
}

port_in_use() {
    "$python" - "$1" <<'PY'
import socket, sys
with socket.socket() as s:
    sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
PY
}

ensure_token() {
    if [[ -n "${RAY_AUTH_TOKEN:-}" ]]; then
        return
    fi
    if [[ -n "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
        [[ -s "$RAY_AUTH_TOKEN_PATH" ]] || die "RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH is not a token file"
        return
    fi
    if [[ ! -s "$HOME/.ray/auth_token" ]]; then
        local out
        # umask 077 (in the command's subshell): the token is 0600, and ~/.ray 0700, from the start
        out="$(umask 077 && "$ray" get-auth-token --generate 2>&1)" || { echo "$out" >&2; die "could not generate a token"; }
        say "generated a token in ~/.ray/auth_token (keep it private: it grants full access to the cluster)"
    fi
}

up() {
    ensure_token
    local mode
    mode="$(auth_mode)"
    if [[ -n "$mode" ]]; then
        say "already running dashboard=$dashboard auth=$mode"
        [[ "$mode" == token ]] || say "WARNING: this head was not started by this script: it has no token auth; \`make local-down\` then \`make local-up\` to restart it"
        return
    fi
    if port_in_use "$port"; then
        die "port $port is taken but no Ray dashboard answers at $dashboard; stop whatever holds it (\`make local-down\` if it is Ray)"
    fi
    say "starting head port=$port dashboard=$dashboard $(grep '^[A-Z]' "$repo/infra/threads.env" | paste -sd ' ')"
    mkdir -p "$(dirname "$mark_file")"
    local mark
    mark="$("$python" -c 'import uuid; print(uuid.uuid4().hex)')"
    echo "$mark" >"$mark_file"
    PONG_LOCAL_HEAD="$mark" "$ray" start --head \
        --port="$port" \
        --dashboard-host=127.0.0.1 \
        --dashboard-port="$dashboard_port" \
        --labels=pong/cluster=local-up \
        --disable-usage-stats >/dev/null
    for _ in $(seq 60); do
        if jobs_api_ready; then
            say "running dashboard=$dashboard auth=token stop_with='make local-down'"
            return
        fi
        sleep 1
    done
    die "the head started but its Jobs API did not answer at $dashboard within 60 s; see /tmp/ray/session_latest/logs/dashboard.log"
}

status() {
    local mode
    mode="$(auth_mode)"
    if [[ -z "$mode" ]]; then
        say "not running (no dashboard at $dashboard); start it with \`make local-up\`"
        return 0
    fi
    say "running dashboard=$dashboard auth=$mode"
    "$ray" status --address="127.0.0.1:$port"
}

# Pids of the live processes whose environment carries PONG_LOCAL_HEAD=$1.
marked_pids() {
    local entry pid
    for entry in /proc/[0-9]*; do
        pid="${entry#/proc/}"
        [[ $pid == "$$" ]] && continue
        grep -qzx "PONG_LOCAL_HEAD=$1" "$entry/environ" 2>/dev/null || continue
        # A zombie has exited already; only its parent can remove it.
        [[ "$(awk '{print $3}' "$entry/stat" 2>/dev/null)" == Z ]] && continue
        echo "$pid"
    done
}

down() {
    if [[ ! -s "$mark_file" ]]; then
        say "no head started from this folder is recorded in $mark_file; nothing stopped"
        return 0
    fi
    local mark pids
    mark="$(cat "$mark_file")"
    mapfile -t pids < <(marked_pids "$mark")
    if ((${#pids[@]} == 0)); then
        rm -f "$mark_file"
        forget_address
        say "stopped: the head had already exited"
        return 0
    fi
    # SIGTERM lets Ray's daemons shut down in order; what still runs after 10 s is killed.
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 20); do
        mapfile -t left < <(marked_pids "$mark")
        ((${#left[@]} == 0)) && break
        sleep 0.5
    done
    mapfile -t left < <(marked_pids "$mark")
    ((${#left[@]} == 0)) || kill -KILL "${left[@]}" 2>/dev/null || true
    rm -f "$mark_file"
    forget_address
    say "stopped processes=${#pids[@]} killed_after_10s=${#left[@]}"
}

# Ray records the address of "the cluster on this machine" in ray_current_cluster, and a
# plain ray.init() (make train, make bench) joins it. `ray stop` removes that file; we
# must too, or those commands wait forever on the head we just stopped. Only if the
# file names this head's port and no Ray process still listens there.
forget_address() {
    local current="${RAY_TMPDIR:-/tmp}/ray/ray_current_cluster" address
    [[ -f "$current" ]] && address="$(cat "$current")" || return 0
    [[ "$address" == *":$port" ]] || return 0
    if ! (exec 3<>"/dev/tcp/${address%:*}/$port") 2>/dev/null; then
        rm -f "$current"
    fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) die "usage: cluster/local-ray.sh up|down|status" ;;
esac
