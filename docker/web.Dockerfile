# The browser client and its token endpoint.
#
#   docker build -f docker/web.Dockerfile -t omni-web .
#
# Build arguments and secrets as in worker.Dockerfile (BASE_IMAGE, --secret id=pip_ca, pip's
# variables), plus NODE_IMAGE for the stage that bundles the page: default the official Node
# image; a plain Debian image works too (Debian's nodejs and npm are installed then).
# Env: LIVEKIT_URL, LIVEKIT_PUBLIC_URL (what browsers use, e.g. wss://livekit.example.com),
# LIVEKIT_API_KEY, LIVEKIT_API_SECRET, AGENT_NAME (only for agents registered with a name).
# Browsers allow the microphone only on https:// pages (or localhost): serve it behind TLS.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:20-bookworm-slim

FROM ${NODE_IMAGE} AS build
RUN if ! command -v npm >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends nodejs npm \
        && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /web
COPY web/package.json web/package-lock.json ./
# npm honours NODE_EXTRA_CA_CERTS, pointed at the same optional CA bundle as pip.
RUN --mount=type=cache,target=/root/.npm --mount=type=secret,id=pip_ca \
    if [ -s /run/secrets/pip_ca ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/pip_ca; fi; \
    npm ci --no-audit --no-fund
COPY web/build.mjs ./
COPY web/src src
RUN npm run build

FROM ${BASE_IMAGE}
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
RUN groupadd --gid 1002 web && useradd --create-home --uid 1002 --gid 1002 web && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/install-requirements.sh /opt/build/
RUN --mount=type=cache,id=omni-wheels,target=/wheels --mount=type=secret,id=pip_ca \
    printf '%s\n' "aiohttp==3.14.*" "livekit-api==1.2.*" > /opt/build/requirements.txt \
    && /opt/build/install-requirements.sh /opt/build/requirements.txt
WORKDIR /app
COPY web/server.py web/server.py
COPY --from=build /web/dist web/dist
ENV PYTHONUNBUFFERED=1
USER 1002:1002
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)"
ENTRYPOINT ["python", "web/server.py"]
CMD ["--host", "0.0.0.0", "--port", "8080"]
