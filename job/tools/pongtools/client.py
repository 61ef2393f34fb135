"""The cluster's Jobs API: one client per command, each mistake and failure of a request one line.

    api = JobsClient("http://127.0.0.1:8265")     # connects once: the token, the Ray version (connect)
    api.line()                                    # `cluster address=... cluster=pong nodes=11 cpus=198`
    api.submit_job(entrypoint=..., ...)           # any JobSubmissionClient call, through api.ask
    api.follow(job_id)                            # the job's logs to its end, then its status name
    api.autodown_line()                           # the head's watcher's last line, or None

`make submit` (pongtools.submit), `make logs`, `make status` and the rest (pongtools.jobs) and `make run`
(pongtools.launch) each open one JobsClient and ask everything through it: the version round trip that
Ray's client makes at its start is made once per command. Mistakes (no cluster at the address, a token that
is missing or not the cluster's, another Ray version, a job id the cluster does not know) are pgpong.cli's
UserError, one line and exit 2; a cluster lost mid-way is one too, naming how to see whether it still runs.
"""

import asyncio
import dataclasses
import importlib.metadata
import json
import logging
import os
import sys
import time
from pathlib import Path

from pgpong.cli import UserError
from pgpong.logline import kv

from pongtools import REPO

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"
# The head's autodown watcher's log, in the head's Ray log folder (cluster/variant.py's AUTODOWN_COMMAND).
AUTODOWN_LOG = "autodown.log"
# The Ray label (`ray start --labels`) that names the cluster of a head: cluster/aws.yaml's and cluster/local.yaml's
# head_start_ray_commands set it to their cluster_name, cluster/local-ray.sh to local-up (this machine's head);
# a head without it (a `ray start` of your own) is UNNAMED. `make submit`, `make logs` and `make status` say it.
CLUSTER_LABEL = "pong/cluster"
UNNAMED = "unnamed"
START_HINT = (
    "start one with `make local-up` (this machine) or `make up` then `make dashboard` "
    "(cloud), or set RAY_ADDRESS to its dashboard address"
)


def last_job_file():
    """Where the latest submission id is recorded: LAST_JOB_FILE, else .last-job in the repo (the one default;
    `make logs`, `make status` and `make stop-job` read it through pongtools.jobs)."""
    return Path(os.environ.get("LAST_JOB_FILE") or REPO / ".last-job")


def dashboard_address():
    address = os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    if "://" not in address:
        address = "http://" + address
    return address.rstrip("/")


def token_source():
    """Where Ray itself looks for the token first: RAY_AUTH_TOKEN, or the file RAY_AUTH_TOKEN_PATH names."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    return os.environ.get("RAY_AUTH_TOKEN_PATH") or str(DEFAULT_TOKEN_PATH)


def local_token():
    """The token to send, found where Ray itself looks, or None."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(token_source())
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    return None


def answers(address):
    """Whether anything answers HTTP at address."""
    import requests

    try:
        requests.get(address + "/api/version", timeout=10)
    except requests.RequestException:
        return False
    return True


