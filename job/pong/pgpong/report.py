"""What the trainer says as it trains: each update's line, Ray's live metrics and the trend line; at
the end, the run's Summary, whose line is the done line. One Report per run; the loop calls it once
per update.

    report = Report(run, cfg.updates, first_update)   # first_update: the one the run resumed at
    report.update(record, played)                      # after each update (played: pool.UpdateResult)
    summary = report.end(stopped, progress, checkpoint, lambda: actor_peak_rss_mb(pool))
    print(summary.line())                              # done updates=... episodes_by_node=...
"""

import collections
import dataclasses
import time

from . import watch
from .logline import kv, peak_rss_mb
from .store import StoreError


def progress(done, wanted, elapsed):
    """With --updates N (wanted): progress=done/N and eta_s, the updates left times the mean wall-clock
    update so far (elapsed seconds over done updates); nothing without it."""
    if not wanted:
        return {}
    return {"progress": f"{done}/{wanted}", "eta_s": elapsed / done * (wanted - done)}


@dataclasses.dataclass(frozen=True)
class Summary:
    """What one run of the trainer did: its done line, and each finished update's record."""

    stopped: str | None  # the signal that stopped it; None: it ran its updates
    updates: int  # updates finished by this run
    episodes: int
    env_steps: int
    seconds: float  # wall clock, from the first update's start to the end
    last_update: int
    total_episodes: int  # over every run of the run dir
    episodes_by_node: dict  # node id -> episodes of the finished updates it played (a replay counts once)
    checkpoint: str | None  # the newest checkpoint, written or resumed from
    driver_peak_rss_mb: float
    actor_peak_rss_mb: float
    records: list  # each finished update's record, as its line shows it
    play_s: float  # the actors' seconds on those updates' episodes (make bench's busy share)

    def line(self):
        """The done line."""
        return kv(
            "done",
            *([] if self.stopped is None else [f"stopped={self.stopped}"]),
            updates=self.updates,
            episodes=self.episodes,
            env_steps=self.env_steps,
            seconds=self.seconds,
            env_steps_per_s=self.env_steps / self.seconds if self.seconds else 0.0,
            last_update=self.last_update,
            total_episodes=self.total_episodes,
            nodes=len(self.episodes_by_node),
            episodes_by_node=",".join(f"{n[:8]}:{c}" for n, c in sorted(self.episodes_by_node.items())),
            checkpoint=self.checkpoint or "none",
            driver_peak_rss_mb=self.driver_peak_rss_mb,
            actor_peak_rss_mb=self.actor_peak_rss_mb,
        )


class Report:
    """Each update's line (with progress= and eta_s= under --updates N), Ray's live metrics, a trend
    line every watch.TREND_EVERY updates and at the end; and what the run did, for its Summary."""

    def __init__(self, run, updates, first, out=print):
        self.out = out
        self.updates, self.first = updates, first  # --updates (0: until stopped); the update resumed at
        self.started = time.perf_counter()
        self.live = watch.LiveMetrics(run)
        try:
            history = run.metrics()  # a resumed run's history too
        except (OSError, StoreError):
            history = []
        self.trend = [r["running_reward"] for r in history if r.get("running_reward") is not None]
        self.trend_at = None  # the update of the last trend line
        self.records = []
        self.by_node = collections.Counter()
        self.play_s = 0.0

    def update(self, rec, played):
        """After every update: its line, Ray's metrics, and a trend line every TREND_EVERY updates."""
        self.records.append(rec)
        self.by_node.update(played.episodes_by_node)
        self.play_s += sum(r.seconds for r in played.results)
        elapsed = time.perf_counter() - self.started
        self.out(kv(**rec, **progress(rec["update"] - self.first, self.updates, elapsed)))
        self.live.record(rec)
        self.trend.append(rec["running_reward"])
        if rec["update"] % watch.TREND_EVERY == 0:
            self.print_trend(rec["update"])

    def stopping(self, signal, update):
        """A signal stopped the run during the update after `update`: it is dropped."""
        self.out(kv("stopping", signal=signal, dropped_update=update + 1, resume_from_update=update))

    def print_trend(self, update):
        """At most one trend line per update; the run's end prints one too, so a short run shows it."""
        if self.trend and self.trend_at != update:
            self.out(watch.trend_line(update, self.trend))
            self.trend_at = update

    def end(self, stopped, progress, checkpoint, actor_peak_rss_mb):
        """The run ended (stopped: the signal, or None): its trend line, and its Summary. progress: the
        trainer's counters; actor_peak_rss_mb() asks the actors."""
        self.print_trend(progress.update)
        seconds = time.perf_counter() - self.started
        return Summary(
            stopped=stopped,
            updates=progress.update - self.first,
            episodes=sum(r["episodes"] for r in self.records),
            env_steps=sum(r["env_steps"] for r in self.records),
            seconds=seconds,
            last_update=progress.update,
            total_episodes=progress.episodes,
            episodes_by_node=dict(self.by_node),
            checkpoint=checkpoint,
            driver_peak_rss_mb=peak_rss_mb(),
            actor_peak_rss_mb=actor_peak_rss_mb(),
            records=self.records,
            play_s=self.play_s,
        )
