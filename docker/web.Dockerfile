# The browser client and its token endpoint.
#
#   docker build -f docker/web.Dockerfile -t omni-web .
#
# Env: LIVEKIT_URL, LIVEKIT_PUBLIC_URL (what browsers use, e.g. wss://livekit.example.com),
# LIVEKIT_API_KEY, LIVEKIT_API_SECRET, AGENT_NAME (only for agents registered with a name).
# Browsers allow the microphone only on https:// pages (or localhost): serve it behind TLS.
FROM node:20-bookworm-slim AS build
WORKDIR /web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY web/build.mjs ./
COPY web/src src
RUN npm run build

FROM python:3.11-slim-bookworm
RUN useradd --create-home --uid 1000 web \
    && pip install --no-cache-dir "aiohttp==3.14.*" "livekit-api==1.2.*"
WORKDIR /app
COPY web/server.py web/server.py
COPY --from=build /web/dist web/dist
ENV PYTHONUNBUFFERED=1
USER web
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)"
ENTRYPOINT ["python", "web/server.py"]
CMD ["--host", "0.0.0.0", "--port", "8080"]
