# derender-worker image: the Kafka worker pool, batch mode and demo (CPU only, no GPU needed).
# Runs as the unprivileged user `derender` (uid/gid 10001). The health/metrics port (--metrics-port,
# 9400 in compose.yaml and ops/k8s) serves /livez, /readyz and /metrics.
# Two stages: `build` installs the package and its pinned core dependencies (ops/constraints.txt,
# generated from the environment CI tested) into /opt/venv; the runtime stage copies only that
# venv (no pip cache, no build tools, no test extras).
# BASE_IMAGE: any Debian-like image with python3 (>= 3.10) and its venv module; the default is the
# official Python image. ops/compose-test.sh builds on a locally made Debian base instead
# (--build-arg BASE_IMAGE=localhost/pybase:bookworm) where no image registry is reachable.
# Built and run by ops/compose-test.sh (CI); linted by hadolint in tests/test_ops_docker.py.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# the pinned dependencies first: a layer that stays cached while only the project's code changes
COPY ops/constraints.txt ./ops/constraints.txt
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/python -m pip install --no-cache-dir -r ops/constraints.txt
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY worker ./worker
RUN /opt/venv/bin/python -m pip install --no-cache-dir --no-deps . \
    && /opt/venv/bin/python -m pip check \
    && /opt/venv/bin/python -m pip uninstall -y pip \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE_IMAGE}

# DL3064 is a false positive here: it matches "TOKEN" in TOKENIZERS_PARALLELISM (a Hugging Face
# tokenizers switch, no secret).
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=false \
    HF_HOME=/tmp/hf

RUN groupadd --system --gid 10001 derender \
    && useradd --system --uid 10001 --gid derender --create-home --home-dir /home/derender \
       --shell /usr/sbin/nologin derender

COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# /app/worker = the installed package (compose.yaml's DERENDER_CONFIG=/app/worker/demo_data/models.json)
RUN ln -s "$(python3 -c 'import os, worker; print(os.path.dirname(worker.__file__))')" /app/worker
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["derender-worker"]
CMD ["run", "--help"]
