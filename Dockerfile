# The project in one CPU image: the engine, the voice agent and the bundled models, assembled at build time
# so containers run offline. docker-compose.yml runs it as the in-process voice gateway (profile cpu), as the
# engine's OpenAI-compatible server (profile engine) and as the gateway in front of vLLM (profile gpu).
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
EXPOSE 8000
# By default: the engine server on the bundled pair, reachable from outside the container.
CMD [".venv/bin/python", "-m", "engine", "serve", "--host", "0.0.0.0", "--port", "8000"]
