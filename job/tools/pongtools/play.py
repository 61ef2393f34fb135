"""Watch a checkpoint play Pong: the score of each game, and a GIF of the first. Runs on your machine.

How to run (from the repo root; `make play CHECKPOINT=... GAMES=3` does the same):

    .venv/bin/python -m pongtools.play ~/pong-runs/a/ckpt-000100.npz --games 3
    .venv/bin/python -m pongtools.play ~/pong-runs/a --policy sampled    # the run's newest checkpoint
    .venv/bin/python -m pongtools.play job/tools/runs/agent --games 10     # the shipped agent (CHECKPOINT=shipped)
    .venv/bin/python -m pongtools.play                                      # your latest run (make play)

Without a checkpoint it plays the newest checkpoint of the newest run in --runs-in (default: `make
train`'s ~/pong-runs/<time> and `make run`'s runs/<time>/run), and its first line names it.

The trainer's own kernel (policy.policy_step) preprocesses each screen and runs the
network. By default the agent plays its more likely action, UP iff P(UP) > 0.5 (greedy,
as evaluations of a trained policy usually do); --policy sampled plays UP with probability
P(UP), as in training. Frame skips and sticky actions are the env's,
drawn from a stream seeded by (--seed, game), so the same seed replays the same games.
Writes the first game as an animated GIF (screens upscaled, nearest neighbour) and
its last screen as a PNG beside it (the game ends on the deciding point, before the score
display counts it). The last line sums up all games:
`mean_point_difference` is the mean of (agent's points - computer's points) per game,
above 0 when the agent beats the built-in AI on average. Needs Pillow (requirements-tools.in, from its lock).
"""

import os
import time

import numpy as np
from pgpong import policy, rollout
from pgpong.checkpoint import CheckpointError
from pgpong.cli import Parser, at_least, fail, run
from pgpong.config import DEFAULT_RUNS
from pgpong.logline import kv
from pgpong.rundir import AGENT_FILE, RUN_RECORD, RunDir
from pgpong.store import StoreError

from pongtools import REPO

MAX_GIF_FRAMES = 3000  # a longer game is subsampled evenly down to this: under 100 MB of memory, a few MB of GIF
ATARI_FPS = 60  # emulator frames per second: a GIF frame shows for as long as the frames it covers
MAX_STEPS = 200_000  # a game longer than this (about an hour of play) is cut off
POLICIES = ("greedy", "sampled")  # --policy: the first is the default
PLAY_STREAM = 0  # the `update` part of each game's random-stream seed; training uses 1, 2, ...
# Where a run without a named checkpoint is looked for: `make train`'s run dirs, `make run`'s OUT (its run/ inside).
RUNS_IN = (DEFAULT_RUNS, str(REPO / "runs"))
NAME_ONE = "pass CHECKPOINT=<ckpt-NNNNNN.npz or a run dir>, or CHECKPOINT=shipped for the shipped agent"


class Policy:
    """The trainer's per-step kernel with fixed weights, on a one-step trace (nothing kept for a gradient)."""

    def __init__(self, params):
        self.w1t = np.ascontiguousarray(params["W1"].T, dtype=np.float32)  # a pixel's weights are a row
        self.w2 = np.ascontiguousarray(params["W2"], dtype=np.float32)
        self.trace = rollout.Trace(steps=1, hidden=len(self.w2))
        self.trace.ensure(0)
        self.prev = np.zeros(policy.D, dtype=np.uint8)

    def act(self, screen, first, u):
        """UP (True) iff u < P(UP): u uniform samples the policy, u = 0.5 plays it greedily."""
        up, _ = self.trace.step(screen, self.prev, first, self.w1t, self.w2, u, 0)
        return bool(up)


class Recorder:
    """Screens of one game, kept as 8-bit palette indices (the Atari 2600 has 128 colours), at most
    `limit`: when full, every other one is dropped, its time added to the one before, so the kept
    screens stay evenly spaced over the whole game."""

    def __init__(self, limit=MAX_GIF_FRAMES):
        self.limit = limit
        self.frames, self.ticks = [], []  # ticks: emulator frames each kept screen stands for
        self.stride, self.seen = 1, 0
        self.known = np.zeros(1 << 24, dtype=bool)  # the 24-bit RGB colours met so far
        self.index = np.zeros(1 << 24, dtype=np.uint8)  # and their palette index
        self.colours = []  # the palette, in index order

    def add(self, screen, ticks):
        self.last = screen.copy()  # the final screen is kept whole, whatever the subsampling
        if self.seen % self.stride == 0:
            self.frames.append(self.indices(screen))
            self.ticks.append(int(ticks))
        else:
            self.ticks[-1] += int(ticks)
        self.seen += 1
        if len(self.frames) > self.limit:
            self.frames = self.frames[::2]
            self.ticks = [sum(self.ticks[i : i + 2]) for i in range(0, len(self.ticks), 2)]
            self.stride *= 2

    def indices(self, screen):
        keys = (screen[..., 0].astype(np.uint32) << 16) | (screen[..., 1].astype(np.uint32) << 8) | screen[..., 2]
        fresh = np.unique(keys[~self.known[keys]])
        if len(fresh):
            assert len(self.colours) + len(fresh) <= 256, "more colours than a GIF palette holds"
            self.known[fresh] = True
            self.index[fresh] = np.arange(len(self.colours), len(self.colours) + len(fresh))
            self.colours.extend(int(c) for c in fresh)
        return self.index[keys]

    def palette(self):
        return bytes(v for c in self.colours for v in (c >> 16, (c >> 8) & 255, c & 255))


