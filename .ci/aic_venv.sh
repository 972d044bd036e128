#!/usr/bin/env bash
# Build (or reuse) the AIConfigurator venv for the sizing tests (tests/test_sizing_aic.py):
# aiconfigurator 0.12.0 (its PyPI dependencies bring aiconfigurator-core 0.12.0, the perf
# databases and model configs) plus omni-pd itself, editable, with its own dependencies
# (`pip install -e '.[sizing]'`: the sizing extra pins aiconfigurator==0.12.0). CPU-only.
# Prints the venv's python path; progress goes to stderr, one line per step.
# Reuse: cached in .cache/aic/ between runs on one machine; a base stamp records the recipe,
# a second stamp the pyproject.toml omni-pd was installed from, so later calls only check.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.cache/aic/venv
say() { echo "aic venv: $*" >&2; }
mkdir -p .cache/aic
exec 8>.cache/aic/aic_venv.lock
flock 8                        # one builder at a time; a waiter re-checks below
BASE="$V/.aic-base"            # written once the base install imports
RECIPE="aiconfigurator 0.12.0, aiconfigurator-core 0.12.0"
HAVE='import importlib.metadata as m, sys
sys.exit(not (m.version("aiconfigurator") == "0.12.0" and m.version("aiconfigurator-core") == "0.12.0"))'
if [ -x "$V/bin/python" ] && [ "$(cat "$BASE" 2>/dev/null)" = "$RECIPE" ] && "$V/bin/python" -I -c "$HAVE" >/dev/null 2>&1; then
  :  # the base install is there (checked from its metadata, without importing it)
else
  say "building $V (aiconfigurator 0.12.0 and its perf databases, ~0.9 GB; a few minutes the first time)"
  rm -rf "$V"
  python3 -m venv "$V"
  say "1/3 upgrading pip"
  "$V/bin/pip" install -q -U pip >&2
  say "2/3 installing aiconfigurator 0.12.0 (pulls aiconfigurator-core, pandas, numpy, scipy ...)"
  "$V/bin/pip" install -q "aiconfigurator==0.12.0" "aiconfigurator-core==0.12.0" >&2
  say "3/3 checking that aiconfigurator.cli imports"
  "$V/bin/python" -c "from aiconfigurator.cli import cli_default, cli_support" >/dev/null
  echo "$RECIPE" > "$BASE"
fi
STAMP="$V/.omni-pd-editable"
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1) $PWD"
FOUND='import importlib.util as u, sys; s = u.find_spec("omni_pd.cli")
sys.exit(not (s and s.origin.startswith(sys.argv[1] + "/")))'
if [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ] && "$V/bin/python" -I -c "$FOUND" "$PWD" >/dev/null 2>&1; then
  say "reusing $V (omni-pd editable install of this checkout is up to date)"
else
  say "installing omni-pd (editable, with its sizing extra) into $V"
  "$V/bin/pip" install -q -e '.[sizing]' >&2
  echo "$WANT" > "$STAMP"
fi
echo "$PWD/$V/bin/python"
