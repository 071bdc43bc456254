# The LiveKit agent worker (turn-taking + the provider plugin). No GPU: it reaches the omni
# worker over WebSocket (OMNI_URL), normally on localhost in the same pod / host network.
#
#   docker build -f docker/agent.Dockerfile -t omni-agent .
#
# The project's dependencies include torch (the reference engine shares the package). To keep
# this image smaller, point pip at PyTorch's CPU-only wheel index with
#   --build-arg PIP_EXTRA_INDEX_URL=<that index>
# Env: LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET, OMNI_URL, OMNI_API_KEY, AGENT_* (docs/agent.md).
FROM python:3.11-slim-bookworm

RUN useradd --create-home --uid 1000 agent
WORKDIR /app

ARG PIP_EXTRA_INDEX_URL=
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}
COPY pyproject.toml README.md ./
COPY inference/__init__.py inference/__init__.py
COPY provider/__init__.py provider/__init__.py
COPY agent/__init__.py agent/__init__.py
RUN pip install --no-cache-dir .

COPY provider provider
COPY agent agent
RUN pip install --no-cache-dir --no-deps .

ENV PYTHONUNBUFFERED=1 \
    OMNI_URL=ws://127.0.0.1:8000/v1/realtime
USER agent
# livekit-agents' health endpoint in `start` mode: GET / on 8081 (503 when LiveKit is unreachable).
EXPOSE 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/', timeout=2)"

# `start`: production mode; on SIGTERM it stops taking calls and lets running ones finish
# (up to AGENT_DRAIN_TIMEOUT_S), so give the container at least that long to stop.
CMD ["python", "agent/agent.py", "start"]
