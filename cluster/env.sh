# Source this file to use Ray's own CLI in your shell as the Makefile does:
#
#   source cluster/env.sh
#   ray job logs <submission id> --follow
#
# It puts this repo's .venv/bin first on PATH (the `ray` of the lock, which the cluster's Ray must
# equal), turns token authentication on for Ray's clients (RAY_AUTH_MODE=token: without it Ray's job
# CLI sends no token and the cluster answers 401), and points them at the dashboard that `make submit`
# uses unless you set RAY_ADDRESS yourself: 127.0.0.1:8265, the head of `make local-up` or a cloud head
# that `make dashboard` forwards there. The token is Ray's usual ~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH).
# Nothing else is changed, and sourcing it twice does what sourcing it once does. RAY_ADDRESS is a
# dashboard's address, which Ray's job CLI wants; `ray status` wants a GCS address and refuses this one:
# in this shell, `make local-status` (or `env -u RAY_ADDRESS ray status` on a node).
# One more: `ray up` of a YAML that sends ~/.ray/auth_token to its nodes (cluster/aws.yaml,
# cluster/local.yaml), on a machine that has none, stops here in one line naming `make token`. Ray
# itself stops such an aws.yaml before any node starts, but with a traceback (its auth.ssh_public_key).
_pong_repo="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
case ":$PATH:" in
*":$_pong_repo/.venv/bin:"*) ;;
*) export PATH="$_pong_repo/.venv/bin:$PATH" ;;
esac
export RAY_AUTH_MODE=token
export RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
unset _pong_repo
ray() {
    if [ "${1-}" = up ] && [ ! -s "$HOME/.ray/auth_token" ]; then
        for _pong_yaml in "$@"; do
            if [ -f "$_pong_yaml" ] && grep -q '~/.ray/auth_token' "$_pong_yaml"; then
                echo "ray up: $_pong_yaml sends the cluster's token, ~/.ray/auth_token, to every node, and there is none here: run \`make token\` first (docs/security.md)" >&2
                unset _pong_yaml
                return 2
            fi
        done
        unset _pong_yaml
    fi
    command ray "$@"
}
