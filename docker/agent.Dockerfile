# The LiveKit agent worker (turn taking + the omni plugin). No GPU and no torch: it reaches the
# omni worker over WebSocket (OMNI_URL), normally on localhost in the same pod / host network.
#
#   docker build -f docker/agent.Dockerfile -t omni-agent .
#
# Build arguments and secrets as in worker.Dockerfile (BASE_IMAGE, --secret id=pip_ca, pip's
# variables). Installs the plugin (provider/) and the agent (agent/) distributions only.
# Env: LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET, OMNI_URL, OMNI_API_KEY, AGENT_* (docs/agent.md).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL

# uid 1001, not the worker image's 1000: in the Kubernetes pod the two share a process namespace,
# and only a different user keeps the worker out of this process's environment (LiveKit's secret).
RUN groupadd --gid 1001 agent && useradd --create-home --uid 1001 --gid 1001 agent && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/install-requirements.sh docker/requirements.py /opt/build/
WORKDIR /app

# Dependencies first, in a layer of their own, so code changes reinstall only our two packages.
COPY provider/pyproject.toml /opt/build/provider/
COPY agent/pyproject.toml /opt/build/agent/
RUN --mount=type=cache,id=omni-wheels,target=/wheels --mount=type=secret,id=pip_ca \
    python /opt/build/requirements.py /opt/build/provider/pyproject.toml /opt/build/agent/pyproject.toml \
        > /opt/build/agent/requirements.txt \
    && /opt/build/install-requirements.sh /opt/build/agent/requirements.txt

COPY provider provider
COPY agent agent
RUN pip install --no-cache-dir --no-index --no-deps --no-build-isolation ./provider ./agent && rm -rf provider agent

ENV PYTHONUNBUFFERED=1 \
    OMNI_URL=ws://127.0.0.1:8000/v1/realtime
USER 1001:1001
# livekit-agents' health endpoint in `start` mode: GET / on 8081 (503 when LiveKit is unreachable).
EXPOSE 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/', timeout=2)"

# `start`: production mode; on SIGTERM it stops taking calls and lets running ones finish
# (up to AGENT_DRAIN_TIMEOUT_S), so give the container at least that long to stop.
CMD ["omni-agent", "start"]
