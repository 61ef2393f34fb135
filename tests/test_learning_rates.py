"""--learning-rate auto: the rule in pgpong/learning_rates.json, the measurements behind it, and the flag."""

import dataclasses
import json
import math

import pytest
from harness import REPO
from pgpong import config
from pgpong.rundir import RunDir
from pongtools import compare

with open(config.RATES_FILE) as f:
    TABLE = json.load(f)
RUNS = TABLE["runs"]
RULES = TABLE["rules"]


def run_id(e):
    return f"{e['rmsprop_start']}-d{e['rmsprop_decay']:g}-b{e['batch_size']}-lr{e['learning_rate']:g}-s{e['seed']}"


@pytest.mark.parametrize("entry", RUNS, ids=run_id)
def test_every_figure_of_the_table_is_its_runs_committed_metrics(entry):
    """The table is what the runs measured: recomputed here from each run's committed metrics and
    config, at the episodes its rule compares runs of that batch size."""
    run = RunDir(REPO / entry["run"])
    records = run.metrics()
    made_with = config.OPTIMIZER_BEFORE_FIELDS | run.config()[0]  # runs from before the fields: pg-pong's
    for key in ("batch_size", "learning_rate", "seed", "rmsprop_start", "rmsprop_decay"):
        assert made_with[key] == entry[key], f"{entry['run']} was made with {key}={made_with[key]!r}"
    episodes = RULES[entry["rmsprop_start"]]["milestones"][str(entry["batch_size"])]
    assert entry["episodes"] == episodes
    at = compare.at_episodes(records, episodes)
    assert at is not None, f"{entry['run']} never reached {episodes} episodes"
    assert (round(at[0], 2), at[1]) == (entry["running_reward"], entry["update"])


@pytest.mark.parametrize("start", sorted(RULES))
def test_the_rule_is_the_best_measured_rate_at_each_batch_size(start):
    """Of the runs with this start, seed 0, the best rate and decay at each batch size."""
    rule = RULES[start]
    best = {}
    for e in RUNS:
        if (e["rmsprop_start"], e["seed"]) != (start, 0):
            continue
        if e["batch_size"] not in best or e["running_reward"] > best[e["batch_size"]]["running_reward"]:
            best[e["batch_size"]] = e
    assert sorted(rule["points"]) == sorted([b, e["learning_rate"], e["rmsprop_decay"]] for b, e in best.items())
    if start == config.Config().rmsprop_start:  # the default's rule, the one every run without flags takes
        assert len(best) >= 3, "measure at least a small, a middle and a large batch size"
        assert sum(e["batch_size"] == 300 for e in RUNS if e["rmsprop_start"] == start) >= 2, "two rates at 300"
    assert len(best) >= 2
    for b, rate, decay in rule["points"]:  # what a run without flags at that batch size trains with
        cfg = config.Config(batch_size=b, rmsprop_start=start)
        assert (cfg.learning_rate, cfg.rmsprop_decay) == (rate, decay)


@pytest.mark.parametrize("start", sorted(RULES))
def test_auto_goes_through_each_point_and_in_straight_lines_between_them_on_log_axes(start):
    points = config.learning_rate_rule(start)
    for b, r in points:
        assert config.auto_learning_rate(b, start) == r
    assert config.auto_learning_rate(1, start) == points[0][1]  # outside the measured range: the nearest point
    assert config.auto_learning_rate(10 * points[-1][0], start) == points[-1][1]
    for (b0, r0), (b1, r1) in zip(points, points[1:], strict=False):
        mid = round(math.sqrt(b0 * b1))
        expected = math.exp(math.log(r0) + math.log(mid / b0) / math.log(b1 / b0) * math.log(r1 / r0))
        assert config.auto_learning_rate(mid, start) == pytest.approx(expected, rel=1e-2)
        assert min(r0, r1) <= config.auto_learning_rate(mid, start) <= max(r0, r1)


