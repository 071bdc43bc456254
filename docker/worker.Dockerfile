# The omni worker: realtime gateway + engine, one per GPU.
#
#   docker build -f docker/worker.Dockerfile -t omni-worker .                          # GPU: vllm-omni
#   docker build -f docker/worker.Dockerfile --build-arg EXTRAS= -t omni-worker-cpu .   # reference engine only
#
# Build arguments and secrets (the same in all three Dockerfiles, docs/deploy.md "Images"):
#   BASE_IMAGE   Debian bookworm with python3 (3.11) and its venv module; default the official
#                python image. Without a registry: a local one (deploy/smoke/run.py builds it).
#   --secret id=pip_ca,src=FILE   a CA bundle for pip behind a TLS-intercepting proxy.
#   PIP_INDEX_URL / PIP_EXTRA_INDEX_URL   pip's usual variables, e.g. an internal mirror. PyPI's
#                torch wheels bring the CUDA libraries (~4 GB) even for the CPU variant; PyTorch's
#                CPU wheel index as PIP_EXTRA_INDEX_URL gives a CPU-only torch instead.
# Downloads go through a wheel house in a build cache mount (docker/install-requirements.sh):
# a rebuild after a dependency change does not download torch again.
#
# The CUDA runtime comes inside the torch/vllm wheels; the host needs the NVIDIA driver and
# the NVIDIA Container Toolkit (`docker run --gpus all` / compose `gpus`).
# Configure with env: OMNI_ENGINE, OMNI_MODEL, OMNI_HOST, OMNI_PORT, OMNI_API_KEY (required),
# OMNI_LIMIT_* (see README). Weights: mount a volume at /models (HF_HOME points there, so a
# Hugging Face id is downloaded once and kept), or set OMNI_MODEL to a local path in it.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG EXTRAS=gpu
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL

# vLLM compiles kernels at start (triton needs a C compiler); the reference engine does not.
RUN if [ -n "$EXTRAS" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends build-essential \
        && rm -rf /var/lib/apt/lists/*; \
    fi

# uid 1000, the agent image's user is 1001: in the Kubernetes pod the two share a process
# namespace, and different users keep each out of the other's /proc (deploy/k8s/omni-agent.yaml).
RUN groupadd --gid 1000 omni && useradd --create-home --uid 1000 --gid 1000 omni && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/install-requirements.sh docker/requirements.py /opt/build/
WORKDIR /app

# The worker is its own distribution (inference/pyproject.toml). Its dependencies first, in a
# layer of their own, so code changes do not reinstall torch/vllm.
COPY inference/pyproject.toml /opt/build/worker/
RUN --mount=type=cache,id=omni-wheels,target=/wheels --mount=type=secret,id=pip_ca \
    python /opt/build/requirements.py /opt/build/worker/pyproject.toml ${EXTRAS:+--extra $EXTRAS} \
        > /opt/build/worker/requirements.txt \
    && /opt/build/install-requirements.sh /opt/build/worker/requirements.txt

# Then the source, installed from the layer above alone (no network); only the installed copy stays.
COPY inference inference
RUN pip install --no-cache-dir --no-index --no-deps --no-build-isolation ./inference && rm -rf inference

# OMNI_CACHE_DIR: the reference engine's compile cache (and tiny-random) on the same volume as
# the weights, so a restarted worker reads its compiled kernels instead of compiling again
ENV HF_HOME=/models \
    OMNI_CACHE_DIR=/models/omni-cache \
    OMNI_ENGINE=vllm-omni \
    OMNI_MODEL=Qwen/Qwen2.5-Omni-7B \
    OMNI_HOST=0.0.0.0 \
    OMNI_PORT=8000 \
    PYTHONUNBUFFERED=1
# /cache: where the Kubernetes pod puts OMNI_CACHE_DIR (its own volume; /models is read-only there)
RUN mkdir -p /models /cache && chown omni:omni /models /cache
# Numeric, so that a kubelet can check runAsNonRoot against it.
USER 1000:1000
EXPOSE 8000

# 503 while the model loads and warms up (minutes for real weights), 200 when ready.
# (Podman keeps HEALTHCHECK only in Docker-format images: `podman build --format docker`.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=15m \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"OMNI_PORT\"]}/health', timeout=2)"

ENTRYPOINT ["omni-worker"]
CMD ["serve"]
