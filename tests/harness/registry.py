"""An image registry and a node's empty Docker engine on this machine, for `make image-push` and a pull.

    with Registry() as registry:          # Debian's docker-registry on 127.0.0.1:<free port>
        registry.address                  # 127.0.0.1:41234, for REGISTRY=
        with NodeEngine() as node:        # a second dockerd, its data in a tmpfs of its own: empty
            node.docker(["pull", f"{registry.address}/pong-on-ray:..."])
            node.env                      # DOCKER_HOST for a command (make, build-image.sh) that talks to it

The registry keeps its blobs in a temporary folder, gone with it. A Docker engine lets plain HTTP
reach a registry on 127.0.0.0/8 without --insecure-registry, as a registry on a LAN host would not.

The node's engine shares this machine's network (so it reaches the registry on loopback) but
not its mounts: it runs in a mount namespace of its own whose /var/lib/docker-like data root
is a tmpfs, so it starts with no image, no layer and no build cache, as a new node's engine
does, and whatever it pulled or built is gone when it stops. It touches no iptables rule
(--iptables=false) and its containers run with --network none, but it has a bridge of its own,
made for it and deleted after: a dockerd with --bridge=none deletes docker0 on start (moby's
removeDefaultBridgeInterface), which is the host engine's default bridge, as this one shares
the host's network.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.launcher import stop_processes
from harness.processes import free_port

REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
START_TIMEOUT_S = 60
NODE_DOCKER_GB = 6  # the most memory the node's engine may fill (an image is about 1.1 GB, a build more)

REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {folder}/data
http:
  addr: {address}
"""

# The node engine's own bridge (never used by a container: they run with --network none).
NODE_BRIDGE_ADDRESS = "10.215.0.1/24"

NODE_INIT = """\
set -eu
mount -t tmpfs -o size={gb}g,mode=0710 pong-node-docker {folder}/data
exec dockerd --host unix://{folder}/docker.sock --data-root {folder}/data --exec-root {folder}/exec \
    --pidfile {folder}/dockerd.pid --bridge={bridge} --iptables=false --ip-masq=false --ip-forward=false
"""


def wait_until(ready, what, log):
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready in {START_TIMEOUT_S}s; its log:\n{Path(log).read_text()[-2000:]}")
        time.sleep(0.3)


class Registry:
    """Debian's docker-registry (distribution 2.8) on 127.0.0.1 at a free port, storing into a temp folder."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="pong-registry-", dir="/var/tmp"))
        self.address = f"127.0.0.1:{free_port()}"
        self.process = None

    def start(self):
        config = self.folder / "config.yml"
        config.write_text(REGISTRY_CONFIG.format(folder=self.folder, address=self.address))
        self.log = open(self.folder / "registry.log", "w")
        self.process = subprocess.Popen(
            [REGISTRY, "serve", str(config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self.answers, f"docker-registry on {self.address}", self.folder / "registry.log")
        return self

    def answers(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"docker-registry stopped: {(self.folder / 'registry.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def manifest(self, name, tag):
        """(digest, manifest) the registry serves for name:tag: its Docker-Content-Digest header, its JSON."""
        request = urllib.request.Request(
            f"http://{self.address}/v2/{name}/manifests/{tag}",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.headers["Docker-Content-Digest"], json.loads(response.read())

    def config(self, name, manifest):
        """The image config a manifest names: its history says which command made each layer."""
        url = f"http://{self.address}/v2/{name}/blobs/{manifest['config']['digest']}"
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read())

    def stop(self):
        if self.process is not None:
            stop_processes([self.process.pid], grace_s=10)
            self.process.wait(timeout=30)
            self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class NodeEngine:
    """A second dockerd with an empty data root (a tmpfs in a mount namespace of its own), as on a new node."""

    def __init__(self):
        # Short: containerd's sockets live under exec/, and a socket's path has at most 107 bytes.
        self.folder = Path(tempfile.mkdtemp(prefix="pong-node-", dir="/var/tmp"))
        self.process = None
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.folder}/docker.sock"}
        self.bridge = f"pongnode{os.getpid() % 100000}"  # at most 15 characters, a Linux interface name

    def start(self):
        for sub in ("data", "exec"):
            (self.folder / sub).mkdir()
        self.log = open(self.folder / "dockerd.log", "w")
        for step in (
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", NODE_BRIDGE_ADDRESS, "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            subprocess.run(step, check=True, capture_output=True, timeout=30)
        self.process = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "bash",
                "-c",
                NODE_INIT.format(gb=NODE_DOCKER_GB, folder=self.folder, bridge=self.bridge),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self.answers, "the node's dockerd", self.folder / "dockerd.log")
        return self

    def answers(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"the node's dockerd stopped: {(self.folder / 'dockerd.log').read_text()[-2000:]}")
        return self.docker(["info"], timeout=30).returncode == 0

    def docker(self, args, timeout=600):
        return subprocess.run(
            ["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def stop(self):
        """Its containers, then dockerd (its containerd with it); the tmpfs goes with the namespace."""
        if self.process is not None:
            if self.process.poll() is None:
                names = self.docker(["ps", "-aq"], timeout=60).stdout.split()
                if names:
                    self.docker(["rm", "-f", *names], timeout=120)
            stop_processes([self.process.pid], grace_s=30)
            self.process.wait(timeout=30)
            self.log.close()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def load_image(name, architecture, env):
    """Load a one-file image named `name` whose config says linux/<architecture> into the Docker engine of env
    (docker load of an image archive made here: no registry, no emulator; Docker 20.10's classic builder and
    `docker import` give this machine's own architecture whatever --platform says)."""
    import hashlib
    import io
    import tarfile

    def archive(files):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for path, data in files.items():
                info = tarfile.TarInfo(path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return out.getvalue()

    layer = archive({"hello": b"a stand-in image\n"})
    rootfs = {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]}
    config = json.dumps({"architecture": architecture, "os": "linux", "config": {}, "rootfs": rootfs}).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": ["layer/layer.tar"]}]
    image = archive({config_name: config, "layer/layer.tar": layer, "manifest.json": json.dumps(manifest).encode()})
    loaded = subprocess.run(["docker", "load"], input=image, env=env, capture_output=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr.decode()
