#!/usr/bin/env bash
# The serve soak (issue 14): a mixed load through real HTTP on loopback —
# chat and completions, streamed and whole, random disconnects, bursts past
# the queue — against one `fathom serve` on 127.0.0.1, for SECONDS (default
# 1800, at most 7200). Passes when no request is lost (each gets its answer
# or a 503), resident memory after the soak equals resident memory after
# the first minute within 8 MiB, and the peak stays within the printed plan.
# The test suite runs the same test for 40 s (crates/fathom-cli/tests/soak.rs);
# both use the test profile (dependencies at opt-level 3, fathom at 1).
#
# usage: scripts/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
seconds="${1:-1800}"
SOAK_SECONDS="$seconds" cargo test --locked -p fathom-cli --test soak -- --nocapture
