"""Compare learning runs by episodes played: the running reward each had reached after the same
number of episodes, whatever its batch size, learning rate or machine. Runs on your machine.

How to run (from the repo root; `make compare RUNS="..." AT=...` does the same):

    .venv/bin/python -m pongtools.compare ~/pong-lr/* --at 1000,3000,6000
    .venv/bin/python -m pongtools.compare ~/pong-lr/* --markdown      # a table for the docs

For each run: its batch size and learning rate (from its newest checkpoint), then at each
milestone the running reward at the first update that reached that many episodes, and the
update it was. A run that has not reached a milestone shows '-'.
"""

import os

from pgpong.checkpoint import CheckpointError
from pgpong.cli import Parser, checked, fail, run
from pgpong.config import OPTIMIZER_BEFORE_FIELDS
from pgpong.logline import kv
from pgpong.rundir import RunDir
from pgpong.store import StoreError


def milestones(text):
    values = [int(v) for v in text.split(",")]
    if not values or min(values) < 1:
        raise ValueError
    return sorted(values)


def at_episodes(records, episodes):
    """(running reward, update) at the first update whose total episodes reached `episodes`, or None."""
    for r in records:
        if r.get("total_episodes", 0) >= episodes:
            return r["running_reward"], r["update"]
    return None


def at_update(records, update):
    """(running reward, update) at `update`, or None if the run stopped before it."""
    return next(((r["running_reward"], r["update"]) for r in records if r["update"] == update), None)


def summary(run, at, at_updates=()):
    """One RunDir's row: {'run', 'batch_size', 'learning_rate', 'rmsprop_start', 'episodes', 'updates',
    'records', at each episode milestone, ("u", n) at each update milestone}."""
    records = run.metrics()
    if not records:
        raise OSError(f"{run} has no metrics yet")
    config, _ = run.config()
    config = OPTIMIZER_BEFORE_FIELDS | config  # a run from before the optimizer fields: pg-pong's
    last = records[-1]
    row = {
        "run": os.path.basename(run.path.rstrip("/")),
        "batch_size": config.get("batch_size"),
        "learning_rate": config.get("learning_rate"),
        "rmsprop_start": config["rmsprop_start"],
        "rmsprop_decay": config["rmsprop_decay"],
        "episodes": last.get("total_episodes"),
        "updates": last["update"],
        "running_reward": last["running_reward"],
        "records": records,
    }
    for m in at:
        row[m] = at_episodes(records, m)
    for u in at_updates:
        row["u", u] = at_update(records, u)
    return row


def plot(rows, out):
    """Running reward against episodes and against updates, one line a run, into one PNG; returns the legend."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (by_episode, by_update) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    for r in rows:
        label = (
            r.get("label")
            or f"batch {r['batch_size']}, lr {r['learning_rate']:g}, {r['rmsprop_start']} start ({r['run']})"
        )
        reward = [m["running_reward"] for m in r["records"]]
        by_episode.plot([m["total_episodes"] for m in r["records"]], reward, label=label)
        by_update.plot([m["update"] for m in r["records"]], reward, label=label)
    for ax, x in ((by_episode, "episodes"), (by_update, "updates (RMSProp steps)")):
        ax.set_xlabel(x)
        ax.set_ylabel("running reward")
        ax.axhline(0, color="grey", lw=0.5)
        ax.grid(alpha=0.3)
    by_update.set_xscale("log")
    legend = by_episode.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return [t.get_text() for t in legend.get_texts()]


def main(argv=None):
    p = Parser(prog="python -m pongtools.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run dirs (the trainer's --run-dir)")
    p.add_argument(
        "--at",
        type=checked(milestones, "episode counts like 1000,3000,6000"),
        default=[1000, 3000, 6000],
        help="episode milestones (default 1000,3000,6000)",
    )
    p.add_argument(
        "--at-updates",
        type=checked(milestones, "update counts like 5,10,20"),
        default=[],
        help="update milestones too: the running reward after the same number of RMSProp steps",
    )
    p.add_argument("--markdown", action="store_true", help="print a Markdown table instead of key=value lines")
    p.add_argument("--plot", metavar="PNG", help="also draw every run's running reward by episodes and by updates")
    p.add_argument(
        "--label",
        action="append",
        default=[],
        help="--plot's legend for a run instead of its config (once per run, in the order of the runs)",
    )
    args = p.parse_args(argv)
    if args.label and len(args.label) != len(args.runs):
        p.error(f"{len(args.label)} --label for {len(args.runs)} runs: give one per run, in their order, or none")
    rows = []
    for path, label in zip(args.runs, args.label or [None] * len(args.runs), strict=True):
        try:
            run = RunDir(path)
            rows.append(summary(run, args.at, args.at_updates) | {"label": label})
        except (OSError, StoreError, CheckpointError) as e:
            fail(f"cannot read run {path}: {e}")
    rows.sort(key=lambda r: (r["batch_size"] or 0, r["rmsprop_start"], r["learning_rate"] or 0))
    if args.plot:
        plot(rows, args.plot)

    def cell(value):
        return "-" if value is None else f"{value[0]:.2f} (update {value[1]})"

    if args.markdown:
        heads = ["run", "batch", "learning rate", "start", *(f"at {m:,} episodes" for m in args.at)]
        heads += [*(f"at update {u}" for u in args.at_updates), "last"]
        print("| " + " | ".join(heads) + " |")
        print("|" + "---|" * len(heads))
        for r in rows:
            last = f"{r['running_reward']:.2f} at {r['episodes']:,} episodes ({r['updates']} updates)"
            cells = [r["run"], str(r["batch_size"]), f"{r['learning_rate']:g}", r["rmsprop_start"]]
            cells += [*(cell(r[m]) for m in args.at), *(cell(r["u", u]) for u in args.at_updates), last]
            print("| " + " | ".join(cells) + " |")
        return
    for r in rows:
        at = {f"at_{m}": "-" if r[m] is None else f"{r[m][0]:.2f}@u{r[m][1]}" for m in args.at}
        at |= {f"at_update_{u}": "-" if r["u", u] is None else f"{r['u', u][0]:.2f}" for u in args.at_updates}
        print(
            kv(
                "compare",
                run=r["run"],
                batch_size=r["batch_size"],
                learning_rate=r["learning_rate"],
                rmsprop_start=r["rmsprop_start"],
                rmsprop_decay=r["rmsprop_decay"],
                episodes=r["episodes"],
                updates=r["updates"],
                running_reward=r["running_reward"],
                **at,
            )
        )


def entry():
    """`python -m pongtools.compare`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
