#!/usr/bin/env bash
# Runs the test suite against real Redis processes.
#
#   ./scripts/test.sh [cargo test args...]
#
# It tests the whole workspace: the library and `cli/`, the `redlimit` command (whose tests run
# the built binary). Arguments select as for `cargo test` (`--test it`, `-p redlimit-cli`, a
# test-name filter after `--`).
#
# The tests start private redis-server processes on free ports (never the machine's Redis on
# 6379), so redis-server must be installed: when it is missing this script installs it with
# apt-get (as root, or through sudo). `./scripts/test.sh --install-only` just installs it.
set -euo pipefail

cd "$(dirname "$0")/.."

install_redis() {
    if command -v redis-server >/dev/null 2>&1; then
        return 0
    fi
    echo "redis-server not found: installing it with apt-get" >&2
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: no apt-get here; install redis-server (7 or later) yourself" >&2
        return 1
    fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "error: not root and no sudo; install redis-server yourself" >&2
            return 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    # A failing mirror need not stop the install: the package lists may already be there.
    ${sudo[@]+"${sudo[@]}"} apt-get update -q </dev/null || echo "warning: apt-get update failed" >&2
    ${sudo[@]+"${sudo[@]}"} apt-get install -y -q --no-install-recommends redis-server </dev/null
    # Debian's package may start a system-wide Redis on 6379; the tests do not use it.
    if ! command -v redis-server >/dev/null 2>&1; then
        echo "error: redis-server is still not on PATH after apt-get install" >&2
        return 1
    fi
}

install_redis

if [ "${1:-}" = "--install-only" ]; then
    exit 0
fi

redis-server --version
exec cargo test --workspace "$@"
