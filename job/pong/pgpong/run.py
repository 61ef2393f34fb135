"""A run directory, opened once: its store, its checkpoints and its metrics. No Ray here.

    run = Run("~/pong-runs/a")               # a folder, or s3://bucket/prefix
    run.prepare()                            # the trainer: create it, check that it takes writes, lock it
    state = run.load_latest(config)          # the newest usable checkpoint, or None; run.loaded_path() names it
    run.trim_metrics(state.update)           # metrics only up to that checkpoint, a torn line cut
    run.append_metrics(record)               # after every update
    run.save(state)                          # a checkpoint, written whole or not at all
    run.close()                              # the trainer's end: the lock goes
    run.metrics()                            # the tools: every update's record
    run.config()                             # the config the run was made with

The trainer opens its run dir once and keeps the Run for its life; the tools (plot, play,
ship, compare, sweep, plan) read runs through the same class. A Run owns its store, so what
the store keeps between calls (S3 has no append: the segment being appended to) lives as
long as the Run.
"""

import gzip
import json
import os
import re

from . import checkpoint, lock
from .checkpoint import CheckpointError, WrongNetwork
from .store import StoreError, join, open_store, where

KEEP = 3  # checkpoints kept in a run directory
_CHECKPOINT = re.compile(r"^ckpt-(\d{6,})\.npz$")
MUST_MATCH = ("env",)  # config fields a resumed run cannot change
AGENT_FILE = "pong-agent.npz"  # an exported agent's weights (make ship)
# An exported comparison run (pongtools.ship --metrics-only): its config and counters, no weights.
RUN_RECORD = "run.json"

# Metrics are one JSON line per update. A local run dir appends them to metrics.jsonl. S3
# has no append, so an S3 run dir writes them in segments of SEGMENT_UPDATES updates,
# metrics-NNNNNN.jsonl named by their first update: each update PUTs only its own segment,
# so the cost of a write does not grow with the run. Readers join metrics.jsonl (a local
# run, or an S3 run from before segments) and then the segments, in update order. An
# exported run (make ship) holds them all, compressed, in metrics.jsonl.gz.
METRICS = "metrics.jsonl"
SEGMENT_UPDATES = 50
_SEGMENT = re.compile(r"^metrics-(\d{6,})\.jsonl$")
SHIPPED_METRICS = "metrics.jsonl.gz"


def _updates(numbers):
    """'update 3', 'updates 1-3, 7': runs of consecutive update numbers."""
    numbers, runs = sorted(set(numbers)), []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return ("update " if len(numbers) == 1 else "updates ") + text


def metrics_segment(update):
    """The S3 segment that holds an update's line: metrics-000051.jsonl for updates 51..100."""
    first = (update - 1) // SEGMENT_UPDATES * SEGMENT_UPDATES + 1
    return f"metrics-{first:06d}.jsonl"


class Run:
    """One run directory: a local folder (made absolute) or s3://bucket/prefix, and its store."""

    def __init__(self, path):
        self.path = where(path)
        self.store = open_store(self.path)
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

    # -- metrics -----------------------------------------------------------------

    def append_metrics(self, record):
        name = METRICS if self.store.appends else metrics_segment(record["update"])
        self._writing()
        self.store.append(name, json.dumps(record) + "\n")

    def metrics_files(self, names=None):
        """The names that hold the run's metrics, oldest first."""
        names = self.store.names() if names is None else names
        segments = sorted((int(m.group(1)), n) for n in names if (m := _SEGMENT.match(n)))
        return ([METRICS] if METRICS in names else []) + [n for _, n in segments]

    def metrics(self):
        """Every update's record, in order: metrics.jsonl and an S3 run's segments joined, or an
        exported run's metrics.jsonl.gz. A line still being written, or cut short, is skipped.

        FileNotFoundError if the run has no metrics yet, StoreError if the run dir cannot be
        reached (S3 credentials, a missing bucket).
        """
        names = self.store.names()
        files = self.metrics_files(names)
        if files:
            parts = [self.store.read(name).decode(errors="replace") for name in files]
            text = "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts)  # a cut line stays alone
        elif SHIPPED_METRICS in names:
            text = gzip.decompress(self.store.read(SHIPPED_METRICS)).decode(errors="replace")
        else:
            raise FileNotFoundError(f"{self.path} has no {METRICS}")
        records = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "update" in record:
                records.append(record)
        return records

    def trim_metrics(self, last_update, warn=print):
        """Keep the metric lines of updates up to last_update, the checkpoint a run starts from (0 for
        a fresh start): later ones will be run again. A line cut short when the driver died (a torn
        last line) or unreadable is cut too. What was dropped, and the updates up to last_update that
        have no line (lost, though their checkpoint counted them), are said through `warn`."""
        self._writing()
        torn, dropped, seen = [], [], set()
        for name in self.metrics_files():
            lines = self.store.read(name).decode(errors="replace").splitlines(keepends=True)
            kept = []
            for line in lines:
                try:
                    update = json.loads(line)["update"]
                except (ValueError, KeyError, TypeError):
                    update = None
                if not isinstance(update, int):  # cut short when the driver died, or not a record
                    torn.append(f"{name}: {len(line.encode())} bytes {line[:40]!r}")
                    continue
                if update > last_update:
                    dropped.append(update)
                    continue
                seen.add(update)
                kept.append(line if line.endswith("\n") else line + "\n")
            if kept == lines:
                continue
            if kept or name == METRICS:
                self.store.write(name, "".join(kept).encode())
            else:
                self.store.delete(name)
        if torn:
            what = "a torn or unreadable metrics line" if len(torn) == 1 else f"{len(torn)} torn or unreadable lines"
            warn(f"cut {what} of {self.path}, as a driver killed mid-write leaves: {'; '.join(torn)}")
        start = f"the checkpoint of update {last_update}" if last_update else "no checkpoint"
        if dropped:
            again = "it runs" if len(set(dropped)) == 1 else "they run"
            warn(f"dropped the metrics of {_updates(dropped)} of {self.path}, past {start}: {again} again")
        lost = sorted(set(range(1, last_update + 1)) - seen)
        if lost:
            its, it = ("its", "it") if len(lost) == 1 else ("their", "them")
            warn(
                f"{self.path} has no metrics line for {_updates(lost)}: lost, though "
                f"{self.loaded or 'the checkpoint'} counts {its} episodes; plots and trend lines skip {it}"
            )

    @classmethod
    def of_file(cls, path):
        """(Run, file name) of a file in a run dir: '/d/ckpt-000001.npz' -> (Run('/d'), 'ckpt-000001.npz')."""
        path = str(path)
        if path.startswith("s3://"):
            head, _, name = path.rstrip("/").rpartition("/")
            return cls(head), name
        head, name = os.path.split(os.path.abspath(os.path.expanduser(path)))
        return cls(head), name
