"""Watching a run: the log's trend line, Ray's live metrics, and `make plot` / `make play` on a real tiny run."""

import json
import shutil
import time
import urllib.request
import uuid

import pytest
from harness import REPO, clean_env, fields, only, run
from pgpong import watch
from PIL import Image
from pongtools import play, plot

METRICS_TIMEOUT_S = 60  # Ray's metrics agent exports what the driver recorded every ~10 s


# -- the trend line ----------------------------------------------------------------


def test_sparkline_of_a_rising_series_rises():
    line = watch.sparkline(list(range(100)))
    assert len(line) == watch.TREND_WIDTH
    heights = [watch.LEVELS.index(c) for c in line]
    assert heights == sorted(heights) and heights[0] == 0 and heights[-1] == len(watch.LEVELS) - 1
    falling = watch.sparkline(list(range(100, 0, -1)))
    assert falling == "".join(reversed(line))


@pytest.mark.parametrize("values", [[-21.0] * 7, [3.5], [-21, -20, -19], list(range(1000)), [0.1] * 500 + [0.2]])
def test_sparkline_is_fixed_width_ascii_without_spaces(values):
    line = watch.sparkline(values)
    assert len(line) == watch.TREND_WIDTH
    assert line.isascii() and line.isprintable() and " " not in line
    assert set(line) <= set(watch.LEVELS)
    if len(set(values)) == 1:
        assert len(set(line)) == 1  # flat input, flat line


def test_trend_line_is_one_parseable_key_value_line():
    line = watch.trend_line(50, [-21.0, -20.5, -20.25, -20.3])
    assert line.startswith("trend ") and "\n" not in line
    words = line.split()[1:]
    assert all(w.count("=") >= 1 for w in words)  # every value without spaces
    got = fields(line)
    assert got["update"] == "50" and got["running_reward"] == "-21..-20.3"
    assert (got["low"], got["high"]) == ("-21", "-20.25")
    assert len(got["spark"]) == watch.TREND_WIDTH and got["spark"].isascii()


# -- Ray's metrics -------------------------------------------------------------------


def scrape(port, run_tag):
    """{sample name: value} of the samples tagged run=run_tag on a node's Prometheus endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    return {
        s.name: s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.labels.get("run") == run_tag
    }


@pytest.mark.slow
def test_live_metrics_reach_the_nodes_prometheus_endpoint(local_ray):
    """What the driver sets after an update is what Prometheus scrapes from the node's metrics agent."""
    run_tag = f"test-{uuid.uuid4().hex[:8]}"
    live = watch.LiveMetrics(run_tag)
    rec = {
        "update": 7,
        "episodes": 4,
        "running_reward": -20.25,
        "reward_mean": -19.5,
        "env_steps_per_s": 1234.5,
        "seconds": 2.5,
    }
    live.record(rec)
    live.record(rec | {"update": 8, "running_reward": -20.0})  # a gauge keeps the last value, a counter adds
    expected = {
        "ray_pong_running_reward": -20.0,
        "ray_pong_reward_mean": -19.5,
        "ray_pong_update": 8.0,
        "ray_pong_env_steps_per_s": 1234.5,
        "ray_pong_update_seconds": 2.5,
        "ray_pong_episodes_total": 8.0,
    }
    [node] = [n for n in local_ray.nodes() if n["Alive"]]
    port = node["MetricsExportPort"]
    assert port > 0, "this Ray node exports no metrics (is ray[default] installed?)"
    got, deadline = {}, time.monotonic() + METRICS_TIMEOUT_S
    while time.monotonic() < deadline:
        got = scrape(port, run_tag)
        if all(name in got for name in expected):
            break
        time.sleep(1)
    assert got == expected, f"samples tagged run={run_tag} on port {port}: {got}"


# -- plot and play on a real run ---------------------------------------------------------


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    """A copy of the tiny run that a test may change."""
    return shutil.copytree(tiny_run[1], tmp_path / "run")


def make(*args):
    return run(["make", *args], clean_env(), timeout=300)


@pytest.mark.slow
def test_the_trainer_ends_with_a_trend_line(tiny_run):
    stdout, _ = tiny_run
    [trend] = only(stdout, "trend ")  # one update: no line at TREND_EVERY, one at the end
    first, last = fields(trend)["running_reward"].split("..")
    assert fields(trend)["update"] == "1" and first == last
    [update] = only(stdout, "update=1 ")
    assert float(last) == pytest.approx(float(fields(update)["running_reward"]), abs=0.01)
    assert stdout.index("trend ") < stdout.index("done ")


