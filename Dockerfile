# One image, two entry points: `groupcluster member ...` (a grid member) and `groupcluster operator ...` (the
# Kubernetes operator). The operator starts members from this same image unless a GroupCluster names another.
#
#   docker build -t groupcluster:0.1.0 .
#   docker run --rm groupcluster:0.1.0 member --help
#
# tests/e2e/test_operator_image.py runs this file's install steps in a fresh virtual environment and lints it
# with hadolint, since the test machines have no container engine.

# Pinned base: the exact Python release and Debian release; bump both deliberately.
FROM python:3.11.7-slim-bookworm AS build

ENV VENV=/opt/groupcluster \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY member member
COPY operator operator
# A virtual environment holds the package and its dependencies, so the runtime stage copies one directory.
RUN python -m venv "$VENV" \
    && "$VENV/bin/pip" install --no-cache-dir . \
    && "$VENV/bin/groupcluster" member --help >/dev/null \
    && "$VENV/bin/groupcluster" operator --help >/dev/null

FROM python:3.11.7-slim-bookworm

LABEL org.opencontainers.image.title="groupcluster" \
      org.opencontainers.image.description="groupcluster member and Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/groupcluster/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/groupcluster /opt/groupcluster
# A fixed numeric non-root user: pods can check it with runAsNonRoot without a name lookup.
RUN groupadd --system --gid 10001 groupcluster \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin groupcluster
USER 10001:10001
WORKDIR /tmp
# 7800: group transport (UDP by default), 8080: member HTTP API, 8081: operator liveness.
EXPOSE 7800/udp 7800/tcp 8080/tcp 8081/tcp
ENTRYPOINT ["groupcluster"]
CMD ["--help"]
