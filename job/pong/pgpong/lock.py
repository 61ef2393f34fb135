"""One run dir, one writer: the lock a trainer holds on its run dir while it writes there. No Ray here.

    lock = acquire(store, warn)    # Locked naming the holder if a live trainer holds it
    lock.check()                   # before each write: LockLost if another trainer has taken it over
    lock.release()                 # at the end, however the trainer ends (finished, SIGINT, SIGTERM, an error)

The lock is the file trainer.lock in the run dir. It names its holder as JSON: the Ray Jobs
submission id when the trainer runs under Ray Jobs, the host, the pid, and when it was taken and
last renewed. How a trainer knows that the holder of a lock left behind is dead:

- A local folder: the holder keeps an exclusive flock(2) on the file for its whole life. The kernel
  drops a flock when its process ends, however it ends (SIGKILL, a crash, the machine's power), so a
  lock file that nobody flocks is a dead holder's, and the next trainer takes it at once. (On NFS
  v4 a flock is held on the server, across hosts.)
- S3, which has no flock: conditional writes. A trainer creates the lock object with If-None-Match: *
  (of two creates, one fails), renews it every RENEW_S seconds with If-Match on its own ETag, and
  deletes it with If-Match at its end. The holder of a lock object is dead if it ran on this host
  (the same hostname and boot id) and its pid runs no more, or runs a process started at another
  time; on another host, if it was not renewed for LEASE_S seconds (the clocks of both hosts
  must agree to a minute, as NTP keeps them). A dead holder's lock is taken over with If-Match on
  the ETag just read, so of two trainers taking it over at once only one succeeds.
"""

import contextlib
import fcntl
import json
import os
import socket
import threading
import time

from .store import LocalStore, StoreError

LOCK = "trainer.lock"
RENEW_S = 30  # an S3 holder rewrites its lock this often
LEASE_S = 300  # an S3 lock of another host not renewed for this long is a dead holder's


class Locked(StoreError):
    """A live trainer holds the run dir; the message names it."""


class LockLost(StoreError):
    """Another trainer took over this trainer's lock (it found it dead): this one must stop writing."""


def _start_ticks(pid):
    """When process pid started (clock ticks after boot, /proc/PID/stat), or None if no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, TypeError, IndexError):
        return None


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _ray_job_id():
    """The Ray Jobs submission id of this driver (Ray passes it in the job's config), or None."""
    try:
        return json.loads(os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"])["metadata"]["job_submission_id"]
    except (KeyError, TypeError, ValueError):
        return None


def me():
    """This trainer, as its lock names it."""
    now = time.time()
    pid = os.getpid()
    return {
        "job": _ray_job_id(),
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": pid,
        "pid_start": _start_ticks(pid),
        "since": now,
        "renewed": now,
    }


def describe(holder):
    """'job raysubmit_X (host h pid 12)', or 'host h pid 12' outside Ray Jobs."""
    where = f"host {holder.get('host', '?')} pid {holder.get('pid', '?')}"
    return f"job {holder['job']} ({where})" if holder.get("job") else where


def _when(seconds):
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds)) if isinstance(seconds, (int, float)) else "?"


def _record(data):
    """The holder a lock's bytes name, {} if they name none (a holder killed mid-write, junk)."""
    try:
        holder = json.loads(data)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def dead(holder, now=None):
    """Why the holder of an S3 lock is dead, or None if it may be alive (module docstring)."""
    here = me()
    if holder.get("host") == here["host"] and holder.get("boot") == here["boot"]:
        started = _start_ticks(holder.get("pid"))
        if started is None:
            return f"its process {holder.get('pid')} on this host has ended"
        if started != holder.get("pid_start"):
            return f"its pid {holder.get('pid')} on this host now runs another process"
        return None
    renewed = holder.get("renewed")
    if not isinstance(renewed, (int, float)):
        return "the lock names no holder"
    age = (time.time() if now is None else now) - renewed
    if age > LEASE_S:
        return f"it was last renewed {age:.0f} s ago, more than the {LEASE_S} s lease of a holder on another host"
    return None


