"""Upstream: code that runs inside vLLM / vllm-omni processes, or drives them.

``vllm_plugin`` (entry points loaded by vLLM and vllm-omni) registers the ``*_pd``
pipelines; ``vllm_oracle`` runs vllm-omni's own resolver and PD checks on files;
``against`` is ``validate --against-vllm-omni``. Nothing here is imported by the
compiler or the checker.
"""