def play_game(stepper, pol, seed, game, greedy, recorder=None):
    """Play one game to its end; returns (points won, points lost, agent steps).

    The recorder gets the screen after each step: the screen before the first one is
    Pong's attract-mode picture, in other colours."""
    stream = rollout.RandomStream(seed, PLAY_STREAM, game, stepper.frameskip)
    screen = stepper.reset()
    won = lost = steps = 0
    first, over = True, False
    while not over and steps < MAX_STEPS:
        u, frames, sticky = stream.next()
        up = pol.act(screen, first, 0.5 if greedy else u)
        reward, over = stepper.step(up, frames, sticky)
        if recorder is not None:
            recorder.add(screen, frames)
        if reward > 0:
            won += int(reward)
        elif reward < 0:
            lost += int(-reward)
        first = False
        steps += 1
    return won, lost, steps


def write_gif(recorder, scale, gif_path, png_path):
    """The recorded screens upscaled (nearest neighbour) into a GIF, the game's last screen into a PNG."""
    from PIL import Image

    def image(index):
        img = Image.fromarray(index)  # 8-bit indices; putpalette makes it a palette image
        img.putpalette(recorder.palette())
        return img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)

    frames = [image(index) for index in recorder.frames]
    durations = [max(20, round(1000 * t / ATARI_FPS)) for t in recorder.ticks]  # browsers slow anything faster
    frames[0].save(gif_path, save_all=True, append_images=frames[1:], duration=durations, loop=0)
    image(recorder.indices(recorder.last)).save(png_path)
    return frames[0].size


def find_checkpoint(path):
    """(RunDir, file name) of a checkpoint file, an exported agent's folder, or a run dir's newest
    checkpoint; exits with one line if there is none."""
    try:
        if path.endswith(".npz"):
            run, name = RunDir.of_file(path)
        else:
            run, name = RunDir(path), None
        local = not run.path.startswith("s3://")
        where = run.file(name) if name else run.path
        if local and not os.path.exists(where):
            fail(f"no checkpoint at {where}; pass CHECKPOINT=<a ckpt-NNNNNN.npz file or a run dir>")
        if name:
            return run, name
        if local and not os.path.isdir(where):
            fail(f"{where} is neither a checkpoint (ckpt-NNNNNN.npz) nor a run dir")
        names = run.store.names()
        found = [AGENT_FILE] if AGENT_FILE in names else run.checkpoints()
    except StoreError as e:
        fail(str(e))
    if not found and RUN_RECORD in names:
        fail(
            f"{where} keeps a run's config and metrics without weights (its {RUN_RECORD}, from pongtools.ship "
            "--metrics-only): nothing to play; pass the run's own run dir or a shipped agent"
        )
    if not found:
        fail(f"{where} holds no checkpoint (ckpt-NNNNNN.npz) yet; the trainer writes one every --checkpoint-every")
    return run, found[0]


def default_gif(run, name, update):
    """play-<update>.gif beside a run's local checkpoint; for one on S3 or an exported agent (a folder
    that may be under version control), in ~/pong-runs/play/."""
    gif = f"play-{update:06d}.gif"
    if run.path.startswith("s3://") or name == AGENT_FILE:
        return os.path.join(os.path.expanduser(DEFAULT_RUNS), "play", gif)
    return os.path.join(run.path, gif)


def add_checkpoint(p):
    """The checkpoint argument play and judge share, and the folders of the latest run without it."""
    p.add_argument(
        "checkpoint",
        nargs="?",
        help="a ckpt-NNNNNN.npz (local or s3://...), a run dir (its newest checkpoint), "
        f"or a folder with an exported {AGENT_FILE} (make ship); default: the latest run in --runs-in",
    )
    p.add_argument(
        "--runs-in",
        action="append",
        metavar="FOLDER",
        help=f"where the latest run is looked for, one folder each (default: {', '.join(RUNS_IN)})",
    )


