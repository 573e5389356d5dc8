#!/usr/bin/env bash
# vLLM's checks on an offline GPU machine (no package index) whose Python 3.12 already has
# torch 2.11 (CUDA 13), transformers, lightning, triton and numpy, as this project's lent
# device machines have: vLLM 0.26.0 is the release pinned to torch 2.11.0.
#
#   tools/offline_vllm.sh pack DIR [CHUNK_BYTES]   # here, with PyPI: DIR/p1 .. DIR/pN, each under CHUNK_BYTES
#   tools/offline_vllm.sh stash DIR/pK             # there, one call per chunk: kept in /tmp/gyre-vllm
#   tools/offline_vllm.sh check OUT                # there, after the last chunk: vLLM tests and benchmark
#
# The chunks exist because a call to such a machine may carry little (64 MiB with the working
# tree, about 20 MB here: the default 40 MB chunks fit); `stash` keeps each in /tmp while the
# machine stays up. With this workplace's device tool: pack into a folder of the checkout that
# .git/info/exclude ignores (`echo /.vl/ >> .git/info/exclude; tools/offline_vllm.sh pack .vl`),
# then one call per chunk, back to back (a machine stays up ~30 s between calls), each carrying
# only its chunk: `bash tools/offline_vllm.sh stash .vl/p1` with carry [".vl/p1"], ..., and the
# last chunk's call ending in `&& bash tools/offline_vllm.sh check $OUT`. Three chunks in all.
# The wheel drops the FA2 and MoE kernels (unused by the GPT-2 models here), and the
# dependencies are the modules `import vllm`, its engine, GPT-2 and its attention backends
# import that such an image lacks (found by importing them with each missing; pydantic,
# gymnasium and pettingzoo are gyre-ma's own).
set -euo pipefail
cmd=${1:?pack, stash or check}
case "$cmd" in
pack)
  dir=${2:?DIR}; chunk=${3:-40000000}
  work=$(mktemp -d); mkdir -p "$dir"
  plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform any)
  for n in 17 24 26 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
  plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/wheels" vllm==0.26.0 \
    annotated-types==0.7.0 apache-tvm-ffi==0.1.15.post2 cachetools==8.0.2 cbor2==6.3.0 fastapi==0.136.3 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0 \
    llguidance==1.7.6 msgspec==0.23.0 openai==3.60.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7 \
    pybase64==1.5.1 pydantic==2.13.4 pydantic_core==2.46.4 pyzmq==27.3.0 sniffio==1.3.1 starlette==1.10.0 \
    typing-inspection==0.4.2 xgrammar==0.2.9 distro==1.9.0 jiter==0.19.0 gymnasium farama-notifications pettingzoo
  mkdir -p "$work/site"
  (cd "$work/site" && unzip -q "$work"/wheels/vllm-0.26.0-*.whl -x 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' \
     'vllm/_moe_C_stable_libtorch.abi3.so' 'vllm/vllm-rs' 'vllm/third_party/*/include/*' 'vllm/third_party/fmha_sm100/*')
  rm "$work"/wheels/vllm-0.26.0-*.whl
  tar cf - -C "$work" site wheels | xz -T1 -6 > "$work/bundle.tar.xz"
  (cd "$work" && split -b "$chunk" -d bundle.tar.xz part.)
  k=0; for part in "$work"/part.*; do k=$((k + 1)); mkdir -p "$dir/p$k"; mv "$part" "$dir/p$k/"; done
  rm -rf "$work"; du -sh "$dir"/p*
  ;;
stash)
  mkdir -p /tmp/gyre-vllm/parts && cp "${2:?DIR/pK}"/part.* /tmp/gyre-vllm/parts/ && ls -la /tmp/gyre-vllm/parts
  ;;
check)
  out=${2:?OUT}; g=/tmp/gyre-vllm
  cat $g/parts/part.* | xz -d | tar x -C $g
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $g/deps $g/wheels/*.whl
  rm -rf $g/pkg  # gyre-ma laid out as pyproject.toml maps it (options/, agents/, envs/ inside gyre_ma)
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target $g/pkg .
  export PYTHONPATH=$g/pkg:$g/site:$g/deps PYTHONUNBUFFERED=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv || true
  python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.is_available())"
  repo=$PWD
  (cd $g/pkg && timeout 240 python3 -m pytest -q -p no:cacheprovider -rs "$repo/tests/gyre_ma/llm" -k vllm \
     > "$out/pytest_vllm.log" 2>&1; echo "pytest rc $?"; tail -25 "$out/pytest_vllm.log") || true
  timeout 280 python3 benchmarks/llm_engines.py --engine vllm --min-seconds 1 --rounds 3 \
     > "$out/llm_engines_vllm.json" 2> "$out/llm_engines_vllm.err" || echo "vllm benchmark rc $?"
  timeout 200 python3 benchmarks/llm_engines.py --device cuda --min-seconds 1 --rounds 3 \
     > "$out/llm_engines_cuda_transformers.json" 2> "$out/llm_engines_cuda.err" || echo "cuda benchmark rc $?"
  tail -3 "$out/llm_engines_vllm.err"; head -c 2000 "$out/llm_engines_vllm.json"
  ;;
*) echo "usage: $0 pack DIR [CHUNK_BYTES] | stash DIR/pK | check OUT" >&2; exit 2 ;;
esac
