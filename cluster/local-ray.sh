#!/usr/bin/env bash
# A one-machine Ray cluster for trying jobs before paying for a cloud one.
#
#   cluster/local-ray.sh up       start a head on this machine unless one already answers
#   cluster/local-ray.sh status   say whether it runs, then `ray status`
#   cluster/local-ray.sh down     `ray stop`: stops every Ray process of this user here
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
# Token authentication is always on (RAY_AUTH_MODE=token). The token is the file
# ~/.ray/auth_token (or $RAY_AUTH_TOKEN_PATH); `up` generates one if it is missing.
# The thread presets of infra/threads.env go into the environment of every Ray process.
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
        out="$("$ray" get-auth-token --generate 2>&1)" || { echo "$out" >&2; die "could not generate a token"; }
        chmod 600 "$HOME/.ray/auth_token"
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
    "$ray" start --head \
        --port="$port" \
        --dashboard-host=127.0.0.1 \
        --dashboard-port="$dashboard_port" \
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

down() {
    local out
    out="$("$ray" stop 2>&1)" || { echo "$out" >&2; die "\`ray stop\` failed (its output is above)"; }
    say "stopped: $(tail -n 1 <<<"$out" | sed 's/\x1b\[[0-9;]*m//g; s/.* -- //')"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) die "usage: cluster/local-ray.sh up|down|status" ;;
esac
