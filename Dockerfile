# derender-worker image: the Kafka worker pool, batch mode and demo (CPU only, no GPU needed).
# Runs as the unprivileged user `derender` (uid/gid 10001). The health/metrics port (--metrics-port,
# 9400 in compose.yaml and ops/k8s) serves /livez, /readyz and /metrics.
# Not built in this repository's CI (no Docker engine there): linted by hadolint in
# tests/test_ops_docker.py.
FROM python:3.11-slim

# DL3064 is a false positive here: it matches "TOKEN" in TOKENIZERS_PARALLELISM (a Hugging Face
# tokenizers switch, no secret).
# hadolint ignore=DL3064
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false \
    HF_HOME=/tmp/hf

RUN groupadd --system --gid 10001 derender \
    && useradd --system --uid 10001 --gid derender --create-home --home-dir /home/derender \
       --shell /usr/sbin/nologin derender

WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY worker ./worker
RUN pip install --no-cache-dir .

USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["derender-worker"]
CMD ["run", "--help"]
