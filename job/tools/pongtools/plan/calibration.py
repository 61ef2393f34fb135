"""Measuring the model's inputs here: real trainer runs, and a probe playing episodes beside them.

    .venv/bin/python -m pongtools.plan calibrate --out cal.json --work-dir /tmp/cal
    .venv/bin/python -m pongtools.plan inputs --calibration cal.json

Ray and the emulator, half an hour on a busy 2-core machine (take `flock /tmp/bench.lock`
on a shared one). `calibrate` runs the trainer at batch 10 and at batch 300 with a probe
process playing episodes beside them the whole time (the rate a core gives under the load
of the moment); tests/test_plan.py checks the model's update times against those runs.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
from pgpong.logline import kv
from pgpong.rundir import RunDir

from pongtools import JOB_DIR


def probe(log_path, niceness=0, seed=0):
    """Play episodes with the initial policy, one after another, until SIGTERM.

    After each episode appends {"time", "steps", "cpu_s", "wall_s"} to log_path: the
    speed one rollout actor gets from a core under the load of the moment, when the
    probe runs as the actors do: at Ray's worker niceness, in the same Unix session as
    their raylet (Linux shares the CPU between sessions first: sched_autogroup). No Ray.
    """
    import signal

    from pgpong import policy, rollout

    os.nice(niceness)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    runner = rollout.EnvRunner("Pong-v0")
    runner.set_weights(policy.init_params(np.random.default_rng(seed)))
    runner.play(seed, 0, 0)  # compile or load the numba kernels outside the timing
    episode = 0
    with open(log_path, "a") as log:
        while not stopping:
            wall, cpu = time.perf_counter(), time.process_time()
            steps = runner.play(seed, 1, episode).steps
            runner.take_gradient()
            log.write(
                json.dumps(
                    {
                        "time": time.time(),
                        "steps": steps,
                        "cpu_s": time.process_time() - cpu,
                        "wall_s": time.perf_counter() - wall,
                    }
                )
                + "\n"
            )
            log.flush()
            episode += 1


def probe_rate(episodes, start, end, processes=1):
    """Env steps per second of one probe process between two clock times (steps spread evenly over episodes)."""
    done = 0.0
    for e in episodes:
        t1 = e["time"]
        t0 = t1 - e["wall_s"]
        overlap = min(t1, end) - max(t0, start)
        if overlap > 0:
            done += e["steps"] * overlap / e["wall_s"]
    return done / (end - start) / processes


def measure_broadcast(workers, repeats=5):
    """Seconds from the driver's ray.put of the weights to every actor of this node holding them."""
    import ray
    from pgpong import policy

    from pongtools import actor_path

    @ray.remote(num_cpus=1)
    class Holder:
        def fetch(self, refs):
            return ray.get(refs[0])["W2"].shape

    ray.init(
        address="local", num_cpus=workers, include_dashboard=False, logging_level="error", runtime_env=actor_path()
    )
    try:
        actors = [Holder.remote() for _ in range(workers)]
        ray.get([a.fetch.remote([ray.put({"W2": np.zeros(1)})]) for a in actors])  # actors up
        params = policy.init_params(np.random.default_rng(0))
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            ref = ray.put(params)
            ray.get([a.fetch.remote([ref]) for a in actors])
            times.append(time.perf_counter() - t)
    finally:
        ray.shutdown()
    return float(np.median(times))


