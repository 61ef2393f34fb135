"""The shipped agent and the learning-rate experiments: `make ship`, `make play` of an exported agent,
`make compare` and `make sweep`, each on a real tiny run of the trainer."""

import gzip
import json
import os
import shutil

import numpy as np
import pytest
from harness import REPO, clean_env, fields, only, run
from harness.runs import trainer_env
from pgpong.rundir import AGENT_FILE, RunDir
from pongtools import compare, judge

pytestmark = pytest.mark.slow


def make(*args, timeout=300):
    return run(["make", *args], clean_env(), timeout=timeout)


def said(made):
    """make's output lines but its own `make: *** [...] Error N`."""
    return [ln for ln in (made.stdout + made.stderr).splitlines() if not ln.startswith("make: ***")]


@pytest.fixture(scope="module")
def shipped(tiny_run, tmp_path_factory):
    """`make ship` of the tiny run into a temp folder: (the make output, the agent folder, the images folder)."""
    root = tmp_path_factory.mktemp("ship")
    made = make("ship", f"RUN={tiny_run[1]}", f"SHIP_DIR={root / 'agent'}", f"IMAGES_DIR={root / 'images'}")
    assert made.returncode == 0, made.stdout + made.stderr
    return made.stdout, root / "agent", root / "images"


def test_ship_writes_float16_weights_that_play_and_the_whole_metrics(tiny_run, shipped):
    out, agent_dir, images = shipped
    [line] = map(fields, only(out, "ship "))
    original = RunDir(tiny_run[1]).load("ckpt-000001.npz")
    agent = RunDir(agent_dir).load_weights(AGENT_FILE)
    assert agent.cache is None and agent.update == original.update == int(line["update"])
    assert agent.config == original.config and agent.running_reward == original.running_reward
    for k, w in original.params.items():
        assert agent.params[k].dtype == np.float32 and agent.params[k].shape == w.shape
        np.testing.assert_array_equal(agent.params[k], w.astype(np.float16).astype(np.float32))
    assert (agent_dir / AGENT_FILE).stat().st_size < 0.4 * (tiny_run[1] / "ckpt-000001.npz").stat().st_size
    shipped_metrics = [
        json.loads(x) for x in gzip.decompress((agent_dir / "metrics.jsonl.gz").read_bytes()).splitlines()
    ]
    assert shipped_metrics == RunDir(tiny_run[1]).metrics()
    assert RunDir(agent_dir).metrics() == shipped_metrics  # make plot RUN=<agent folder> reads them
    assert (images / "agent-curve.png").stat().st_size > 0 and (images / "agent-game.gif").stat().st_size > 0
    [played] = map(fields, only(out, "play "))
    assert played["checkpoint"] == str(agent_dir / AGENT_FILE) and played["games"] == "1"


def test_make_play_with_checkpoint_shipped_plays_the_shipped_agent(shipped, tmp_path):
    _, agent_dir, _ = shipped
    made = make("play", "CHECKPOINT=shipped", f"SHIP_DIR={agent_dir}", "GAMES=1", f"ARGS=--out {tmp_path / 'g.gif'}")
    assert made.returncode == 0, made.stdout + made.stderr
    first = fields(made.stdout.splitlines()[0])
    assert made.stdout.startswith("checkpoint ") and first["path"] == str(agent_dir / AGENT_FILE), made.stdout
    [summary] = map(fields, only(made.stdout, "play "))
    assert summary["checkpoint"] == str(agent_dir / AGENT_FILE)
    [game] = map(fields, only(made.stdout, "game="))
    assert float(summary["mean_point_difference"]) == int(game["reward"])


