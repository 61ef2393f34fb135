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
_pong_repo="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
case ":$PATH:" in
*":$_pong_repo/.venv/bin:"*) ;;
*) export PATH="$_pong_repo/.venv/bin:$PATH" ;;
esac
export RAY_AUTH_MODE=token
export RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
unset _pong_repo
