"""A node's pull of the pushed image against the same node's build of it, timed side by side in one run
(this machine's speed drifts from hour to hour, so two figures from two runs would not compare).

    make image && PYTHONPATH=tests .venv/bin/python -m harness.pull_vs_build      # as root; a few minutes

1. Debian's docker-registry on 127.0.0.1 (harness.registry.Registry), and `make image-push` to it of
   the image `make image` built here;
2. a node's Docker engine, empty (harness.registry.NodeEngine): `docker pull` of it, timed;
3. another such engine, empty: `infra/build-image.sh`, timed, as cluster/*.yaml run it on a node,
   from this repository's .cache (the base saved there, built from infra/base.Dockerfile, and the
   wheelhouse, as the test hosts of tests/test_lan_cluster.py build from it): so neither the base's
   apt step nor PyPI is in the figure (harness.node_setup times those). The base's load from the cache,
   which a node does not do (it builds the base), is timed by build-image.sh: less_base_load_s is the rest.

Prints the push's line, each node's, then `pull_vs_build pull_s=... build_s=... download_mb=... image_mb=...`
(download_mb: the layers a pull downloads, compressed, as the registry's manifest lists them; image_mb: the
pulled image unpacked, docker image inspect's Size), the figures of `make plan`'s pull path
(job/tools/pongtools/plan/end_to_end_inputs.json), and `venv_layer_mb=... venv_layer_unpacked_mb=...`: of
those, the layer of the venv that pip filled with the lock (infra/Dockerfile copies it onto the base),
compressed (the registry's) and unpacked (docker history's). The push records nothing in .cache/pushed-image (PUSHED_IMAGE_FILE is a temp file): a
registry on loopback is no image for AWS.
"""

import subprocess
import tempfile
import time
from pathlib import Path

from harness import REPO, clean_env, only, read_env_file, run
from harness.registry import NodeEngine, Registry

IMAGE = read_env_file(REPO / "infra" / "image.env")["IMAGE"]


def timed(command, env, what):
    started = time.monotonic()
    done = run(command, env, timeout=1800)
    seconds = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"pull_vs_build: {what} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds, done


VENV_LAYER = "in /home/ray/venv"  # the end of the history line of infra/Dockerfile's COPY of the filled venv


def venv_layer(registry, name, manifest):
    """(compressed, unpacked) bytes of the layer of the venv pip filled with the lock: the registry's
    manifest and config give the first, in the order of the config's history (empty layers left out),
    and docker history the second."""
    made = [h for h in registry.config(name, manifest)["history"] if not h.get("empty_layer")]
    [compressed] = [
        layer["size"]
        for h, layer in zip(made, manifest["layers"], strict=True)
        if h.get("created_by", "").rstrip().endswith(VENV_LAYER)
    ]
    listed = run(
        ["docker", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}", IMAGE],
        clean_env(),
    )
    [unpacked] = [int(line.split("\t")[0]) for line in listed.stdout.splitlines() if line.rstrip().endswith(VENV_LAYER)]
    return compressed, unpacked


def main():
    with Registry() as registry, tempfile.TemporaryDirectory() as folder:
        env = clean_env(PUSHED_IMAGE_FILE=str(Path(folder) / "pushed-image"))
        pushed = run(["make", "image-push", f"REGISTRY={registry.address}"], env, timeout=1800)
        if pushed.returncode:
            raise SystemExit(f"pull_vs_build: make image-push failed: {pushed.stderr.strip()}")
        print(only(pushed.stdout, "push-image ")[0], flush=True)
        target = f"{registry.address}/{IMAGE}"
        _, manifest = registry.manifest(*IMAGE.split(":"))
        compressed = sum(layer["size"] for layer in manifest["layers"])  # what a pull downloads
        venv_mb, venv_unpacked_mb = (size / 1e6 for size in venv_layer(registry, IMAGE.split(":")[0], manifest))
        try:
            with NodeEngine() as node:
                pull_s, _ = timed(["docker", "pull", "--quiet", target], node.env, "the pull")
                size = node.docker(["image", "inspect", "--format", "{{.Size}}", target]).stdout.strip()
            print(f"node_pull image={target} seconds={pull_s:.1f}", flush=True)
            with NodeEngine() as node:
                build_s, built = timed(["bash", str(REPO / "infra" / "build-image.sh")], node.env, "the build")
            loaded = only(built.stdout, "build-image: loaded ")[0]
            load_s = float(loaded.rsplit("seconds=", 1)[1])
            print(loaded, only(built.stdout, "build-image: built ")[0], sep="\n", flush=True)
            print(f"node_build image={IMAGE} seconds={build_s:.1f} less_base_load_s={build_s - load_s:.1f}", flush=True)
        finally:
            subprocess.run(["docker", "rmi", target], capture_output=True, timeout=60)
    print(
        f"pull_vs_build pull_s={pull_s:.1f} build_s={build_s:.1f} build_over_pull={build_s / pull_s:.1f}"
        f" download_mb={compressed / 1e6:.0f} image_mb={int(size) / 1e6:.0f}"
        f" venv_layer_mb={venv_mb:.0f} venv_layer_unpacked_mb={venv_unpacked_mb:.0f}"
    )


if __name__ == "__main__":
    main()
