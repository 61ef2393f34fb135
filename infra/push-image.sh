#!/usr/bin/env bash
# Pushes the image `make image` built (its name in infra/image.env) to a registry once, so
# that the nodes of `make up IMAGE=...` pull it instead of each building it.
#
#   REGISTRY=127.0.0.1:5000 infra/push-image.sh      a registry of your own (docs/image.md)
#   make image-push REGISTRY=<account>.dkr.ecr.<region>.amazonaws.com   ECR (docs/aws.md)
#
# Tags the image REGISTRY/<name:tag> and pushes it with this machine's Docker login for that
# registry (for ECR: `aws ecr get-login-password | docker login ...` first, docs/aws.md). Prints
#   push-image image=REGISTRY/<name:tag> digest=sha256:... seconds=N recorded=.cache/pushed-image
# the name to pass as `make up IMAGE=...`, and records it as IMAGE=... in PUSHED_IMAGE_FILE (default
# .cache/pushed-image), where `make up` and `make run` of cluster/aws.yaml find an ECR image to pull
# (Makefile). A mistake (no REGISTRY, no image built, a push the registry refuses) is one line on
# stderr and exit 2, and records nothing; so is an image of another platform than PLATFORM in infra/image.env.
set -eu -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
record="${PUSHED_IMAGE_FILE:-$(dirname "$here")/.cache/pushed-image}"
started=$SECONDS

die() { echo "push-image: $*" >&2; exit 2; }

registry="${REGISTRY:-}"
registry="${registry%/}"
[[ -n "$registry" ]] || die "pass REGISTRY=host:port[/path], the registry to push to, e.g. make image-push REGISTRY=127.0.0.1:5000"
image="$(sed -n 's/^IMAGE=//p' "$here/image.env")"
[[ -n "$image" ]] || die "infra/image.env has no IMAGE= line; put the image name there"
docker info >/dev/null 2>&1 || die "no Docker engine answers; start one (make docker-engine)"
docker image inspect "$image" >/dev/null 2>&1 || die "no image $image in this Docker engine; build it first with make image"
# An image of another platform than the nodes' (a Mac's own build) is refused here, before anything is pushed.
"$here/image-platform.sh" "$image" push-image || exit 2

target="$registry/$image"
docker tag "$image" "$target" || die "cannot tag $image as $target; REGISTRY=$registry is not a registry name (host:port[/path])"
if ! pushed="$(docker push "$target" 2>&1)"; then
    docker rmi "$target" >/dev/null 2>&1 || true
    die "cannot push $target ($(tail -1 <<<"$pushed")); check that REGISTRY answers and your docker login for it"
fi
# The push's last line names the digest the registry stored: "<tag>: digest: sha256:... size: N".
digest="$(sed -n 's/.*digest: \(sha256:[0-9a-f]*\).*/\1/p' <<<"$pushed" | tail -1)"
[[ -n "$digest" ]] || die "the push of $target printed no digest: $(tail -1 <<<"$pushed")"
mkdir -p "$(dirname "$record")" && echo "IMAGE=$target" >"$record.part" && mv "$record.part" "$record" \
    || { echo "push-image: pushed $target, but cannot record it in $record; pass make up IMAGE=$target" >&2; exit 1; }
echo "push-image image=$target digest=$digest seconds=$((SECONDS - started)) recorded=${record#"$(dirname "$here")/"}"
