"""The docs' samples: each is the output of a command the page names beside it, written by cog.

cog (cogapp) runs the Python in a Markdown comment and writes what it prints below it, up to the
comment `[[[end]]]`; `cog -r` rewrites the blocks, `cog --check` fails when one would change:

    make docs                                     # every sample of README.md and docs/*.md, again
    .venv/bin/python -m pytest tests/test_docs.py -k current    # fails on a stale one

A quick sample (deterministic, seconds) runs its command each time:

    <!-- [[[cog shell("make plan NODES=11 CPUS=18 BATCH=300", keep="^milestone ")]]] -->
    ...the block cog writes...
    <!-- [[[end]]] -->

A slow or changing one (a training run, a benchmark, `make demo`) is saved once, with its date,
commit and machine, into docs/samples/<name>.txt, and the page's block reads that file:

    .venv/bin/python -m pongtools.samples save demo-tail --tail 4 -- "make demo"
    <!-- [[[cog saved("demo-tail")]]] -->

A sample of a run too long to make again (hours of training, a benchmark of the full batch, a cloud
run) that a page pasted before samples were saved keeps that run's output as it was, with the date,
commit and machine the page gave it, said by hand; the block reads it the same way:

    .venv/bin/python -m pongtools.samples record bench-b300 \\
        --made "2026-11-22 at 21:05 UTC, commit 04c0f3a, AMD EPYC, 2 cores" < pasted.txt

A figure in a sentence comes from a line the command prints now (line_of): cog writes the sentence;
a Markdown table a command prints (make compare ARGS=--markdown) becomes the page's table (table).

Either way a sample is `$ <command>` and its output (stdout and stderr as they came), from the
repository's root, in a plain block; the repository's own path is shown as `.`, and make's error
line `make: *** [Makefile:NNN: train] Error 2` as `make: *** [train] Error 2`, so that a sample does
not go stale when the Makefile or the clone's folder moves.
"""

import datetime
import functools
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from pgpong.cli import Parser, fail, run
from pgpong.logline import fields, kv
from pgpong.rundir import RunDir

from pongtools import REPO
from pongtools.plan.milestones import THRESHOLDS, first_update, point

SAMPLES = REPO / "docs" / "samples"
MAKE_ERROR = re.compile(r"^(make(?:\[\d+\])?: \*\*\* )\[Makefile:\d+: ([^\]]+)\]")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
FENCE = "```"


def environment():
    """The environment a user's shell gives a command: none of Ray's client settings, no outer make's.
    RAY_TMPDIR stays: a Ray the command starts, or joins, stays in the caller's temp dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_TMPDIR"}
    for key in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH", "VIRTUAL_ENV", "VENV"):
        env.pop(key, None)
    return env


def transcript(command, keep=None, tail=None, timeout=600, again=False):
    """`$ command` and its output lines (keep: only those matching this regex; tail: the last N), run
    by bash in the repository's root; once per cog run (a quick sample's command is deterministic),
    or each time with again=True (a saved sample's commands change things: the same one twice may
    print two different things)."""
    lines = list((output.__wrapped__ if again else output)(command, timeout))
    if keep:
        lines = [line for line in lines if re.search(keep, line)]
    if tail:
        lines = lines[-tail:]
    return [f"$ {command}", *lines]


@functools.cache
def output(command, timeout):
    """The output lines of one command, as samples show them (plain)."""
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=REPO,
        env=environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return tuple(plain(line) for line in proc.stdout.splitlines())


def plain(line):
    """An output line as a sample shows it: no colours, the repository's path as `.`, make's error line
    without the Makefile's line number."""
    line = ANSI.sub("", line).replace(f"{REPO}/", "").replace(str(REPO), ".")
    return MAKE_ERROR.sub(r"\1[\2]", line)


def block(lines):
    """A plain fenced block of lines, as a string cog writes."""
    return "\n".join([FENCE, *lines, FENCE]) + "\n"


def out(text):
    import cog  # only inside cog's run

    cog.out(text)


def shell(*commands, keep=None, tail=None):
    """Write, in one block, each command and its output, run now (a quick sample)."""
    out(block([line for c in commands for line in transcript(c, keep, tail)]))


def table(command):
    """Write the Markdown table a command prints (make compare ARGS=--markdown) as the page's own table."""
    out("\n".join(line for line in transcript(command)[1:] if line.startswith("|")) + "\n")


