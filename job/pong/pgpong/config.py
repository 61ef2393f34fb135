"""The trainer's one config object. Each field's help text is its CLI help."""

import argparse
import bisect
import dataclasses
import functools
import json
import math
import os
import time

from . import cli, store

DEFAULT_RUNS = "~/pong-runs"
KARPATHY_LEARNING_RATE = 1e-4  # pg-pong's own step size: the reference, one flag away
DECAY_RATE = 0.99  # pg-pong's RMSProp decay of the squared-gradient average
# RMSProp's start when --rmsprop-start is not given: the corrected one, ahead of pg-pong's zero
# start at batch 10 and 300 and level at 50 (docs/history.md, "RMSProp's first steps").
DEFAULT_START = "corrected"
# The optimizer fields of a run made before they existed: pg-pong's zero start and decay.
OPTIMIZER_BEFORE_FIELDS = {"rmsprop_start": "zero", "rmsprop_decay": DECAY_RATE}
# What a resumed run keeps from its checkpoint, since it decides the run's bits, and the value of
# a run made before the field existed (None: every checkpoint has it). The env must match instead
# (run.MUST_MATCH); the learning rate is kept unless --learning-rate is given (train.keep_learning_rate).
KEPT_ON_RESUME = {"batch_size": None, "seed": None, **OPTIMIZER_BEFORE_FIELDS}
RATES_FILE = os.path.join(os.path.dirname(__file__), "learning_rates.json")
# The run's end when --updates is not given: batch 300 at the defaults met the play criterion (it beats the
# built-in AI: pongtools.judge) by update 40 with seed 0 and by 44 with seed 1 (docs/results.md), and the
# shipped agent, update 56, won 169 of 200 games; 60 leaves a third more than the later of the two. So a job
# submitted as typed (`make submit JOB=pong`) trains an agent that wins, then ends. --updates 0 runs until
# stopped, only when asked for.
DEFAULT_UPDATES = 60


@dataclasses.dataclass(frozen=True)
class Config:
    batch_size: int = dataclasses.field(default=300, metadata={"help": "episodes per policy update"})
    updates: int = dataclasses.field(
        default=DEFAULT_UPDATES,
        metadata={
            "help": "updates to run now (a resumed run: that many more); 0 runs until stopped. The default: batch "
            "300 beat the built-in AI by update 40 and 44 (seeds 0 and 1)"
        },
    )
    workers: str = dataclasses.field(
        default="auto",
        metadata={
            "help": "rollout actors (one CPU each); auto = one per CPU of the cluster, up to the batch size, "
            "training from the first that answers and following the nodes as they join and leave"
        },
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "seeds the weights and every episode"})
    env: str = dataclasses.field(default="Pong-v0", metadata={"help": "ALE env id, e.g. Pong-v0 or ALE/Pong-v5"})
    learning_rate: float = dataclasses.field(
        default="auto",
        metadata={
            "help": "RMSProp step size: a number, or auto = the rule measured for the batch size "
            f"(pgpong/learning_rates.json); {KARPATHY_LEARNING_RATE:g} is Karpathy's"
        },
    )
    # Not a flag: how learning_rate was chosen, "auto" or "given", kept with the run's config.
    learning_rate_rule: str = dataclasses.field(default="given", metadata={"cli": False})
    rmsprop_start: str = dataclasses.field(
        default=DEFAULT_START,
        metadata={
            "help": "RMSProp's first steps: corrected = the squared-gradient average divided by its weight "
            "so far (1 - decay^t, as Adam), zero = pg-pong's zero-started cache, about 10x the rate at first; "
            "a resumed run keeps its own"
        },
    )
    rmsprop_decay: float = dataclasses.field(
        default="auto",
        metadata={
            "help": "RMSProp's decay of the squared-gradient average: a number, or auto = the rule's for the "
            f"batch size and start (pgpong/learning_rates.json); {DECAY_RATE} is pg-pong's; a resumed run keeps its own"
        },
    )
    run_dir: str = dataclasses.field(
        default="",
        metadata={"help": f"checkpoints and metrics.jsonl; reused to resume (default {DEFAULT_RUNS}/<time>)"},
    )
    checkpoint_every: int = dataclasses.field(default=10, metadata={"help": "updates between checkpoints"})
    actor_wait_s: int = dataclasses.field(
        default=300,
        metadata={
            "help": "seconds to wait for the rollout actors to start (each needs a free CPU; with --workers auto, "
            "for the first) before giving up; meanwhile a `starting` line every 30 s says how many answered"
        },
    )

    def __post_init__(self):
        if self.rmsprop_decay == "auto":  # resolved at once too: the checkpoint keeps the number
            object.__setattr__(self, "rmsprop_decay", auto_rmsprop_decay(self.batch_size, self.rmsprop_start))
        if self.learning_rate == "auto":  # resolved once, so the run's config records the number used
            object.__setattr__(self, "learning_rate", auto_learning_rate(self.batch_size, self.rmsprop_start))
            object.__setattr__(self, "learning_rate_rule", "auto")


