"""A run directory, opened once: its store, its checkpoints and its metrics. No Ray here.

    run = RunDir("~/pong-runs/a")             # a folder, or s3://bucket/prefix
    run.prepare()                            # the trainer: create it, check that it takes writes, lock it
    state = run.load_latest(config)          # the newest usable checkpoint, or None; run.loaded_path() names it
    run.trim_metrics(state.update)           # metrics only up to that checkpoint, a torn line cut
    run.append_metrics(record)               # after every update
    run.save(state)                          # a checkpoint, written whole or not at all
    run.close()                              # the trainer's end: the lock goes
    run.metrics()                            # the tools: every update's record
    run.config()                             # the config the run was made with

The trainer opens its run dir once and keeps the RunDir for its life; the tools (plot, play,
ship, compare, sweep, plan) read runs through the same class. A RunDir owns its store, so what
the store keeps between calls (S3 has no append: the segment being appended to) lives as
long as the RunDir.
"""

import gzip
import json
import os
import re

from . import checkpoint, lock
from .checkpoint import CheckpointError, WrongNetwork
from .metrics import METRICS, SHIPPED_METRICS, MetricsLog
from .store import StoreError, join, open_store, where

KEEP = 3  # checkpoints kept in a run directory
_CHECKPOINT = re.compile(r"^ckpt-(\d{6,})\.npz$")
MUST_MATCH = ("env",)  # config fields a resumed run cannot change
AGENT_FILE = "pong-agent.npz"  # an exported agent's weights (make ship)
# An exported comparison run (pongtools.ship --metrics-only): its config and counters, no weights.
RUN_RECORD = "run.json"