def _refuse(url, holder):
    return Locked(
        f"run dir {url} is in use by {describe(holder)} since {_when(holder.get('since'))} "
        f"(its lock: {LOCK}); stop that trainer or wait for its end, or use another --run-dir"
    )


def acquire(store, url, warn=print):
    """The lock of the run dir `url` in `store` for this trainer; Locked if a live trainer holds it.
    A dead holder's lock is taken over, said through `warn`."""
    return LocalLock(store, url, warn) if isinstance(store, LocalStore) else S3Lock(store, url, warn)


class LocalLock:
    def __init__(self, store, url, warn):
        self.url, self.path = url, os.path.join(store.root, LOCK)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise StoreError(f"cannot lock run dir {url}: {e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                with os.fdopen(fd, "rb") as f:
                    raise _refuse(url, _record(f.read())) from None
            except OSError as e:  # a file system without flock
                os.close(fd)
                raise StoreError(f"cannot lock run dir {url} ({self.path}): {e.strerror or e}") from None
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # its holder deleted it as we opened it (a clean end): take the new one
        self.fd, self.inode = fd, os.fstat(fd).st_ino
        left = os.read(fd, 1 << 16)
        if left:
            holder = _record(left)
            warn(
                f"took over the lock of {url} from {describe(holder)}, which is dead: no process holds "
                "its flock, and the kernel drops a flock only when its process ends"
            )
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(me()).encode())
        os.fsync(fd)

    def check(self):
        try:
            ours = os.stat(self.path).st_ino == self.inode
        except FileNotFoundError:
            ours = False
        if not ours:
            raise LockLost(f"the lock {self.path} was removed while this trainer held it; it stops writing")

    def release(self):
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)  # before the flock goes, so no one takes the file being deleted
        os.close(self.fd)


class S3Lock:
    def __init__(self, store, url, warn):
        self.store, self.url, self.holder = store, url, me()
        self.etag = store.create(LOCK, self._body())
        while self.etag is None:
            found = store.read_tagged(LOCK)
            if found is None:  # its holder deleted it meanwhile: create it again
                self.etag = store.create(LOCK, self._body())
                continue
            data, etag = found
            holder = _record(data)
            why = dead(holder)
            if why is None:
                raise _refuse(url, holder)
            self.etag = store.replace(LOCK, self._body(), etag)
            if self.etag is not None:
                warn(f"took over the lock of {url} from {describe(holder)}, which is dead: {why}")
        self.lost = None
        self.stop = threading.Event()
        self.mutex = threading.Lock()
        self.renewer = threading.Thread(target=self._renew, name="run-dir-lock", daemon=True)
        self.renewer.start()

    def _body(self):
        return json.dumps(self.holder).encode()

    def _renew(self):
        while not self.stop.wait(RENEW_S):
            with self.mutex:
                self.holder["renewed"] = time.time()
                try:
                    etag = self.store.replace(LOCK, self._body(), self.etag)
                except StoreError:
                    continue  # S3 unreachable for now: try again; past the lease another may take it over
                if etag is None:
                    try:
                        found = self.store.read_tagged(LOCK)
                        taker = describe(_record(found[0])) if found else "no one (the lock was deleted)"
                    except StoreError:
                        taker = "a trainer S3 did not name (it could not be read)"
                    self.lost = f"another trainer took over the lock of {self.url}: now held by {taker}"
                    return
                self.etag = etag

    def check(self):
        if self.lost:
            raise LockLost(f"{self.lost}; this trainer stops writing")

    def release(self):
        self.stop.set()
        self.renewer.join()
        if not self.lost:
            with contextlib.suppress(StoreError):
                self.store.delete_tagged(LOCK, self.etag)
