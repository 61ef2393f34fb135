"""Learning-rate experiments: train several (batch size, learning rate) settings to the same number
of episodes, so that they can be compared by episodes, which do not depend on how busy the machine was.

How to run (from the repo root; `make sweep` and `make compare` do the same):

    .venv/bin/python -m pongtools.sweep --root ~/pong-lr --episodes 6000 300:1e-2:0.94 300:2e-2 50:4e-3
    .venv/bin/python -m pongtools.compare ~/pong-lr/* --at 1000,3000,6000

Each setting BATCH:RATE or BATCH:RATE:DECAY (RMSProp's decay; without it, the trainer's auto)
trains with the real trainer (python -m pgpong.train, seed 0, the trainer's RMSProp start unless
--rmsprop-start is given) in <root>/b<BATCH>-lr<RATE>[-d<DECAY>] until it has played --episodes
episodes, one setting after the other.
Stop it at any time (Ctrl-C or SIGTERM: the running setting checkpoints); the same command again
resumes each setting where it stopped and skips those already done.
"""

import os
import signal
import subprocess
import sys

from pgpong.cli import Parser, at_least, checked, positive, run, whole
from pgpong.logline import kv
from pgpong.rundir import RunDir

from pongtools import JOB_DIR


def setting(text):
    """'300:3e-3' -> (300, 0.003, None); '300:1e-2:0.94' -> (300, 0.01, 0.94)."""
    batch, sep, rest = text.partition(":")
    rate, _, decay = rest.partition(":")
    if not sep:
        raise ValueError
    if decay and not 0 < float(decay) < 1:
        raise ValueError
    return whole(batch, 1), positive(rate), float(decay) if decay else None


def run_dir(root, batch, rate, decay=None):
    return os.path.join(root, f"b{batch}-lr{rate:g}" + (f"-d{decay:g}" if decay is not None else ""))


def updates_done(path):
    """Updates in the newest checkpoint of a run dir (0 for a new one)."""
    run = RunDir(path)
    found = run.checkpoints()
    return run.load(found[0]).update if found else 0


def main(argv=None):
    p = Parser(prog="python -m pongtools.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "settings",
        nargs="+",
        type=checked(setting, "BATCH:RATE or BATCH:RATE:DECAY, e.g. 300:1e-2 or 300:1e-2:0.94"),
        help="batch size, learning rate and optionally RMSProp decay of each run, e.g. 10:2e-3 300:1e-2:0.94",
    )
    p.add_argument("--root", default="~/pong-lr", help="folder of the run dirs (default: ~/pong-lr)")
    p.add_argument(
        "--episodes",
        type=at_least(1),
        default=6000,
        help="episodes each setting trains for (rounded up to whole updates; default 6000)",
    )
    p.add_argument("--workers", default="auto", help="rollout actors of each run (the trainer's --workers)")
    p.add_argument("--seed", default="0", help="the trainer's --seed for every setting")
    p.add_argument(
        "--rmsprop-start",
        choices=("corrected", "zero"),
        help="the trainer's --rmsprop-start for every setting (default: the trainer's)",
    )
    args = p.parse_args(argv)
    root = os.path.abspath(os.path.expanduser(args.root))
    stopping, child = [], []

    def stop(signum, frame):  # pass SIGTERM on to the running trainer, which checkpoints and exits
        stopping.append(signum)
        for proc in child:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    for batch, rate, decay in args.settings:
        path = run_dir(root, batch, rate, decay)
        wanted = -(-args.episodes // batch)  # updates, rounded up
        left = wanted - updates_done(path)
        print(
            kv("sweep", run=path, batch_size=batch, learning_rate=rate, updates=wanted, left=max(left, 0)), flush=True
        )
        if left <= 0:
            continue
        command = [
            sys.executable,
            "-m",
            "pgpong.train",
            "--batch-size",
            str(batch),
            "--learning-rate",
            str(rate),
            "--updates",
            str(left),
            "--workers",
            args.workers,
            "--seed",
            args.seed,
            "--run-dir",
            path,
            "--checkpoint-every",
            str(max(1, 1000 // batch)),
            *(["--rmsprop-decay", str(decay)] if decay is not None else []),
            *(["--rmsprop-start", args.rmsprop_start] if args.rmsprop_start else []),
        ]
        proc = subprocess.Popen(command, cwd=JOB_DIR)
        child[:] = [proc]
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the trainer too (same process group): let it save
            code = proc.wait()
        child.clear()
        if code != 0 or stopping:
            print(kv("sweep", stopped=path, exit=code, resume="run the same command again"), flush=True)
            return code or 1  # the trainer's own status (2: a mistake), or 1 for a stopped sweep
    print(kv("sweep", done=len(args.settings), compare=f"python -m pongtools.compare {root}/*"), flush=True)


def entry():
    """`python -m pongtools.sweep`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
