#!/usr/bin/env bash
# Runs this tree's torture test against commit 3431009 (before the fixes of the cancellation,
# data-loss and provider-trust defects), to show what it finds there by itself.
#
#   scripts/torture-on-3431009/run.sh [WORKTREE] -- [env for the run, e.g. TORTURE_SECS=900 TORTURE_FAMILY=rate]
#
# It makes (or reuses) a git worktree of 3431009, copies tests/torture into it, and rewrites the
# paths that moved since (`redlimit::concurrency`, `failure_policy`, `mirror`) to a shim
# (compat.rs.txt here) that re-exports them from where they were. Generator, fleet and oracles
# stay byte-identical to this tree's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
old=${1:-${TMPDIR:-/tmp}/redlimit-3431009}
shift || true
[ "${1:-}" = "--" ] && shift
if [ ! -d "$old" ]; then
    git -C "$root" worktree add --detach "$old" 3431009
fi
dst=$old/tests/torture
rm -rf "$dst"
cp -r "$root/tests/torture" "$dst"
cp "$here/compat.rs.txt" "$dst/compat.rs"
sed -i \
    -e 's/redlimit::concurrency::/crate::compat::concurrency::/g' \
    -e 's/redlimit::failure_policy::/crate::compat::failure_policy::/g' \
    -e 's/redlimit::mirror::/crate::compat::mirror::/g' \
    "$dst"/*.rs
grep -q '^mod compat;' "$dst/main.rs" || sed -i 's/^mod faults;$/mod compat;\nmod faults;/' "$dst/main.rs"
cd "$old"
export CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_INCREMENTAL=0
env TORTURE_KEEP_GOING=1 "$@" cargo test --test torture -- --nocapture