def line_of(command, kind, **match):
    """The key=value fields of the first line of `kind` the command prints now whose fields include
    `match`: a figure in a sentence, from the run that prints it (milestone name=play_criterion). A line
    without a kind word is found by its first key (seconds_per_update)."""
    for line in transcript(command)[1:]:
        found = fields(line)
        if line.startswith((f"{kind} ", f"{kind}=")) and all(found.get(k) == v for k, v in match.items()):
            return found
    raise LookupError(f"`{command}` printed no {kind} line with {match}")


def span(value, scale=1, digits=None, form="{}"):
    """A figure of a line as a sentence shows it: a number, or a range over seeds (`40..42`) as `40-42`;
    each end times scale, rounded to digits places (None: as printed), then put in form (`${}`)."""

    def one(text):
        return form.format(text if digits is None else f"{float(text) * scale:.{digits}f}")

    low, _, high = value.partition("..")
    return f"{one(low)}-{one(high)}" if high and one(low) != one(high) else one(low)


def saved(name):
    """Write a saved sample: the line that says when and where it was made, then its block."""
    header, *lines = (SAMPLES / f"{name}.txt").read_text().splitlines()
    out(f"{header.removeprefix('# ')} (`docs/samples/{name}.txt`):\n\n{block(lines)}")


def judge_tables(name):
    """Write the saved `make judge` sample `name` as two Markdown tables, seeds 0-9 and 10-19 with the whole:
    each seed's games won, points (agent-computer) and mean point difference."""
    lines = (SAMPLES / f"{name}.txt").read_text().splitlines()
    seeds = [fields(line) for line in lines if line.startswith("seed=")]
    [whole] = [fields(line) for line in lines if line.startswith("judge ")]
    half = (len(seeds) + 1) // 2
    text = []
    for part, last in ((seeds[:half], False), (seeds[half:], True)):
        cells = {
            "seed": [s["seed"] for s in part],
            "games won": [s["games_won"] for s in part],
            "points": [f"{s['agent_points']}-{s['computer_points']}" for s in part],
            "mean": [f"{float(s['mean_point_difference']):+.1f}" for s in part],
        }
        if last:
            agent, computer, games = (int(whole[k]) for k in ("agent_points", "computer_points", "games"))
            cells["seed"].append(f"all {games}")
            cells["games won"].append(whole["games_won"])
            cells["points"].append(f"{agent:,}-{computer:,}")
            cells["mean"].append(f"{(agent - computer) / games:+.2f}")
        rows = [f"| {key} | {' | '.join(values)} |" for key, values in cells.items()]
        rows.insert(1, "|" + " --- |" * (len(cells["seed"]) + 1))
        text.append("\n".join(rows) + "\n")
    out("\n".join(text))


def judged(name, folder=SAMPLES):
    """The `judge` line of the saved `make judge` sample `name`, as a table cell: its seeds, its verdict, the
    mean point difference, the seeds above 0 and the games won, with a link to the sample."""
    lines = (folder / f"{name}.txt").read_text().splitlines()
    [j] = [fields(line) for line in lines if line.startswith("judge ")]
    verdict = {"beats_ai": "passed", "not_yet": "failed"}[j["verdict"]]
    return (
        f"seeds {j['seeds']}, {verdict}: {float(j['mean_point_difference']):+.2f} a game, {j['seeds_above_0']} seeds"
        f" above 0, {j['games_won']} of {j['games']} won ([sample](samples/{name}.txt))"
    ), int(j["update"])


def run_table(run, updates, judges=(), folder=SAMPLES):
    """Write a committed run's table from its own metrics: at each of `updates` its episodes, env steps and
    running reward, the first update at a running reward of 0 and of +2 in bold (read as the plan reads its
    milestones); judges: saved `make judge` samples of its checkpoints, each in its update's row, so that a
    judged figure on a page is one a saved sample holds (a sample of an update not in the table fails)."""
    records = RunDir(str(REPO / run)).metrics()
    firsts = {first_update(records, t) for _, t in THRESHOLDS}
    cells = {}
    for name in judges:
        cell, update = judged(name, folder)
        if update not in updates:
            raise LookupError(f"the judge sample {name} is of update {update}, not a row of {updates}")
        cells.setdefault(update, []).append(cell)
    reward = {r["update"]: r["running_reward"] for r in records}
    rows = ["| update | episodes | env steps | running reward | greedy, `make judge` |", "|" + " --- |" * 5]
    for u in updates:
        at = point(records, u)
        row = [f"{u}", f"{at['episodes']:,}", f"{at['env_steps'] / 1e6:.1f} M", f"{reward[u]:+.2f}"]
        row = [f"**{c}**" for c in row] if u in firsts else row
        rows.append(f"| {' | '.join(row)} | {'; '.join(cells.get(u, []))} |")
    out("\n".join(rows) + "\n")


