# syntax=docker/dockerfile:1
# The async GRPO journey's image with prime-rl's own environment in it, so that `train` and
# `qualify` run prime-rl's orchestrator (docs/async-grpo.md). Built on the `grpo` journey image
# (ci/images.py builds that one from docker/Dockerfile), in one of two ways:
#
#   # from GitHub (the default target), on a machine that reaches it:
#   python ci/images.py --journey grpo --keep
#   podman build -f docker/primerl.Dockerfile --build-arg GRPO_IMAGE=cortex/grpo:pinned \
#       -t cortex/grpo-primerl:pinned .
#   # from local clones at the pinned commits (no GitHub needed): ci/images.py makes the build
#   # context (the two clones, checked out at the pins) and builds the `from-clones` target
#   python ci/images.py --journey grpo --primerl-clones DIR    # DIR/prime-rl, DIR/verifiers
#
# What it adds, all pinned: git (Debian: install.sh checks each clone's commit, pip fetches the
# VCS requirements); CPython 3.12.16 from uv 0.13.9's own download list (uv checks the sha256 it
# ships for that build); then recipes/rl/async_grpo/primerl/install.sh: requirements.txt and
# requirements-nodeps.txt with --require-hashes, prime-rl 559b447 and verifiers a60a606 by full
# commit (from GitHub, or from the clones after checking their commits).
ARG GRPO_IMAGE=cortex/grpo:pinned

FROM ${GRPO_IMAGE} AS python312
# root only while installing: both targets below end as the image's user (uid 10001)
# hadolint ignore=DL3002
USER 0:0
ARG UV_VERSION=0.13.9
ARG PYTHON312=3.12.16
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/uv \
    && /opt/uv/bin/pip install --no-cache-dir "uv==${UV_VERSION}" \
    && UV_PYTHON_INSTALL_DIR=/opt/python /opt/uv/bin/uv python install "${PYTHON312}" \
    && UV_PYTHON_INSTALL_DIR=/opt/python /opt/uv/bin/uv python find "${PYTHON312}" > /opt/python/PYTHON312 \
    && chmod -R a+rX /opt/python

# prime-rl and verifiers from clones in the build context (prime-rl/, verifiers/, each a git
# checkout at its pinned commit; install.sh refuses any other commit).
FROM python312 AS from-clones
COPY prime-rl/ /tmp/primerl-src/prime-rl/
COPY verifiers/ /tmp/primerl-src/verifiers/
RUN PYTHON312="$(cat /opt/python/PYTHON312)" \
        bash /app/recipes/rl/async_grpo/primerl/install.sh /opt/prime-rl-venv \
            /tmp/primerl-src/prime-rl /tmp/primerl-src/verifiers \
    && rm -rf /tmp/primerl-src /opt/uv /root/.cache \
    && chmod -R a+rX /opt/prime-rl-venv
ENV CORTEX_RECIPES_PRIMERL_PYTHON=/opt/prime-rl-venv/bin/python
LABEL io.cortex-recipes.primerl="prime-rl 559b44772e471d1538537b8805cc77f3824a5e64, verifiers a60a606ecc4d309247edf9ff92c3eabca362781f (local clones)"
USER 10001:10001

# prime-rl and verifiers from GitHub by full commit (the default target).
FROM python312 AS from-github
RUN PYTHON312="$(cat /opt/python/PYTHON312)" \
        bash /app/recipes/rl/async_grpo/primerl/install.sh /opt/prime-rl-venv \
    && rm -rf /opt/uv /root/.cache \
    && chmod -R a+rX /opt/prime-rl-venv
ENV CORTEX_RECIPES_PRIMERL_PYTHON=/opt/prime-rl-venv/bin/python
LABEL io.cortex-recipes.primerl="prime-rl 559b44772e471d1538537b8805cc77f3824a5e64, verifiers a60a606ecc4d309247edf9ff92c3eabca362781f"
USER 10001:10001
