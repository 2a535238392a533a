#!/usr/bin/env bash
# Builds deploy/Dockerfile as $IMAGE (`make image`).
#
# Engine: docker when its daemon answers, else buildah, else podman
# (IMAGE_ENGINE overrides). buildah and podman build with chroot isolation
# (BUILDAH_ISOLATION) and vfs storage (IMAGE_STORAGE_DRIVER): both work
# rootless and inside containers, where overlay mounts and runtimes often
# do not.
#
# Bases (IMAGE_BASES): the Dockerfile's defaults (golang:<v>-bookworm,
# debian:bookworm-slim) when present or pullable ("auto", the default, or
# "pull" to insist); otherwise, or with "local", both are made here:
#   localhost/debian:bookworm-slim  mmdebstrap --variant=minbase from
#                                   DEBIAN_MIRROR (cached in .cache/image)
#   localhost/golang:<v>-bookworm   that plus the local Go toolchain
#                                   ($(go env GOROOT), at least go.mod's go)
# The module download inside the build goes through GOPROXY and trusts the
# host's local certificate authorities (IMAGE_CA_CERTS).
# IMAGE_REBUILD_BASES=1 makes the local bases again.
#
# `build.sh export DIR` writes the built $IMAGE as an OCI image layout
# (tag "latest") with the same engine and storage, for deploy/image_test.go.
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE=${IMAGE:-toolgate:latest}
ENGINE=${IMAGE_ENGINE:-}
BASES=${IMAGE_BASES:-auto}
CACHE=${IMAGE_CACHE:-.cache/image}
PULL_TIMEOUT=${IMAGE_PULL_TIMEOUT:-300}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
LOCAL_DEBIAN=localhost/debian:${DEBIAN_SUITE}-slim

say() { echo "make image: $*" >&2; }
die() { say "$*"; exit 1; }

# The Dockerfile's default for a base (ARG NAME=default).
dockerfile_default() { sed -n "s/^ARG $1=//p" deploy/Dockerfile | head -n1; }

