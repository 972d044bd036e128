"""Every diagnostic code omni-pd emits, explainable: the validate rules plus the codes
emitted outside the rule engine (reading input, bad usage, ``expand``, ``--against-vllm-omni``,
``launch``, internal errors).

Rules document themselves (``omni_pd/check/rules``); the other codes are catalogued
here, each with a summary, a doc paragraph (what triggers it, what to do) and where it
is emitted. ``omni-pd rules`` lists :func:`explainable`, ``omni-pd explain CODE`` prints
one entry. tests/test_cli.py scans the source for every ``"OPDnnn"`` string constant and
fails when one is missing here or in the rule registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from omni_pd.diagnostics import Severity
from omni_pd.io import MAX_DEPTH, MAX_INPUT_BYTES, MAX_NODES


@dataclass(frozen=True)
class CodeDoc:
    """A code emitted outside the rule engine. ``family``: which part of omni-pd emits
    it (input, usage, expand, against, launch, internal); ``emitted_by``: the module(s);
    ``exit``: the exit status it causes on its own (None: it is a finding among others)."""

    code: str
    name: str
    severity: Severity
    family: str
    summary: str
    doc: str
    emitted_by: str
    exit: int | None = None


_E, _W, _I = Severity.ERROR, Severity.WARNING, Severity.INFO

CODES: tuple[CodeDoc, ...] = (
    CodeDoc("OPD000", "internal-error", _E, "internal", "a bug in omni-pd (an exception it did not expect)",
            """Any command that hits an unexpected exception reports it as OPD000 and exits 3
            instead of printing a traceback; a rule that crashes yields OPD000 and the other
            rules still run. ``expand`` also reports OPD000 when the config it is about to write
            fails its own ``validate`` (nothing is written). Rerun with ``OMNI_PD_DEBUG=1`` for the
            traceback and report it.""",
            "omni_pd/cli_validate.py exit_status(), omni_pd/check/rules/__init__.py run_rules()", exit=3),
    CodeDoc("OPD001", "input-unreadable", _E, "input", "an input file cannot be read",
            f"""The file is missing, a directory (or a directory without ``*.yaml``/``*.yml`` files
            given to ``validate``), unreadable, larger than {MAX_INPUT_BYTES} bytes, or not UTF-8 (located at the
            first bad byte). Option files (``--inventory``, ``--model-info``) name their option.""",
            "omni_pd/io.py load_file(), omni_pd/check/inputs.py collect_inputs(), omni_pd/cli/", exit=2),
    CodeDoc("OPD002", "invalid-yaml", _E, "input", "the input is not valid YAML or exceeds the loader's limits",
            f"""A YAML syntax error (located by ruamel.yaml), a value that cannot be read as its
            tag, a non-scalar mapping key, more than {MAX_NODES} nodes, nesting deeper than
            {MAX_DEPTH} levels or an alias that expands past those limits (a "billion laughs"
            document).""",
            "omni_pd/io.py parse_text()", exit=2),
    CodeDoc("OPD003", "duplicate-key", _E, "input", "a mapping has the same key twice",
            """YAML requires unique keys; PyYAML (which vllm-omni uses) silently keeps the last one,
            so a duplicated ``devices:`` or ``kv_role:`` hides a mistake. Both locations are shown.""",
            "omni_pd/io.py parse_text()", exit=2),
    CodeDoc("OPD004", "not-a-mapping", _E, "input", "the document is empty or not a mapping",
            """A deploy config is a YAML mapping with a ``stages:`` list; an empty file, a list or
            a scalar at the top level is refused.""",
            "omni_pd/io.py parse_text()", exit=2),
    CodeDoc("OPD005", "output-unwritable", _E, "input", "the output file cannot be written",
            """``-o`` names an input file (omni-pd never overwrites its input), a directory, a
            block device, a symbolic link to nothing, or a place the user cannot write. A regular
            file (or a new path) is written atomically: a failed write leaves no partial file. A
            symbolic link is followed and the file it names is replaced atomically (the link is
            kept, and stderr says so); a link to a file that does not exist is refused rather than
            creating one where it points. A character device or a FIFO (``/dev/null``, ``mkfifo``)
            is written through, never replaced; ``/dev/stdout`` and ``/dev/stderr`` are omni-pd's
            own streams.""",
            "omni_pd/io_write.py atomic_write()", exit=2),
    CodeDoc("OPD006", "bad-usage", _E, "usage", "an option value omni-pd cannot use",
            """A malformed or unknown ``--vllm-version`` (omni-pd knows the releases listed by
            ``omni-pd --version``), an unknown ``--platform``, a ``--kv-buffer-device`` the chosen
            connector does not accept, a bad inventory, a ``--model-info`` that is not a
            config.json mapping, or an unknown code given to ``explain``. The message names the
            option and the help lists what it accepts.""",
            "omni_pd/cli_options.py, omni_pd/check/validate.py, omni_pd/compile/expand.py", exit=2),
    CodeDoc("OPD007", "not-a-deploy-config", _E, "input", "the file is not a deploy config",
            """``expand`` and ``validate`` share one gate (omni_pd/check/inputs.py ``not_a_deploy_config``):
            a file without a non-empty ``stages:`` list (and no ``base_config`` to inherit one
            from) says what it looks like instead (an omni-pd pipeline definition from
            ``presets/pipelines/``, ``stages: []``, a launch inventory, a Hugging Face config.json,
            a JSON Schema, a CI workflow or Kubernetes manifest), located at the top of the file.
            Nothing else in that file is checked (no rule judges keys written for another
            schema). ``expand`` writes nothing (exit 2); ``validate`` reports it as an error
            (exit 1); for vllm-omni's forced-aligner stage settings (``forced_aligner:``,
            shipped beside its deploy configs) as a warning.""",
            "omni_pd/check/inputs.py, omni_pd/cli/expand_run.py, omni_pd/check/validate.py", exit=2),
    CodeDoc("OPD008", "not-a-pd-split", _E, "input", "diff was given a second file that is not a prefill/decode split",
            """``omni-pd diff IN OUT`` matches each stage of OUT to the stage of IN it came from
            through the split's id map, so OUT must have a prefill/decode pair with consecutive
            stage ids (what ``omni-pd expand IN`` writes).""",
            "omni_pd/cli/commands/diff.py", exit=2),
    CodeDoc("OPD009", "unused-suppression", _W, "suppress", "a suppression comment suppresses nothing",
            """``# omni-pd: ignore[CODE, ...]`` (a YAML comment at the end of the line a finding is
            located at or of its key's line, or alone on the line before it) hides those findings
            of that line, as ruff's ``# noqa`` does; codes or the rule names ``omni-pd rules``
            prints, comma-separated. A code in it that hid nothing is reported here, like ruff's
            RUF100: no such finding on that line (the problem was fixed: remove the code), the
            code is not enabled for the file (``--select``/``--ignore``, ``[tool.omni-pd]`` in
            ``pyproject.toml`` or the same keys in a stand-alone ``.omni-pd`` file with the ``.toml``
            suffix, found from the file's directory upwards), an unknown code, a code that means the file
            cannot be read (OPD000..OPD005 are never suppressed), or a comment without codes in
            brackets. A suppressed error no longer fails ``validate``; OPD009 itself is a warning
            and is silenced with ``--ignore OPD009``.""",
            "omni_pd/check/suppress.py apply()"),
    CodeDoc("OPD010", "placement-from-header", _W, "input",
            "a file compiled for an inventory is validated without one",
            """``expand --inventory`` allocates devices and ports per host and records the placement
            in the file's header (``# Placement (--inventory): stage 0 -> A, stage 1 -> B``).
            Validated without ``--inventory``, such a file was judged as one host: prefill and
            decode on "the same" device 0 (OPD404, OPD403) and port (OPD501), whose help would break
            the correct layout. validate reads the placement from the header instead and says so;
            the hosts' device counts, memory and addresses are not in the file, so the checks that
            need them (OPD402, addresses) wait for ``--inventory FILE``.""",
            "omni_pd/check/validate.py validate_document()"),
    CodeDoc("OPD208", "pd-pair-without-pipeline", _E, "topology",
            "a KV producer/consumer pair in a file that names no `pipeline:`",
            """Without ``pipeline:`` vllm-omni 0.30 takes the pipeline from the model's
            ``model_type``, which is never a PD pipeline: the stages merge into the three-stage
            pipeline, the last stage is dropped and the decode entry configures the wrong
            stage. Add ``pipeline: <name>_pd``. Source: vllm-omni
            ``config/stage_config.py StageConfigFactory.get_pipeline_config``.""",
            "omni_pd/check/validate.py choose_pipeline()"),
    CodeDoc("OPD801", "no-thinker", _E, "expand", "the pipeline has no Thinker (or single LLM) stage to split",
            """PD disaggregation splits the Thinker (or the only stage of an LLM pipeline) into a
            prefill and a decode engine; choose a pipeline that has one with ``--pipeline``.""",
            "omni_pd/compile/passes/pd_split.py plan_pd_split()", exit=2),
    CodeDoc("OPD802", "unknown-pipeline", _E, "expand", "the pipeline is unknown or cannot be told",
            """The ``pipeline:`` value (or ``--pipeline``) is not in omni-pd's catalogue
            (``omni-pd pipelines``), or the file names none and its stages do not identify one.""",
            "omni_pd/compile/topology.py select_pipeline()", exit=2),
    CodeDoc("OPD803", "already-pd", _E, "expand", "the config is already prefill/decode split",
            """Splitting twice would make a second producer/consumer pair; run ``validate`` on it,
            or expand the original three-stage config.""",
            "omni_pd/compile/passes/pd_split.py plan_pd_split()", exit=2),
    CodeDoc("OPD804", "connector-unavailable", _E, "expand", "omni-pd has no contract for the KV connector",
            """``--connector`` (or the Thinker's ``kv_connector``) is not one omni-pd can emit
            (``omni-pd connectors``), or is not registered in the target vLLM version
            (``vllm/distributed/kv_transfer/kv_connector/factory.py``).""",
            "omni_pd/compile/passes/pd_split.py plan_pd_split()", exit=2),
    CodeDoc("OPD805", "cannot-place", _E, "expand", "prefill and decode cannot be given devices or ports",
            """The device options overlap or do not match the tensor parallel size, the engine
            needs more devices than omni-pd places, or no free connector port range is left
            below 65536 (pass a lower ``--port-base``).""",
            "omni_pd/compile/passes/pd_split.py plan_pd_split()", exit=2),
    CodeDoc("OPD806", "no-encoder-split", _E, "expand", "the pipeline cannot take an encoder split",
            """``--encoder-split`` (``1e1pd``, ``1e1p1d``) moves the multimodal encoder of a single-LLM
            pipeline (``llm``, ``*_thinker_only``) into its own instance. The full omni pipelines
            (Thinker -> Talker -> Code2Wav) are refused: vllm-omni 0.30's registry has no encoder
            stage type and its orchestrator never sends the per-item encoder request nor passes
            ``ec_transfer_params`` (vllm_omni/config/pipeline_registry.py, engine/orchestrator.py).
            Serve the ``*_thinker_only`` pipeline for text output.""",
            "omni_pd/compile/passes/encoder_split.py plan_encoder_split()", exit=2),
    CodeDoc("OPD807", "ec-connector-unavailable", _E, "expand", "omni-pd cannot emit that EC connector",
            """``--ec-connector`` is not one omni-pd has an emit contract for
            (``omni_pd/compile/ec_connectors/``: ECExampleConnector), or the target vLLM does not
            register it (``presets/targets/ec_connectors.yaml``). ``validate`` still checks files
            that use the others (OPD614/OPD615).""",
            "omni_pd/compile/passes/encoder_split.py plan_encoder_split()", exit=2),
    CodeDoc("OPD808", "base-config-input", _E, "expand", "expand takes a flat deploy config, not one with base_config",
            """A file with ``base_config:`` takes its stages from another file, which vllm-omni
            merges at load time (``vllm_omni/config/stage_config.py`` ``resolve_deploy_yaml``).
            ``expand`` rewrites the stages it reads, so it needs them in one file: write the
            merged stages into the file (or expand the base file) and keep the override keys
            there. ``validate`` follows ``base_config`` chains.""",
            "omni_pd/compile/expand.py _front()", exit=2),
    CodeDoc("OPD901", "async-chunk-off", _I, "expand", "expand set async_chunk to false",
            """vllm-omni's orchestrator routes prefill -> decode only when ``async_chunk`` is false
            (``vllm_omni/engine/orchestrator.py``); with it on, decode would get a placeholder
            prompt. Streaming audio chunks between stages is given up.""",
            "omni_pd/compile/passes/pd_split.py plan_pd_split()"),
    CodeDoc("OPD902", "devices-chosen", _I, "expand", "expand chose devices for a Thinker that had none",
            """The Thinker had no ``devices``; prefill gets the first free device and decode the
            next. Pass ``--prefill-devices``/``--decode-devices`` to choose them.""",
            "omni_pd/compile/passes/pd_split.py plan_pd_split()"),
    CodeDoc("OPD904", "npu-replicas-reduced", _W, "expand", "the npu overlay runs one replica of a PD side",
            """expand's npu pass writes ``platforms.npu`` for a file whose base runs elsewhere. When
            the base asks for several replicas of the prefill or decode stage and vllm-ascend's
            connector would bind the same ``kv_port`` range in each (vllm-omni 0.30 hands every
            replica the stage's ``kv_transfer_config`` unchanged: engine/stage_runtime.py
            ``_prepare_replica_vllm_config`` offsets only MooncakeConnector's bootstrap port), the
            overlay sets ``num_replicas: 1`` for that stage on npu and says so. With
            ``--platform npu`` (the base itself is for npu) expand refuses instead (OPD805).""",
            "omni_pd/compile/passes/ascend.py plan_ascend()"),
    CodeDoc("OPD905", "stages-left-out", _I, "expand", "expand kept the Thinker alone (--pipeline *_thinker_only)",
            """``--pipeline <name>_thinker_only`` on a deploy file whose stages are those of the full
            pipeline ``<name>`` (Thinker -> Talker -> Code2Wav, e.g. the bundled preset): the Thinker's
            entry (stage 0 in both pipelines, as vllm-omni registers them) is split and the other
            stages, their overlay entries and the connectors only they used are left out.""",
            "omni_pd/compile/passes/narrow.py thinker_only_narrowing()"),
    CodeDoc("OPD906", "placement-proposed", _I, "expand", "expand placed stages the inventory does not place",
            """``expand --inventory`` with hosts but no ``placement:`` entry (and no ``all:``) for
            some stages: with one host they go on it; with two or more, prefill goes on the
            first host listed and decode and every other stage on the second (downstream stages
            follow decode, whose output feeds them, so those edges stay on one host). Write the
            placement into the inventory, so validate and launch read the same one.""",
            "omni_pd/compile/placement.py resolve_placement()"),
    CodeDoc("OPD907", "cross-host-stage-edges", _I, "expand", "expand gave the stage edges a cross-host omni connector",
            """``expand --inventory`` with a stage edge whose two stages are on different hosts (the
            prefill -> decode edge aside: it carries no payload, the KV connector moves prefill's
            KV): vllm-omni 0.30's default ``SharedMemoryConnector`` reaches one host only
            (vllm_omni/distributed/omni_connectors/connectors/shm_connector.py), so every stage
            edge is written with ``NixlConnector``, each edge's ``host`` the address of the host
            of the stage that sends on it. Every edge, not only the crossing one: a middle stage
            (Thinker decode, Talker) sends through its incoming edge's connector, and only
            NixlConnector serves both directions (vllm_omni/engine/stage_init_utils.py
            ``get_stage_connector_spec``).""",
            "omni_pd/compile/stage_edges.py cross_host_plan()"),
    CodeDoc("OPD903", "encoder-shares-devices", _I, "expand", "the encoder instance shares devices with the LLM",
            """``--encoder-devices`` names a device the prefill/decode engines already use; fine for
            a small encoder, but both processes then compete for its memory.""",
            "omni_pd/compile/passes/encoder_split.py plan_encoder_split()"),
    CodeDoc("OPD950", "vllm-omni-resolved", _I, "against", "what the real vllm-omni resolved the file to",
            """``validate --against-vllm-omni``: vllm-omni's serve-path resolver accepted the file;
            the message gives the pipeline, the stages and the PD pair it found.""",
            "omni_pd/upstream/against.py against_vllm_omni()"),
    CodeDoc("OPD951", "vllm-omni-refused", _E, "against", "the real vllm-omni refuses the file",
            """``validate --against-vllm-omni``: vllm-omni's resolver or its PD checks raised; the
            message quotes the exception.""",
            "omni_pd/upstream/against.py against_vllm_omni()"),
    CodeDoc("OPD952", "vllm-omni-unavailable", _E, "against", "vllm-omni cannot be run",
            """``validate --against-vllm-omni`` found no interpreter with vllm-omni and omni-pd
            importable (this one, ``--vllm-omni-python`` or ``$OMNI_PD_ORACLE_PYTHON``), or it
            failed to start. The help says how to install it.""",
            "omni_pd/upstream/against.py against_vllm_omni()", exit=2),
    CodeDoc("OPD953", "vllm-omni-not-applicable", _I, "against", "the pipeline runs on plain vLLM, not vllm-omni",
            """``validate --against-vllm-omni`` on a file whose pipeline omni-pd's catalogue marks
            ``runtime: vllm`` (``llm``, ``llm_pd``, the encoder layouts): vllm-omni registers no
            such pipeline and ``omni-pd launch`` serves it with plain ``vllm serve``, so
            vllm-omni is not run; the other diagnostics decide the exit status.""",
            "omni_pd/upstream/against.py plain_vllm_pipeline()"),
    CodeDoc("OPD960", "port-unbindable", _E, "launch", "a planned port cannot be bound",
            """Preflight try-binds every port of the launch plan on its host (TCP, no listen,
            SO_REUSEADDR as uvicorn and ZMQ set it); a port held by another process, or planned
            twice, stops the launch.""",
            "omni_pd/launch/preflight.py preflight()"),
    CodeDoc("OPD961", "executable-missing", _E, "launch", "an executable of the plan is missing",
            """The ``vllm`` executable (``--vllm``) or the python of a process is not found or not
            executable.""",
            "omni_pd/launch/preflight.py preflight()"),
    CodeDoc("OPD962", "module-missing", _E, "launch", "a Python module a process needs is not importable",
            """``vllm``, the connector's package (``nixl``, ``mooncake``), ``vllm_omni`` or
            ``omni_pd`` (its plugin) is not importable by the engines' interpreter.""",
            "omni_pd/launch/preflight.py preflight()"),
    CodeDoc("OPD963", "device-missing", _E, "launch", "a process is given a device this machine does not have",
            """A stage's ``devices`` names a GPU ``nvidia-smi`` does not list.""",
            "omni_pd/launch/preflight.py preflight()"),
    CodeDoc("OPD964", "device-memory", _E, "launch", "the engines ask more device memory than is free",
            """Per device, the sum of ``gpu_memory_utilization`` x total memory of the engines on
            it exceeds the free memory ``nvidia-smi`` reports.""",
            "omni_pd/launch/preflight.py preflight()"),
    CodeDoc("OPD965", "check-skipped", _I, "launch", "a preflight check could not run here",
            """E.g. no ``nvidia-smi`` on the machine: devices and device memory are not checked.""",
            "omni_pd/launch/preflight.py preflight()"),
    CodeDoc("OPD967", "dir-not-writable", _E, "launch", "a directory an engine must write is not writable",
            """The encoder split's shared directory (ECExampleConnector ``shared_storage_path``):
            E writes ``<dir>/<mm_hash>/encoder_cache.safetensors`` there and prefill reads it.
            Preflight requires it writable, or creatable when missing (this host only).""",
            "omni_pd/launch/preflight.py check_dirs()"),
    CodeDoc("OPD970", "migrate-note", _I, "migrate", "migrate moved, dropped or wrote a key",
            """One note per change ``omni-pd migrate`` makes to a legacy ``stage_args`` file, at the
            legacy key: where it went in the ``stages:`` schema, why it was dropped (the pipeline
            owns it, the target release does not read it), or which default is now written
            explicitly. The table of every legacy key is docs/migrate.md.""",
            "omni_pd/compile/migrate.py migrate_document()"),
    CodeDoc("OPD971", "cannot-migrate", _E, "migrate", "a legacy key has no home in the target's schema",
            """``omni-pd migrate`` (and ``validate``/``expand`` on a legacy file) cannot map this key:
            it is in no row of presets/targets/legacy_stage_args.yaml, it contradicts the pipeline
            (``model_stage``, ``engine_input_source``, ``final_output`` are the pipeline's), no or
            several catalogued pipelines fit the stages (``--pipeline`` picks one), or vllm-omni
            0.30 could not place the engine argument. Nothing is dropped silently: fix or remove
            the key.""",
            "omni_pd/compile/migrate.py migrate_document()", exit=2),
    CodeDoc("OPD966", "not-pd", _E, "launch", "launch was given a config that is not prefill/decode split",
            """``launch`` starts a compiled PD config; compile it first with ``omni-pd expand``. A
            vllm-omni pipeline across hosts is started as vllm-omni's head (``vllm serve MODEL
            --omni --stage-id N --omni-master-address ...``) and one headless process per other
            stage (``--headless``); launch refuses the placements that form has not been run
            for (a stage with ``num_replicas`` > 1 across hosts).""",
            "omni_pd/launch/plan.py plan_document()", exit=2),
)

#: code -> CodeDoc
BY_CODE: dict[str, CodeDoc] = {c.code: c for c in CODES}

Entry = Union["Rule", CodeDoc]  # noqa: F821


def explainable() -> dict[str, "Entry"]:
    """Every code ``omni-pd explain`` knows, sorted: the rule registry plus :data:`CODES`.

    Raises RuntimeError when a code is both a rule and catalogued here."""
    from omni_pd.check.rules import registry

    rules = registry()
    both = sorted(set(rules) & set(BY_CODE))
    if both:
        raise RuntimeError(f"codes both registered as rules and catalogued in codes.py: {', '.join(both)}")
    return dict(sorted({**rules, **BY_CODE}.items()))


def lookup(code: str) -> "Entry | None":
    """The rule or catalogued code for ``code`` (case and surrounding spaces ignored)."""
    return explainable().get(code.strip().upper())
