"""Export a trained run as a shipped agent: weights only, and the run's compressed metrics.

How to run (from the repo root; `make ship RUN=...` does this, then draws the curve and a game):

    PYTHONPATH=job/pong:job/tools python -m pongtools.ship ~/pong-runs/a                # its newest checkpoint
    PYTHONPATH=job/pong:job/tools python -m pongtools.ship ~/pong-runs/a --checkpoint ~/pong-runs/a/ckpt-000900.npz

Writes into --out (default docs/agent):
- pong-agent.npz: W1 and W2 as float16 (2.6 MB instead of the checkpoint's 10 MB with its
  RMSProp cache), the counters and the config. `make play` plays it; it cannot resume a run.
- metrics.jsonl.gz: every update's metrics line up to that checkpoint, so `make plot RUN=docs/agent`
  redraws the whole learning curve.
"""

import gzip
import json
import os

import numpy as np
from pgpong import checkpoint
from pgpong.cli import Parser, fail
from pgpong.logline import kv
from pgpong.store import StoreError
from pgpong.watch import SHIPPED_METRICS, read_metrics

DEFAULT_OUT = "docs/agent"


def metrics_until(run_dir, last_update):
    """The run's metrics lines of updates 1..last_update, as text; exactly one line per update."""
    records = [r for r in read_metrics(run_dir) if r["update"] <= last_update]
    updates = [r["update"] for r in records]
    if updates != list(range(1, last_update + 1)):
        missing = sorted(set(range(1, last_update + 1)) - set(updates))
        fail(f"{run_dir} metrics do not hold each update 1..{last_update} once (missing: {missing[:5]})")
    return "".join(json.dumps(r) + "\n" for r in records)


def main(argv=None):
    p = Parser(prog="python -m pongtools.ship", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the trainer's --run-dir (a folder or s3://bucket/prefix)")
    p.add_argument("--checkpoint", help="the checkpoint to ship (default: the run's newest)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"folder to write (default: {DEFAULT_OUT})")
    args = p.parse_args(argv)
    run_dir = args.run_dir if args.run_dir.startswith("s3://") else os.path.abspath(os.path.expanduser(args.run_dir))
    try:
        path = args.checkpoint or next(iter(checkpoint.checkpoints(run_dir)), None)
        if path is None:
            fail(f"{run_dir} holds no checkpoint (ckpt-NNNNNN.npz); give the trainer's --run-dir")
        state = checkpoint.load(path)
        metrics = metrics_until(run_dir, state.update)
        os.makedirs(args.out, exist_ok=True)
        agent = checkpoint.export_weights(state, os.path.join(os.path.abspath(args.out), checkpoint.AGENT_FILE))
        gz = gzip.compress(metrics.encode(), mtime=0)  # mtime 0: the same run gives the same bytes
        checkpoint.store(os.path.abspath(args.out)).write(SHIPPED_METRICS, gz)
    except (checkpoint.CheckpointError, StoreError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot ship {run_dir}: {e.strerror or e}")
    shipped = checkpoint.load_weights(agent)
    drift = max(float(np.max(np.abs(shipped.params[k] - state.params[k]))) for k in state.params)
    print(
        kv(
            "ship",
            checkpoint=path,
            agent=agent,
            agent_mb=os.path.getsize(agent) / 2**20,
            metrics=os.path.join(os.path.abspath(args.out), SHIPPED_METRICS),
            metrics_kb=len(gz) / 1024,
            update=state.update,
            episodes=state.episodes,
            running_reward=state.running_reward,
            training_hours=state.seconds / 3600,
            float16_max_abs_error=drift,
        )
    )


if __name__ == "__main__":
    main()
