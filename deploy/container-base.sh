#!/usr/bin/env bash
# Prepare this machine to build and run Warren's container image without a
# Docker engine: podman + runc, plus local stand-ins for the base images that
# would otherwise come from Docker Hub.
#
#   localhost/bookworm-min   Debian 12 minbase, made with debootstrap
#   localhost/python-base    stand-in for python:3.11-slim: Debian's Python 3.11
#                            in a venv at /opt/venv, first on PATH, so that
#                            `python -m pip install ...` works as in the
#                            official image (Debian's own Python is
#                            "externally managed" and would refuse).
#
# Idempotent: every step is skipped when its result is already there, so it
# is cheap to call before every build.  Must run as root.  Progress goes to
# stderr; any failure exits non-zero with a message saying what failed.
#
# Then build and run the image with, e.g.:
#   podman --runtime runc --cgroup-manager cgroupfs build --isolation chroot \
#       --network host --format docker \
#       -v /var/tmp/warren-pip.conf:/etc/pip.conf:ro \
#       -v /etc/ssl/certs/ca-certificates.crt:/etc/host-ca.crt:ro \
#       --build-arg BASE_IMAGE=localhost/python-base -t warren:dev .
#
# podman's configuration: this machine forbids raising rlimits, so podman must
# not set default ulimits. The script does not touch /etc/containers: it reads
# CONTAINERS_CONF, the file podman itself reads instead of containers.conf when
# the variable is set (tests/test_container.py points it at its temporary dir).
# If the file is missing, the script writes it with
#     [containers]
#     default_ulimits = []
# and if CONTAINERS_CONF is unset it uses a file of its own, removed at exit.
# Run podman afterwards with the same CONTAINERS_CONF exported.
#
# Environment overrides:
#   CONTAINERS_CONF   podman's containers.conf for this run (see above)
#   PIP_CONF          where to write the pip.conf to mount into builds
#                     (default: /var/tmp/warren-pip.conf)
#   DEBIAN_SUITE      suite for debootstrap (default: bookworm)
#   BOOKWORM_IMAGE    name of the minbase image (default: localhost/bookworm-min)
#   PYTHON_BASE_IMAGE name of the python base image (default: localhost/python-base)
#   WARREN_REBUILD_BASE=1  rebuild both images even if they exist
set -Eeuo pipefail

DEBIAN_SUITE="${DEBIAN_SUITE:-bookworm}"
BOOKWORM_IMAGE="${BOOKWORM_IMAGE:-localhost/bookworm-min}"
PYTHON_BASE_IMAGE="${PYTHON_BASE_IMAGE:-localhost/python-base}"
PIP_CONF="${PIP_CONF:-/var/tmp/warren-pip.conf}"
HOST_CA=/etc/ssl/certs/ca-certificates.crt
LOCK_FILE=/var/lock/warren-container-base.lock