@pytest.mark.slow
def test_make_plot_draws_the_run_and_skips_a_half_written_line(run_copy):
    made = make("plot", f"RUN={run_copy}")
    assert made.returncode == 0, made.stdout + made.stderr
    [line] = only(made.stdout, "plot ")
    assert fields(line)["out"] == str(run_copy / "curve.png") and fields(line)["updates"] == "1"
    with Image.open(run_copy / "curve.png") as png:
        assert png.size == (plot.SIZE_IN[0] * plot.DPI, plot.SIZE_IN[1] * plot.DPI)

    # a run in progress: one more whole line, then one the trainer is still writing
    metrics = run_copy / "metrics.jsonl"
    first = json.loads(metrics.read_text().splitlines()[0])
    second = json.dumps(first | {"update": 2, "running_reward": -20.9, "total_seconds": 2 * first["total_seconds"]})
    third = json.dumps(first | {"update": 3})
    with open(metrics, "a") as f:
        f.write(second + "\n" + third[: len(third) // 2])
    out = run_copy / "elsewhere" / "cut.png"
    made = make("plot", f"RUN={run_copy}")
    assert made.returncode == 0, made.stdout + made.stderr
    assert fields(only(made.stdout, "plot ")[0])["last_update"] == "2"
    plotted = run(["python", "-m", "pongtools.plot", str(run_copy), "--out", str(out)], clean_env())
    assert plotted.returncode == 0 and out.stat().st_size > 0, plotted.stderr


@pytest.mark.slow
def test_make_play_prints_each_score_a_summary_and_writes_a_gif_and_its_last_screen(run_copy):
    made = make("play", f"CHECKPOINT={run_copy / 'ckpt-000001.npz'}", "GAMES=2")
    assert made.returncode == 0, made.stdout + made.stderr
    games = only(made.stdout, "game=")
    assert [fields(g)["game"] for g in games] == ["1", "2"], made.stdout
    for g in map(fields, games):
        agent, computer = int(g["agent"]), int(g["computer"])
        assert agent + computer == int(g["points"]) and agent - computer == int(g["reward"])
        assert max(agent, computer) == 21 and min(agent, computer) < 21  # a game of Pong ends at 21
    [summary] = map(fields, only(made.stdout, "play "))
    assert int(summary["agent_points"]) == sum(int(fields(g)["agent"]) for g in games)
    assert int(summary["computer_points"]) == sum(int(fields(g)["computer"]) for g in games)
    rewards = [int(fields(g)["reward"]) for g in games]
    assert float(summary["mean_point_difference"]) == pytest.approx(sum(rewards) / 2)
    assert int(summary["games_won"]) == sum(r > 0 for r in rewards)
    assert summary["gif"] == str(run_copy / "play-000001.gif") and summary["policy"] == "greedy"
    size = (160 * 2, 210 * 2)  # the Atari screen, upscaled 2x
    with Image.open(summary["gif"]) as gif:
        assert gif.size == size and gif.is_animated
        assert 100 < gif.n_frames <= int(summary["gif_frames"]) <= play.MAX_GIF_FRAMES
    with Image.open(summary["png"]) as png, Image.open(summary["gif"]) as gif:
        assert png.size == size
        # the PNG is the game's last screen (the final score), not the GIF's opening picture
        assert png.convert("RGB").tobytes() != gif.convert("RGB").tobytes()
    assert 0 < (run_copy / "play-000001.gif").stat().st_size < 5 * 2**20


@pytest.mark.slow
def test_a_seed_replays_the_same_games_under_either_policy(tiny_run, tmp_path, capsys):
    """Greedy by default, sampled on request; either way the same seed plays the same game."""
    ckpt = str(tiny_run[1] / "ckpt-000001.npz")

    def one_game(*policy):
        play.main([ckpt, "--games", "1", "--seed", "5", "--out", str(tmp_path / "game.gif"), *policy])
        out = capsys.readouterr().out
        [game], [summary] = only(out, "game="), only(out, "play ")
        del (game := fields(game))["seconds"]
        return game, fields(summary)["policy"]

    greedy, sampled = one_game(), one_game("--policy", "sampled")
    assert greedy[1] == "greedy" and sampled[1] == "sampled"
    assert one_game("--policy", "greedy") == greedy and one_game("--policy", "sampled") == sampled
    assert greedy[0]["steps"] != sampled[0]["steps"]  # the policy changed the game, not the env's draws
    assert max(int(greedy[0]["agent"]), int(greedy[0]["computer"])) == 21


@pytest.mark.slow
def test_plot_and_play_read_a_run_dir_on_s3(tiny_run, s3, tmp_path, capsys):  # noqa: F811
    _, run_dir = tiny_run
    for name in ("metrics.jsonl", "ckpt-000001.npz"):
        s3.put_object(Bucket="runs", Key=f"exp/tiny/{name}", Body=(run_dir / name).read_bytes())
    plot.main(["s3://runs/exp/tiny", "--out", str(tmp_path / "curve.png")])
    play.main(["s3://runs/exp/tiny", "--games", "1", "--out", str(tmp_path / "game.gif")])
    out = capsys.readouterr().out
    assert fields(only(out, "plot ")[0])["updates"] == "1"
    assert fields(only(out, "play ")[0])["checkpoint"] == "s3://runs/exp/tiny/ckpt-000001.npz"
    assert (tmp_path / "curve.png").stat().st_size > 0 and (tmp_path / "game.png").stat().st_size > 0


@pytest.mark.parametrize(
    "command, message",
    [
        (["pongtools.plot", "/nonexistent/run"], "error: run dir /nonexistent/run does not exist"),
        (["pongtools.play", "/nonexistent/ckpt-000001.npz"], "error: no checkpoint at /nonexistent/ckpt-000001.npz"),
        (["pongtools.play", str(REPO / "tests")], "holds no checkpoint (ckpt-NNNNNN.npz) yet"),
        (["pongtools.play", "x.npz", "--games", "0"], "argument --games: must be a whole number >= 1, not '0'"),
        (["pongtools.play", "x.npz", "--policy", "best"], "argument --policy: invalid choice: 'best'"),
    ],
)
def test_a_wrong_path_is_one_line_and_exit_2(command, message):
    proc = run(["python", "-m", *command], clean_env(), timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == "", proc.stderr
