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

# `install PACKAGE COMMAND`: apt-get when the command is missing.
. scripts/install.sh

# Debian's package may start a system-wide Redis on 6379; the tests do not use it.
install redis-server redis-server

if [ "${1:-}" = "--install-only" ]; then
    exit 0
fi

redis-server --version
exec cargo test --workspace "$@"
