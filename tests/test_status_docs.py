"""``omni-pd status``'s documentation says what the code reads (issue 37): docs/launch.md's
verdict table names every verdict with its exit status and the failure counters the verdict
reads, its per-release table names every series ``status`` reads, and the README's status
block is what ``omni-pd status`` prints on the Qwen3-Omni CPU rehearsal's page
(tests/fixtures/status/omni_cpu_run.prom.gz), docs/launch.md's on the recorded vLLM pages
(tests/fixtures/status/pd_*).
"""

from __future__ import annotations

import gzip
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from docs_pages import fenced_blocks, page, section
from omni_pd.cli import main
from omni_pd.status import rules
from omni_pd.status.verdict import CONNECTOR, FAILURES, SERIES, START, VERDICT_EXIT

ROOT = Path(__file__).resolve().parents[1]
STATUS = "## Is PD happening? `omni-pd status`"


def _rows(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("|---")]


def test_every_verdict_is_in_the_table_with_its_exit_status():
    table = section(section(page("docs/launch.md"), STATUS), "### Verdicts, first that applies")
    found = {m.group(1): int(m.group(2)) for ln in _rows(table) if (m := re.match(r"\| \*\*(.+?)\*\* \| (\d) \|", ln))}
    assert found == VERDICT_EXIT


def test_the_transfers_failing_row_names_exactly_the_counters_the_verdict_reads():
    table = section(section(page("docs/launch.md"), STATUS), "### Verdicts, first that applies")
    (row,) = [ln for ln in _rows(table) if ln.startswith("| **transfers failing**")]
    named = set(re.findall(r"`(vllm:[a-z_]+)`", row))
    assert named == {n for key in FAILURES for n in CONNECTOR[key]} == set(rules.FAILURE_COUNTERS)


def test_every_series_status_reads_is_in_the_per_release_table():
    table = section(section(page("docs/launch.md"), STATUS), "### Series per release")
    rows = _rows(table)
    missing = []
    for name in (*SERIES, START):
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        suffix = name[len(family):]
        if any(f"`{name}`" in r for r in rows):
            continue
        if suffix and any(f"`{family}`" in r and f"`{suffix}`" in r for r in rows):
            continue  # a histogram: the family and its samples' suffixes in one row
        missing.append(name)
    assert missing == []
    # one column per vLLM release read, 0.30-0.34
    assert rows[0].split(" | ")[1:] == ["0.30", "0.31", "0.32", "0.33", "0.34 |"]


def _serve(pages: list[bytes]) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"" if self.path == "/health" else (pages[0] if len(pages) == 1 else pages.pop(0))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _page(name: str) -> bytes:
    with gzip.open(ROOT / "tests" / "fixtures" / "status" / f"{name}.prom.gz", "rb") as f:
        return f.read()


def test_the_launch_page_block_is_what_status_prints_on_the_recorded_pages(capsys):
    block = next(b for b in fenced_blocks(page("docs/launch.md"), "text")
                 if b.startswith("$ omni-pd status --url prefill=http://127.0.0.1:8100"))
    command, *shown = block.splitlines()
    assert command == "$ omni-pd status --url prefill=http://127.0.0.1:8100 --url decode=http://127.0.0.1:8200"
    servers = [_serve([_page("pd_prefill_before"), _page("pd_prefill_after")]),
               _serve([_page("pd_decode_before"), _page("pd_decode_after")])]
    try:
        p, d = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
        capsys.readouterr()
        rc = main(["status", "--url", f"prefill={p}", "--url", f"decode={d}", "--window", "0.5"])
        out = capsys.readouterr().out
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
    assert rc == 0
    printed = [ln.rstrip() for ln in out.splitlines()]

    def window(lines: list[str]) -> list[str]:  # the measured window's length differs run to run
        return [re.sub(r"\(window \d+\.\d s\)", "(window N s)", ln) for ln in lines]

    # the page shows the title and the pairs' table, without the instances' table below it
    assert window(shown) == window(printed[:len(shown)])
    assert printed[len(shown)].startswith("┏━━━━━━━━━━━┳━━━━━━━━━┳")  # the instance table starts right after


OMNI_COMMAND = ("$ omni-pd status --url prefill=http://127.0.0.1:8000#stage=0 "
                "--url decode=http://127.0.0.1:8000#stage=1 --window 0")


def test_the_readme_omni_block_is_what_status_prints_on_the_cpu_rehearsals_page(capsys):
    """The README's second status block: the four-stage Qwen3-Omni pipeline of the CPU rehearsal
    (tests/test_e2e_omni_stream_pd.py, `omni-pd launch --platform cpu` of `expand --stream`), its
    one server's /metrics page kept after the run's requests (tests/fixtures/status/omni_cpu_run.prom.gz;
    the e2e test writes it to OMNI_PD_STATUS_PAGES). One scrape (--window 0): totals since start."""
    block = next(b for b in fenced_blocks(page("README.md"), "text") if b.startswith(OMNI_COMMAND.split(" --url")[0])
                 and "#stage=" in b.splitlines()[0])
    command, *shown = block.splitlines()
    assert command == OMNI_COMMAND
    srv = _serve([_page("omni_cpu_run")])
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        capsys.readouterr()
        rc = main(["status", "--url", f"prefill={url}#stage=0", "--url", f"decode={url}#stage=1", "--window", "0"])
        out = capsys.readouterr().out
    finally:
        srv.shutdown()
        srv.server_close()
    assert rc == 0
    printed = [ln.rstrip().replace(url, "http://127.0.0.1:8000") for ln in out.splitlines()]
    assert shown == printed[:len(shown)]
    assert "PD working" in "\n".join(shown)
