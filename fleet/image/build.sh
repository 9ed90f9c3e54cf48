#!/usr/bin/env bash
# Builds the Tessera worker image with no registry.
#
#   fleet/image/build.sh TESSERA_BINARY [IMAGE_NAME] [BLENDER_TARBALL]
#
# 1. A Debian bookworm base (debootstrap --variant=minbase with the packages
#    below, then `docker import`), tagged IMAGE_NAME-base:CONTENT_TAG, where
#    the tag hashes this script, the package list and the suite: a second
#    run finds it and skips debootstrap.
# 2. The worker image FROM it (Containerfile): the binary, an optional
#    official Blender tarball, the NVIDIA runtime variables. Tagged
#    IMAGE_NAME:CONTENT_TAG (base, binary, Containerfile, Blender) and
#    IMAGE_NAME:latest; built again only when one of those changed.
# Prints the image's content tag on stdout. Needs root (debootstrap), the
# Debian mirror debootstrap defaults to (or DEBIAN_MIRROR), and Docker.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary="${1:?usage: build.sh TESSERA_BINARY [IMAGE_NAME] [BLENDER_TARBALL]}"
name="${2:-tessera-worker}"
blender="${3:-}"
suite=bookworm
# ca-certificates: HTTPS for `--blender auto` downloads; xz-utils: unpacking
# Blender tarballs; procps: `ps` for whoever debugs a node. Blender's own
# libraries are added when a Blender build is baked in.
packages="ca-certificates,xz-utils,procps"
if [ -n "$blender" ]; then
    packages="$packages,libx11-6,libxi6,libxxf86vm1,libxfixes3,libxrender1,libxkbcommon0,libsm6,libgl1,libegl1"
fi
base_tag="$( (cat "$0"; echo "$suite $packages") | sha256sum | cut -c1-16)"
base="$name-base:$base_tag"
if ! docker image inspect "$base" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { echo "build.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
    root="$(mktemp -d "${TMPDIR:-/tmp}/$name-rootfs.XXXXXX")"
    trap 'rm -rf "$root"' EXIT
    echo "build.sh: debootstrap $suite ($packages) into $root" >&2
    debootstrap --variant=minbase --include="$packages" "$suite" "$root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >&2
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" --numeric-owner -c . | docker import - "$base" >&2
    rm -rf "$root"
    trap - EXIT
fi
ctx="$(mktemp -d "${TMPDIR:-/tmp}/$name-context.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/context"
cp "$here/Containerfile" "$ctx/Containerfile"
cp "$binary" "$ctx/context/tessera"
blender_arg=none
if [ -n "$blender" ]; then
    cp "$blender" "$ctx/context/blender.tar.xz"
    blender_arg="$(basename "$blender")"
fi
tag="$( (echo "$base"; sha256sum "$ctx/context/tessera" "$ctx/Containerfile"; [ -z "$blender" ] || sha256sum "$ctx/context/blender.tar.xz") | sha256sum | cut -c1-16)"
if ! docker image inspect "$name:$tag" >/dev/null 2>&1; then
    # The classic builder: FROM a local image, nothing pulled.
    DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE=$base" \
        --build-arg "BLENDER=$blender_arg" -f "$ctx/Containerfile" -t "$name:$tag" "$ctx" >&2
fi
docker tag "$name:$tag" "$name:latest"
echo "$name:$tag"
