#!/usr/bin/env bash
# Builds the CUDA-enabled `mens` of another commit (default: HEAD) into .device/mens-old.xz, for
# `scripts/cuda-device.sh ab` (the working tree's binary against it, alternating). The commit is
# checked out in its own worktree and built with its own CARGO_TARGET_DIR: with a shared target
# directory cargo gives both trees' crates the same artifact names, and the "new" binary can link
# the old engine (docs/benchmarks.md, session 13).
# Usage: scripts/cuda-build-old.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
tree=$(mktemp -d /tmp/mens-old-tree.XXXXXX)
target=${OLD_TARGET_DIR:-/tmp/mens-old-target}
git worktree add -f --detach "$tree" "$rev" >/dev/null
trap 'git worktree remove --force "$tree"' EXIT
(cd "$tree" && CARGO_TARGET_DIR="$target" cargo build --release -p mens-cli --features cuda)
mkdir -p .device
strip -o .device/mens-old "$target/release/mens"
xz -9 -f .device/mens-old
echo "built $(git rev-parse --short "$rev") into .device/mens-old.xz"
