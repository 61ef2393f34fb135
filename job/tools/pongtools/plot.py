"""Plot a run's learning curves into one PNG, from its metrics.jsonl. Runs on your machine.

How to run (from the repo root; `make plot RUN=...` does the same):

    .venv/bin/python -m pongtools.plot ~/pong-runs/a            # writes ~/pong-runs/a/curve.png
    .venv/bin/python -m pongtools.plot s3://bucket/runs/a --out a.png

It works on a run still in progress: the line the trainer is writing right now is
skipped until it is whole. The title is the run's config, from its newest
checkpoint (or, before the first checkpoint, what the metrics tell).
Needs matplotlib (requirements-tools.in, installed from its lock by `make plot`); the cluster never imports this module.
"""

import os

from pgpong.cli import Parser, fail, run
from pgpong.logline import kv
from pgpong.rundir import RunDir
from pgpong.store import StoreError

SIZE_IN = (12, 8)  # figure size in inches
DPI = 100  # so the PNG is 1200 x 800 pixels
TITLE_KEYS = ("env", "batch_size", "learning_rate", "seed", "workers")  # the config shown in the title


def time_axis(seconds):
    """(values, label) of training wall-clock time in a unit that fits the run's length."""
    longest = max(seconds)
    for unit, size in (("hours", 3600), ("minutes", 60)):
        if longest >= 2 * size:
            return [s / size for s in seconds], f"training wall-clock time ({unit})"
    return seconds, "training wall-clock time (seconds)"


def draw(records, title, out):
    """Four panels: reward by update, reward by time, episode length, env steps/s. Writes out (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    updates = [r["update"] for r in records]
    elapsed, time_label = time_axis([r.get("total_seconds", 0.0) for r in records])
    running = [r["running_reward"] for r in records]
    mean = [r["reward_mean"] for r in records]
    marker = "o" if len(records) < 30 else None  # a run of a few updates still shows its points

    fig, axes = plt.subplots(2, 2, figsize=SIZE_IN, dpi=DPI)
    for ax, x, label in ((axes[0, 0], updates, "update"), (axes[0, 1], elapsed, time_label)):
        ax.fill_between(
            x,
            [r["reward_min"] for r in records],
            [r["reward_max"] for r in records],
            color="tab:blue",
            alpha=0.12,
            label="episode reward min..max",
        )
        ax.plot(x, mean, color="tab:blue", lw=0.8, alpha=0.7, marker=marker, ms=3, label="mean episode reward")
        ax.plot(x, running, color="tab:red", lw=2, marker=marker, ms=3, label="running reward")
        ax.set(xlabel=label, ylabel="reward (points won - points lost)")
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, -21.5), min(high, 21.5))  # a game's reward is -21..21
        ax.legend(loc="upper left", fontsize=8)
    axes[1, 0].plot(updates, [r["episode_len_mean"] for r in records], color="tab:green", marker=marker, ms=3)
    axes[1, 0].set(xlabel="update", ylabel="steps per episode (mean)", title="episode length")
    axes[1, 1].plot(updates, [r["env_steps_per_s"] for r in records], color="tab:purple", marker=marker, ms=3)
    axes[1, 1].set(xlabel="update", ylabel="env steps / s", title="throughput", ylim=(0, None))
    axes[0, 0].set_title("reward by update")
    axes[0, 1].set_title("reward by time")
    for ax in (axes[0, 0], axes[1, 0], axes[1, 1]):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # updates are whole numbers
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def default_out(run_dir):
    """<run dir>/curve.png for a local run; for S3, <last part of the prefix>-curve.png here."""
    if run_dir.startswith("s3://"):
        return os.path.abspath(f"{run_dir.rstrip('/').rsplit('/', 1)[-1]}-curve.png")
    return os.path.join(run_dir, "curve.png")


def main(argv=None):
    p = Parser(prog="python -m pongtools.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the run directory: a folder or s3://bucket/prefix")
    p.add_argument("--out", help="PNG to write (default: <run dir>/curve.png; for S3, ./<name>-curve.png)")
    args = p.parse_args(argv)
    try:
        run = RunDir(args.run_dir)
        run_dir = run.path
        if not run_dir.startswith("s3://") and not os.path.isdir(run_dir):
            fail(f"run dir {run_dir} does not exist; give the trainer's --run-dir (make plot RUN=...)")
        records = run.metrics()
        if not records:
            fail(f"{run_dir}/metrics.jsonl has no complete line yet; try again after the first update")
        config, source = run.config()
    except StoreError as e:
        fail(str(e))
    except OSError:
        fail(f"{run_dir} has no metrics.jsonl yet; is it a run dir, and has its first update finished?")
    last = records[-1]
    shown = " ".join(f"{k}={config[k]}" for k in TITLE_KEYS if k in config)
    title = (
        f"pg-pong  {shown}  ({source})\n{run_dir}: update {last['update']}, "
        f"{last.get('total_episodes', '?')} episodes, running reward {last['running_reward']:.2f}"
    )
    out = os.path.abspath(os.path.expanduser(args.out)) if args.out else default_out(run_dir)
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror or e}")
    draw(records, title, out)
    print(kv("plot", out=out, updates=len(records), last_update=last["update"], running_reward=last["running_reward"]))


def entry():
    """`python -m pongtools.plot`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
