"""A ``stages:`` deploy file from one vLLM / vllm-omni release to another. Pure.

``omni-pd migrate FILE --from 0.30 --to 0.32`` rewrites what the two releases read
differently, from the release tables alone (nothing here knows a version number):

* ``kv_transfer_config`` fields (``presets/targets/vllm.yaml``
  ``kv_transfer_config_fields``; vLLM ``vllm/config/kv_transfer.py``): a field the target
  removed is dropped with a note (``kv_ip``, ``kv_rank``, ``kv_parallel_size``,
  ``kv_buffer_size`` from vLLM 0.32); a field the target does not have yet is an error
  naming it (vLLM 0.18+ refuses unknown fields, older releases ignore them: either way
  the setting would be lost);
* KV connector names (``kv_connectors`` and their ``renamed_to``;
  ``kv_connector/factory.py``): a renamed connector takes the target's name, in either
  direction (``SharedStorageConnector`` <-> ``ExampleConnector`` at 0.13); one the target
  does not register is an error naming the releases that have it;
* the Mooncake prefill's bootstrap port (``presets/targets/mooncake_bootstrap.yaml``):
  the port moves from the setting the source release reads to the one the target reads
  (vllm-omni 0.28 reads the stage env ``VLLM_MOONCAKE_BOOTSTRAP_PORT``, 0.30
  ``kv_connector_extra_config.bootstrap_port``), and keys nothing reads on the target
  are dropped;
* the schema itself: vllm-omni before 0.20 reads only ``stage_args`` files
  (``--stage-configs-path``), an error.

Every change is one located note (OPD970, info); what cannot be mapped is an OPD971 error
(:class:`omni_pd.compile.migrate.MigrateError`), never a silent drop. Legacy
``stage_args`` files go through :mod:`omni_pd.compile.migrate` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_pd.compile.migrate import BOOTSTRAP_ENV, NOTE, MigrateError, _before, _Work, key_map
from omni_pd.compile.targets import Target, parse_version
from omni_pd.diagnostics import Diagnostic, Location, Severity
from omni_pd.io import Document, Path_

#: the kv_roles that start a Mooncake bootstrap server (vLLM mooncake_connector.py)
_BOOTSTRAP_ROLES = ("kv_producer", "kv_both")


@dataclass(frozen=True)
class ReleaseMigration:
    """:func:`migrate_release`'s answer: ``tree`` (a new round-trip tree, ``doc.tree``
    untouched), ``notes`` (one OPD970 per change, located in the source file), the two
    releases (``source``, ``target``) and the ``runtime`` whose facts were used."""

    tree: Any
    notes: tuple[Diagnostic, ...]
    source: Target
    target: Target
    runtime: str

    @property
    def changed(self) -> bool:
        return bool(self.notes)


def kv_transfer_configs(tree: Any, at: Path_ = ()) -> list[tuple[Path_, Any, Any]]:
    """Every ``kv_transfer_config`` mapping in ``tree`` (stages and ``platforms.<P>``
    overlays alike): ``(path of the kv_transfer_config, the mapping, the stage mapping
    that holds it)``, in file order."""
    out: list[tuple[Path_, Any, Any]] = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k == "kv_transfer_config" and isinstance(v, dict):
                out.append((tuple(at) + (k,), v, tree))
            else:
                out += kv_transfer_configs(v, tuple(at) + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += kv_transfer_configs(v, tuple(at) + (i,))
    return out


def migrate_release(doc: Document, source: Target, target: Target, runtime: str = "vllm-omni") -> ReleaseMigration:
    """Rewrite the ``stages:`` file ``doc``, written for ``source``, for ``target``
    (vLLM major.minor; vllm-omni X.Y runs on vLLM X.Y). ``runtime``: ``"vllm-omni"`` (a
    ``vllm serve --omni`` deploy file) or ``"vllm"`` (omni-pd's plain-vLLM pipelines), for
    the Mooncake bootstrap facts. Same release: nothing changes.

    Raises :class:`~omni_pd.compile.migrate.MigrateError` (OPD971, exit 2) listing every
    key the target cannot take; ValueError when ``doc`` is not a ``stages:`` file."""
    from omni_pd.compile.migrate import is_legacy
    from omni_pd.io import copy_tree

    if is_legacy(doc.tree) or not isinstance(doc.tree, dict):
        raise ValueError("not a `stages:` deploy file")
    tree = copy_tree(doc.tree)
    w = _Work(doc)
    serve = key_map()["serve"]
    if runtime == "vllm-omni" and target.version < parse_version(serve["deploy_flag_since"]):
        w.error(("stages",), f"vllm-omni {target.label} reads only legacy `stage_args` files "
                f"(`{serve['legacy_flag']}`); the `stages:` schema is read from vllm-omni {serve['deploy_flag_since']}",
                help=f"target vllm-omni {serve['deploy_flag_since']} or later")
    if source.version != target.version:
        for at, kv, stage in kv_transfer_configs(tree):
            _connector(kv, at, source, target, w)
            _fields(kv, at, source, target, w)
            _bootstrap(kv, stage, at, source, target, runtime, w)
    if w.errors:
        raise MigrateError(sorted(w.errors, key=lambda d: (d.location.line or 0, d.location.column or 0)))
    return ReleaseMigration(tree=tree, notes=tuple(w.notes), source=source, target=target, runtime=runtime)


def _connector(kv: Any, at: Path_, source: Target, target: Target, w: _Work) -> None:
    """The connector name the target registers for ``kv_connector`` (renames either way)."""
    name = kv.get("kv_connector")
    if not isinstance(name, str) or kv.get("kv_connector_module_path") or name in target.connectors():
        return  # an out-of-tree connector, or one the target has
    history = target.connector_history(name)
    if history is None:
        return  # not a connector any release registered: validate says so (OPD601)
    names = [history.get("renamed_to")] + [n for n in target.connector_names_ever()
                                           if (target.connector_history(n) or {}).get("renamed_to") == name]
    new = next((n for n in names if n and n in target.connectors()), None)
    if new is not None:
        kv["kv_connector"] = new
        w.note(at + ("kv_connector",), f"`kv_connector: {name}` -> `{new}`: vLLM {target.label} registers it "
               f"under that name (vLLM {source.label}: `{name}`)")
        return
    span = f"vLLM {history.get('since', '?')}" + (f" to {_before(history['removed'])}" if history.get("removed") else "+")
    w.error(at + ("kv_connector",), f"vLLM {target.label} has no KV connector `{name}` ({span})",
            help="choose a connector vLLM " + target.label + " registers: " + ", ".join(sorted(target.connectors())))


def _fields(kv: Any, at: Path_, source: Target, target: Target, w: _Work) -> None:
    """Drop the fields ``target`` removed; refuse the ones it does not have yet."""
    have = target.kv_fields()
    for k in list(kv):
        name = str(k)
        if name in have or not target.kv_field_known(name):
            continue  # kept, or a key no release has (validate: OPD609)
        fact = target.kv_field_history(name)
        if fact.get("removed") and target.version >= parse_version(fact["removed"]):
            del kv[k]
            w.note(at + (k,), f"`kv_transfer_config.{name}` dropped: vLLM {target.label} has no such field "
                   f"(removed in {fact['removed']}; vllm/config/kv_transfer.py)")
        else:
            w.error(at + (k,), f"`kv_transfer_config.{name}`: vLLM {target.label} has no such field "
                    f"(from vLLM {fact.get('since')})", help=f"remove it, or target vLLM {fact.get('since')} or later")


def _bootstrap(kv: Any, stage: Any, at: Path_, source: Target, target: Target, runtime: str, w: _Work) -> None:
    """Move a Mooncake producer's bootstrap port to the setting ``target`` reads, and drop
    the ``kv_connector_extra_config`` keys nothing reads on it."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    if "mooncake" not in str(kv.get("kv_connector") or "").lower():
        return
    src, dst = source.mooncake_bootstrap(runtime), target.mooncake_bootstrap(runtime)
    extra = kv.get("kv_connector_extra_config")
    env = stage.get("env")
    if kv.get("kv_role") in _BOOTSTRAP_ROLES and src.key != dst.key:
        port = (extra.get(src.extra_key) if src.extra_key and isinstance(extra, dict)
                else env.get(BOOTSTRAP_ENV) if isinstance(env, dict) else None)
        if port is not None:
            if dst.extra_key:
                if not isinstance(extra, dict):
                    kv["kv_connector_extra_config"] = extra = CommentedMap()
                if dst.extra_key not in extra:
                    extra[dst.extra_key] = int(port)
                    w.note(at, f"`kv_connector_extra_config.{dst.extra_key}: {int(port)}` written: what "
                           f"{runtime} {target.label} reads for the prefill's bootstrap port ({src.label}: {src.where})")
            elif not (isinstance(env, dict) and BOOTSTRAP_ENV in env):
                if not isinstance(env, dict):
                    keys = list(stage)  # beside the devices, where expand and migrate write it
                    stage.insert(keys.index("devices") + 1 if "devices" in keys else len(keys), "env", CommentedMap())
                    env = stage["env"]
                env[BOOTSTRAP_ENV] = DoubleQuotedScalarString(str(port))
                w.note(at, f"env `{BOOTSTRAP_ENV}: \"{port}\"` written: what {runtime} {target.label} reads for "
                       f"the prefill's bootstrap port ({src.label}: {src.where})")
    if isinstance(extra, dict):
        for dotted in dst.unread_keys:
            key = dotted.removeprefix("kv_connector_extra_config.")
            if key != dotted and key in extra and key not in _unread_on(src):
                del extra[key]
                w.note(at + ("kv_connector_extra_config", key),
                       f"`kv_connector_extra_config.{key}` dropped: nothing reads it on {runtime} {target.label}")
        if not extra and "kv_connector_extra_config" in kv:
            del kv["kv_connector_extra_config"]


def _unread_on(facts: Any) -> frozenset[str]:
    """Extra-config keys already unread on the source: left as the user had them (validate
    warns about them, OPD505); only what the release change made unread is dropped."""
    return frozenset(k.removeprefix("kv_connector_extra_config.") for k in facts.unread_keys)


def release_text(doc: Document, source: Target, target: Target,
                 runtime: str = "vllm-omni") -> tuple[str, ReleaseMigration]:
    """The text of ``doc`` rewritten for ``target`` and the :class:`ReleaseMigration`.
    Unchanged (``not m.changed``): ``doc.text`` itself, so a second run changes nothing.
    omni-pd's own expand header (``# Stages: ... vLLM 0.30.``) is updated to the target
    with a note, since it would otherwise name the old release. Raises as
    :func:`migrate_release`."""
    from omni_pd.io import dump

    m = migrate_release(doc, source, target, runtime)
    text = dump(m.tree) if m.changed else doc.text
    old, new = f", vLLM {source.label}.", f", vLLM {target.label}."
    lines = text.splitlines(True) if source.version != target.version else []
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            break
        if line.startswith("# Stages: ") and line.rstrip("\n").endswith(old):
            lines[i] = line.rstrip("\n")[: -len(old)] + new + "\n"
            note = Diagnostic(code=NOTE, severity=Severity.INFO, location=Location(file=doc.name, line=i + 1, column=1),
                              message=f"expand's header now names vLLM {target.label} (it said {source.label})")
            notes = sorted(m.notes + (note,), key=lambda d: (d.location.line or 0, d.location.column or 0))
            m = ReleaseMigration(tree=m.tree, notes=tuple(notes), source=source, target=target, runtime=runtime)
            text = "".join(lines)
            break
    return text, m

