"""Hosts of their own on this machine, for `ray up` of a head and workers: each test host is a network
namespace (its own address, its own sshd on port 22) and a mount namespace (its own /tmp, /run,
/var/lib/docker, /etc/hosts, resolv.conf and root's home, so its own Docker engine and login), the
way Ray's local provider sees a LAN of machines.

    lan = Lan(["head", "worker1", "worker2"], login_key_pub, image_cache)   # then lan.start()
    lan.hosts[0].address                  # 10.213.0.11, reachable from the lan and the other hosts
    lan.laptop(["ray", "up", ...])        # a command run where a user's laptop sits: on the lan
    lan.hosts[1].run(["docker", "ps"])    # a command run on a host (its network, its mounts)
    lan.stop()                            # every process, mount, namespace and folder: gone

The lan is a network namespace holding a bridge (10.213.0.1, the laptop's address) and one veth
per host. Nothing here touches this machine's own network: no address, route or interface outside
the namespaces made here. A host's default route points at the laptop's address, so Ray finds the
host's own address as it does on a real LAN; the lan leads nowhere, and no host has a DNS server.

With login_user (cluster/aws.yaml's `ubuntu`), each host also has that user as an AWS node has it: uid 1000,
a home of its own, passwordless sudo, not in the docker group; the host's /etc is an overlay of this
machine's, so what a host's commands change there (usermod adding the user to the docker group) stays on
that host, and uid 1000 is that user on every host, whoever it is here.

Each host's folder (under /var/tmp, so it stays visible inside the hosts, whose /tmp is their own)
holds its sshd config and the logs of its sshd and Docker engine; the engine keeps its data in a
tmpfs of the host's, gone with it. image_cache, the repository's
.cache (the Debian base and the wheelhouse of infra/build-image.sh), is mounted where the image
build finds it inside each host's copy of the launcher's file mounts: the hosts reach no registry
and no mirror, so they build from the cache that `make image` filled here.
"""

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from harness.launcher import stop_processes

SUBNET = "10.213.0"  # inside the lan namespace only
LAPTOP_ADDRESS = f"{SUBNET}.1"
FIRST_HOST = 11  # the hosts are .11, .12, ...
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
START_TIMEOUT_S = 60
DOCKER_GB = 4  # the most memory a host's Docker engine may fill (its tmpfs)

SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey {folder}/host_key
AuthorizedKeysFile {authorized_keys}
PidFile /run/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The key files live in the test's folder, which only root writes.
StrictModes no
"""

# Run by bash inside the host's new mount (and UTS) namespace, already in its network namespace:
# its own folders over the machine's, its Docker engine in the background, then sshd in the
# foreground, whose pid stands for the host (nsenter -t PID enters its namespaces).
HOST_INIT = """\
set -eu
hostname {name}
mount --bind {image_cache} {inside}
{login}mount --rbind {folder}/tmp /tmp
mount --bind {folder}/run /run
mkdir -p /run/sshd /var/lib/docker
# The engine's data in memory: it goes with the host, in no time (an image is about 1.3 GB).
mount -t tmpfs -o size={docker_gb}g,mode=0710 pong-{name}-docker /var/lib/docker
mount --bind {folder}/hosts /etc/hosts
mount --bind {folder}/home {home}
mount --bind {folder}/resolv.conf /etc/resolv.conf
dockerd --host unix:///run/docker.sock >{folder}/dockerd.log 2>&1 &
exec {sshd} -D -e -f {folder}/sshd_config
"""


# Where the host has a login user: /etc an overlay of this machine's, and /home a folder of its own.
# And apt's and dpkg's lock files of its own, which a test may hold there as apt-daily holds them on a fresh node
# (the rest of /var/lib/apt and /var/lib/dpkg is this machine's; nothing on a host runs apt).
LOGIN_MOUNTS = """\
mount -t overlay pong-{name}-etc -o lowerdir=/etc,upperdir={folder}/etc-upper,workdir={folder}/etc-work /etc
mount --bind {folder}/homes /home
{apt_locks}"""
APT_LOCKS = ("/var/lib/apt/lists/lock", "/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")
LOGIN_UID = 1000  # ubuntu's on Canonical's AMIs, and the uid of Ray's image user
# The groups cloud-init gives ubuntu on Canonical's AMIs, as far as this machine has them; never docker.
LOGIN_GROUPS = ("adm", "cdrom", "sudo", "dip", "lxd")


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Host:
    name: str
    address: str
    netns: str
    folder: Path
    process: subprocess.Popen = None
    log: object = None

    @property
    def pid(self):
        return self.process.pid

    def command(self, args):
        """args as run on this host: in its network and mount namespaces."""
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "-u", "--", *args]

    def run(self, args, timeout=120, **kwargs):
        if "input" not in kwargs:
            kwargs["stdin"] = subprocess.DEVNULL
        return subprocess.run(self.command(args), capture_output=True, text=True, timeout=timeout, **kwargs)

    def docker_answers(self):
        return self.run(["docker", "info"], timeout=30).returncode == 0

    def containers(self):
        """The names of every container on this host's Docker engine, running or not."""
        found = self.run(["docker", "ps", "-a", "--format", "{{.Names}}"], timeout=60)
        if found.returncode:
            return []
        return found.stdout.split()

    def processes(self):
        """Every process in this host's mount namespace (its sshd, sessions, dockerd, containers)."""
        try:
            mine = os.readlink(f"/proc/{self.pid}/ns/mnt")
        except OSError:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == mine:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found


