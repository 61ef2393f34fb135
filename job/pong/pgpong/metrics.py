"""A run directory's metrics: one JSON line per update, appended after each, read back in order by the tools,
trimmed to the checkpoint a resumed run starts from. No Ray here; pgpong.rundir's RunDir holds one per run dir."""

import gzip
import json
import re

from pgpong.store import StoreError

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


class MetricsError(StoreError):
    """A whole line of a run's metrics that is no update's record: the file is corrupt, not being written."""


class MetricsLog:
    """The metrics of the run dir at path, in its store (pgpong.store): written by the trainer, read by every tool."""

    def __init__(self, store, path):
        self.store, self.path = store, path

    def append(self, record):
        name = METRICS if self.store.appends else metrics_segment(record["update"])
        self.store.append(name, json.dumps(record) + "\n")

    def files(self, names=None):
        """The names that hold the run's metrics, oldest first."""
        names = self.store.names() if names is None else names
        segments = sorted((int(m.group(1)), n) for n in names if (m := _SEGMENT.match(n)))
        return ([METRICS] if METRICS in names else []) + [n for _, n in segments]

    def records(self):
        """Every update's record, in order: metrics.jsonl and an S3 run's segments joined, or an
        exported run's metrics.jsonl.gz. A file's last line without its newline (still being written,
        or cut short) is skipped.

        FileNotFoundError if the run has no metrics yet, StoreError if the run dir cannot be
        reached (S3 credentials, a missing bucket), MetricsError (a StoreError) for a whole line that is
        no record, named by its file and line number.
        """
        names = self.store.names()
        files = self.files(names)
        if files:
            texts = [(name, self.store.read(name).decode(errors="replace")) for name in files]
        elif SHIPPED_METRICS in names:
            texts = [(SHIPPED_METRICS, gzip.decompress(self.store.read(SHIPPED_METRICS)).decode(errors="replace"))]
        else:
            raise FileNotFoundError(f"{self.path} has no {METRICS}")
        records = []
        for name, text in texts:
            for number, line in enumerate(text.splitlines(keepends=True), 1):
                if not line.endswith("\n"):  # the line being written
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if not isinstance(record, dict) or "update" not in record:
                    raise MetricsError(
                        f"{self.path}/{name} line {number} is no update's record ({line[:40]!r}): the file is corrupt;"
                        " remove that line (a resumed run cuts it itself)"
                    )
                records.append(record)
        return records

    def trim(self, last_update, loaded, warn=print):
        """Keep the metric lines of updates up to last_update, the checkpoint a run starts from (0 for
        a fresh start): later ones will be run again. A line cut short when the driver died (a torn
        last line) or unreadable is cut too. What was dropped, and the updates up to last_update that
        have no line (lost, though their checkpoint, named `loaded`, counted them), are said through `warn`."""
        torn, dropped, seen = [], [], set()
        for name in self.files():
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
                f"{loaded} counts {its} episodes; plots and trend lines skip {it}"
            )
