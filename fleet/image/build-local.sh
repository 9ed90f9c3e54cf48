#!/usr/bin/env bash
# Builds a small worker image from this machine's own files, downloading
# nothing: the tests' image (tests/e2e/fleet.rs), not the release one.
#
#   fleet/image/build-local.sh TESSERA_BINARY [IMAGE_NAME]
#
# The image is one `docker import` of a small tarball: the `tessera` binary,
# the shared libraries `ldd` lists for it (and the loader), a /bin/sh with
# `ls`, `wc` and `cat` for whoever looks inside a node (and the tests'
# `docker exec`), /etc/passwd and /etc/group with the `tessera` user
# (uid 1000), its home, /tmp, and this machine's CA bundle where it has
# one (HTTPS for `--blender auto`). It has the release image's user, working
# folder, variables and entrypoint (Containerfile) but no Blender and no
# package manager: fleet/image/build.sh makes the release image (Debian
# base by debootstrap; .ci/nightly tests it).
#
# Tagged IMAGE_NAME:CONTENT_TAG, the hash of the tarball (its entries sorted,
# owners and times fixed) and of the image settings: a second run with the
# same binary and libraries finds it and imports nothing. Prints the tag on
# stdout. Needs Docker and `ldd` (glibc's).
set -euo pipefail
binary="${1:?usage: build-local.sh TESSERA_BINARY [IMAGE_NAME]}"
name="${2:-tessera-worker-local}"
root="$(mktemp -d "${TMPDIR:-/tmp}/$name-rootfs.XXXXXX")"
trap 'rm -rf "$root"' EXIT

# Copies FILE (following links) to the same path under the root.
put() {
    local dest="$root$2"
    mkdir -p "$(dirname "$dest")"
    cp -L "$1" "$dest"
}
# An executable at PATH_IN_IMAGE, with every library `ldd` lists for it.
put_exe() {
    put "$1" "$2"
    chmod 0755 "$root$2"
    local lib
    # `ldd` lines: "libX.so => /path (0x…)", or "/lib64/ld-linux… (0x…)".
    for lib in $(ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
        [ -e "$root$lib" ] || put "$lib" "$lib"
    done
}
put_exe "$binary" /usr/local/bin/tessera
# Without its debug info (a debug build's is most of its 300 MB); the symbols
# stay, so a backtrace still names functions.
if command -v strip >/dev/null 2>&1; then
    strip --strip-debug "$root/usr/local/bin/tessera"
fi
put_exe "$(command -v dash || command -v sh)" /bin/sh
for tool in ls wc cat; do
    put_exe "$(command -v "$tool")" "/bin/$tool"
done
# Debian's loader finds libraries in /lib/x86_64-linux-gnu by its built-in
# path; /usr/lib… paths that `ldd` shows on a merged-/usr machine are copied
# as they are, and /lib is the same folder there.
[ -e /etc/ssl/certs/ca-certificates.crt ] && put /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
mkdir -p "$root/etc" "$root/tmp" "$root/home/tessera" "$root/run" "$root/proc" "$root/sys" "$root/dev"
chmod 1777 "$root/tmp"
cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
tessera:x:1000:1000::/home/tessera:/bin/sh
PASSWD
cat > "$root/etc/group" <<'GROUP'
root:x:0:
tessera:x:1000:
GROUP
echo "hosts: files dns" > "$root/etc/nsswitch.conf"

# The image settings of the Containerfile (STOPSIGNAL is SIGTERM, Docker's
# default).
changes=(
    "ENV NVIDIA_VISIBLE_DEVICES=all"
    "ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics"
    "ENV TESSERA_CACHE_DIR=/home/tessera/cache"
    "USER tessera"
    "WORKDIR /home/tessera"
    'ENTRYPOINT ["/usr/local/bin/tessera"]'
    'CMD ["worker", "--blender", "auto"]'
)
tarball="$root.tar"
trap 'rm -rf "$root" "$tarball"' EXIT
# The home belongs to the worker's user: owners are set in the tarball,
# the rest is root's.
tar -C "$root" --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 \
    --exclude=./home/tessera -cf "$tarball" .
tar -C "$root" --sort=name --mtime=@0 --numeric-owner --owner=1000 --group=1000 \
    -rf "$tarball" ./home/tessera
tag="$( (sha256sum < "$tarball"; printf '%s\n' "${changes[@]}") | sha256sum | cut -c1-16)"
if ! docker image inspect "$name:$tag" >/dev/null 2>&1; then
    args=()
    for c in "${changes[@]}"; do args+=(--change "$c"); done
    echo "build-local.sh: docker import of $(du -h "$tarball" | cut -f1) as $name:$tag" >&2
    docker import "${args[@]}" "$tarball" "$name:$tag" >/dev/null
fi
echo "$name:$tag"
