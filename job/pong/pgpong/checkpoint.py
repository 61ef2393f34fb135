"""Checkpoints and metrics in a run directory (a folder or s3://bucket/prefix). No Ray here.

A checkpoint is one .npz holding everything needed to resume: the weights, the
RMSProp cache, the counters, the running reward, the random state and the
config. The store writes it whole or not at all (store.py), so a reader sees
either the old one or the whole new one, never a part.
"""

import dataclasses
import functools
import io
import json
import re
import zipfile

import numpy as np

from .store import StoreError, join, open_store, split

FORMAT = 1  # bump when the file layout changes
WEIGHTS_FORMAT = "weights-1"  # an exported agent: weights only, no RMSProp cache, so it plays but cannot resume
AGENT_FILE = "pong-agent.npz"  # the exported agent's name in a folder (make ship)
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
    rmsprop_steps: int = 0  # RMSProp steps taken into the cache (the corrected start divides by 1 - decay^t)
    config: dict = dataclasses.field(default_factory=dict)


@functools.cache
def store(run_dir):
    """One store per run dir for the life of the process (S3 keeps appended files in memory)."""
    return open_store(str(run_dir))


def prepare_run_dir(run_dir):
    """Create the run directory and check it can be written, or raise StoreError."""
    store(run_dir).prepare()


def checkpoints(run_dir):
    """Checkpoint paths (or s3:// URLs) in the run directory, newest first."""
    names = store(run_dir).names()
    found = sorted(((int(m.group(1)), n) for n in names if (m := _NAME.match(n))), reverse=True)
    return [join(str(run_dir), n) for _, n in found]


def save(run_dir, state, keep=KEEP):
    """Write the checkpoint for state.update atomically; prune old ones. Returns its path."""
    name = f"ckpt-{state.update:06d}.npz"
    meta = {
        "format": FORMAT,
        "update": state.update,
        "episodes": state.episodes,
        "env_steps": state.env_steps,
        "running_reward": state.running_reward,
        "seconds": state.seconds,
        "rmsprop_steps": state.rmsprop_steps,
        "rng": {"seed": state.config.get("seed"), "next_update": state.update + 1},
        "config": state.config,
    }
    arrays = {f"params/{k}": v for k, v in state.params.items()}
    arrays |= {f"cache/{k}": v for k, v in state.cache.items()}
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
    store(run_dir).write(name, buffer.getvalue())
    for old in checkpoints(run_dir)[keep:]:
        store(run_dir).delete(split(old)[1])
    return join(str(run_dir), name)