def parse_args(argv):
    p = Parser(prog="python -m pongtools.play", description=__doc__.split("\n\n")[0])
    add_checkpoint(p)
    p.add_argument("--games", type=at_least(1), default=3, help="games to play")
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default=POLICIES[0],
        help="greedy: UP iff P(UP) > 0.5; sampled: UP with probability P(UP), as in training",
    )
    p.add_argument(
        "--seed",
        type=at_least(0),
        default=0,
        help="seeds the frame skips, sticky actions and sampled actions",
    )
    p.add_argument(
        "--scale",
        type=at_least(1),
        default=2,
        help="GIF pixels per screen pixel (nearest neighbour)",
    )
    p.add_argument("--out", help="GIF to write (default: play-<update>.gif beside the checkpoint); its PNG beside it")
    return p.parse_args(argv)


def latest_run(folders):
    """(RunDir, file name) of the newest checkpoint of the newest run in folders: each folder's run dirs
    (`make train`'s) and OUTs with a run/ inside (`make run`'s), the newest being the one whose newest
    checkpoint was written last; exits with one line, saying what to name, if none holds one."""
    found = []
    for folder in folders:
        folder = os.path.expanduser(folder)
        if not os.path.isdir(folder):
            continue
        for entry in os.listdir(folder):
            for run_dir in (os.path.join(folder, entry), os.path.join(folder, entry, "run")):
                if not os.path.isdir(run_dir):
                    continue
                run = RunDir(run_dir)
                names = run.checkpoints()
                if names:
                    found.append((os.path.getmtime(run.file(names[0])), run, names[0]))
    if not found:
        fail(f"no run with a checkpoint in {' or '.join(folders)} (make train's and make run's runs); {NAME_ONE}")
    _, run, name = max(found, key=lambda f: f[0])
    return run, name


def load_player(where, runs_in=RUNS_IN):
    """(path, weights state, env id, a stepper of that env) of the checkpoint at `where` (see
    find_checkpoint), or, where is None, of the latest run in runs_in (latest_run); its first line
    names it. Exits with one line if it cannot be loaded or its env cannot be played here."""
    run, name = find_checkpoint(where) if where else latest_run(runs_in)
    path = run.file(name)
    try:
        state = run.load_weights(name)
    except CheckpointError as e:
        fail(str(e))
    print(kv("checkpoint", path=path, update=state.update, chosen="named" if where else "latest"), flush=True)
    env_id = state.config.get("env", "Pong-v0")
    try:
        stepper = rollout.AtariStepper(env_id)
    except rollout.EnvError as e:
        fail(f"checkpoint {path} was made for {env_id!r}, which this machine cannot play: {e}")
    return run, name, state, env_id, stepper


def main(argv=None):
    args = parse_args(argv)
    run, name, state, env_id, stepper = load_player(args.checkpoint, args.runs_in or RUNS_IN)
    path = run.file(name)
    gif = os.path.abspath(os.path.expanduser(args.out)) if args.out else default_gif(run, name, state.update)
    png = os.path.splitext(gif)[0] + ".png"
    try:
        os.makedirs(os.path.dirname(gif), exist_ok=True)
    except OSError as e:
        fail(f"cannot write {gif}: {e.strerror or e}")

    pol = Policy(state.params)
    recorder = Recorder()
    totals = [0, 0]
    wins = 0
    for game in range(1, args.games + 1):
        t = time.perf_counter()
        won, lost, steps = play_game(
            stepper, pol, args.seed, game, args.policy == "greedy", recorder if game == 1 else None
        )
        totals[0] += won
        totals[1] += lost
        wins += won > lost
        print(
            kv(
                game=game,
                agent=won,
                computer=lost,
                points=won + lost,
                reward=won - lost,
                steps=steps,
                seconds=time.perf_counter() - t,
            ),
            flush=True,
        )
        if steps >= MAX_STEPS:
            print(f"WARNING: game {game} was cut off after {MAX_STEPS} steps, before either side reached 21")
    size = write_gif(recorder, args.scale, gif, png)
    print(
        kv(
            "play",
            checkpoint=path,
            update=state.update,
            env=env_id,
            policy=args.policy,
            seed=args.seed,
            games=args.games,
            agent_points=totals[0],
            computer_points=totals[1],
            games_won=wins,
            mean_point_difference=(totals[0] - totals[1]) / args.games,
            gif=gif,
            png=png,
            gif_frames=len(recorder.frames),
            gif_stride=recorder.stride,
            gif_size=f"{size[0]}x{size[1]}",
            gif_mb=os.path.getsize(gif) / 2**20,
        )
    )


def entry():
    """`python -m pongtools.play`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
