"""Watching a run while it trains: a trend line for the job's log, live metrics for Ray.

The trend line is plain text, so `ray job logs --follow` alone shows where the
running reward is heading:

    trend update=10 running_reward=-21..-20.93 low=-21 high=-20.93 spark=____________....--------~~~~~~~~~~~~^^^^

The live metrics go through Ray's metrics API (`ray.util.metrics`): the node's
metrics agent exports them to Prometheus as `ray_pong_*`, and the dashboard's
Metrics view (Grafana) can chart them while the job runs. Ray is imported only in
LiveMetrics, so the rest is plain functions a test can call.
"""

from .logline import kv, value

TREND_EVERY = 10  # updates between two trend lines in the job's log
TREND_WIDTH = 40  # characters of a sparkline, whatever the number of updates
LEVELS = "_.-~^"  # ASCII characters from the lowest value to the highest


def resample(values, width):
    """`width` values: bucket means when there are more values, repeats when fewer."""
    n = len(values)
    out = []
    for i in range(width):
        lo = i * n // width
        hi = max(lo + 1, (i + 1) * n // width)
        bucket = values[lo:hi]
        out.append(sum(bucket) / len(bucket))
    return out


def sparkline(values, width=TREND_WIDTH):
    """One line of exactly `width` ASCII characters, low values `_`, high values `^`."""
    if not values:
        return ""
    points = resample([float(v) for v in values], width)
    low, high = min(points), max(points)
    if high == low:  # flat: draw it through the middle
        return LEVELS[len(LEVELS) // 2] * width
    top = len(LEVELS) - 1
    return "".join(LEVELS[round((p - low) / (high - low) * top)] for p in points)


def trend_line(update, running_rewards, width=TREND_WIDTH):
    """The log's trend line: first..last running reward, the scale, and the sparkline."""
    first, last = (value(float(v)) for v in (running_rewards[0], running_rewards[-1]))
    return kv(
        "trend",
        update=update,
        running_reward=f"{first}..{last}",
        low=float(min(running_rewards)),
        high=float(max(running_rewards)),
        spark=sparkline(running_rewards, width),
    )


class LiveMetrics:
    """Gauges and a counter in Ray's metrics, set by the driver after every update.

    Prometheus sees them as ray_pong_running_reward, ray_pong_reward_mean, ray_pong_update,
    ray_pong_env_steps_per_s, ray_pong_update_seconds and ray_pong_episodes_total, each
    tagged run=<run dir> so that several runs can share one Prometheus.
    """

    GAUGES = {
        "pong_running_reward": "Running reward (exponential mean over episodes, 0.99)",
        "pong_reward_mean": "Mean episode reward of the last update",
        "pong_update": "Updates completed",
        "pong_env_steps_per_s": "Environment steps per second in the last update",
        "pong_update_seconds": "Wall-clock seconds of the last update",
    }

    def __init__(self, run):
        from ray.util.metrics import Counter, Gauge

        tags = {"run": str(run)}
        self.gauges = {
            name: Gauge(name, description=text, tag_keys=("run",)).set_default_tags(tags)
            for name, text in self.GAUGES.items()
        }
        episodes = Counter("pong_episodes", description="Episodes played", tag_keys=("run",))
        self.episodes = episodes.set_default_tags(tags)

    def record(self, rec):
        """Set every metric from one update's record (the trainer's `rec`)."""
        values = {
            "pong_running_reward": rec["running_reward"],
            "pong_reward_mean": rec["reward_mean"],
            "pong_update": rec["update"],
            "pong_env_steps_per_s": rec["env_steps_per_s"],
            "pong_update_seconds": rec["seconds"],
        }
        for name, v in values.items():
            self.gauges[name].set(float(v))
        if rec["episodes"] > 0:
            self.episodes.inc(rec["episodes"])
