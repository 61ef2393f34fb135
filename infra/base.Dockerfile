# The base of the cluster image: Debian 12 with Python 3.11, what Ray's cluster launcher needs
# inside a container, and the user Ray's own image runs as. No Python package: infra/Dockerfile's
# pip installs the whole lock requirements.txt on top, Ray included.
#
# Built by infra/build-image.sh (`make image`), not by hand; by hand, from an empty folder:
#
#   docker build -f infra/base.Dockerfile -t pong-debian-base:bookworm-py311-slim <empty folder>
#
# Build argument:
#   OS_IMAGE   the Debian 12 root it starts from. Default: Docker Hub's debian:bookworm-slim, what
#              AWS nodes build from. Where no image registry answers, build-image.sh passes a
#              debootstrap minbase root of the same release instead: the same steps run on both.

ARG OS_IMAGE=debian:bookworm-slim
FROM ${OS_IMAGE}

# What a node needs besides Python: rsync and ssh for the cluster launcher, ps for Ray's tools,
# CA certificates for anything that talks HTTPS, netbase for /etc/services, sudo as Ray's image
# has it. --no-install-recommends and no package lists left: what is not asked for is not pulled.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    python3 python3-venv rsync openssh-client ca-certificates procps netbase sudo \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

# Ray's image user (rayproject/ray runs as ray: uid 1000, gid 100 "users", HOME /home/ray), with
# sudo and no password, and root's home closed to it, as on Ubuntu. Ray's launcher runs node
# commands in `bash --login`, whose /etc/profile resets PATH: profile.d puts the venv back first.
RUN useradd --uid 1000 --gid 100 --home-dir /home/ray --create-home --shell /bin/bash ray \
 && echo 'ray ALL=(ALL) NOPASSWD:ALL' >/etc/sudoers.d/ray \
 && chmod 0440 /etc/sudoers.d/ray \
 && chmod 0700 /root \
 && echo 'export PATH="/home/ray/venv/bin:$PATH"' >/etc/profile.d/venv.sh

USER ray
WORKDIR /home/ray
ENV HOME=/home/ray \
    LANG=C.UTF-8 \
    PATH=/home/ray/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Debian's Python refuses system-wide pip installs (PEP 668): Ray's user gets a venv of its own, empty.
RUN python3 -m venv /home/ray/venv

CMD ["bash"]