log() { printf '[container-base] %s\n' "$*" >&2; }
die() { printf '[container-base] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'rc=$?; printf "[container-base] ERROR: command failed (exit %s) at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND" >&2' ERR

[ "$(id -u)" -eq 0 ] || die "must run as root (needs apt-get, debootstrap and rootful podman); current uid is $(id -u)"

# Serialise concurrent runs (e.g. two test sessions at once).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$LOCK_FILE" || die "cannot open lock file $LOCK_FILE"
    if ! flock -w 1800 9; then
        die "timed out waiting for another container-base.sh run (lock $LOCK_FILE)"
    fi
fi

# --- 1. packages -------------------------------------------------------------
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 \
        || die "missing ${missing[*]} and apt-get is not available to install them (this script needs a Debian-family host)"
    log "installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -q -o DPkg::Lock::Timeout=600 update >&2 \
        || die "apt-get update failed"
    # With recommends: that is the set this recipe was tried with.
    apt-get -q -y -o DPkg::Lock::Timeout=600 install podman runc debootstrap >&2 \
        || die "apt-get install ${missing[*]} failed"
else
    log "podman, runc and debootstrap already installed"
fi
export PATH="$PATH:/usr/sbin:/sbin"

# --- 2. containers.conf (CONTAINERS_CONF, never /etc/containers) ---------------
# The sandbox forbids raising rlimits, so podman must not set default ulimits.
own_conf=""
if [ -z "${CONTAINERS_CONF:-}" ]; then
    own_conf="$(mktemp /var/tmp/warren-containers-conf.XXXXXX)"
    export CONTAINERS_CONF="$own_conf"
    log "CONTAINERS_CONF unset: using $own_conf for this run only (export CONTAINERS_CONF=<file> first to keep it for your own podman runs)"
fi
export CONTAINERS_CONF
if [ -s "$CONTAINERS_CONF" ] && [ -z "$own_conf" ]; then
    log "using CONTAINERS_CONF=$CONTAINERS_CONF as it is"
else
    printf '[containers]\ndefault_ulimits = []\n' > "$CONTAINERS_CONF" || die "cannot write $CONTAINERS_CONF"
    log "wrote $CONTAINERS_CONF"
fi

# pip.conf to mount into builds so pip trusts this machine's CA bundle.
if [ -f "$HOST_CA" ]; then
    printf '[global]\ncert = /etc/host-ca.crt\n' > "$PIP_CONF.tmp" && mv -f "$PIP_CONF.tmp" "$PIP_CONF"
fi

PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
"${PODMAN[@]}" info >/dev/null 2>&1 || {
    "${PODMAN[@]}" info >&2 || true
    die "podman does not work on this machine (see 'podman info' output above)"
}

image_exists() { "${PODMAN[@]}" image exists "$1"; }

workdir=""
cleanup() { if [ -n "$workdir" ] && [ -d "$workdir" ]; then rm -rf --one-file-system "$workdir"; fi; }
cleanup_all() { cleanup; if [ -n "$own_conf" ]; then rm -f "$own_conf"; fi; }
trap cleanup_all EXIT

# --- 3. localhost/bookworm-min -------------------------------------------------------
if [ "${WARREN_REBUILD_BASE:-0}" != 1 ] && image_exists "$BOOKWORM_IMAGE"; then
    log "$BOOKWORM_IMAGE already exists"
else
    workdir="$(mktemp -d /var/tmp/warren-debootstrap.XXXXXX)"
    log "debootstrap --variant=minbase $DEBIAN_SUITE into $workdir (takes ~30 s)"
    start=$SECONDS
    if ! debootstrap --variant=minbase "$DEBIAN_SUITE" "$workdir/root" >"$workdir/debootstrap.log" 2>&1; then
        tail -n 30 "$workdir/debootstrap.log" >&2 || true
        die "debootstrap of $DEBIAN_SUITE failed (log above)"
    fi
    log "debootstrap done in $((SECONDS - start)) s; importing as $BOOKWORM_IMAGE"
    # Clean apt caches so the image is smaller.
    rm -rf "$workdir/root/var/cache/apt/archives/"*.deb "$workdir/root/var/lib/apt/lists/"* || true
    tar -C "$workdir/root" -c . | "${PODMAN[@]}" import \
            --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            - "$BOOKWORM_IMAGE" >/dev/null \
        || die "podman import of the debootstrap tree as $BOOKWORM_IMAGE failed"
    cleanup
    workdir=""
    log "built $BOOKWORM_IMAGE"
fi

# --- 4. localhost/python-base --------------------------------------------------------
if [ "${WARREN_REBUILD_BASE:-0}" != 1 ] && image_exists "$PYTHON_BASE_IMAGE"; then
    log "$PYTHON_BASE_IMAGE already exists"
else
    workdir="$(mktemp -d /var/tmp/warren-python-base.XXXXXX)"
    cat > "$workdir/Dockerfile" <<EOF
FROM $BOOKWORM_IMAGE
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
RUN apt-get update \\
 && apt-get install -y --no-install-recommends python3 python3-venv python-is-python3 ca-certificates \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \\
 && python3 -m venv /opt/venv \\
 && /opt/venv/bin/python -m pip --version
# Like python:3.11-slim: a 'python' with a working pip first on PATH.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    VIRTUAL_ENV=/opt/venv \\
    PIP_DISABLE_PIP_VERSION_CHECK=1
CMD ["python3"]
EOF
    log "building $PYTHON_BASE_IMAGE from $BOOKWORM_IMAGE (apt-get inside; takes ~1 min)"
    start=$SECONDS
    if ! "${PODMAN[@]}" build --isolation chroot --network host --format docker \
            -t "$PYTHON_BASE_IMAGE" "$workdir" >"$workdir/build.log" 2>&1; then
        tail -n 40 "$workdir/build.log" >&2 || true
        die "building $PYTHON_BASE_IMAGE failed (log above)"
    fi
    cleanup
    workdir=""
    log "built $PYTHON_BASE_IMAGE in $((SECONDS - start)) s"
fi

"${PODMAN[@]}" run --rm --network host "$PYTHON_BASE_IMAGE" \
        python -c 'import sys, ssl, venv; assert sys.version_info[:2] >= (3, 11), sys.version' >/dev/null \
    || die "$PYTHON_BASE_IMAGE does not run a usable Python >= 3.11"
log "ready: $BOOKWORM_IMAGE and $PYTHON_BASE_IMAGE"
