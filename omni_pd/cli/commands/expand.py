"""``omni-pd expand``: the options; the work is :func:`omni_pd.cli.expand_run.run_expand`
(``size --write`` runs it too)."""

from pathlib import Path
from typing import Optional

import typer

from omni_pd.cli.expand_run import run_expand


def expand(
    input: Optional[Path] = typer.Argument(None, help="three-stage deploy YAML (default: the bundled Qwen3-Omni preset)",
                                           show_default=False),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write here (atomically) instead of stdout"),
    connector: Optional[str] = typer.Option(None, "--connector", help="KV connector: MooncakeConnector (default), NixlConnector or NixlPushConnector (omni-pd connectors; npu: --npu-connector)"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version",
                                               help="target vLLM major.minor (default and known range: omni-pd --version)"),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="tensor parallel size of both prefill and decode"),
    prefill_tp: Optional[int] = typer.Option(
        None, "--prefill-tp", min=1, help="prefill's tensor parallel size (per instance); unequal to decode's only "
        "where the connector, vLLM version and runtime pair them (OPD603, OPD306)"),
    decode_tp: Optional[int] = typer.Option(None, "--decode-tp", min=1,
                                            help="decode's tensor parallel size (per instance)"),
    dp: Optional[int] = typer.Option(None, "--dp", min=1, max=64,
                                     help="data parallel size (data_parallel_size) of both prefill and decode"),
    prefill_dp: Optional[int] = typer.Option(
        None, "--prefill-dp", min=1, max=64, help="prefill's data parallel size (per instance: one engine of DP "
        "ranks on TP x DP devices)"),
    decode_dp: Optional[int] = typer.Option(None, "--decode-dp", min=1, max=64,
                                            help="decode's data parallel size (per instance)"),
    prefill_devices: Optional[str] = typer.Option(
        None, "--prefill-devices",
        help='prefill\'s devices as written, e.g. "0,1"; with num_replicas (the Thinker\'s or --prefill-replicas) '
             'every replica\'s: replica r on the r-th TP x PP x DP of them'),
    decode_devices: Optional[str] = typer.Option(
        None, "--decode-devices",
        help='decode\'s devices as written, e.g. "2,3"; with replicas every replica\'s, as --prefill-devices'),
    downstream_devices: Optional[str] = typer.Option(None, "--downstream-devices",
                                                     help="devices for every stage after the Thinker (Talker, Code2Wav)"),
    kv_host: str = typer.Option("127.0.0.1", "--kv-host", help="address prefill/decode advertise to each other"),
    kv_buffer_device: Optional[str] = typer.Option(None, "--kv-buffer-device", help="KV buffer device: NixlConnector cuda or cpu (host staging); checked per connector and vLLM version"),
    mooncake_protocol: Optional[str] = typer.Option(
        None, "--mooncake-protocol", help="MooncakeConnector's Transfer Engine protocol, rdma (vLLM's default) or "
        "tcp (no RDMA NIC: a CPU rehearsal); written to kv_connector_extra_config.mooncake_protocol"),
    port_base: Optional[int] = typer.Option(None, "--port-base", help="first connector port to try"),
    stream: Optional[bool] = typer.Option(
        None, "--stream/--no-stream", help="async_chunk of the PD output: --stream turns vllm-omni's streaming on "
        "where the input turns it off (the spoken answer in chunks while decode writes), --no-stream writes false "
        "(the answer's audio in one piece after the text); default: as the input, where the PD pair can stream"),
    prefill_replicas: Optional[int] = typer.Option(
        None, "--prefill-replicas", min=1, max=64,
        help="xPyD: prefill instances (num_replicas of the prefill stage), each with its own devices, "
             "engine id and connector ports"),
    decode_replicas: Optional[int] = typer.Option(
        None, "--decode-replicas", min=1, max=64, help="xPyD: decode instances (num_replicas of the decode stage)"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline name when the file does not say"),
    schema_ref: Optional[str] = typer.Option(
        None, "--schema-ref", metavar="URL|PATH",
        help="$schema of the yaml-language-server header line; a relative path is resolved against the output "
             "file (default: omni-pd-deploy.schema.json next to it, written by `omni-pd schema -o`; '' drops the line)"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="hide info diagnostics"),
    encoder_split: Optional[str] = typer.Option(
        None, "--encoder-split", help="disaggregate the multimodal encoder: 1e1pd (encoder + one instance) or "
        "1e1p1d (encoder + prefill/decode pair), as vLLM's disagg_1e1pd/1e1p1d examples"),
    ec_connector: Optional[str] = typer.Option(None, "--ec-connector",
                                               help="EC connector (with --encoder-split; default ECExampleConnector)"),
    ec_storage_path: Optional[str] = typer.Option(None, "--ec-storage-path",
                                                  help="directory the encoder and its consumer share (ECExampleConnector; default /tmp/omni-pd-ec)"),
    encoder_devices: Optional[str] = typer.Option(None, "--encoder-devices", help='devices of the encoder instance, e.g. "4"'),
    platform: Optional[str] = typer.Option(None, "--platform", help="npu: the base stages run on Ascend NPUs "
                                           "(the platforms.npu overlay gets the Ascend pair either way)"),
    npu_connector: str = typer.Option("MooncakeConnectorV1", "--npu-connector",
                                      help="vllm-ascend connector on npu: MooncakeConnectorV1 (pull) or "
                                           "MooncakeLayerwiseConnector (layerwise push)"),
    npu_decode_tp: Optional[int] = typer.Option(None, "--npu-decode-tp", min=1,
                                                help="npu: decode TP below prefill's (prefill TP must be a multiple)"),
    inventory: Optional[Path] = typer.Option(
        None, "--inventory", help="hosts (address, count) and stage placement (YAML): devices, ports and advertised "
        "addresses per host (docs/launch.md, Two hosts)"),
    prefill_set: Optional[list[str]] = typer.Option(
        None, "--prefill-set", help="KEY=VALUE: a stage key on prefill only, e.g. max_num_seqs=16 (repeatable; "
        "VALUE read as YAML; validated like the file)"),
    decode_set: Optional[list[str]] = typer.Option(
        None, "--decode-set", help="KEY=VALUE: a stage key on decode only, e.g. max_num_seqs=64 (repeatable)"),
) -> None:
    """Split the Thinker of a deploy config into a prefill/decode pair (three stages -> four).

    With --encoder-split, run the multimodal encoder as its own instance feeding the LLM
    (1e1pd) or its prefill/decode pair (1e1p1d) through an EC connector.

    Every option value is checked first, the input must pass the schema checks, and the
    output must pass `omni-pd validate` before it is written (else exit 3: a bug).
    """
    run_expand(**locals())