# docker.io/library/ for an unqualified name, as docker resolves it; podman
# and buildah refuse short names without search registries.
qualify() {
  case $1 in
  */*) case ${1%%/*} in *.* | *:* | localhost) echo "$1" ;; *) echo "docker.io/$1" ;; esac ;;
  *) echo "docker.io/library/$1" ;;
  esac
}

if [ -z "$ENGINE" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    ENGINE=docker
  elif command -v buildah >/dev/null 2>&1; then
    ENGINE=buildah
  elif command -v podman >/dev/null 2>&1; then
    ENGINE=podman
  else
    die "no docker daemon, buildah or podman here (Debian: apt-get install buildah mmdebstrap)"
  fi
fi
case $ENGINE in docker | buildah | podman) ;; *) die "IMAGE_ENGINE=$ENGINE: want docker, buildah or podman" ;; esac

# buildah and podman: the storage driver (IMAGE_STORAGE_DRIVER, vfs unless
# set; empty: the engine's configured one) and chroot isolation.
run=("$ENGINE")
if [ "$ENGINE" != docker ]; then
  export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
  driver=${IMAGE_STORAGE_DRIVER-vfs}
  [ -z "$driver" ] || run+=(--storage-driver "$driver")
fi

have() {
  case $ENGINE in
  docker) docker image inspect "$1" >/dev/null 2>&1 ;;
  buildah) "${run[@]}" inspect --type image "$1" >/dev/null 2>&1 ;;
  podman) "${run[@]}" image exists "$1" ;;
  esac
}

pull() {
  say "pulling $1"
  if command -v timeout >/dev/null 2>&1; then
    timeout "$PULL_TIMEOUT" "${run[@]}" pull "$1" >&2
  else
    "${run[@]}" pull "$1" >&2
  fi
}

if [ "${1:-}" = export ]; then
  [ -n "${2:-}" ] || die "usage: build.sh export DIR"
  case $ENGINE in
  docker)
    command -v skopeo >/dev/null 2>&1 || die "exporting from docker needs skopeo"
    skopeo copy "docker-daemon:$IMAGE" "oci:$2:latest" >&2
    ;;
  *) "${run[@]}" push "$IMAGE" "oci:$2:latest" >&2 ;;
  esac
  exit 0
fi

build() {
  local a shown=()
  for a in "$@"; do case $a in EXTRA_CA_CERTS=?*) shown+=("EXTRA_CA_CERTS=(PEM)") ;; *) shown+=("$a") ;; esac; done
  say "${run[*]} build ${shown[*]}"
  "${run[@]}" build "$@" >&2
}

# local_debian makes $LOCAL_DEBIAN from Debian's mirror: minbase (what
# -slim is, without documentation), the suite with its updates and security
# archives, no device nodes (the runtime provides /dev).
local_debian() {
  if [ "${IMAGE_REBUILD_BASES:-}" != 1 ] && have "$LOCAL_DEBIAN"; then
    return
  fi
  command -v mmdebstrap >/dev/null 2>&1 || die "no registry reachable and no mmdebstrap to make $LOCAL_DEBIAN (Debian: apt-get install mmdebstrap)"
  local dir=$CACHE/debian-$DEBIAN_SUITE
  mkdir -p "$dir"
  if [ "${IMAGE_REBUILD_BASES:-}" = 1 ] || [ ! -s "$dir/rootfs.tar" ]; then
    say "making $LOCAL_DEBIAN with mmdebstrap from $DEBIAN_MIRROR"
    mmdebstrap --variant=minbase --format=tar --skip=output/dev \
      --aptopt='Acquire::Languages "none"' \
      --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      "$DEBIAN_SUITE" "$dir/rootfs.tar.part" \
      "deb $DEBIAN_MIRROR $DEBIAN_SUITE main" \
      "deb $DEBIAN_MIRROR $DEBIAN_SUITE-updates main" \
      "deb $DEBIAN_SECURITY_MIRROR $DEBIAN_SUITE-security main" >&2
    mv "$dir/rootfs.tar.part" "$dir/rootfs.tar"
  fi
  build -f deploy/image/debian.Dockerfile -t "$LOCAL_DEBIAN" "$dir"
}

# local_golang makes localhost/golang:<v>-bookworm from the given Debian base
# and the local Go toolchain; prints its name.
local_golang() {
  command -v go >/dev/null 2>&1 || die "no registry reachable and no local Go toolchain for the builder base"
  local goroot v want name
  goroot=$(go env GOROOT)
  v=$(go env GOVERSION)
  v=${v#go}
  want=$(sed -n 's/^go //p' go.mod)
  if [ "$(printf '%s\n%s\n' "$want" "$v" | sort -V | head -n1)" != "$want" ]; then
    die "local Go $v is older than go.mod's $want"
  fi
  name=localhost/golang:$v-$DEBIAN_SUITE
  if [ "${IMAGE_REBUILD_BASES:-}" = 1 ] || ! have "$name"; then
    say "making $name from $1 and $goroot"
    build -f deploy/image/golang.Dockerfile --build-arg BASE_IMAGE="$1" -t "$name" "$goroot"
  fi
  echo "$name"
}

# resolve NAME: the public base, qualified, if present or pullable.
resolve() {
  local q
  q=$(qualify "$1")
  if have "$q" || pull "$q"; then echo "$q"; fi
}

go_default=$(dockerfile_default GO_IMAGE)
base_default=$(dockerfile_default BASE_IMAGE)
case $BASES in
auto | pull)
  GO_IMAGE=$(resolve "$go_default")
  BASE_IMAGE=$(resolve "$base_default")
  if [ -z "$GO_IMAGE" ] || [ -z "$BASE_IMAGE" ]; then
    [ "$BASES" = auto ] || die "cannot pull $go_default and $base_default"
    say "registry unreachable: making the bases locally"
    local_debian
    BASE_IMAGE=$LOCAL_DEBIAN
    GO_IMAGE=$(local_golang "$LOCAL_DEBIAN")
  fi
  ;;
local)
  local_debian
  BASE_IMAGE=$LOCAL_DEBIAN
  GO_IMAGE=$(local_golang "$LOCAL_DEBIAN")
  ;;
*) die "IMAGE_BASES=$BASES: want auto, pull or local" ;;
esac

# Local certificate authorities (a TLS-intercepting proxy's) the build stage
# trusts for the module download: IMAGE_CA_CERTS, a PEM file, or the host's
# /usr/local/share/ca-certificates.
extra_ca() {
  if [ -n "${IMAGE_CA_CERTS:-}" ]; then
    cat "$IMAGE_CA_CERTS"
  else
    find /usr/local/share/ca-certificates -name '*.crt' -type f -exec cat {} + 2>/dev/null || true
  fi
}

gosetting() { if command -v go >/dev/null 2>&1; then go env "$1"; else printenv "$1" || true; fi; }
build -f deploy/Dockerfile -t "$IMAGE" \
  --build-arg GO_IMAGE="$GO_IMAGE" --build-arg BASE_IMAGE="$BASE_IMAGE" \
  --build-arg GOPROXY="$(gosetting GOPROXY)" --build-arg GOSUMDB="$(gosetting GOSUMDB)" \
  --build-arg EXTRA_CA_CERTS="$(extra_ca)" \
  --build-arg VERSION="$(git describe --tags --always --dirty 2>/dev/null || echo dev)" \
  --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || true)" \
  .
say "built $IMAGE with $ENGINE from $GO_IMAGE and $BASE_IMAGE"