MILESTONE_NAMES = {
    "running_reward_0": "running reward 0",
    "play_criterion": "beats the built-in AI (`make judge`)",
    "running_reward_2": "running reward +2",
}


def milestone_table(command):
    """Write the `milestone` lines a `make plan` prints as a table: each milestone's updates and episodes (a range
    over the seeds measured), and the minutes and dollars of training it projects."""
    rows = ["| milestone | updates | episodes | seeds | minutes of training | $ on demand |", "|" + " --- |" * 6]
    for line in transcript(command)[1:]:
        if line.startswith("milestone "):
            m = fields(line)
            episodes = "-".join(f"{int(e):,}" for e in m["episodes"].split(".."))
            cells = [MILESTONE_NAMES.get(m["name"], m["name"]), span(m["updates"]), episodes, m["seeds"]]
            cells += [span(m["hours"], 60, 1), span(m["dollars"], digits=2, form="${}")]
            rows.append(f"| {' | '.join(cells)} |")
    if len(rows) == 2:
        raise LookupError(f"`{command}` printed no milestone line")
    out("\n".join(rows) + "\n")


def save(name, commands, keep=None, tail=None, folder=SAMPLES):
    """Run the commands now, one after the other, and keep their transcript in docs/samples/<name>.txt,
    headed by the date, commit and machine that made it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d at %H:%M UTC")
    lines = [line for c in commands for line in transcript(c, keep, tail, timeout=None, again=True)]
    header = f"# Made on {when}, commit {commit.stdout.strip()}, {machine()}"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.txt").write_text("\n".join([header, *lines]) + "\n")
    return folder / f"{name}.txt"


RECORDED = re.compile(r"\d{4}-\d{2}-\d{2}\b.*\bcommit [0-9a-f]{7,40}\b")


def record(name, made, lines, folder=SAMPLES):
    """Keep the pasted output of an earlier real run as docs/samples/<name>.txt, headed by `made`: the date,
    commit and machine that made it, as the page said (a run too long to make again)."""
    if not RECORDED.search(made):
        raise ValueError(f"--made {made!r}: give the run's date (YYYY-MM-DD ...) and its commit (commit abc1234)")
    if not lines:
        raise ValueError("no output to keep: pass the pasted lines on stdin")
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.txt"
    path.write_text("\n".join([f"# Recorded on {made}, pasted then and kept as it was", *lines]) + "\n")
    return path


def machine():
    """lscpu's model name and the core count: where a saved sample was made."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"`{model}`, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv=None):
    p = Parser(prog="python -m pongtools.samples", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(required=True, dest="action", metavar="{save,record}")
    s = sub.add_parser("save", help="run commands now and keep their output as docs/samples/NAME.txt")
    s.add_argument("name", help="the sample's name: docs/samples/NAME.txt, read by saved('NAME') in a page")
    s.add_argument("commands", nargs="+", help="shell commands, run one after the other from the repo's root")
    s.add_argument("--keep", help="keep only output lines matching this regex")
    s.add_argument("--tail", type=int, help="keep only the last N lines of each command's output")
    r = sub.add_parser("record", help="keep an earlier run's pasted output (stdin) as docs/samples/NAME.txt")
    r.add_argument("name", help="the sample's name: docs/samples/NAME.txt, read by saved('NAME') in a page")
    r.add_argument("--made", required=True, help="when, at which commit and where it was made, as the page says")
    args = p.parse_args(argv)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", args.name):
        fail(f"sample name {args.name!r}: lower-case letters, digits and hyphens")
    if args.action == "record":
        try:
            written = record(args.name, args.made, sys.stdin.read().splitlines())
        except ValueError as e:
            fail(str(e))
        print(kv("sample", name=args.name, file=written.relative_to(REPO), recorded=args.made.split(" ")[0]))
        return 0
    written = save(args.name, args.commands, args.keep, args.tail)
    print(kv("sample", name=args.name, file=written.relative_to(REPO), commands=len(args.commands)))


def entry():
    """`python -m pongtools.samples`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
