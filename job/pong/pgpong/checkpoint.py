"""The checkpoint file: what it holds and its bytes. No Ray, no files here (rundir.py reads and writes them).

A checkpoint is one .npz holding everything needed to resume: the weights, the
RMSProp cache, the counters, the running reward, the random state and the
config. An exported agent (make ship) is an .npz of the weights alone, as float16:
it plays, it cannot resume.
"""

import dataclasses
import io
import json
import zipfile

import numpy as np

FORMAT = 1  # bump when the file layout changes
WEIGHTS_FORMAT = "weights-1"  # an exported agent: weights only, no RMSProp cache, so it plays but cannot resume
COUNTERS = ("update", "episodes", "env_steps", "running_reward", "seconds")


class CheckpointError(Exception):
    """A checkpoint cannot be used; the message names the file."""


class WrongNetwork(CheckpointError):
    """A readable checkpoint whose arrays do not fit this trainer's network: a run of another
    network, never skipped as damage is (the message names the file, the array and both shapes)."""


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


def to_bytes(state):
    """The checkpoint file of state."""
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
    return buffer.getvalue()


def _open(data, where):
    """(meta, {name: array}) of an .npz; CheckpointError naming `where` if it cannot be read."""
    if not data.startswith(b"PK"):  # not a zip: numpy would try it as a pickle and advise loading it unsafely
        raise CheckpointError(f"checkpoint {where} is corrupt or unreadable (not an .npz file)")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return json.loads(str(z["meta"])), {k: z[k] for k in z.files if k != "meta"}
    except ValueError as e:
        why = "it holds Python objects, which a checkpoint never does" if "allow_pickle" in str(e) else e
        raise CheckpointError(f"checkpoint {where} is corrupt or unreadable ({why})") from None
    except (OSError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {where} is corrupt or unreadable ({e})") from None


def check_shapes(arrays, where):
    """WrongNetwork naming `where`, the array and both shapes if an array (params/W1, cache/W2, ...)
    does not have the shape of this trainer's network (policy.shapes)."""
    from .policy import shapes  # here, not at the top: numba is slow to import and plot never needs it

    for name, array in arrays.items():
        want = shapes()[name.rsplit("/", 1)[-1]]
        if array.shape != want:
            raise WrongNetwork(
                f"checkpoint {where} has {name} of shape {array.shape}, but this trainer's network needs "
                f"{want}; it is a run of another network: use another --run-dir"
            )


def _part(arrays, prefix):
    return {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def from_bytes(data, where):
    """The State of a checkpoint file; `where` names it in a CheckpointError."""
    return _resumable(*_open(data, where), where)


def _resumable(meta, arrays, where):
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {where} has format {meta.get('format')}, this trainer reads {FORMAT}")
    params, cache = _part(arrays, "params"), _part(arrays, "cache")
    if set(params) != {"W1", "W2"} or set(cache) != set(params):
        raise CheckpointError(f"checkpoint {where} lacks weights or RMSProp cache")
    check_shapes({f"{part}/{k}": v for part, d in (("params", params), ("cache", cache)) for k, v in d.items()}, where)
    params["W1"] = np.asfortranarray(params["W1"])
    cache["W1"] = np.asfortranarray(cache["W1"])
    try:
        fields = {k: meta[k] for k in COUNTERS}
        fields["rmsprop_steps"] = meta.get("rmsprop_steps", meta["update"])  # before the field: one step an update
        return State(params=params, cache=cache, config=meta["config"], **fields)
    except KeyError as e:
        raise CheckpointError(f"checkpoint {where} is corrupt or unreadable ({e})") from None


def weights_to_bytes(state, dtype=np.float16):
    """An exported agent's file: the weights alone, as `dtype`, compressed; the counters and the config."""
    meta = {
        "format": WEIGHTS_FORMAT,
        "dtype": np.dtype(dtype).name,
        **{k: getattr(state, k) for k in COUNTERS},
        "config": state.config,
    }
    buffer = io.BytesIO()
    arrays = {f"params/{k}": v.astype(dtype) for k, v in state.params.items()}
    np.savez_compressed(buffer, meta=np.array(json.dumps(meta)), **arrays)
    return buffer.getvalue()


def weights_from_bytes(data, where):
    """The weights (float32), counters and config of an exported agent or of a checkpoint; State.cache
    is None for an agent. `where` names the file in a CheckpointError."""
    from .policy import DTYPE  # here, not at the top: numba is slow to import and plot never needs it

    meta, arrays = _open(data, where)
    if meta.get("format") != WEIGHTS_FORMAT:
        return _resumable(meta, arrays, where)
    params = {k: v.astype(DTYPE) for k, v in _part(arrays, "params").items()}
    if set(params) != {"W1", "W2"}:
        raise CheckpointError(f"agent {where} lacks weights")
    check_shapes({f"params/{k}": v for k, v in params.items()}, where)
    params["W1"] = np.asfortranarray(params["W1"])
    try:
        return State(params=params, cache=None, config=meta["config"], **{k: meta[k] for k in COUNTERS})
    except KeyError as e:
        raise CheckpointError(f"checkpoint {where} is corrupt or unreadable ({e})") from None
