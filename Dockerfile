# syntax=docker/dockerfile:1
# The worker-sidecar image. The final stage installs a wheel, never the source tree:
#   docker build -t sie-sidecar .                          # the wheel is built in the first stage
#   make wheels && docker build --build-arg WHEELS=dist .  # ship the wheels `make release-check` proved
# Untested here: the development machines have no Docker engine; hadolint checks it in `make lint`,
# and tests/deploy/test_dockerfile.py checks it against the code's settings (docs/deploying.md).
ARG PYTHON_VERSION=3.11
ARG WHEELS=source

FROM python:${PYTHON_VERSION}-slim-bookworm AS wheels-source
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# Debian's packaged rustc is too old for current PyO3, so use rustup's stable toolchain.
ENV RUSTUP_HOME=/opt/rustup CARGO_HOME=/opt/cargo PATH=/opt/cargo/bin:$PATH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
# cmake builds the libopus native/audio bundles (opusic-sys).
RUN pip install --no-cache-dir "maturin>=1.9,<2" "cython>=3.1,<4" "cmake>=3.16"
WORKDIR /src
COPY Cargo.toml Cargo.lock pyproject.toml README.md ./
COPY native ./native
COPY cython ./cython
COPY python ./python
RUN maturin build --release --locked --compatibility manylinux2014 -o /wheels

FROM scratch AS wheels-dist
COPY dist/*.whl /wheels/

# hadolint ignore=DL3006
FROM wheels-${WHEELS} AS wheels

FROM python:${PYTHON_VERSION}-slim-bookworm
ARG UID=10001
RUN groupadd --system --gid ${UID} sidecar \
 && useradd --system --uid ${UID} --gid ${UID} --home-dir /nonexistent --shell /usr/sbin/nologin sidecar
# pip picks the wheel whose tags match this image (python minor, architecture) out of /wheels and
# nothing else (no index: a newer sie-sidecar on PyPI must not win); then its dependencies, pinned
# to the version just installed, come from the index. (DL3013: /wheels holds one version, the pin.)
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --no-deps --find-links /wheels sie-sidecar \
 && pip install --no-cache-dir "sie-sidecar==$(python -c 'import importlib.metadata as m; print(m.version("sie-sidecar"))')"
# A numeric user, so a pod's runAsNonRoot can verify it without reading /etc/passwd.
USER ${UID}:${UID}
# The wire core refuses to fall back to the Python twins silently; make that explicit in the image.
ENV SIE_SIDECAR_NO_EXTENSIONS=0 PYTHONUNBUFFERED=1 SIE_WORKER_PROBE_PORT=9095 \
    SIE_IPC_SOCKET_PATH=/run/sie/ipc.sock
# The probe port (`SIE_WORKER_PROBE_PORT`): /healthz and /readyz.
EXPOSE 9095
# /healthz answers while the process serves; `sie-sidecar probe` needs no curl in the slim image.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["sie-sidecar", "probe", "healthz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["sie-sidecar"]
CMD ["run"]