def _workers(text):
    if text != "auto":
        cli.whole(text, 1)
    return text


def _decay(text):
    if text == "auto":
        return text
    value = float(text)
    if not 0 < value < 1:
        raise ValueError
    return value


def _start(text):
    if text not in ("corrected", "zero"):
        raise ValueError
    return text


def _learning_rate(text):
    return text if text == "auto" else cli.positive(text)


@functools.cache
def rule(start=DEFAULT_START):
    """The rule's points [(batch size, learning rate, decay), ...] by batch size for RMSProp's start
    (Config.rmsprop_start), from RATES_FILE: at each measured batch size, the best run's settings."""
    with open(RATES_FILE) as f:
        points = sorted((int(b), float(r), float(d)) for b, r, d in json.load(f)["rules"][start]["points"])
    if not points or any(r <= 0 or not 0 < d < 1 for _, r, d in points):
        raise ValueError(f"{RATES_FILE} has no usable rule for rmsprop_start={start}")
    return points


def on_log_axes(points, batch_size):
    """points [(batch size, value > 0)] joined by straight lines on log-log axes; outside their
    range, the nearest point's value. 3 significant digits."""
    sizes = [b for b, _ in points]
    if batch_size <= sizes[0]:
        return points[0][1]
    if batch_size >= sizes[-1]:
        return points[-1][1]
    i = bisect.bisect_right(sizes, batch_size)
    (b0, v0), (b1, v1) = points[i - 1], points[i]
    t = math.log(batch_size / b0) / math.log(b1 / b0)
    return float(f"{math.exp(math.log(v0) + t * math.log(v1 / v0)):.3g}")


def learning_rate_rule(start=DEFAULT_START):
    """The rule's [(batch size, learning rate)]."""
    return [(b, r) for b, r, _ in rule(start)]


def auto_learning_rate(batch_size, start=DEFAULT_START):
    """The measured rule: the best learning rate found at each measured batch size, straight
    lines between them on log-log axes, and the nearest measured one outside their range."""
    return on_log_axes(learning_rate_rule(start), batch_size)


def auto_rmsprop_decay(batch_size, start=DEFAULT_START):
    """The decay of the best run at each measured batch size; between them, 1 - decay on straight
    lines on log-log axes, which is Malladi et al.'s scaling (1 - decay in proportion to the batch)
    where the measured points follow it."""
    return round(1 - on_log_axes([(b, 1 - d) for b, _, d in rule(start)], batch_size), 6)


_TYPES = {
    "batch_size": cli.at_least(1),
    "updates": cli.at_least(0),
    "workers": cli.checked(_workers, "'auto' or a whole number >= 1"),
    "seed": cli.at_least(0),
    "learning_rate": cli.checked(_learning_rate, "'auto' or a number > 0"),
    "checkpoint_every": cli.at_least(1),
    "actor_wait_s": cli.at_least(1),
    "rmsprop_start": cli.checked(_start, "'corrected' or 'zero'"),
    "rmsprop_decay": cli.checked(_decay, "'auto' or a number between 0 and 1, e.g. 0.99"),
}


def parser(prog="python -m pgpong.train", defaults=True):
    """The trainer's flags; with defaults=False, a flag not given is left out of the result."""
    p = cli.Parser(prog=prog, description="Train Pong with Karpathy's policy gradient on Ray actors.")
    for f in dataclasses.fields(Config):
        if not f.metadata.get("cli", True):
            continue
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            type=_TYPES.get(f.name, str),
            default=f.default if defaults else argparse.SUPPRESS,
            help=f.metadata["help"] + (f" (default: {f.default})" if f.default != "" else ""),
        )
    return p


def given_flags(argv=None):
    """The config fields named on the command line (argv or sys.argv), whatever their values."""
    return set(vars(parser(defaults=False).parse_args(argv)))


