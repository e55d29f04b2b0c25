# syntax=docker/dockerfile:1
# The async GRPO journey's image with prime-rl's own environment in it, so that `train` and
# `qualify` run prime-rl's orchestrator (docs/async-grpo.md). Built on the `grpo` journey image
# (ci/images.py builds that one from docker/Dockerfile), on a machine that reaches GitHub:
#
#   python ci/images.py --journey grpo --keep
#   podman build -f docker/primerl.Dockerfile --build-arg GRPO_IMAGE=cortex/grpo:pinned \
#       -t cortex/grpo-primerl:pinned .
#
# What it adds, all pinned: git (Debian, to fetch the two VCS requirements); CPython 3.12.16 from
# uv 0.13.9's own download list (uv checks the sha256 it ships for that build); then
# recipes/rl/async_grpo/primerl/install.sh: requirements.txt and requirements-nodeps.txt with
# --require-hashes, prime-rl 559b447 and verifiers a60a606 by full commit from GitHub. Not built
# by this project's CI, which reaches PyPI and Debian but not GitHub (docs/reproducibility.md).
ARG GRPO_IMAGE=cortex/grpo:pinned
FROM ${GRPO_IMAGE}
USER 0:0
ARG UV_VERSION=0.13.9
ARG PYTHON312=3.12.16
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /tmp/uv \
    && /tmp/uv/bin/pip install --no-cache-dir "uv==${UV_VERSION}" \
    && UV_PYTHON_INSTALL_DIR=/opt/python /tmp/uv/bin/uv python install "${PYTHON312}" \
    && PYTHON312="$(UV_PYTHON_INSTALL_DIR=/opt/python /tmp/uv/bin/uv python find "${PYTHON312}")" \
        bash /app/recipes/rl/async_grpo/primerl/install.sh /opt/prime-rl-venv \
    && rm -rf /tmp/uv /root/.cache \
    && chmod -R a+rX /opt/python /opt/prime-rl-venv
ENV CORTEX_RECIPES_PRIMERL_PYTHON=/opt/prime-rl-venv/bin/python
LABEL io.cortex-recipes.primerl="prime-rl 559b44772e471d1538537b8805cc77f3824a5e64, verifiers a60a606ecc4d309247edf9ff92c3eabca362781f"
USER 10001:10001