def calibrate(out_path, work_dir, runs=((10, 20), (300, 2)), workers=2):
    """Measure what tests/test_plan.py checks the model against: real runs, and a probe beside them.

    Each run is the trainer's own CLI on a fresh local Ray (`python -m pgpong.train`, as
    `make train` runs it). The probe plays episodes the whole time in this process's
    Unix session, where the runs' Ray (raylet and actors) also lives, at the actors'
    niceness: it sees the load they see. The JSON is written again after each run.
    """
    os.makedirs(work_dir, exist_ok=True)
    env = dict(os.environ, RAY_ADDRESS="local")
    # Ray starts its worker processes at niceness 15 (RAY_worker_niceness; `ps` shows NI 15 for
    # the actors here): on a busy machine they get less CPU than a process at 0 would.
    niceness = int(os.environ.get("RAY_worker_niceness", "15"))
    record = {
        "command": "python -m pongtools.plan " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "broadcast_s": measure_broadcast(workers),
        "runs": [],
        "probe": [],
        "probe_processes": 1,
        "probe_niceness": niceness,
    }
    print(kv("calibrate", broadcast_s=record["broadcast_s"]), flush=True)
    probe_log = os.path.join(work_dir, "probe.jsonl")
    prober = subprocess.Popen(
        [sys.executable, "-m", "pongtools.plan", "probe", "--log", probe_log, "--niceness", str(niceness)], env=env
    )
    try:
        while not os.path.exists(probe_log) and prober.poll() is None:  # playing before the first run starts
            time.sleep(1)
        for batch, updates in [(b, n) for b, n in runs if n > 0]:  # 0 skips a run (it would never end)
            run_dir = os.path.join(work_dir, f"batch{batch}")
            args = [
                "--batch-size",
                str(batch),
                "--updates",
                str(updates),
                "--workers",
                str(workers),
                "--run-dir",
                run_dir,
            ]
            for attempt in range(3):  # on a busy machine Ray's node can miss its 30 s startup deadline
                proc = subprocess.run(
                    [sys.executable, "-m", "pgpong.train", *args], cwd=JOB_DIR, env=env, capture_output=True, text=True
                )
                if proc.returncode == 0 or "timed out during startup" not in proc.stderr:
                    break
                print(kv("calibrate", batch_size=batch, retry=attempt + 1, reason="ray_startup_timeout"), flush=True)
            if proc.returncode != 0:
                raise RuntimeError(f"calibrate: the batch-{batch} run failed: {proc.stderr[-2000:]}")
            keep = ("update", "time", "seconds", "rollout_s", "reduce_s", "update_s", "driver_bytes", "episode_steps")
            ups = [{k: m[k] for k in keep} for m in RunDir(run_dir).metrics()]
            record["runs"].append(
                {
                    "batch_size": batch,
                    "workers": workers,
                    "nodes": 1,
                    "updates": ups,
                    "args": "python -m pgpong.train " + " ".join(args),
                }
            )
            with open(probe_log) as f:
                record["probe"] = [json.loads(ln) for ln in f]
            with open(out_path, "w") as f:
                json.dump(record, f)
                f.write("\n")
            t0, t1 = ups[0]["time"] - ups[0]["seconds"], ups[-1]["time"]
            print(
                kv(
                    "calibrate",
                    batch_size=batch,
                    updates=len(ups),
                    seconds=sum(u["seconds"] for u in ups),
                    probe_env_steps_per_s=probe_rate(record["probe"], t0, t1),
                ),
                flush=True,
            )
    finally:
        prober.terminate()
        prober.wait()


# Episodes a core plays a second at a fresh policy's lengths: 300 in make bench's trainer phase, 42.3 s on 2
# cores (docs/samples/bench-core.txt), rounded down; measure_core sizes its update by it.
EPISODES_PER_CORE_S = 3


def measure_core(seconds=40.0, workers=None):
    """This machine's core rate now, as the trainer gets it: one real update of the trainer on one actor
    per core (os.cpu_count()), make bench's trainer phase (pongtools.bench.bench_trainer, the phase the
    committed rate comes from), its batch sized to take about `seconds`. Raw probe processes would leave
    out what the trainer keeps of a core (its dispatch, its reduce, its last wave). Returns the env steps
    per second of one actor over the update, with how it was measured."""
    import tempfile

    import ray

    from pongtools import actor_path, bench

    workers = workers or os.cpu_count()
    batch = workers * max(1, round(seconds * EPISODES_PER_CORE_S))
    ray.init(address="local", num_cpus=workers, logging_level="warning", runtime_env=actor_path())
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            phase = bench.bench_trainer("Pong-v0", workers, batch, run_dir)
    finally:
        ray.shutdown()
    return {
        "env_steps_per_s": round(phase["env_steps_per_s_per_core"], 1),
        "source": "measured_now",
        "measured_with": "trainer_update",
        "kind": f"env steps per second per actor of one batch-{batch} update of the trainer on {workers} actors "
        "(make bench's trainer phase)",
        "batch_size": batch,
        "workers": workers,
        "seconds": round(phase["seconds"], 2),
        "actor_busy": round(phase["actor_busy"], 3),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
    }


def machine():
    """One line about this machine: CPU model, cores, host name, load."""
    import platform

    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.node()}, load {os.getloadavg()[0]:.1f}"
