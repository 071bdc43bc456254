# The LiveKit agent worker (turn-taking + the provider plugin). No GPU: it reaches the omni
# worker over WebSocket (OMNI_URL), normally on localhost in the same pod / host network.
#
#   docker build -f docker/agent.Dockerfile -t omni-agent .
#
# Two distributions: the plugin (provider/, livekit-plugins-omni) and the agent (agent/). No torch.
# Env: LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET, OMNI_URL, OMNI_API_KEY, AGENT_* (docs/agent.md).
FROM python:3.11-slim-bookworm

RUN useradd --create-home --uid 1000 agent
WORKDIR /app

COPY provider provider
COPY agent agent
RUN pip install --no-cache-dir ./provider ./agent && rm -rf provider/build agent/build

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
