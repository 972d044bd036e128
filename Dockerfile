# The PD router image `omni-pd render --target kubernetes` names with --router-image
# (default omni-pd:latest): omni-pd and its router (aiohttp) on a small Python base. The
# router container runs `python -m omni_pd.launch.router ...` (the manifests' command).
# Build and push it where the cluster pulls from (docs/launch.md, Kubernetes):
#   docker build -t REGISTRY/omni-pd:TAG .
#   docker push REGISTRY/omni-pd:TAG
#   omni-pd render pd.yaml --target kubernetes --model M --router-image REGISTRY/omni-pd:TAG --to k8s/
# The engines need another image: vLLM (plain PD pairs), or vllm-omni 0.30 with omni-pd
# installed for a vllm-omni pipeline (--image).
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY omni_pd ./omni_pd
COPY presets ./presets
COPY schemas ./schemas
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
USER 65534:65534
CMD ["python", "-m", "omni_pd.launch.router", "--help"]
