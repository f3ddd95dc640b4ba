# derender-worker image: the Kafka worker pool, batch mode and demo (CPU only, no GPU needed).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY worker ./worker
RUN pip install --no-cache-dir .
ENV TOKENIZERS_PARALLELISM=false
ENTRYPOINT ["derender-worker"]
CMD ["run", "--help"]