def connect(address):
    """A JobSubmissionClient for the cluster, or one line saying why there is none."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    # Ray warns through logging when it finds no token; our own line below says it better.
    logging.getLogger("ray").setLevel(logging.ERROR)
    token = local_token()
    headers = {"Authorization": "Bearer " + token} if token else None
    try:
        client = JobSubmissionClient(address, headers=headers)
    except ConnectionError:
        raise UserError(f"no Ray cluster answers at {address}; {START_HINT}") from None
    except AuthenticationError:
        if token is None and not answers(address):  # Ray refused to send no token before it asked anyone
            raise UserError(f"no Ray cluster answers at {address}; {START_HINT}") from None
        if token is None:
            same_ray(address)
            raise UserError(
                f"the cluster at {address} requires a token but there is none at {token_source()}; "
                "copy the cluster's token there (docs/security.md, Token authentication)"
            ) from None
        raise UserError(
            f"the cluster at {address} rejected the token; the one in {token_source()} is not the cluster's: "
            "copy the cluster's token there (docs/security.md, Token authentication)"
        ) from None
    except (RuntimeError, ValueError, OSError) as e:  # an HTTP server, but not a Ray dashboard
        raise UserError(f"{address} is not a Ray dashboard ({str(e).splitlines()[0]}); {START_HINT}") from None
    ours = importlib.metadata.version("ray")
    theirs = client._server_ray_version  # read by the client's own version check just now
    if theirs != ours:
        raise UserError(
            f"the cluster runs Ray {theirs} but this client has Ray {ours}; "
            "both must be the version pinned in requirements.txt"
        )
    return client


def same_ray(address):
    """UserError unless what answers at address is a Ray dashboard of this client's Ray version, said before a token
    is asked for: its /api/version (which a dashboard without token auth answers), else its public
    /api/authentication_mode (one with token auth answers only that: then the caller says a token is needed)."""
    import requests

    not_ray = UserError(
        f"{address} is not a Ray dashboard (it names no Ray version or authentication mode); {START_HINT}"
    )
    try:
        answer = requests.get(address + "/api/version", timeout=10)
        if answer.status_code in (401, 403):
            mode = requests.get(address + "/api/authentication_mode", timeout=10).json().get("authentication_mode")
            if mode != "token":
                raise not_ray
            return
        theirs = answer.json()["ray_version"]
    except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError):
        raise not_ray from None
    ours = importlib.metadata.version("ray")
    if theirs != ours:
        raise UserError(
            f"the cluster at {address} runs Ray {theirs} but this client has Ray {ours}; "
            "both must be the version pinned in requirements.txt"
        )


@dataclasses.dataclass(frozen=True)
class Reached:
    """The cluster a client reaches: its name (the head's CLUSTER_LABEL; UNNAMED without one), its alive nodes,
    their CPUs in all and on the largest, and its head's node id (None: no head answered)."""

    name: str
    nodes: int
    cpus: int
    cpus_per_node: int
    head_id: str | None

    def fields(self):
        return {"cluster": self.name, "nodes": self.nodes, "cpus": self.cpus}


def get(client, path):
    """A GET of the dashboard's REST API with the client's token: its text, None if not 200."""
    answer = client._do_request("GET", path)
    return answer.text if answer.status_code == 200 else None


def reached(client):
    """The Reached of the cluster behind client, from the dashboard's list of nodes."""
    listed = json.loads(get(client, "/api/v0/nodes?detail=false&limit=1000") or "{}")
    alive = [n for n in listed.get("data", {}).get("result", {}).get("result", []) if n.get("state") == "ALIVE"]
    heads = [n for n in alive if n.get("is_head_node")]
    name = (heads[0].get("labels") or {}).get(CLUSTER_LABEL, UNNAMED) if heads else UNNAMED
    cpus = [int((n.get("resources_total") or {}).get("CPU", 0)) for n in alive]
    return Reached(name, len(alive), sum(cpus), max(cpus, default=0), heads[0]["node_id"] if heads else None)


def autodown_line(client, head_id=None):
    """The last line of the head's autodown watcher (infra/autodown.py writes it in the head's Ray log
    folder), or None where the head runs none (the head of `make local-up`). head_id: the head's node id, if
    known (reached's), else asked for."""
    head_id = head_id or reached(client).head_id
    if head_id is None:
        return None
    text = get(client, f"/api/v0/logs/file?node_id={head_id}&filename={AUTODOWN_LOG}&lines=1") or ""
    lines = [line for line in text.splitlines() if line.startswith("autodown ")]
    return lines[-1] if lines else None


def follow(client, job_id, out=None):
    """Print the job's logs (to out, default stdout) until it ends; return its final status name."""
    out = out or sys.stdout

    async def tail():
        async for chunk in client.tail_job_logs(job_id):
            out.write(chunk)
            out.flush()

    try:
        asyncio.run(tail())
    except RuntimeError:  # the log stream broke (head busy, network): the status still tells
        pass
    while True:
        status = client.get_job_status(job_id)
        if status.is_terminal():
            return str(status.value)
        time.sleep(1)


class JobsClient:
    """The cluster's Jobs API, each failure of a request one UserError."""

    def __init__(self, address):
        self.address = address
        self.client = connect(address)
        self.reached = None  # reached()'s answer, asked once (line, where)
        logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)  # not its INFO "WebSocket closed"

    def ask(self, request, job_id=None):
        try:
            return request()
        except RuntimeError as e:  # the SDK's word for any HTTP answer but 200
            if job_id is not None and "status code 404" in str(e):
                raise UserError(
                    f"the cluster at {self.address} has no job '{job_id}'; `make list` shows its jobs: pass "
                    f"ID=<submission id> (without ID, the last submission's, recorded in {last_job_file()})"
                ) from None
            raise UserError(f"the cluster at {self.address} refused: {str(e).splitlines()[0]}") from None
        except OSError as e:  # requests' ConnectionError and the like: the cluster went away
            raise UserError(
                f"lost the cluster at {self.address} ({type(e).__name__}); "
                "see whether it still runs: `make local-status`, or `make dashboard` for a cloud cluster"
            ) from None
        except ValueError as e:  # a JSONDecodeError: an answer that is not the dashboard's
            raise UserError(f"the cluster at {self.address} answered what its Jobs API does not ({e})") from None

    def info(self, job_id):
        return self.ask(lambda: self.client.get_job_info(job_id), job_id)

    def autodown_line(self):
        """The last line of the head's autodown watcher, or None where the head runs none (autodown_line)."""
        return self.ask(lambda: autodown_line(self.client, self.where().head_id))

    def where(self):
        """The Reached of this cluster, asked once."""
        if self.reached is None:
            self.reached = self.ask(lambda: reached(self.client))
        return self.reached

    def follow(self, job_id, out=None):
        """The job's logs to out until it ends; its final status name."""
        return self.ask(lambda: follow(self.client, job_id, out), job_id)

    def line(self):
        """`cluster address=... cluster=<name> nodes=N cpus=C`: which cluster this is (reached), so that a job
        meant for a cloud head is not read from the laptop's own without a word."""
        return kv("cluster", address=self.address, **self.where().fields())
