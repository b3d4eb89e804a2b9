# The project in one CPU container: the engine and the bundled models, assembled at build time so the
# container runs offline. (GPU serving moves the LLM to vLLM: see docker-compose.yml.)
FROM python:3.11-slim-bookworm
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    VOICEAGENT_CACHE=/var/cache/voiceagent
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md LICENSE Makefile ./
COPY requirements requirements
COPY scripts scripts
COPY engine engine
COPY voiceagent voiceagent
COPY web web
RUN make venv debian models
CMD [".venv/bin/python", "-m", "engine", "chat"]