class RunDir:
    """One run directory: a local folder (made absolute) or s3://bucket/prefix, and its store."""

    def __init__(self, path):
        self.path = where(path)
        self.store = open_store(self.path)
        self.log = MetricsLog(self.store, self.path)  # metrics.jsonl, or an S3 run's segments
        self.lock = None  # held from prepare() to close(): this process is the run dir's one writer
        self.loaded = None  # the name of the checkpoint load_latest returned

    def __str__(self):
        return self.path

    def file(self, name):
        """The path (or s3:// URL) of one of the run's files."""
        return join(self.path, name)

    def prepare(self, warn=print):
        """Create the run directory, check that it can be written and lock it for this process (the
        trainer), or raise StoreError: lock.Locked, naming the holder, if a live trainer writes there.
        A dead trainer's lock is taken over and its temp files removed, said through `warn`."""
        self.store.prepare()
        self.lock = lock.acquire(self.store, self.path, warn)
        self.store.clean()

    def close(self):
        """Release the lock prepare() took (the trainer's end, however it ends)."""
        if self.lock:
            self.lock.release()
            self.lock = None

    def _writing(self):
        if self.lock:
            self.lock.check()  # LockLost if another trainer has taken the run dir over

    # -- checkpoints -------------------------------------------------------------

    def checkpoints(self):
        """The names of the run's checkpoints, newest first."""
        found = [(int(m.group(1)), n) for n in self.store.names() if (m := _CHECKPOINT.match(n))]
        return [n for _, n in sorted(found, reverse=True)]

    def save(self, state, keep=KEEP):
        """Write the checkpoint of state.update whole or not at all; prune old ones. Returns its path."""
        name = f"ckpt-{state.update:06d}.npz"
        self._writing()
        self.store.write(name, checkpoint.to_bytes(state))
        for old in self.checkpoints()[keep:]:
            self.store.delete(old)
        return self.file(name)

    def _read(self, name):
        try:
            return self.store.read(name)
        except (OSError, StoreError) as e:
            raise CheckpointError(f"checkpoint {self.file(name)} is corrupt or unreadable ({e})") from None

    def load(self, name):
        """One checkpoint, everything needed to resume; CheckpointError naming the file if it is unusable."""
        return checkpoint.from_bytes(self._read(name), self.file(name))

    def load_weights(self, name):
        """The weights (float32), counters and config of a checkpoint or an exported agent
        (State.cache is None for an agent); CheckpointError naming the file if it is unusable."""
        return checkpoint.weights_from_bytes(self._read(name), self.file(name))

    def loaded_path(self):
        """The path of the checkpoint load_latest returned, or None."""
        return self.file(self.loaded) if self.loaded else None

    def load_latest(self, config, warn=print):
        """The newest usable checkpoint as a State, or None if there is none.

        A corrupt newest checkpoint (a crash mid-write, a damaged disk) is reported by name
        through `warn` and the previous one is used; self.loaded names the one returned. If none
        can be read, one is of another network (checkpoint.WrongNetwork: its arrays' shapes), or
        the newest readable one belongs to another config, CheckpointError: never a silent fresh
        start, and never an older checkpoint in place of a bug's.
        """
        names = self.checkpoints()
        if not names:
            return None
        bad = []
        for name in names:
            try:
                state = self.load(name)
                break
            except WrongNetwork:
                raise
            except CheckpointError as e:
                bad.append(str(e))
        else:
            raise CheckpointError("; ".join(bad) + "; no usable checkpoint is left: use another --run-dir")
        for message in bad:
            warn(f"{message}; using {name} instead")
        for key in MUST_MATCH:
            if state.config.get(key) != config.get(key):
                raise CheckpointError(
                    f"checkpoint {self.file(name)} was made with {key}={state.config.get(key)!r}, "
                    f"not {config.get(key)!r}; use another --run-dir"
                )
        self.loaded = name
        return state

    def export(self, state, records, weights=True):
        """Write the run as a shipped agent: the weights alone as float16 (it plays, it cannot resume)
        and every metrics record, compressed. Without weights, RUN_RECORD stands in for them: the
        config and counters, all that comparing runs needs. Returns the path of the one or the other."""
        if weights:
            self.store.write(AGENT_FILE, checkpoint.weights_to_bytes(state))
        else:
            fields = ("update", "episodes", "env_steps", "running_reward", "seconds", "rmsprop_steps", "config")
            record = {k: getattr(state, k) for k in fields}
            self.store.write(RUN_RECORD, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        text = "".join(json.dumps(r) + "\n" for r in records)
        self.store.write(SHIPPED_METRICS, gzip.compress(text.encode(), mtime=0))  # mtime 0: same run, same bytes
        return self.file(AGENT_FILE if weights else RUN_RECORD)

    def config(self):
        """(config, where it came from): that of the newest readable checkpoint, or of the exported
        agent or run record; before the first checkpoint, the batch size the metrics show."""
        names = self.checkpoints() + ([AGENT_FILE] if AGENT_FILE in self.store.names() else [])
        for name in names:
            try:
                return self.load_weights(name).config, f"config of {name}"
            except CheckpointError:
                continue
        if RUN_RECORD in self.store.names():
            return json.loads(self.store.read(RUN_RECORD))["config"], f"config of {RUN_RECORD}"
        records = self.metrics()
        return {
            "batch_size": records[0]["episodes"]
        } if records else {}, f"no checkpoint yet: batch size from {METRICS}"

    # -- metrics: the run's MetricsLog (pgpong.metrics) ------------------------

    def append_metrics(self, record):
        self._writing()
        self.log.append(record)

    def metrics(self):
        """Every update's record, in order (MetricsLog.records)."""
        return self.log.records()

    def trim_metrics(self, last_update, warn=print):
        """Keep the metric lines of updates up to last_update (MetricsLog.trim)."""
        self._writing()
        self.log.trim(last_update, self.loaded or "the checkpoint", warn)

    @classmethod
    def of_file(cls, path):
        """(RunDir, file name) of a file in a run dir: '/d/ckpt-000001.npz' -> (RunDir('/d'), 'ckpt-000001.npz')."""
        path = str(path)
        if path.startswith("s3://"):
            head, _, name = path.rstrip("/").rpartition("/")
            return cls(head), name
        head, name = os.path.split(os.path.abspath(os.path.expanduser(path)))
        return cls(head), name
