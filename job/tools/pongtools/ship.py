"""Export a trained run as a shipped agent: weights only, and the run's compressed metrics.

How to run (from the repo root; `make ship RUN=...` does this, then draws the curve and a game):

    .venv/bin/python -m pongtools.ship ~/pong-runs/a                # its newest checkpoint
    .venv/bin/python -m pongtools.ship ~/pong-runs/a --checkpoint ~/pong-runs/a/ckpt-000900.npz

Writes into --out (default job/tools/runs/agent):
- pong-agent.npz: W1 and W2 as float16 (2.6 MB instead of the checkpoint's 10 MB with its
  RMSProp cache), the counters and the config. `make play` plays it; it cannot resume a run.
- metrics.jsonl.gz: every update's metrics line up to that checkpoint, so `make plot RUN=job/tools/runs/agent`
  redraws the whole learning curve.

With --metrics-only, run.json (the config and counters, 1 KB) replaces the weights: enough for
make compare, make plot, make plan-inputs and learning_rates.json's runs, which compare runs and
never play them:

    .venv/bin/python -m pongtools.ship ~/pong-runs/b300-x --metrics-only --out job/tools/runs/lr/b300-x
"""

import os

import numpy as np
from pgpong.checkpoint import CheckpointError
from pgpong.cli import Parser, fail, run
from pgpong.logline import kv
from pgpong.rundir import AGENT_FILE, SHIPPED_METRICS, RunDir
from pgpong.store import StoreError

DEFAULT_OUT = "job/tools/runs/agent"


def metrics_until(run, last_update):
    """The RunDir's metrics records of updates 1..last_update; exactly one per update."""
    records = [r for r in run.metrics() if r["update"] <= last_update]
    updates = [r["update"] for r in records]
    if updates != list(range(1, last_update + 1)):
        missing = sorted(set(range(1, last_update + 1)) - set(updates))
        fail(f"{run} metrics do not hold each update 1..{last_update} once (missing: {missing[:5]})")
    return records


def main(argv=None):
    p = Parser(prog="python -m pongtools.ship", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the trainer's --run-dir (a folder or s3://bucket/prefix)")
    p.add_argument("--checkpoint", help="the checkpoint to ship (default: the run's newest)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"folder to write (default: {DEFAULT_OUT})")
    p.add_argument(
        "--metrics-only",
        action="store_true",
        help="no weights: the config and counters (run.json) and the metrics, for runs kept to compare",
    )
    args = p.parse_args(argv)
    try:
        run = RunDir(args.run_dir)
        source, name = (
            RunDir.of_file(args.checkpoint) if args.checkpoint else (run, next(iter(run.checkpoints()), None))
        )
        if name is None:
            fail(f"{run} holds no checkpoint (ckpt-NNNNNN.npz); give the trainer's --run-dir")
        state = source.load(name)
        records = metrics_until(run, state.update)
        os.makedirs(args.out, exist_ok=True)
        out = RunDir(args.out)
        written = out.export(state, records, weights=not args.metrics_only)
        shipped = None if args.metrics_only else out.load_weights(AGENT_FILE)
    except (CheckpointError, StoreError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot ship {args.run_dir}: {e.strerror or e}")
    if shipped:
        drift = max(float(np.max(np.abs(shipped.params[k] - state.params[k]))) for k in state.params)
        what = dict(agent=written, agent_mb=os.path.getsize(written) / 2**20)
    else:
        what = dict(agent="none", run_record=written)
    print(
        kv(
            "ship",
            checkpoint=source.file(name),
            **what,
            metrics=out.file(SHIPPED_METRICS),
            metrics_kb=os.path.getsize(out.file(SHIPPED_METRICS)) / 1024,
            update=state.update,
            episodes=state.episodes,
            running_reward=state.running_reward,
            training_hours=state.seconds / 3600,
            **({"float16_max_abs_error": drift} if shipped else {}),
        )
    )


def entry():
    """`python -m pongtools.ship`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