@pytest.mark.parametrize("start", sorted(RULES))
def test_auto_decay_goes_through_each_point_and_scales_one_minus_decay_on_log_axes_between(start):
    points = config.rule(start)
    for b, _, decay in points:
        assert config.auto_rmsprop_decay(b, start) == decay
    assert config.auto_rmsprop_decay(1, start) == points[0][2]
    assert config.auto_rmsprop_decay(10 * points[-1][0], start) == points[-1][2]
    for (b0, _, d0), (b1, _, d1) in zip(points, points[1:], strict=False):
        mid = round(math.sqrt(b0 * b1))
        expected = math.exp(math.log(1 - d0) + math.log(mid / b0) / math.log(b1 / b0) * math.log((1 - d1) / (1 - d0)))
        assert 1 - config.auto_rmsprop_decay(mid, start) == pytest.approx(expected, rel=1e-2)


@pytest.mark.parametrize(
    "argv, decay",
    [
        ([], config.auto_rmsprop_decay(300)),
        (["--batch-size", "10"], config.auto_rmsprop_decay(10)),
        (["--rmsprop-decay", "auto", "--batch-size", "50"], config.auto_rmsprop_decay(50)),
        (["--rmsprop-decay", "0.99"], 0.99),  # pg-pong's, one flag away
        (["--rmsprop-start", "zero"], config.auto_rmsprop_decay(300, "zero")),
    ],
)
def test_the_decay_defaults_to_auto_and_a_number_always_wins(argv, decay):
    assert config.parse_args(argv).rmsprop_decay == decay


@pytest.mark.parametrize(
    "argv, rate, rule",
    [
        ([], config.auto_learning_rate(300), "auto"),
        (["--batch-size", "10"], config.auto_learning_rate(10), "auto"),
        (["--learning-rate", "auto", "--batch-size", "50"], config.auto_learning_rate(50), "auto"),
        (["--learning-rate", "1e-4"], 1e-4, "given"),  # Karpathy's, one flag away
        (["--learning-rate", "3e-3", "--batch-size", "10"], 3e-3, "given"),
        (["--rmsprop-start", "zero"], config.auto_learning_rate(300, "zero"), "auto"),  # pg-pong's start, its rule
    ],
)
def test_the_flag_defaults_to_auto_and_a_number_always_wins(argv, rate, rule):
    cfg = config.parse_args(argv)
    assert (cfg.learning_rate, cfg.learning_rate_rule) == (rate, rule)
    assert isinstance(cfg.learning_rate, float)


def test_a_resumed_run_keeps_its_own_rate_unless_one_is_given(capsys):
    made = dataclasses.asdict(config.Config(batch_size=300, learning_rate=1e-4))  # an old run, Karpathy's rate
    kept = config.keep_learning_rate(config.Config(batch_size=300), made)
    assert (kept.learning_rate, kept.learning_rate_rule) == (1e-4, "kept")
    assert "resuming with the run's own learning_rate=0.0001" in capsys.readouterr().out
    given = config.Config(batch_size=300, learning_rate=2e-3)
    assert config.keep_learning_rate(given, made) == given  # the flag wins
    same = config.Config(batch_size=300)
    assert config.keep_learning_rate(same, dataclasses.asdict(same)) == same


def test_between_two_decays_one_minus_decay_grows_with_the_batch_as_malladi_scales_it(tmp_path, monkeypatch):
    """Batch 50 at 0.99 and batch 300 at 0.94 (1 - decay x6 for x6 the batch): in between, 1 - decay
    in proportion to the batch, as Malladi et al. 2022 scale it; the rate on its own log-log line."""
    rules = {"rules": {"corrected": {"points": [[50, 0.004, 0.99], [300, 0.01, 0.94]]}}}
    (tmp_path / "rates.json").write_text(json.dumps(rules))
    monkeypatch.setattr(config, "RATES_FILE", str(tmp_path / "rates.json"))
    config.rule.cache_clear()
    try:
        assert [config.auto_rmsprop_decay(b, "corrected") for b in (10, 50, 100, 150, 300, 600)] == [
            0.99,
            0.99,
            0.98,
            0.97,
            0.94,
            0.94,
        ]
        assert config.auto_learning_rate(100, "corrected") == float(
            f"{0.004 * (0.01 / 0.004) ** (math.log(2) / math.log(6)):.3g}"
        )
        assert config.Config(batch_size=150, rmsprop_start="corrected").rmsprop_decay == 0.97
    finally:
        config.rule.cache_clear()