def test_make_play_and_judge_without_a_checkpoint_take_the_latest_run_and_say_so_first(tiny_run, tmp_path):
    """Without CHECKPOINT: the newest checkpoint of the run written last among RUNS_IN's run dirs (make
    train's <folder>/<time>) and OUTs (make run's <folder>/<time>/run), named on the first line."""
    older, newer = tmp_path / "train" / "20260101-000000", tmp_path / "out" / "20260102-000000" / "run"
    for run_dir in (older, newer):
        shutil.copytree(tiny_run[1], run_dir)
    (newer / "ckpt-000001.npz").rename(newer / "ckpt-000003.npz")
    os.utime(older / "ckpt-000001.npz", (2e9, 2e9))  # the newest checkpoint: the run dir named later loses
    os.utime(newer / "ckpt-000003.npz", (1e9, 1e9))
    runs_in = f"RUNS_IN={tmp_path / 'out'} {tmp_path / 'train'}"
    played = make("play", runs_in, "GAMES=1", f"ARGS=--out {tmp_path / 'g.gif'}")
    judged = make("judge", runs_in, "ARGS=--seeds 0 --games 1 --need 0 --processes 1", timeout=600)
    for made in (played, judged):
        assert made.returncode == 0, made.stdout + made.stderr
        first = fields(made.stdout.splitlines()[0])
        assert made.stdout.startswith("checkpoint "), made.stdout
        assert (first["path"], first["update"], first["chosen"]) == (str(older / "ckpt-000001.npz"), "1", "latest")
    [verdict] = map(fields, only(judged.stdout, "judge "))
    assert verdict["checkpoint"] == str(older / "ckpt-000001.npz")
    os.utime(newer / "ckpt-000003.npz", (3e9, 3e9))
    played = make("play", runs_in, "GAMES=1", f"ARGS=--out {tmp_path / 'g.gif'}")
    assert fields(played.stdout.splitlines()[0])["path"] == str(newer / "ckpt-000003.npz"), played.stdout


@pytest.mark.parametrize("folder, batch_size", [("agent", 300), ("agent-b50", 50)])
def test_the_committed_agents_load_whole_and_play(folder, batch_size, tmp_path):
    """job/tools/runs/agent (batch 300's, `make play CHECKPOINT=shipped` plays it) and agent-b50 (the batch-50
    agent shipped before it) as committed: float16 weights and every metrics line up to their update.
    A trained agent scores: an untrained one takes 0-2 points a game off the built-in AI, these won 169
    and 163 of 200 games (docs/history.md)."""
    shipped = REPO / "job" / "tools" / "runs" / folder
    agent = RunDir(shipped).load_weights(AGENT_FILE)
    assert agent.cache is None and agent.config["batch_size"] == batch_size, agent.config
    assert [m["update"] for m in RunDir(shipped).metrics()] == list(range(1, agent.update + 1))
    chosen = ["CHECKPOINT=shipped"] if folder == "agent" else [f"CHECKPOINT={shipped}"]
    made = make("play", "GAMES=1", *chosen, f"ARGS=--out {tmp_path / 'g.gif'}")
    assert made.returncode == 0, made.stdout + made.stderr
    [summary] = map(fields, only(made.stdout, "play "))
    assert summary["checkpoint"] == str(shipped / AGENT_FILE) and summary["update"] == str(agent.update)
    assert int(summary["agent_points"]) >= 5, summary


@pytest.mark.parametrize("target", ["play", "judge"])
def test_make_play_and_judge_without_a_run_or_a_shipped_agent_say_which_to_name(target, tmp_path):
    """No run with a checkpoint in RUNS_IN (a run dir without one does not count), or CHECKPOINT=shipped and
    no agent in SHIP_DIR: one line, exit 2, saying what to name."""
    (tmp_path / "20260101-000000").mkdir()
    made = make(target, f"RUNS_IN={tmp_path} {tmp_path / 'none'}", f"SHIP_DIR={tmp_path}")
    assert made.returncode == 2 and len(said(made)) == 1, made.stdout + made.stderr
    assert f"no run with a checkpoint in {tmp_path} or {tmp_path / 'none'}" in made.stderr, made.stderr
    assert "pass CHECKPOINT=" in made.stderr and "CHECKPOINT=shipped" in made.stderr, made.stderr
    made = make(target, "CHECKPOINT=shipped", f"SHIP_DIR={tmp_path}")
    assert made.returncode == 2 and len(said(made)) == 1, made.stdout + made.stderr
    assert f"there is no shipped agent in {tmp_path}" in made.stderr and "pass CHECKPOINT=" in made.stderr