def load(path):
    """Read one checkpoint; raise CheckpointError naming the file if it is unusable."""
    try:
        run_dir, name = split(str(path))
        with np.load(io.BytesIO(store(run_dir).read(name)), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            params = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("params/")}
            cache = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("cache/")}
    except (OSError, StoreError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')}, this trainer reads {FORMAT}")
    if set(params) != {"W1", "W2"} or set(cache) != set(params):
        raise CheckpointError(f"checkpoint {path} lacks weights or RMSProp cache")
    params["W1"] = np.asfortranarray(params["W1"])
    cache["W1"] = np.asfortranarray(cache["W1"])
    fields = {k: meta[k] for k in ("update", "episodes", "env_steps", "running_reward", "seconds")}
    fields["rmsprop_steps"] = meta.get("rmsprop_steps", meta["update"])  # before the field: one step an update
    return State(params=params, cache=cache, config=meta["config"], **fields)


def export_weights(state, path, dtype=np.float16):
    """Write the weights alone, as `dtype`, compressed: what `make play` needs and nothing to resume from."""
    meta = {
        "format": WEIGHTS_FORMAT,
        "dtype": np.dtype(dtype).name,
        **{k: getattr(state, k) for k in ("update", "episodes", "env_steps", "running_reward", "seconds")},
        "config": state.config,
    }
    buffer = io.BytesIO()
    arrays = {f"params/{k}": v.astype(dtype) for k, v in state.params.items()}
    np.savez_compressed(buffer, meta=np.array(json.dumps(meta)), **arrays)
    run_dir, name = split(str(path))
    store(run_dir).write(name, buffer.getvalue())
    return path


def load_weights(path):
    """The weights (float32) and counters of a checkpoint or an exported agent; State.cache is None
    for an agent. Raises CheckpointError naming the file if it is unusable."""
    from .policy import DTYPE  # here, not at the top: numba is slow to import and plot never needs it

    try:
        run_dir, name = split(str(path))
        with np.load(io.BytesIO(store(run_dir).read(name)), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != WEIGHTS_FORMAT:
                return load(path)
            params = {k.split("/", 1)[1]: z[k].astype(DTYPE) for k in z.files if k.startswith("params/")}
    except (OSError, StoreError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({e})") from None
    if set(params) != {"W1", "W2"}:
        raise CheckpointError(f"agent {path} lacks weights")
    params["W1"] = np.asfortranarray(params["W1"])
    fields = {k: meta[k] for k in ("update", "episodes", "env_steps", "running_reward", "seconds")}
    return State(params=params, cache=None, config=meta["config"], **fields)


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
        warn(f"{message}; using {split(path)[1]} instead")
    for key in MUST_MATCH:
        if state.config.get(key) != config.get(key):
            raise CheckpointError(
                f"checkpoint {path} was made with {key}={state.config.get(key)!r}, "
                f"not {config.get(key)!r}; use another --run-dir"
            )
    if state.params["W1"].shape != (state.params["W2"].shape[0], 80 * 80):
        raise CheckpointError(f"checkpoint {path} has weights of shape {state.params['W1'].shape}")
    return state


# Metrics are one JSON line per update. A local run dir appends them to metrics.jsonl. S3
# has no append, so an S3 run dir writes them in segments of SEGMENT_UPDATES updates,
# metrics-NNNNNN.jsonl named by their first update: each update PUTs only its own segment,
# so the cost of a write does not grow with the run. Readers join metrics.jsonl (a local
# run, or an S3 run from before segments) and then the segments, in update order.
METRICS = "metrics.jsonl"
SEGMENT_UPDATES = 50
_SEGMENT = re.compile(r"^metrics-(\d{6,})\.jsonl$")


def metrics_segment(update):
    """The S3 segment that holds an update's line: metrics-000051.jsonl for updates 51..100."""
    first = (update - 1) // SEGMENT_UPDATES * SEGMENT_UPDATES + 1
    return f"metrics-{first:06d}.jsonl"


def append_metrics(run_dir, record):
    st = store(run_dir)
    name = METRICS if st.appends else metrics_segment(record["update"])
    st.append(name, json.dumps(record) + "\n")


def metrics_files(run_dir):
    """The names that hold the run's metrics, oldest first."""
    names = store(run_dir).names()
    segments = sorted((int(m.group(1)), n) for n in names if (m := _SEGMENT.match(n)))
    return ([METRICS] if METRICS in names else []) + [n for _, n in segments]


def read_metrics_text(run_dir):
    """All metric lines of the run, joined; FileNotFoundError if it has none yet."""
    st, parts = store(run_dir), []
    files = metrics_files(run_dir)
    if not files:
        raise FileNotFoundError(f"{run_dir} has no {METRICS}")
    for name in files:
        text = st.read(name).decode(errors="replace")
        parts.append(text if text.endswith("\n") or not text else text + "\n")  # a cut line stays alone
    return "".join(parts)


def trim_metrics(run_dir, last_update):
    """Drop metric lines of updates after the checkpoint we resume from (they will be run again)."""
    st = store(run_dir)
    for name in metrics_files(run_dir):
        lines = st.read(name).decode().splitlines(keepends=True)
        kept = []
        for line in lines:
            try:
                if json.loads(line)["update"] <= last_update:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                pass  # a line cut short when the driver died
        if kept == lines:
            continue
        if kept or name == METRICS:
            st.write(name, "".join(kept).encode())
        else:
            st.delete(name)
