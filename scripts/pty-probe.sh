#!/usr/bin/env bash
# Real-PTY probe (issue 7, item 5): bash and zsh as the session shell, with a
# throwaway HOME and XDG dirs; each runs `sleep 120 &` and `setsid sleep 120 &`;
# immediate close; the sleeps, found by reading /proc directly (not through
# the session's records), are all gone. Under the default mechanism and with
# the weakest one (pgroup) forced, plus the controls (graceful close, the
# pgroup mechanism alone, no tether) that must see a survivor.
#
# Usage: scripts/pty-probe.sh [extra pytest args]
# Needs: bash, zsh (apt-get install -y zsh), setsid (util-linux).
# A missing shell fails the probe here (CI=1): it never skips silently.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in bash zsh setsid; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "pty-probe: $tool is not installed (apt-get install -y ${tool/setsid/util-linux})" >&2
        exit 1
    fi
done
PY=${PYTHON:-python3}
CI=${CI:-1} exec "$PY" -m pytest -q -p no:cacheprovider tests/test_pty.py -k probe "$@"
