"""What more than one command resolves: a document against the pipeline validate would check it
with (graph, diff), validate's suppressions for a compiled config (launch, render).
"""

from pathlib import Path
from typing import Optional

from omni_pd.cli_validate import _cli_layer, _selection_layers, _suppress


def resolve_doc(doc, pipeline: Optional[str], platform: Optional[str]):
    """``doc`` resolved against the pipeline validate would check it with (catalogued,
    an inferred PD pair, or a linear chain). Raises OmniPdError for unparsable input."""
    from omni_pd.check.validate import Locator, ValidateOptions, choose_pipeline
    from omni_pd.compile.parse import parse_config, to_plain
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve

    cfg = parse_config(doc)
    plain = to_plain(doc.tree)
    pipe, _ = choose_pipeline(cfg, Locator(doc), load_catalogue(), ValidateOptions(pipeline=pipeline),
                              base_name=plain.get("base_config"))
    return resolve(cfg, pipe, platform, doc), plain


def plan_suppression(config: Path, select: Optional[list[str]], ignore: Optional[list[str]]):
    """validate's suppressions for the compiled config ``config`` of ``launch`` and ``render``:
    ``(kept, hidden)``, ``kept(result)`` the findings of a validation result that count after
    ``# omni-pd: ignore[...]`` comments, ``--select``/``--ignore`` and the [tool.omni-pd]
    table (:func:`_selection_layers`, :func:`_suppress`: validate's own), the callable
    :func:`omni_pd.launch.plan.plan_document` takes as ``suppress``; ``hidden[0]``: how many
    it hid, for the verdict line (read after ``plan_document``). Raises OPD006 (exit 2) for
    a selector that names no code or a bad settings file, before anything is read."""
    known: dict = {}
    layers = _selection_layers(str(config), _cli_layer(select, ignore, known), known, {})
    hidden = [0]

    def kept(r) -> list:
        out, hidden[0] = _suppress(list(r.diagnostics), r.docs, layers, known)
        return out

    return kept, hidden
