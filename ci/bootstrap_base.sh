#!/usr/bin/env bash
# Build the CI-only stand-in for the pinned base image, offline from Debian's mirror:
# Debian bookworm minbase + python3 (3.11) + venv + headers + ca-certificates, with this machine's CA
# bundle copied in so pip inside image builds reaches PyPI through the network's TLS proxy.
# It replaces docker.io/library/python:3.11-slim-bookworm@sha256:... only on machines that
# cannot pull from a registry; production builds use the pinned digest (docker/README.md).
#   usage: ci/bootstrap_base.sh [image name]   (default localhost/cortex-ci-base:bookworm)
set -euo pipefail
name="${1:-localhost/cortex-ci-base:bookworm}"
if podman image exists "$name"; then
  echo "base image $name already present"
  exit 0
fi
ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
tarball="$(mktemp --suffix=.tar)"
trap 'rm -f "$tarball"' EXIT
mmdebstrap --variant=minbase --quiet \
  --include=python3,python3-venv,python3-dev,ca-certificates,passwd \
  --customize-hook="copy-in $ca /etc/ssl/certs/" \
  --customize-hook='chroot "$1" sh -c "ln -sf /usr/bin/python3 /usr/local/bin/python3"' \
  bookworm "$tarball" http://deb.debian.org/debian
podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$tarball" "$name" >/dev/null
echo "built $name"
