"""Does a checkpoint beat Pong's built-in AI? The play criterion, in one command. Runs on your machine.

How to run (from the repo root; `make judge CHECKPOINT=...` does the same):

    .venv/bin/python -m pongtools.judge job/tools/runs/agent             # the shipped agent
    .venv/bin/python -m pongtools.judge                                  # your latest run (make judge)
    .venv/bin/python -m pongtools.judge ~/pong-runs/a --seeds 300-319    # a run's newest checkpoint

It plays --games greedy games at each of --seeds, the games `make play GAMES=10 ARGS="--seed N"`
plays at each seed N, score for score (the same kernel, the same seeded frame skips and sticky
actions), one process per core. A checkpoint beats the AI when the mean point difference over all
the games is above 0 and at least --need of the seeds' sets of games are above 0: with the
defaults, 200 games at seeds 0-19 and 18 seeds, the criterion of issue 24 (docs/results.md).
Its first line names the checkpoint (without one: the latest run, as pongtools.play finds it).
One line per seed, then a `judge` line with `verdict=beats_ai` or `verdict=not_yet`; the exit
status is 0 either way. To pick a checkpoint, judge candidates at seeds other than the ones you
report (the shipped agent was picked at seeds 300-311 and reported at 0-19).
"""

import multiprocessing
import os
import time

from pgpong import rollout
from pgpong.cli import Parser, at_least, run
from pgpong.logline import kv

from pongtools import play

GAMES = 10  # greedy games at each seed
SEEDS = "0-19"
NEED = 18  # seeds whose games must add up above 0


def parse_seeds(text):
    """'0-19', '3,5,7' or '300-309,400': a sorted list of distinct seeds; ValueError on anything else."""
    seeds = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part.strip()!r} is not a seed (N) or a range (N-M)")
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo:
            raise ValueError(f"{part.strip()!r} runs backwards")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


def verdict(per_seed, need):
    """(mean point difference over every game, seeds above 0, beats the AI?) of per_seed, a list of
    (agent points, computer points, games) for each seed."""
    games = sum(g for _, _, g in per_seed)
    mean = sum(a - c for a, c, _ in per_seed) / games
    above = sum(a > c for a, c, _ in per_seed)
    return mean, above, mean > 0 and above >= need


def label(seeds):
    """'0-19' for a run of consecutive seeds, else '3,5,7'."""
    if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def play_seed(task):
    """One seed's games: the worker's share of a judgement (the weights travel with the task)."""
    params, env_id, seed, games = task
    stepper = rollout.AtariStepper(env_id)
    pol = play.Policy(params)
    t = time.perf_counter()
    agent = computer = won = steps = 0
    for game in range(1, games + 1):
        a, c, n = play.play_game(stepper, pol, seed, game, True, None)
        agent, computer, won, steps = agent + a, computer + c, won + (a > c), steps + n
    return seed, agent, computer, won, steps, time.perf_counter() - t


def parse_args(argv):
    p = Parser(prog="python -m pongtools.judge", description=__doc__.split("\n\n")[0])
    play.add_checkpoint(p)
    p.add_argument("--seeds", default=SEEDS, help="seeds to play at: N-M, N,M,... or both (default: %(default)s)")
    p.add_argument("--games", type=at_least(1), default=GAMES, help="greedy games at each seed")
    p.add_argument("--need", type=at_least(0), default=NEED, help="seeds whose games must come out above 0")
    p.add_argument(
        "--processes", type=at_least(1), default=os.cpu_count(), help="games played side by side (default: cores)"
    )
    args = p.parse_args(argv)
    try:
        args.seeds = parse_seeds(args.seeds)
    except ValueError as e:
        p.error(f"--seeds: {e}")
    if args.need > len(args.seeds):
        p.error(f"--need {args.need} is more than the {len(args.seeds)} seeds of --seeds")
    return args


def main(argv=None):
    args = parse_args(argv)
    run, name, state, env_id, _ = play.load_player(
        args.checkpoint, args.runs_in or play.RUNS_IN
    )  # one-line errors before any game
    tasks = [(state.params, env_id, seed, args.games) for seed in args.seeds]
    per_seed = []
    won_all = 0
    t = time.perf_counter()
    # spawn: each worker starts its own emulator in a clean process, whatever the parent holds
    with multiprocessing.get_context("spawn").Pool(min(args.processes, len(tasks))) as pool:
        for seed, agent, computer, won, steps, seconds in pool.imap(play_seed, tasks):
            per_seed.append((agent, computer, args.games))
            won_all += won
            print(
                kv(
                    seed=seed,
                    games=args.games,
                    games_won=won,
                    agent_points=agent,
                    computer_points=computer,
                    mean_point_difference=(agent - computer) / args.games,
                    steps=steps,
                    seconds=seconds,
                ),
                flush=True,
            )
    mean, above, beats = verdict(per_seed, args.need)
    worst = min(range(len(per_seed)), key=lambda i: per_seed[i][0] - per_seed[i][1])
    print(
        kv(
            "judge",
            checkpoint=run.file(name),
            update=state.update,
            policy="greedy",
            seeds=label(args.seeds),
            games=args.games * len(args.seeds),
            games_won=won_all,
            agent_points=sum(a for a, _, _ in per_seed),
            computer_points=sum(c for _, c, _ in per_seed),
            mean_point_difference=mean,
            seeds_above_0=above,
            need=args.need,
            worst_seed=args.seeds[worst],
            worst_mean=(per_seed[worst][0] - per_seed[worst][1]) / args.games,
            verdict="beats_ai" if beats else "not_yet",
            seconds=time.perf_counter() - t,
        )
    )


def entry():
    """`python -m pongtools.judge`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
