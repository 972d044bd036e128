"""Option values checked where the command line is parsed: one function per option kind.

Each raises :class:`~omni_pd.diagnostics.OmniPdError` OPD006 (exit 2) whose message names
the option and whose help lists what it accepts, so a value nothing downstream would
accept (``--vllm-version 9.9``, ``--kv-buffer-device banana``) never reaches a file.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from omni_pd.compile.targets import Target
from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

#: the choices vLLM's KVTransferConfig documents for ``kv_buffer_device``
#: (vllm/config/kv_transfer.py, KVTransferConfig.kv_buffer_device); the field is a plain
#: ``str`` there and only connectors that stage through a buffer check it
KV_BUFFER_DEVICES = ("cuda", "cpu", "xpu")

#: the platform a deploy file's base section (no ``platforms:`` overlay) runs on
BASE_PLATFORM = "cuda"

_HOSTNAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _bad(option: str, value: object, why: str, help: str) -> OmniPdError:
    return OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                  message=f"{option} {value}: {why}", help=help))


def vllm_version(value: str | None, option: str = "--vllm-version") -> Target:
    """The :class:`Target` for ``value`` (None: the default) when omni-pd has facts for
    it (presets/targets/vllm.yaml ``known_versions``). Raises OPD006 otherwise."""
    from omni_pd.compile.versions import known_target, known_vllm_versions

    try:
        return known_target(value)
    except ValueError as e:
        known = known_vllm_versions()
        raise _bad(option, value, str(e), f"give a vLLM major.minor from {known[0]} to {known[-1]}") from None


def kv_buffer_device(value: str, connector: str, target: Target, option: str = "--kv-buffer-device",
                     overlays: tuple[str, ...] = ()) -> str:
    """``value`` when ``connector`` at ``target`` accepts it as ``kv_buffer_device`` on
    the base platform (CUDA); raises OPD006 otherwise.

    NixlConnector: the per-version, per-platform table of validate's OPD611
    (vLLM ``kv_connector/v1/nixl/utils.py _NIXL_SUPPORTED_DEVICE``: ``cuda`` only in 0.11,
    ``cuda`` or ``cpu`` from 0.13). Other connectors (MooncakeConnector in vLLM 0.30 does
    not read the field: ``v1/mooncake/mooncake_connector.py`` registers the device KV
    cache itself): the choices KVTransferConfig documents, :data:`KV_BUFFER_DEVICES`.
    ``overlays``: the platforms whose ``platforms.<P>`` overlay the written file carries; the
    value must be accepted on each of them too (the same table), else OPD006 names the overlay."""
    from omni_pd.check.rules.capability import BUFFER_DEVICES

    table = BUFFER_DEVICES.get(connector)
    allowed: tuple[str, ...] = KV_BUFFER_DEVICES
    where = "vLLM's KVTransferConfig (vllm/config/kv_transfer.py)"
    if table is not None:
        rows = [vals for plat, since, vals in table if plat == BASE_PLATFORM and target.version >= since]
        if rows:
            allowed = rows[-1]
            where = f"{connector} with vLLM {target.label} on {BASE_PLATFORM}"
    if value not in allowed:
        staging = table is not None and "cpu" in allowed[1:]
        raise _bad(option, value, f"{where} accepts {_either(allowed)}",
                   f"pass {option} {allowed[0]}" + (" (or cpu for host staging)" if staging else ""))
    for plat in overlays:  # the written kv_transfer_config applies under each platforms.<P> overlay too
        rows = [vals for p, since, vals in (table or ()) if p == plat and target.version >= since]
        if plat == BASE_PLATFORM or not rows or value in rows[-1]:
            continue
        both = tuple(v for v in allowed if v in rows[-1])
        raise _bad(option, value, f"the file's platforms.{plat} overlay runs {connector} on {plat}, where vLLM "
                   f"{target.label} accepts {_either(rows[-1])}",
                   (f"pass {option} {both[0]} (accepted on {BASE_PLATFORM} and {plat}), " if both else "")
                   + f"or drop {option}, or the platforms.{plat} overlay")
    return value


def mooncake_protocol(value: str | None, connector: str | None) -> str | None:
    """``value`` when it is a Transfer Engine protocol
    (:data:`omni_pd.compile.connectors.mooncake.PROTOCOLS`) and ``connector`` is
    MooncakeConnector or not chosen on the command line (None: the Thinker's own or the
    default, Mooncake; expand refuses a file whose connector is another, OPD006); raises
    OPD006 otherwise. None passes through (nothing written: vLLM's ``rdma``)."""
    from omni_pd.compile.connectors.mooncake import CONNECTOR, PROTOCOLS

    if value is None:
        return None
    if value not in PROTOCOLS:
        raise _bad("--mooncake-protocol", value, f"the Mooncake Transfer Engine protocols are {_either(PROTOCOLS)}",
                   "pass --mooncake-protocol tcp (no RDMA NIC) or rdma")
    if connector is not None and connector != CONNECTOR.name:
        raise _bad("--mooncake-protocol", value, f"it configures MooncakeConnector, not {connector}",
                   "drop --mooncake-protocol, or pass --connector MooncakeConnector")
    return value


def _either(values: tuple[str, ...]) -> str:
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " or " + values[-1]


def host(value: str, option: str) -> str:
    """``value`` when it is an IPv4/IPv6 address or a DNS host name; raises OPD006."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(value) or value.replace(".", "").isdigit():
        raise _bad(option, repr(value), "not an IP address or host name",
                   f"pass {option} with an address the other engine can reach, e.g. 10.0.0.1 or host-a")
    return value


#: the TCP port range a listener can bind (0 means "any free", never a planned port)
PORT_MIN, PORT_MAX = 1, 65535


def port(value: int | None, option: str) -> int | None:
    """``value`` when it is a TCP port (:data:`PORT_MIN`..:data:`PORT_MAX`) or None (option
    not given); raises OPD006 (exit 2) otherwise, before anything is planned or bound."""
    if value is not None and not PORT_MIN <= value <= PORT_MAX:
        raise _bad(option, value, f"not a TCP port ({PORT_MIN}..{PORT_MAX})",
                   f"pass {option} with a port from {PORT_MIN} to {PORT_MAX}")
    return value


def encoder_split(layout: str | None, *, ec_connector: str | None, storage: str | None,
                  devices: str | None, pd_options: tuple[tuple[str, Any], ...] = ()) -> None:
    """``--encoder-split`` must be ``1e1pd`` or ``1e1p1d`` (omni_pd.compile.pipelines
    ``ENCODER_SPLITS``), and the encoder options (``--ec-connector``, ``--ec-storage-path``,
    ``--encoder-devices``) mean nothing without it. ``pd_options``: the given (flag, value)
    pairs of the prefill/decode options (connector, TP/DP per side, replicas, side devices,
    connector ports and host); ``1e1pd`` has no prefill/decode pair, so any of them there is
    refused rather than dropped. Raises OPD006 (exit 2)."""
    from omni_pd.compile.pipelines import ENCODER_SPLITS

    if layout is not None and layout not in ENCODER_SPLITS:
        raise _bad("--encoder-split", layout, "not an encoder layout",
                   "use 1e1pd (encoder + one instance) or 1e1p1d (encoder + prefill/decode pair)")
    if layout == "1e1pd":
        for opt, val in pd_options:
            if val is not None:
                raise _bad(opt, val, "has no prefill/decode pair to apply to: --encoder-split 1e1pd is "
                           "an encoder and one instance that runs prefill and decode itself",
                           "use --encoder-split 1e1p1d for a prefill/decode pair, or drop the option "
                           "(the instance keeps the input stage's own settings)")
    if layout is None:
        for opt, val in (("--ec-connector", ec_connector), ("--ec-storage-path", storage),
                         ("--encoder-devices", devices)):
            if val is not None:
                raise _bad(opt, val, "applies only with --encoder-split",
                           "add --encoder-split 1e1pd or 1e1p1d, or drop the option")


def selectors(values: list[str] | None, option: str, known: dict[str, str]) -> tuple[str, ...] | None:
    """``--select`` / ``--ignore`` values (repeatable, each comma-separated) as selectors
    (omni_pd/check/suppress.py ``resolve``: codes, rule names, code prefixes, ``ALL``);
    None when the option was not given. ``known``: code -> rule name. Raises OPD006
    (exit 2) naming the first selector that names no code, before any file is read."""
    from omni_pd.check.suppress import bad_selectors

    if values is None:
        return None
    out = tuple(s.strip() for v in values for s in v.split(",") if s.strip())
    bad = bad_selectors(out, known)
    if bad:
        raise _bad(option, bad[0], "names no code omni-pd knows",
                   "give codes (OPD704), code prefixes (OPD7), rule names (`omni-pd rules`) or ALL, comma-separated")
    return out
