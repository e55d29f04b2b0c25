# syntax=docker/dockerfile:1
# The async GRPO journey's image with prime-rl's own environment in it, so that `train` and
# `qualify` run prime-rl's orchestrator (docs/async-grpo.md). Built on the `grpo` journey image
# (ci/images.py builds that one from docker/Dockerfile), in one of two ways:
#
#   # from GitHub (the default target), on a machine that reaches it:
#   python ci/images.py --journey grpo --keep
#   podman build -f docker/primerl.Dockerfile --build-arg GRPO_IMAGE=cortex/grpo:pinned \
#       -t cortex/grpo-primerl:pinned .
#   # from local clones at the pinned commits: ci/images.py makes the build context (the two
#   # clones, checked out at the pins; optionally a local CPython 3.12) and builds `from-clones`
#   python ci/images.py --journey grpo --primerl-clones DIR [--primerl-python312 PREFIX]
#
# What it adds, all pinned: git (Debian: install.sh checks each clone's commit, pip fetches the
# VCS requirements); CPython 3.12.16 from uv 0.13.9's own download list (uv checks the sha256 it
# ships for that build; the download is from GitHub), or, from clones, a CPython 3.12 install
# the context carries (python312/, copied to the prefix it was built for, python312.prefix); then recipes/rl/async_grpo/primerl/install.sh: requirements.txt and
# requirements-nodeps.txt with --require-hashes, prime-rl 559b447 and verifiers a60a606 by full
# commit (from GitHub, or from the clones after checking their commits).
ARG GRPO_IMAGE=cortex/grpo:pinned

FROM ${GRPO_IMAGE} AS with-git
# root only while installing: both targets below end as the image's user (uid 10001)
# hadolint ignore=DL3002
USER 0:0
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# prime-rl and verifiers from clones in the build context (prime-rl/, verifiers/, each a git
# checkout at its pinned commit; install.sh refuses any other commit), mounted (writable, the
# writes discarded) rather than copied, so no layer keeps them; the context's CPython 3.12 when
# it carries one, else uv's download. The grpo image sets UV_PYTHON_DOWNLOADS=never (its venv
# needs no download); that one install asks for it by version. pip reads the system CA bundle
# (PIP_CERT; upstream pip otherwise carries its own, which a TLS-inspecting proxy fails).
FROM with-git AS from-clones
ARG UV_VERSION=0.13.9
ARG PYTHON312=3.12.16
RUN --mount=type=bind,target=/tmp/primerl-ctx,rw \
    set -e; ctx=/tmp/primerl-ctx; \
    if [ -d "$ctx/python312" ]; then \
        prefix="$(cat "$ctx/python312.prefix")"; mkdir -p "$(dirname "$prefix")"; \
        cp -a "$ctx/python312" "$prefix"; chmod -R a+rX "$prefix"; \
        dir="$prefix"; while [ "$dir" != / ]; do chmod a+rx "$dir"; dir="$(dirname "$dir")"; done; \
        python="$prefix/bin/python3.12"; \
    else \
        python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir "uv==${UV_VERSION}"; \
        UV_PYTHON_DOWNLOADS=manual UV_PYTHON_INSTALL_DIR=/opt/python \
            /opt/uv/bin/uv python install "${PYTHON312}"; \
        chmod -R a+rX /opt/python; \
        python="$(UV_PYTHON_INSTALL_DIR=/opt/python /opt/uv/bin/uv python find "${PYTHON312}")"; \
    fi; \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PYTHON312="$python" \
        bash /app/recipes/rl/async_grpo/primerl/install.sh /opt/prime-rl-venv \
        "$ctx/prime-rl" "$ctx/verifiers"; \
    rm -rf /opt/uv /root/.cache; \
    chmod -R a+rX /opt/prime-rl-venv
ENV CORTEX_RECIPES_PRIMERL_PYTHON=/opt/prime-rl-venv/bin/python
LABEL io.cortex-recipes.primerl="prime-rl 559b44772e471d1538537b8805cc77f3824a5e64, verifiers a60a606ecc4d309247edf9ff92c3eabca362781f (local clones)"
USER 10001:10001

# prime-rl and verifiers from GitHub by full commit (the default target).
FROM with-git AS from-github
ARG UV_VERSION=0.13.9
ARG PYTHON312=3.12.16
RUN python3 -m venv /opt/uv \
    && /opt/uv/bin/pip install --no-cache-dir "uv==${UV_VERSION}" \
    && UV_PYTHON_DOWNLOADS=manual UV_PYTHON_INSTALL_DIR=/opt/python \
        /opt/uv/bin/uv python install "${PYTHON312}" \
    && chmod -R a+rX /opt/python \
    && PYTHON312="$(UV_PYTHON_INSTALL_DIR=/opt/python /opt/uv/bin/uv python find "${PYTHON312}")" \
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
        bash /app/recipes/rl/async_grpo/primerl/install.sh /opt/prime-rl-venv \
    && rm -rf /opt/uv /root/.cache \
    && chmod -R a+rX /opt/prime-rl-venv
ENV CORTEX_RECIPES_PRIMERL_PYTHON=/opt/prime-rl-venv/bin/python
LABEL io.cortex-recipes.primerl="prime-rl 559b44772e471d1538537b8805cc77f3824a5e64, verifiers a60a606ecc4d309247edf9ff92c3eabca362781f"
USER 10001:10001
