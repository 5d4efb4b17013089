# Warren: an AMQP 0.9.1 broker.
#
#   docker build -t warren .
#   docker run -p 5672:5672 -p 15692:15692 \
#       -e WARREN_USERS='[{"name": "admin", "password": "change-me"}]' warren
#
# The default user guest/guest may only connect from loopback (as RabbitMQ's), so
# with published ports configure a user through WARREN_USERS (or a TOML file given
# with --config; see deploy/warren.toml).
#
# BASE_IMAGE can be swapped for a compatible image: any Debian-based image whose
# `python` is Python >= 3.11 with pip (see deploy/container-base.sh for a stand-in
# built from Debian packages when Docker Hub is out of reach).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore

# An unprivileged user owning the data directory.
RUN groupadd --gid 10001 warren \
 && useradd --no-log-init --uid 10001 --gid warren --home-dir /var/lib/warren \
        --no-create-home --shell /usr/sbin/nologin warren \
 && mkdir -p /var/lib/warren \
 && chown warren:warren /var/lib/warren \
 && chmod 0750 /var/lib/warren

# Dependencies first, in their own layer, so that a change to the source does not
# download them again.  They are read from pyproject.toml (tomllib: Python >= 3.11).
COPY pyproject.toml /tmp/warren-deps/pyproject.toml
RUN python -c "import tomllib; deps = tomllib.load(open('/tmp/warren-deps/pyproject.toml', 'rb'))['project'].get('dependencies', []); print('\n'.join(deps))" \
        > /tmp/warren-deps/requirements.txt \
 && python -m pip install --no-cache-dir -r /tmp/warren-deps/requirements.txt \
 && rm -rf /tmp/warren-deps

# The project itself (see .dockerignore for what is left out).
COPY . /tmp/warren-src
RUN python -m pip install --no-cache-dir /tmp/warren-src \
 && rm -rf /tmp/warren-src \
 && cd / && python -c "import warren.broker, warren.config, warren.protocol" \
 && command -v warren-server

ENV WARREN_DATA_DIR=/var/lib/warren \
    WARREN_AMQP_HOST=0.0.0.0 \
    WARREN_AMQP_PORT=5672 \
    WARREN_METRICS_PORT=15692 \
    WARREN_LOG_FORMAT=json \
    WARREN_LOG_LEVEL=info

VOLUME ["/var/lib/warren"]
EXPOSE 5672 15692
WORKDIR /var/lib/warren
# Numeric, so that orchestrators can check runAsNonRoot.
USER 10001:10001

# No curl in the slim image: Python fetches the Prometheus endpoint, and falls back
# to opening a TCP connection to the AMQP port (e.g. with WARREN_METRICS_PORT=0).
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=4).read()" \
            "http://127.0.0.1:${WARREN_METRICS_PORT:-15692}/metrics" \
        || python -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=4).close()" \
            "${WARREN_AMQP_PORT:-5672}" \
        || exit 1

STOPSIGNAL SIGTERM
CMD ["warren-server"]
