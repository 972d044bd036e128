"""The e2e harness's reading of vLLM's prompt-token counter, on a page shaped as vllm-omni
0.30 serves it (one server page, every stage's series labelled ``stage`` and ``replica``) and
as plain vLLM serves it (no ``stage`` label)."""

from __future__ import annotations

from e2e.harness import prompt_tokens_by_source

OMNI_PAGE = """\
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",replica="0",source="local_compute",stage="0"} 343.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",replica="0",source="external_kv_transfer",stage="1"} 336.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",replica="0",source="local_compute",stage="1"} 7.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",replica="1",source="external_kv_transfer",stage="1"} 2.0
vllm:prompt_tokens_total{engine="0",model_name="tiny",stage="1"} 345.0
"""


def test_one_stage_sums_its_replicas_and_nothing_else():
    assert prompt_tokens_by_source(OMNI_PAGE, "1") == {"external_kv_transfer": 338.0, "local_compute": 7.0}
    assert prompt_tokens_by_source(OMNI_PAGE, "0") == {"local_compute": 343.0}
    assert prompt_tokens_by_source(OMNI_PAGE, "2") == {}


def test_without_a_stage_every_series_counts():
    assert prompt_tokens_by_source(OMNI_PAGE) == {"local_compute": 350.0, "external_kv_transfer": 338.0}
    plain = 'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 16.0\n'
    assert prompt_tokens_by_source(plain) == {"local_cache_hit": 16.0}
