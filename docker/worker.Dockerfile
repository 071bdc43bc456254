# The omni worker: realtime gateway + engine, one per GPU.
#
#   docker build -f docker/worker.Dockerfile -t omni-worker .                  # GPU: vllm-omni
#   docker build -f docker/worker.Dockerfile --build-arg EXTRAS= -t omni-worker-cpu .   # reference engine only
#
# The CUDA runtime comes inside the torch/vllm wheels; the host needs the NVIDIA driver and
# the NVIDIA Container Toolkit (`docker run --gpus all` / compose `gpus`).
# Configure with env: OMNI_ENGINE, OMNI_MODEL, OMNI_HOST, OMNI_PORT, OMNI_API_KEY (required),
# OMNI_LIMIT_* (see README). Weights: mount a volume at /models (HF_HOME points there, so a
# Hugging Face id is downloaded once and kept), or set OMNI_MODEL to a local path in it.
FROM python:3.11-slim-bookworm

# vLLM compiles kernels at start (triton needs a C compiler); curl-free health checks use python.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 omni
WORKDIR /app

# Dependencies first, so code changes do not reinstall torch/vllm.
ARG EXTRAS=gpu
# (the worker is its own distribution, inference/pyproject.toml: only its package files are needed)
COPY inference/pyproject.toml inference/__init__.py inference/
COPY inference/engine/__init__.py inference/engine/
COPY inference/engine/reference/__init__.py inference/engine/reference/
COPY inference/engine/vllm_omni/__init__.py inference/engine/vllm_omni/
RUN pip install --no-cache-dir "./inference${EXTRAS:+[$EXTRAS]}" && rm -rf inference/build

COPY inference inference
RUN pip install --no-cache-dir --no-deps --force-reinstall ./inference && rm -rf inference/build

ENV HF_HOME=/models \
    OMNI_ENGINE=vllm-omni \
    OMNI_MODEL=Qwen/Qwen2.5-Omni-7B \
    OMNI_HOST=0.0.0.0 \
    OMNI_PORT=8000 \
    PYTHONUNBUFFERED=1
RUN mkdir -p /models && chown omni /models
USER omni
EXPOSE 8000

# 503 while the model loads and warms up (minutes for real weights), 200 when ready.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15m \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"OMNI_PORT\"]}/health', timeout=2)"

ENTRYPOINT ["omni-worker"]
CMD ["serve"]
