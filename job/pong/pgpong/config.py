"""The trainer's one config object. Each field's help text is its CLI help."""

import argparse
import dataclasses
import os
import sys
import time

DEFAULT_RUNS = "~/pong-runs"


@dataclasses.dataclass(frozen=True)
class Config:
    batch_size: int = dataclasses.field(default=300, metadata={"help": "episodes per policy update"})
    updates: int = dataclasses.field(default=0, metadata={"help": "updates to run now; 0 runs until stopped"})
    workers: str = dataclasses.field(
        default="auto", metadata={"help": "rollout actors (one CPU each); auto = one per CPU of the cluster"}
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "seeds the weights and every episode"})
    env: str = dataclasses.field(default="Pong-v0", metadata={"help": "ALE env id, e.g. Pong-v0 or ALE/Pong-v5"})
    learning_rate: float = dataclasses.field(default=1e-4, metadata={"help": "RMSProp learning rate"})
    run_dir: str = dataclasses.field(
        default="",
        metadata={"help": f"checkpoints and metrics.jsonl; reused to resume (default {DEFAULT_RUNS}/<time>)"},
    )
    checkpoint_every: int = dataclasses.field(default=10, metadata={"help": "updates between checkpoints"})


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise ValueError
    return value


def _non_negative_int(text):
    value = int(text)
    if value < 0:
        raise ValueError
    return value


def _workers(text):
    if text != "auto":
        _positive_int(text)
    return text


def _positive_float(text):
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError
    return value


_TYPES = {
    "batch_size": (_positive_int, "a whole number >= 1"),
    "updates": (_non_negative_int, "a whole number >= 0"),
    "workers": (_workers, "'auto' or a whole number >= 1"),
    "seed": (_non_negative_int, "a whole number >= 0"),
    "learning_rate": (_positive_float, "a number > 0"),
    "checkpoint_every": (_positive_int, "a whole number >= 1"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def _checked(convert, wanted):
    def parse(text):
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, not {text!r}") from None

    return parse


def parser(prog="python -m pgpong.train"):
    p = _Parser(prog=prog, description="Train Pong with Karpathy's policy gradient on Ray actors.")
    for f in dataclasses.fields(Config):
        convert, wanted = _TYPES.get(f.name, (str, "text"))
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            type=_checked(convert, wanted),
            default=f.default,
            help=f.metadata["help"] + (f" (default: {f.default})" if f.default != "" else ""),
        )
    return p


def parse_args(argv=None):
    """Config from the command line; a bad value exits 2 with one line on stderr."""
    cfg = Config(**vars(parser().parse_args(argv)))
    if not cfg.run_dir:
        cfg = dataclasses.replace(cfg, run_dir=os.path.join(DEFAULT_RUNS, time.strftime("%Y%m%d-%H%M%S")))
    return cfg
