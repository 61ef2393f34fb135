"""`ray dashboard` as `make run` uses it: the head's Jobs API forwarded to a free port here, for as long as a
`with` block runs; and how a child of ours that only reads or forwards is ended."""

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

WAIT_S = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end(process, group=False, grace_s=10):
    """End a child of ours that only reads or forwards, if it still runs: SIGTERM (to its whole process
    group with group=True), then SIGKILL if it has not gone within grace_s."""
    if process is None or process.poll() is not None:
        return
    send = (lambda signum: os.killpg(process.pid, signum)) if group else process.send_signal
    send(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()


class Tunnel:
    """`ray dashboard -p <free port> --remote-port <the head's> CLUSTER`; .address once it answers."""

    def __init__(self, cluster, remote_port):
        self.cluster, self.remote_port = cluster, remote_port
        self.process, self.address = None, None

    def __enter__(self):
        port = free_port()
        self.process = subprocess.Popen(
            ["ray", "dashboard", "-p", str(port), "--remote-port", str(self.remote_port), self.cluster],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches this program, not the tunnel; close() ends it
        )
        address = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                urllib.request.urlopen(address + "/api/version", timeout=5).close()
            except urllib.error.HTTPError:  # it answers (a 401 without the token is an answer)
                pass
            except OSError:
                time.sleep(1)
                continue
            self.address = address
            return self
        self.close()
        raise RuntimeError(f"`ray dashboard {self.cluster}` forwarded nothing within {WAIT_S}s")

    def close(self):
        end(self.process, group=True, grace_s=30)  # `ray dashboard` and the ssh it started

    def __exit__(self, *exc):
        self.close()
