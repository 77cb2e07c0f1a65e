# syntax=docker/dockerfile:1
# Multi-stage build: the builder makes the wheel (Rust + Cython inside), the runtime installs it.
# Untested here: the development machines have no Docker engine (see docs/building.md).
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# Debian's packaged rustc is too old for current PyO3, so use rustup's stable toolchain.
ENV RUSTUP_HOME=/opt/rustup CARGO_HOME=/opt/cargo PATH=/opt/cargo/bin:$PATH
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
RUN pip install --no-cache-dir "maturin>=1.9,<2" "cython>=3.1,<4"
WORKDIR /src
COPY Cargo.toml Cargo.lock pyproject.toml README.md ./
COPY native ./native
COPY cython ./cython
COPY python ./python
RUN maturin build --release --locked -o /wheels

FROM python:${PYTHON_VERSION}-slim-bookworm
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin sidecar
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER sidecar
# The wire core refuses to fall back silently; make that explicit in the image.
ENV SIE_SIDECAR_NO_EXTENSIONS=0 PYTHONUNBUFFERED=1
EXPOSE 8080
ENTRYPOINT ["sie-sidecar"]
CMD ["--help"]
