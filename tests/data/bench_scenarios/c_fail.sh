#!/usr/bin/env bash
# bench/scenarios/c_fail.sh — fixture: a scenario that fails half-way.
set -euo pipefail
echo "fixture: server did not start" >&2
exit 3
