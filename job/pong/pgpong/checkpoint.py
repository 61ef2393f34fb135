"""Checkpoints and metrics in a run directory. No Ray here.

A checkpoint is one .npz holding everything needed to resume: the weights, the
RMSProp cache, the counters, the running reward, the random state and the
config. It is written to a temporary name and renamed, so a reader sees either
the old file or the whole new one, never a part.
"""

import dataclasses
import json
import os
import re
import tempfile
import zipfile

import numpy as np

FORMAT = 1  # bump when the file layout changes
KEEP = 3  # checkpoints kept in a run directory
_NAME = re.compile(r"^ckpt-(\d{6,})\.npz$")
MUST_MATCH = ("env",)  # config fields a resumed run cannot change


class CheckpointError(Exception):
    """A checkpoint cannot be used; the message names the file."""


@dataclasses.dataclass
class State:
    params: dict
    cache: dict
    update: int = 0  # updates completed
    episodes: int = 0
    env_steps: int = 0
    running_reward: float | None = None
    seconds: float = 0.0  # training wall-clock seconds, summed over runs
    config: dict = dataclasses.field(default_factory=dict)


def prepare_run_dir(run_dir):
    """Create the run directory (and check it can be written) or raise OSError."""
    os.makedirs(run_dir, exist_ok=True)
    with tempfile.TemporaryFile(dir=run_dir):
        pass


def checkpoints(run_dir):
    """Checkpoint paths in the run directory, newest first."""
    try:
        names = os.listdir(run_dir)
    except FileNotFoundError:
        return []
    found = sorted(((int(m.group(1)), n) for n in names if (m := _NAME.match(n))), reverse=True)
    return [os.path.join(run_dir, n) for _, n in found]


def save(run_dir, state, keep=KEEP):
    """Write the checkpoint for state.update atomically; prune old ones. Returns its path."""
    path = os.path.join(run_dir, f"ckpt-{state.update:06d}.npz")
    meta = {
        "format": FORMAT,
        "update": state.update,
        "episodes": state.episodes,
        "env_steps": state.env_steps,
        "running_reward": state.running_reward,
        "seconds": state.seconds,
        "rng": {"seed": state.config.get("seed"), "next_update": state.update + 1},
        "config": state.config,
    }
    arrays = {f"params/{k}": v for k, v in state.params.items()}
    arrays |= {f"cache/{k}": v for k, v in state.cache.items()}
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=run_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    for old in checkpoints(run_dir)[keep:]:
        os.unlink(old)
    return path


def load(path):
    """Read one checkpoint; raise CheckpointError naming the file if it is unusable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            params = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("params/")}
            cache = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("cache/")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')}, this trainer reads {FORMAT}")
    if set(params) != {"W1", "W2"} or set(cache) != set(params):
        raise CheckpointError(f"checkpoint {path} lacks weights or RMSProp cache")
    params["W1"] = np.asfortranarray(params["W1"])
    cache["W1"] = np.asfortranarray(cache["W1"])
    fields = {k: meta[k] for k in ("update", "episodes", "env_steps", "running_reward", "seconds")}
    return State(params=params, cache=cache, config=meta["config"], **fields)


def load_latest(run_dir, config, warn=print):
    """The newest usable checkpoint in run_dir as a State, or None if there is none.

    A corrupt newest checkpoint (a crash mid-write, a damaged disk) is reported by name
    through `warn` and the previous one is used. If none can be read, or the newest
    readable one belongs to another config, CheckpointError: never a silent fresh start.
    """
    paths = checkpoints(run_dir)
    if not paths:
        return None
    bad = []
    for path in paths:
        try:
            state = load(path)
            break
        except CheckpointError as e:
            bad.append(str(e))
    else:
        raise CheckpointError("; ".join(bad) + "; no usable checkpoint is left: use another --run-dir")
    for message in bad:
        warn(f"{message}; using {os.path.basename(path)} instead")
    for key in MUST_MATCH:
        if state.config.get(key) != config.get(key):
            raise CheckpointError(
                f"checkpoint {path} was made with {key}={state.config.get(key)!r}, "
                f"not {config.get(key)!r}; use another --run-dir"
            )
    if state.params["W1"].shape != (state.params["W2"].shape[0], 80 * 80):
        raise CheckpointError(f"checkpoint {path} has weights of shape {state.params['W1'].shape}")
    return state


def append_metrics(run_dir, record):
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def trim_metrics(run_dir, last_update):
    """Drop metric lines of updates after the checkpoint we resume from (they will be run again)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line)["update"] <= last_update:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                pass  # a line cut short when the driver died
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)