@dataclass
class Lan:
    names: list
    authorized_keys: Path  # the public keys that log root in on every host
    image_cache: Path  # the repository's .cache, shared by every host's image build
    cache_mountpoint: str  # where a host's build looks for it (inside the launcher's copy of file mounts)
    login_user: str = None  # a non-root passwordless sudoer of uid 1000 on every host, as ubuntu on AWS
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    hosts: list = field(default_factory=list)
    root: Path = None

    @property
    def netns(self):
        return f"pong-lan-{self.tag}"

    def laptop(self, args):
        """args as run on the lan, where the user's laptop is (this machine's files, the lan's network)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *args]

    def start(self):
        self.root = Path(tempfile.mkdtemp(prefix=f"pong-hosts-{self.tag}-", dir="/var/tmp"))
        # A copy the hosts can read: the given file may be under /tmp, which each host has its own of.
        shutil.copy(self.authorized_keys, self.root / "authorized_keys")
        # sshd reads them as the user who logs in: a login user other than root must reach them (public keys).
        self.root.chmod(0o755)
        (self.root / "authorized_keys").chmod(0o644)
        ip("netns", "add", self.netns)
        ip("-n", self.netns, "link", "set", "lo", "up")
        ip("-n", self.netns, "link", "add", "br0", "type", "bridge")
        ip("-n", self.netns, "addr", "add", f"{LAPTOP_ADDRESS}/24", "dev", "br0")
        ip("-n", self.netns, "link", "set", "br0", "up")
        for n, name in enumerate(self.names):
            host = Host(name, f"{SUBNET}.{FIRST_HOST + n}", f"pong-{self.tag}-{name}", self.root / name)
            self.hosts.append(host)
            self.start_host(host, n)
        for host in self.hosts:
            self.wait_for(host)
        return self

    def start_host(self, host, n):
        ip("netns", "add", host.netns)
        ip("-n", self.netns, "link", "add", f"veth{n}", "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        ip("-n", self.netns, "link", "set", f"veth{n}", "master", "br0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "route", "add", "default", "via", LAPTOP_ADDRESS)
        folder = host.folder
        # A home of its own, as fresh as a new machine's: this machine's root login may run tools
        # (pyenv) that write to its home, and hosts logged into at once would share those writes.
        shutil.copytree("/etc/skel", folder / "home")
        for sub in ("tmp", "run"):
            (folder / sub).mkdir(parents=True)
        (folder / "tmp").chmod(0o1777)
        # The cache appears inside the host's /tmp where the launcher copies the build's files.
        inside = folder / "tmp" / Path(self.cache_mountpoint).relative_to("/tmp")
        inside.mkdir(parents=True)
        if self.login_user:  # the folders the launcher makes there as the login user, as on a fresh node
            for made in [inside, *inside.parents]:
                if made == folder / "tmp":
                    break
                os.chown(made, LOGIN_UID, LOGIN_UID)
        (folder / "hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n")
        if self.login_user:
            self.add_login(folder)
        (folder / "resolv.conf").write_text("# no DNS server on this test host\n")
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(folder / "host_key")],
            check=True,
            timeout=60,
        )
        (folder / "sshd_config").write_text(
            SSHD_CONFIG.format(address=host.address, folder=folder, authorized_keys=self.root / "authorized_keys")
        )
        # The cache is bound onto its mount point inside the host's /tmp folder first, and that folder
        # onto /tmp with its submounts: so a repository that lives under /tmp stays reachable.
        script = HOST_INIT.format(
            name=host.name,
            folder=folder,
            image_cache=self.image_cache,
            inside=inside,
            sshd=SSHD,
            docker_gb=DOCKER_GB,
            home=pwd.getpwuid(os.getuid()).pw_dir,  # the login's home (sshd's), not the test's $HOME,
            login=LOGIN_MOUNTS.format(name=host.name, folder=folder, apt_locks=apt_locks(folder))
            if self.login_user
            else "",
        )
        host.log = open(folder / "sshd.log", "w")
        host.process = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{host.netns}", "--", "unshare", "--mount", "--uts", "bash", "-c", script],
            stdout=host.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def add_login(self, folder):
        """The files that give a host its login user (the upper layer of its /etc, its /home): uid and gid
        LOGIN_UID (whoever has them on this machine gives them up there), sudo without a password as
        cloud-init writes it, no password of its own (key logins only), and not in the docker group."""
        user, uid = self.login_user, LOGIN_UID
        assert user != "root", "root logs in on every host already: pass no login_user for it"
        upper = folder / "etc-upper"
        (upper / "sudoers.d").mkdir(parents=True)
        (folder / "etc-work").mkdir()

        def rewrite(name, keep, line, mode, group=0):
            kept = [entry for entry in Path(f"/etc/{name}").read_text().splitlines() if keep(entry.split(":"))]
            (upper / name).write_text("\n".join([*kept, line]) + "\n")
            os.chown(upper / name, 0, group)
            (upper / name).chmod(mode)

        taken = {entry.pw_name for entry in pwd.getpwall() if entry.pw_uid == uid}
        rewrite(
            "passwd",
            lambda f: f[2] != str(uid) and f[0] != user,
            f"{user}:x:{uid}:{uid}::/home/{user}:/bin/bash",
            0o644,
        )
        rewrite(
            "shadow",
            lambda f: f[0] not in taken | {user},
            f"{user}:*:20000:0:99999:7:::",
            0o640,
            grp.getgrnam("shadow").gr_gid,
        )
        groups = []
        for entry in Path("/etc/group").read_text().splitlines():
            name, password, gid, members = entry.split(":")
            if gid == str(uid) or name == user:
                continue
            people = [m for m in members.split(",") if m and m not in taken]
            if name in LOGIN_GROUPS:
                people.append(user)
            groups.append(":".join([name, password, gid, ",".join(people)]))
        (upper / "group").write_text("\n".join([*groups, f"{user}:x:{uid}:"]) + "\n")
        (upper / "group").chmod(0o644)
        sudoers = upper / "sudoers.d" / "90-cloud-init-users"
        sudoers.write_text(f"{user} ALL=(ALL) NOPASSWD:ALL\n")
        sudoers.chmod(0o440)
        for lock in APT_LOCKS:
            (folder / lock_copy(lock)).touch(mode=0o640)
        home = folder / "homes" / user
        shutil.copytree("/etc/skel", home)
        for path in [home, *home.rglob("*")]:
            os.chown(path, uid, uid)
        home.chmod(0o750)

    def wait_for(self, host):
        """Until the host's sshd listens and its Docker engine answers."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if host.process.poll() is not None:
                raise RuntimeError(f"test host {host.name} stopped: {(host.folder / 'sshd.log').read_text()[-2000:]}")
            listening = host.run(["ss", "-ltn", "sport = :22"], timeout=30).stdout.count("LISTEN")
            if listening and host.docker_answers():
                return
            if time.monotonic() > deadline:
                dockerd = (host.folder / "dockerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"test host {host.name} not ready in {START_TIMEOUT_S}s; dockerd's log:\n{dockerd}")
            time.sleep(0.5)

    def stop_docker(self, host, grace_s=30):
        """Stop a host's Docker engine, as when it crashes or is stopped: its containers stop with it."""
        pids = [p for p in host.processes() if read_comm(p) == "dockerd"]
        stop_processes(pids, grace_s)
        return pids

    def stop(self):
        """Every host's containers, Docker engine, sshd and sessions; the namespaces; the folders.
        Returns what could not be removed (empty when all is gone)."""
        left = []
        for host in self.hosts:
            if host.process is None:
                continue
            if host.process.poll() is None and host.docker_answers():
                names = host.containers()
                if names:
                    host.run(["docker", "rm", "-f", *names], timeout=120)
            self.stop_docker(host)
            stop_processes(host.processes(), grace_s=10)
            host.process.wait(timeout=30)
            host.log.close()
            if host.processes():
                left.append(f"processes of {host.name}")
        for netns in [h.netns for h in self.hosts] + [self.netns]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.root.exists():
                left.append(str(self.root))
        existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
        left += [name for name in [h.netns for h in self.hosts] + [self.netns] if name in existing]
        return left


def lock_copy(lock):
    """The name of a host's own copy of one of apt's lock files, in its folder."""
    return "apt" + lock.replace("/", "-")


def apt_locks(folder):
    """The mounts that give a host its own apt and dpkg lock files."""
    return "".join(f"mount --bind {folder / lock_copy(lock)} {lock}\n" for lock in APT_LOCKS)


def read_comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
