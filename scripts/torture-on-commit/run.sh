#!/usr/bin/env bash
# Runs this tree's torture test against the library of another commit, to show what it finds
# there by itself (each oracle that fires, with its first seed and the seconds it took).
#
#   scripts/torture-on-commit/run.sh COMMIT [WORKTREE] -- [env for the run, e.g. TORTURE_SECS=300 TORTURE_FAMILY=batching]
#
# It makes (or reuses) a detached git worktree of COMMIT (in WORKTREE, by default
# $TMPDIR/redlimit-torture-<COMMIT>), copies tests/torture into it and runs
# `cargo test --test torture` there with TORTURE_KEEP_GOING=1. Generator, fleet and oracles stay
# byte-identical to this tree's. For a commit from before `redlimit::concurrency`,
# `failure_policy` and `mirror` existed, the copied files' paths to them are rewritten to a shim
# (compat.rs.txt here) that re-exports them from where they were; for one from before the test
# hooks were named `test_hooks`, to their earlier name `mirror`.
#
# CARGO_TARGET_DIR is passed through: pointing it at this tree's target/ reuses the
# dependencies already built.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "--" ]; then
    echo "usage: $0 COMMIT [WORKTREE] -- [env...]" >&2
    exit 2
fi
commit=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
old=${TMPDIR:-/tmp}/redlimit-torture-$commit
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    old=$1
    shift
fi
[ "${1:-}" = "--" ] && shift
if [ ! -d "$old" ]; then
    git -C "$root" worktree add --detach "$old" "$commit"
fi
dst=$old/tests/torture
rm -rf "$dst"
cp -r "$root/tests/torture" "$dst"
# Before the test hooks were `redlimit::test_hooks` they were `redlimit::mirror`.
if ! git -C "$root" show "$commit:src/lib.rs" 2>/dev/null | grep -q 'test_hooks'; then
    sed -i 's/redlimit::test_hooks::/redlimit::mirror::/g' "$dst"/*.rs
fi
if ! git -C "$root" cat-file -e "$commit:src/failure_policy.rs" 2>/dev/null; then
    cp "$here/compat.rs.txt" "$dst/compat.rs"
    sed -i \
        -e 's/redlimit::concurrency::/crate::compat::concurrency::/g' \
        -e 's/redlimit::failure_policy::/crate::compat::failure_policy::/g' \
        -e 's/redlimit::mirror::/crate::compat::mirror::/g' \
        "$dst"/*.rs
    grep -q '^mod compat;' "$dst/main.rs" || sed -i 's/^mod faults;$/mod compat;\nmod faults;/' "$dst/main.rs"
fi
cd "$old"
export CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_INCREMENTAL=0
env TORTURE_KEEP_GOING=1 "$@" cargo test --test torture -- --nocapture
