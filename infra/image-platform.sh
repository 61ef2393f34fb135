#!/usr/bin/env bash
# Refuses an image whose platform is not the nodes' (PLATFORM in infra/image.env): every node would pull
# it, then fail to start it ("exec format error"), after minutes of billing. Reads the platform from this
# machine's Docker engine (docker image inspect), as Docker reports it: OS/Architecture.
#
#   infra/image-platform.sh NAME WHO               exit 0 when NAME is PLATFORM; else one line "WHO: ...", exit 2
#   infra/image-platform.sh NAME WHO --if-present  the same, but exit 0 too when no engine here holds NAME
#
# `make image-push` (infra/push-image.sh) runs it before the push; `make up` and `make run` before they
# launch nodes that pull IMAGE (given, or recorded in .cache/pushed-image), with --if-present: an image
# pushed from another machine cannot be read here.
set -eu -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name="$1" who="$2" if_present="${3:-}"
platform="$(sed -n 's/^PLATFORM=//p' "$here/image.env")"
[[ -n "$platform" ]] || { echo "$who: infra/image.env has no PLATFORM= line; put the nodes' platform there" >&2; exit 2; }

if ! found="$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$name" 2>/dev/null)"; then
    [[ "$if_present" == --if-present ]] && exit 0
    echo "$who: no image $name in this Docker engine, so its platform is unknown; build it first with make image" >&2
    exit 2
fi
if [[ "$found" != "$platform" ]]; then
    echo "$who: image $name is $found, but the nodes run $platform; make image builds $platform on any machine, then make image-push (or IMAGE= builds on every node)" >&2
    exit 2
fi
