#!/usr/bin/env bash
# Cross-compiles fathom-kernels for aarch64 and runs its tests under
# qemu-user: the portable kernels and the NEON ones, each held against the
# other by the tests that iterate over every ISA level. Installs nothing;
# says what is missing. Extra arguments go to `cargo test` (a test name
# filter, or `-- --nocapture`).
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
missing=0
if ! rustup target list --installed | grep -qx "$target"; then
    echo "missing Rust target: rustup target add $target" >&2
    missing=1
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    echo "missing cross linker: apt-get install gcc-aarch64-linux-gnu" >&2
    missing=1
fi
qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
if [ -z "$qemu" ]; then
    echo "missing qemu-user: apt-get install qemu-user-static (or qemu-user)" >&2
    missing=1
fi
[ "$missing" = 0 ] || exit 1
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$qemu -L /usr/aarch64-linux-gnu"
cargo test --release --locked -p fathom-kernels --target "$target" "$@"
