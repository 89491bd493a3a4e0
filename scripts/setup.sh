#!/usr/bin/env bash
# Installs what the tests and the demo need beyond Python packages, on a Debian
# machine: PostgreSQL server binaries (for the block database tests), Debian's
# chromium (the headless browser the dashboard tests drive through Playwright),
# Debian's python3.X of .python-version if missing (what executors run as nobody
# with) and the npm packages pinned in package-lock.json (anvil, a local Ethereum
# node). Safe to run again: each step is skipped when what it installs is already
# there.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_updated=""
apt_install() {
    # $1: what it is, for the messages; the rest: the Debian packages.
    local what=$1
    shift
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "setup: $what: missing; install it (Debian: apt-get install $*) or put it on PATH" >&2
        exit 1
    fi
    echo "setup: installing $what (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if [[ -z "$apt_updated" ]]; then
        apt-get update -qq
        apt_updated=1
    fi
    apt-get install -y -qq "$@" >/dev/null
}

have_postgres() {
    local bin
    for bin in /usr/lib/postgresql/*/bin; do
        if [[ -x "$bin/initdb" && -x "$bin/pg_ctl" ]]; then
            return 0
        fi
    done
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1
}

if ! have_postgres; then
    apt_install "PostgreSQL server binaries (initdb, pg_ctl)" postgresql
    have_postgres || { echo "setup: apt-get installed postgresql but no initdb/pg_ctl was found" >&2; exit 1; }
fi

# The dashboard tests drive this browser with Playwright's executable_path: never
# `playwright install`, whose browser download is not a Debian package.
if ! command -v chromium >/dev/null 2>&1; then
    apt_install "chromium (the dashboard tests' headless browser)" chromium
    command -v chromium >/dev/null 2>&1 || { echo "setup: apt-get installed chromium but it is not on PATH" >&2; exit 1; }
fi

# A root Worker's executors run as nobody, from a copy of their code, with an
# interpreter of the virtual environment's Python version that nobody can read:
# the environment's own may not be (pyenv under /root), Debian's python3.X is.
python_version=$(tr -d '[:space:]' < .python-version)
if [[ "$(id -u)" == 0 && ! -x /usr/bin/python$python_version && ! -x /usr/local/bin/python$python_version ]]; then
    if command -v apt-cache >/dev/null 2>&1 && apt-cache show "python$python_version" >/dev/null 2>&1; then
        apt_install "python$python_version (the interpreter executors run as nobody)" "python$python_version"
    else
        echo "setup: no python$python_version in /usr/bin: a root Worker's executors will run as root (docs/security.md)" >&2
    fi
fi

if [[ -f package-lock.json ]]; then
    stamp=node_modules/.blockx-setup-lock
    if [[ ! -f "$stamp" ]] || ! cmp -s package-lock.json "$stamp"; then
        command -v npm >/dev/null 2>&1 || { echo "setup: npm is missing (install Node.js 20 with npm)" >&2; exit 1; }
        echo "setup: installing npm packages (npm ci)"
        npm ci --no-audit --no-fund --loglevel=error
        mkdir -p node_modules && cp package-lock.json "$stamp"
    fi
fi
