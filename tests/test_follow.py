"""A pool that follows the cluster (--workers auto), on a real cluster of this machine: a job starts on
the head alone (1 CPU), a second node joins while it trains, and later dies (every process of it
SIGKILLed). The pool must grow onto the new node between updates, drop its actor once it is gone, say
how many actors played each update, and end with the very bits of a one-node run of the same seed.
"""

import time
import uuid

import pytest
from harness import RAY, fields, run
from harness.cluster import logs, plain_submit, two_node_cluster, wait_for, wait_until_done
from harness.runs import assert_same_run, read_metrics, stop_then_reference

ARGS = [
    "--batch-size",
    "4",
    "--workers",
    "auto",
    "--seed",
    "23",
    "--learning-rate",
    "1e-3",
    "--checkpoint-every",
    "1000",
]
# The head declares a node dead after 3 failed health checks, one a second (Ray's default: about 15 s).
FAST_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


def lines_of(text, kind):
    """(position, fields) of each line of that kind ('update' for the update lines)."""
    lines = text.splitlines()
    prefix = "update=" if kind == "update" else kind + " "
    return [(n, fields(line)) for n, line in enumerate(lines) if line.startswith(prefix)]


def node_beside(cluster, known, which, timeout_s=90):
    """The id of the one alive node not in known, once it shows (within timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while not (new := {n["node_id"] for n in cluster.alive_nodes()} - known):
        assert time.monotonic() < deadline, f"{which} never showed as alive"
        time.sleep(1)
    [node] = new
    return node


def after(text, kind, position):
    return [f for n, f in lines_of(text, kind) if n > position]


@pytest.mark.slow  # a cluster of its own, a node started and killed while a job trains, a reference run: minutes
@pytest.mark.alone  # it starts a node while its job trains (see test_chaos.py)
def test_the_pool_grows_onto_a_joining_node_drops_it_when_it_dies_and_the_bits_stay(tmp_path):
    run_dir = tmp_path / "follow"
    with two_node_cluster(second_node=False, **FAST_DEATH) as cluster:
        head = {n["node_id"] for n in cluster.alive_nodes()}
        submission = f"follow-{uuid.uuid4().hex[:8]}"
        # --updates 1000, not 0 (until stopped), so the update lines show progress= and eta_s=, as the
        # sample of this log in docs/aws.md does; the test stops the job long before.
        plain_submit(cluster, submission, *ARGS, "--updates", "1000", "--run-dir", str(run_dir))
        try:
            wait_for(cluster, submission, lambda t: len(lines_of(t, "update")) >= 2, what="two updates on the head")
            cluster.start_second_node()
            new_node = node_beside(cluster, head, "the second node")

            def played_on_both(text):
                joined = [n for n, f in lines_of(text, "joined") if f["node"] == new_node[:8]]
                return joined and any(u["actors"] == "2" for u in after(text, "update", joined[0]))

            wait_for(cluster, submission, played_on_both, timeout_s=240, what="an update played on both nodes")
            cluster.kill_session(cluster.sessions[1])

            def dropped_then_two_updates(text):
                dropped = [n for n, f in lines_of(text, "dropped") if f["node"] == new_node[:8]]
                return dropped and len(after(text, "update", dropped[0])) >= 2

            wait_for(cluster, submission, dropped_then_two_updates, timeout_s=240, what="the dead node's actor dropped")
            reference = tmp_path / "reference"  # as many updates on the head alone, the cluster's one node now
            status, text, last = stop_then_reference(cluster, submission, ARGS, reference)
        finally:
            run([RAY, "job", "stop", submission], cluster.client_env(), timeout=120)
    assert status == "STOPPED", text[-4000:]
    [(_, start)] = lines_of(text, "start")
    assert (start["workers"], start["worker_nodes"]) == ("1", "1"), start
    [(grew_at, grew)] = lines_of(text, "growing")
    assert (grew["added"], grew["actors"], grew["cluster_cpus"]) == ("1", "2", "2"), grew
    [(joined_at, joined)] = lines_of(text, "joined")
    [(dropped_at, dropped)] = lines_of(text, "dropped")
    assert joined["node"] == dropped["node"] == new_node[:8] and grew_at < joined_at < dropped_at, text[-4000:]
    assert (dropped["reason"], dropped["size"]) == ("node_left", "1"), dropped
    updates = lines_of(text, "update")
    # The actor counts: one actor on the head until the new node's actor answered, both once it did (an
    # update it joined during counts it if it played), and one again after its node was dropped.
    before = [(u["actors"], u["nodes"]) for n, u in updates if n < joined_at]
    between = [(u["actors"], u["nodes"]) for n, u in updates if joined_at < n < dropped_at]
    since = [(u["actors"], u["nodes"]) for n, u in updates if n > dropped_at]
    assert before and set(before) == {("1", "1")}, text[-4000:]
    assert ("2", "2") in between, text[-4000:]
    assert len(since) >= 2 and set(since) == {("1", "1")}, text[-4000:]
    assert [int(u["update"]) for _, u in updates] == list(range(1, last + 1)), text[-3000:]
    assert all(u["ledger"] == "complete" for _, u in updates)
    assert [r["update"] for r in read_metrics(run_dir)] == list(range(1, last + 1))
    assert_same_run(run_dir, reference)
    # The job's log from the pool's growth on, which docs/aws.md shows (saved with pytest -s: its
    # docs/samples/follow-log.txt names the command).
    print("\n" + "\n".join(text.splitlines()[grew_at:]))


@pytest.mark.slow  # a cluster of its own, two nodes started and one killed while a job trains: minutes
@pytest.mark.alone  # it starts nodes while its job trains (see test_chaos.py)
def test_an_actor_whose_node_died_before_it_answered_plays_on_the_next_node(tmp_path):
    """The pool adds an actor for a joining node; that node dies before the actor first answers, so the
    pool never learns its node and cannot drop it. Ray starts it again (max_restarts) on the next node
    with a free CPU, where it answers: a third node that joins gets played on, with no actor added."""
    run_dir = tmp_path / "never-answered"
    with two_node_cluster(second_node=False, **FAST_DEATH) as cluster:
        head = {n["node_id"] for n in cluster.alive_nodes()}
        submission = f"never-answered-{uuid.uuid4().hex[:8]}"
        plain_submit(cluster, submission, *ARGS, "--updates", "1000", "--run-dir", str(run_dir))
        try:
            wait_for(cluster, submission, lambda t: len(lines_of(t, "update")) >= 2, what="two updates on the head")
            # The joining node's actor starts a Python worker, imports the job and warms up its
            # emulator: seconds, long after its node is killed here, which follows the `growing` line.
            session = cluster.start_second_node()
            wait_for(cluster, submission, lambda t: lines_of(t, "growing"), timeout_s=120, what="a growing line")
            cluster.kill_session(session)
            text = logs(cluster, submission)
            assert not lines_of(text, "joined"), "the actor answered before its node was killed:\n" + text[-3000:]
            deadline = time.monotonic() + 90
            while len(cluster.alive_nodes()) != 1:
                assert time.monotonic() < deadline, "the killed node still shows as alive"
                time.sleep(1)
            cluster.start_second_node()
            third = node_beside(cluster, head, "the third node")

            def played_on_the_third(text):
                joined = [n for n, f in lines_of(text, "joined") if f["node"] == third[:8]]
                return joined and any(u["actors"] == "2" for u in after(text, "update", joined[0]))

            text = wait_for(cluster, submission, played_on_the_third, timeout_s=240, what="an update on the third node")
        finally:
            run([RAY, "job", "stop", submission], cluster.client_env(), timeout=120)
    # One actor added, for the second node; the same actor answered on the third; nothing dropped.
    [(_, grew)] = lines_of(text, "growing")
    [(_, joined)] = lines_of(text, "joined")
    assert (grew["added"], joined["actor"], joined["node"]) == ("1", "1", third[:8]), text[-4000:]
    assert not lines_of(text, "dropped"), text[-4000:]


@pytest.mark.slow  # a cluster of its own, a node started while a job waits: a minute or two
@pytest.mark.alone  # it starts a node while its job waits (see test_chaos.py)
def test_a_job_on_a_head_without_cpus_waits_for_a_worker_and_grows_onto_it(tmp_path):
    """An autoscaling cluster whose workers are all gone: a head of 0 CPUs. A job gives up after
    --actor-wait-s in one line; the next waits (`starting ... need=1`), starts once a 2-CPU worker joins,
    and asks for an actor on the worker's second CPU, which then plays too. docs/reliability.md links
    both logs (saved with pytest -s: docs/samples/no-worker.txt)."""
    with two_node_cluster(second_node=False, head_cpus=0) as cluster:
        alone = f"no-worker-{uuid.uuid4().hex[:8]}"
        plain_submit(
            cluster,
            alone,
            "--batch-size",
            "2",
            "--updates",
            "1",
            "--actor-wait-s",
            "10",
            "--run-dir",
            str(tmp_path / "alone"),
        )
        alone_status = wait_until_done(cluster, alone, timeout_s=180)
        alone_text = logs(cluster, alone)
        submission = f"worker-joins-{uuid.uuid4().hex[:8]}"
        plain_submit(
            cluster, submission, "--batch-size", "4", "--updates", "1000", "--run-dir", str(tmp_path / "joins")
        )
        try:
            wait_for(cluster, submission, lambda t: lines_of(t, "starting"), timeout_s=120, what="a starting line")
            cluster.start_second_node(cpus=2)

            def played_on_both(text):
                joined = [n for n, _ in lines_of(text, "joined")]
                return joined and any(u["actors"] == "2" for u in after(text, "update", joined[0]))

            wait_for(cluster, submission, played_on_both, timeout_s=240, what="an update played by both actors")
            stopped = run([RAY, "job", "stop", submission], cluster.client_env(), timeout=120)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            wait_until_done(cluster, submission, timeout_s=120)
            text = logs(cluster, submission)
        finally:
            run([RAY, "job", "stop", submission], cluster.client_env(), timeout=120)
    assert alone_status == "FAILED", alone_text[-3000:]
    assert lines_of(alone_text, "starting")[0][1]["need"] == "1", alone_text[-3000:]
    assert "error: no rollout actor started in " in alone_text, alone_text[-3000:]
    (_, waiting), *_ = lines_of(text, "starting")
    assert (waiting["answered"], waiting["need"]) == ("0", "1"), text[-4000:]
    [(_, start)] = lines_of(text, "start")
    assert (start["cluster_cpus"], start["workers"]) == ("2", "1"), start
    [(grew_at, grew)] = lines_of(text, "growing")
    [(joined_at, _)] = lines_of(text, "joined")
    assert grew["added"] == "1" and grew_at < joined_at, text[-4000:]
    assert all(u["ledger"] == "complete" for _, u in lines_of(text, "update")), text[-4000:]
    print(
        f"\njob {alone} ({alone_status}):\n{alone_text.rstrip()}\njob {submission} (stopped by the test):\n{text.rstrip()}"
    )