def test_make_judge_plays_make_plays_games_and_gives_the_criterions_verdict(tiny_run, tmp_path):
    """`make judge` at two seeds, one game each: each seed's points are those `make play` scores at that
    seed, and the verdict follows from them. The tiny run's barely trained checkpoint loses."""
    made = make("judge", "CHECKPOINT=shipped", "ARGS=--seeds 3-4 --games 1 --need 2 --processes 2", timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    per_seed = {ln["seed"]: ln for ln in map(fields, only(made.stdout, "seed="))}
    assert sorted(per_seed) == ["3", "4"]
    for seed, line in per_seed.items():
        played = make("play", "CHECKPOINT=shipped", "GAMES=1", f"ARGS=--seed {seed} --out {tmp_path / 'g.gif'}")
        [summary] = map(fields, only(played.stdout, "play "))
        assert (line["agent_points"], line["computer_points"]) == (summary["agent_points"], summary["computer_points"])
    [verdict] = map(fields, only(made.stdout, "judge "))
    points = [(int(ln["agent_points"]), int(ln["computer_points"]), 1) for ln in per_seed.values()]
    mean, above, beats = judge.verdict(points, 2)
    assert verdict["verdict"] == ("beats_ai" if beats else "not_yet")
    assert (verdict["seeds"], verdict["games"], int(verdict["seeds_above_0"])) == ("3-4", "2", above)
    assert float(verdict["mean_point_difference"]) == pytest.approx(mean, abs=1e-3)
    untrained = make("judge", f"CHECKPOINT={tiny_run[1]}", "ARGS=--seeds 0 --games 1 --need 0", timeout=600)
    assert untrained.returncode == 0, untrained.stderr
    [verdict] = map(fields, only(untrained.stdout, "judge "))
    assert verdict["verdict"] == "not_yet" and float(verdict["mean_point_difference"]) < 0, verdict


def test_the_verdict_needs_a_mean_above_0_and_enough_seeds_above_0():
    """The criterion: the mean point difference over every game above 0, and at least `need` seeds above 0."""
    assert judge.verdict([(30, 20, 10), (21, 20, 10)], 2) == (0.55, 2, True)
    assert judge.verdict([(40, 20, 10), (20, 21, 10)], 2) == (0.95, 1, False)  # one seed lost
    assert judge.verdict([(40, 20, 10), (20, 21, 10)], 1)[2]
    assert not judge.verdict([(21, 20, 10), (20, 21, 10)], 1)[2]  # mean 0: not above
    assert judge.parse_seeds("300-302,7,0-1") == [0, 1, 7, 300, 301, 302]
    for bad in ("3-1", "a", "1-", "-1", ""):
        with pytest.raises(ValueError):
            judge.parse_seeds(bad)


def test_ship_refuses_a_run_without_checkpoints(tmp_path):
    proc = run(["python", "-m", "pongtools.ship", str(tmp_path)], clean_env(), timeout=60)
    assert proc.returncode == 2 and "holds no checkpoint" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_ship_metrics_only_keeps_what_a_comparison_reads_and_no_weights(tiny_run, tmp_path):
    """A run kept to compare (learning_rates.json's runs) needs its config and metrics, not 2.4 MB of
    weights: --metrics-only writes run.json instead, and compare reads the run as it reads the trainer's."""
    out = tmp_path / "lean"
    proc = run(["python", "-m", "pongtools.ship", str(tiny_run[1]), "--metrics-only", "--out", str(out)], clean_env())
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl.gz", "run.json"]
    [line] = map(fields, only(proc.stdout, "ship "))
    assert (line["agent"], line["run_record"]) == ("none", str(out / "run.json"))
    original, lean = RunDir(tiny_run[1]), RunDir(out)
    assert lean.config() == (original.config()[0], "config of run.json")
    assert lean.metrics() == original.metrics()
    assert compare.summary(lean, [2]) == compare.summary(original, [2]) | {"run": "lean"}
    played = run(["python", "-m", "pongtools.play", str(out), "--games", "1"], clean_env(), timeout=60)
    assert played.returncode == 2 and "without weights" in played.stderr and "nothing to play" in played.stderr
    assert len(played.stderr.strip().splitlines()) == 1, played.stderr


def test_compare_reads_each_runs_reward_at_the_milestones(tiny_run):
    records = RunDir(tiny_run[1]).metrics()
    row = compare.summary(RunDir(tiny_run[1]), [1, 2, 3])
    assert row["batch_size"] == 2 and row["episodes"] == 2 and row["updates"] == 1
    assert row[1] == row[2] == (records[0]["running_reward"], 1) and row[3] is None
    made = make("compare", f"RUNS={tiny_run[1]}", "AT=1,5")
    assert made.returncode == 0, made.stderr
    [line] = map(fields, only(made.stdout, "compare "))
    assert line["at_1"] == f"{records[0]['running_reward']:.2f}@u1" and line["at_5"] == "-"


def test_compare_labels_each_run_in_the_order_given_whatever_the_order_drawn(tmp_path, monkeypatch, capsys):
    """--label names a run in --plot's legend (the batch-50 agent's config holds only its last rate); the
    rows are sorted by batch size, and each label must stay with its own run."""
    runs = [str(REPO / "job" / "tools" / "runs" / "lr" / n) for n in ("b300-lr0.001", "b50-lr0.002")]
    png, drawn = tmp_path / "curves.png", []
    real_plot = compare.plot
    monkeypatch.setattr(compare, "plot", lambda rows, out: drawn.extend(real_plot(rows, out)))
    compare.main([*runs, "--at", "1500", "--plot", str(png), "--label", "three hundred", "--label", "fifty"])
    assert drawn == ["fifty", "three hundred"] and png.stat().st_size > 20_000
    with pytest.raises(SystemExit) as exit_:
        compare.main([*runs, "--plot", str(png), "--label", "only one"])
    assert exit_.value.code == 2 and "1 --label for 2 runs" in capsys.readouterr().err


def test_compare_puts_batch_sizes_side_by_side_by_episodes_and_by_updates(tmp_path):
    """Two committed runs of batch 50 and 300: the same updates are 6x the episodes at batch 300."""
    runs = [REPO / "job" / "tools" / "runs" / "lr" / n for n in ("b50-lr0.002", "b300-lr0.001")]
    png = tmp_path / "curves.png"
    made = make("compare", f"RUNS={' '.join(map(str, runs))}", "AT=1500", f"ARGS=--at-updates 5 --plot {png}")
    assert made.returncode == 0, made.stderr
    lines = {ln["batch_size"]: ln for ln in map(fields, only(made.stdout, "compare "))}
    for batch, path in zip(("50", "300"), runs, strict=True):
        records = RunDir(path).metrics()
        assert lines[batch]["at_update_5"] == f"{records[4]['running_reward']:.2f}"
        assert lines[batch]["at_1500"] == "{:.2f}@u{}".format(*compare.at_episodes(records, 1500))
        assert lines[batch]["rmsprop_start"] == "zero"  # made before the field: pg-pong's
    assert lines["300"]["at_1500"].endswith("@u5") and lines["50"]["at_1500"].endswith("@u30")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_at_episodes_takes_the_first_update_that_reached_the_milestone():
    records = [{"update": u, "total_episodes": 10 * u, "running_reward": -21 + u} for u in range(1, 6)]
    assert compare.at_episodes(records, 10) == (-20, 1)
    assert compare.at_episodes(records, 11) == (-19, 2)
    assert compare.at_episodes(records, 50) == (-16, 5)
    assert compare.at_episodes(records, 51) is None


def test_sweep_trains_each_setting_to_the_episodes_then_resumes_with_nothing_left(tmp_path):
    """Two settings, the second with its own RMSProp decay; --rmsprop-start reaches every setting."""
    root = tmp_path / "lr"
    args = ["--root", str(root), "--episodes", "3", "--workers", "1", "--rmsprop-start", "zero", "2:1e-3", "3:2e-3:0.9"]
    first = run_cli_module("pongtools.sweep", *args)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    sweeps = [fields(x) for x in only(first.stdout, "sweep run=")]
    assert [(s["batch_size"], s["updates"], s["left"]) for s in sweeps] == [("2", "2", "2"), ("3", "1", "1")]
    for name, batch, updates, decay in (("b2-lr0.001", 2, 2, 0.99), ("b3-lr0.002-d0.9", 3, 1, 0.9)):
        run = RunDir(root / name)
        state = run.load(run.checkpoints()[0])
        assert (state.update, state.episodes, state.config["batch_size"]) == (updates, batch * updates, batch)
        assert (state.config["rmsprop_start"], state.config["rmsprop_decay"]) == ("zero", decay)
    again = run_cli_module("pongtools.sweep", *args)
    assert again.returncode == 0 and "start " not in again.stdout  # nothing trained the second time
    assert [fields(x)["left"] for x in only(again.stdout, "sweep run=")] == ["0", "0"]


def test_a_bad_sweep_setting_is_one_line_and_exit_2():
    for bad in ("300", "300:1e-2:1.5", "300:x"):
        proc = run_cli_module("pongtools.sweep", bad)
        assert proc.returncode == 2 and "must be BATCH:RATE" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def run_cli_module(module, *args):
    """python -m <module> ARGS with the tools on the path, unbuffered, on the suite's Ray head."""
    return run(["python", "-m", module, *args], trainer_env(), timeout=600)