def check(cfg):
    """The trainer's checks of a Config that need no Ray and write nothing: its env is an ALE env, an s3:// run dir
    names a bucket. The trainer runs them first; `make run` and `make submit` run them on the laptop (pongtools),
    before anything is launched or sent. UserError (one line, exit 2) for the first that fails."""
    from . import rollout

    try:
        rollout.check_env_id(cfg.env)
        if cfg.run_dir.startswith("s3://"):
            store.split_url(cfg.run_dir)
    except (rollout.EnvError, store.StoreError) as e:
        raise cli.UserError(str(e)) from None


def too_many_workers(cfg, cpus):
    """The trainer's line refusing --workers N beyond a cluster's CPUs, or None: its own check once Ray answers,
    and `make run`'s on the laptop against the launched YAML's nodes x CPUs."""
    if cfg.workers != "auto" and int(cfg.workers) > cpus:
        return f"--workers {cfg.workers} is more than the cluster's {cpus} CPUs; use --workers auto or fewer"
    return None


def parse_args(argv=None):
    """Config from the command line, its derived fields filled: the learning rate and decay
    (Config.__post_init__) and the run dir, made absolute (or a new one under DEFAULT_RUNS). A bad
    value exits 2 with one line on stderr."""
    args = vars(parser().parse_args(argv))
    args["run_dir"] = store.where(args["run_dir"] or os.path.join(DEFAULT_RUNS, time.strftime("%Y%m%d-%H%M%S")))
    return Config(**args)


def keep_run(cfg, made_with, given):
    """A resumed run keeps what decides its bits (KEPT_ON_RESUME: batch size, seed, optimizer)
    from made_with, the checkpoint's config; a run made before a field existed has its value there.
    Another value named on the command line would make a different run under the same name: refused (UserError).
    (cfg, {field: value kept})."""
    kept = {k: made_with.get(k, before) for k, before in KEPT_ON_RESUME.items()}
    kept = {k: v for k, v in kept.items() if v is not None}
    for key, value in kept.items():
        if key in given and getattr(cfg, key) != value:
            flag = "--" + key.replace("_", "-")
            raise cli.UserError(
                f"{cfg.run_dir} was made with {flag} {value} and a resumed run keeps it; "
                f"leave out {flag}, or start a new run with another --run-dir"
            )
    cfg = dataclasses.replace(cfg, **kept)
    if cfg.learning_rate_rule == "auto":  # the rule's rate for the run's own batch size and start
        cfg = dataclasses.replace(cfg, learning_rate=auto_learning_rate(cfg.batch_size, cfg.rmsprop_start))
    return cfg, kept


def keep_learning_rate(cfg, made_with, say=print):
    """A resumed run keeps its own learning rate unless --learning-rate names one: resuming
    without the flag must not change the step size under the run (nor move a run made with
    Karpathy's 1e-4 onto the auto rule). made_with is the checkpoint's config; say: where the note goes."""
    rate = made_with.get("learning_rate")
    if cfg.learning_rate_rule != "auto" or not isinstance(rate, float) or rate == cfg.learning_rate:
        return cfg
    say(
        f"note: resuming with the run's own learning_rate={rate:g}, not auto's {cfg.learning_rate:g} "
        f"for batch {cfg.batch_size}; give --learning-rate to change it"
    )
    return dataclasses.replace(cfg, learning_rate=rate, learning_rate_rule="kept")


def resolve(argv, readable=lambda run_dir: run_dir.startswith("s3://")):
    """The config the trainer will run with ARGS argv, decided here as the trainer decides it: parse_args, its checks
    that need no Ray (check), then, where this machine can read the run dir (readable: an s3:// one; a folder on a cluster's head is not), what a
    resume keeps from its newest checkpoint (keep_run, keep_learning_rate). So `make run` and `make submit` cap a
    resumed run by its own batch size, and refuse a flag that it would refuse, before anything is launched. A
    run dir that cannot be read, or a checkpoint that cannot be used, is a UserError (one line, exit 2)."""
    from .checkpoint import CheckpointError  # here: the trainer's flags alone need no numpy
    from .rundir import RunDir
    from .store import StoreError

    cfg = parse_args(argv)
    check(cfg)
    if not readable(cfg.run_dir):
        return cfg
    try:
        state = RunDir(cfg.run_dir).load_latest(dataclasses.asdict(cfg), warn=lambda message: None)
    except (StoreError, CheckpointError) as e:
        raise cli.UserError(f"--run-dir {cfg.run_dir}: {e}") from None
    if state is None:
        return cfg
    cfg, _ = keep_run(cfg, state.config, given_flags(argv))
    return keep_learning_rate(cfg, state.config, say=lambda note: None)
