"""Checks, inside the image, what every node needs before a job can run.

Run at build time by infra/Dockerfile (a failure stops the build) and by hand with
`docker run --rm IMAGE python /opt/pong/check_image.py`. Prints key=value lines:

    check_image ray=2.60.0 gymnasium=1.4.0 ale_py=0.12.1 numpy=2.4.6 ...
    check_image env=Pong-v0 obs=210x160x3 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 ...
"""

import importlib.metadata
import os
import re
import sys
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")


def pins(path):
    """{'ray': '2.60.0', ...} from the `name[extra]==version` lines of requirements.txt."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;#]+)", line)
        if match:
            found[match.group(1)] = match.group(3)
    return found


def main():
    problems = []
    installed = {}
    for name, wanted in pins(REQUIREMENTS).items():
        try:
            installed[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed[name] = "missing"
        if installed[name] != wanted:
            problems.append(f"{name} is {installed[name]}, requirements.txt pins {wanted}")
    print("check_image " + " ".join(f"{k}={v}" for k, v in installed.items()), flush=True)

    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)  # each process must register the ALE envs itself
    env = gym.make("Pong-v0")
    obs, _ = env.reset(seed=0)
    env.close()
    threads = {var: os.environ.get(var, "unset") for var in THREAD_VARS}
    problems += [f"{var}={value}, want 1" for var, value in threads.items() if value != "1"]
    shape = "x".join(str(n) for n in obs.shape)
    print(f"check_image env=Pong-v0 obs={shape} " + " ".join(f"{k}={v}" for k, v in threads.items()))

    for problem in problems:
        print(f"check_image: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
