"""``omni-pd schema``: the editor JSON Schema (omni_pd/compile/editor_schema.py)."""

import sys
from pathlib import Path
from typing import Optional

import typer


def schema(output: Optional[Path] = typer.Option(
        None, "-o", "--output",
        help="write here (atomically) instead of stdout; a directory gets omni-pd-deploy.schema.json"),
        vllm_version: Optional[str] = typer.Option(
            None, "--vllm-version",
            help="target vLLM major.minor: its KV connectors and kv_transfer_config keys (default: omni-pd --version)"),
) -> None:
    """Print the JSON Schema of a deploy config (generated from omni-pd's pydantic model and
    the target's facts: kv_role/kv_connector/ec_role/platform enums, port and size ranges,
    unknown top-level and kv_transfer_config keys refused; omni_pd/compile/editor_schema.py).

    expand's header line (`# yaml-language-server: $schema=omni-pd-deploy.schema.json`)
    names this file next to its output: `omni-pd schema -o DIR` puts it there."""
    import json

    from omni_pd import cli_options
    from omni_pd.compile.model import json_schema
    from omni_pd.io_write import atomic_write
    from omni_pd.resources import SCHEMA_FILENAME

    tgt = cli_options.vllm_version(vllm_version)
    text = json.dumps(json_schema(tgt.label), indent=2, sort_keys=True) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        target = output / SCHEMA_FILENAME if output.is_dir() else output
        atomic_write(target, text)  # OPD005 names the path it could not write
        sys.stderr.write(f"wrote {target}\n")
