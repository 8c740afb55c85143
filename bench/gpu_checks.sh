#!/usr/bin/env bash
# The GPU checks in one run on a GPU machine, most wanted first, so that a run cut short still leaves what it
# finished: the extension built for this GPU (skipped where a _C for this Python is already there, e.g. built by an
# earlier run on the same image), D2 hashes (against another GPU's with COMPARE), the same without cuDNN and what
# that costs, EasyScaleDDP against torch DDP and gradient accumulation, the hashes under mixed precision,
# `make test-gpu`'s tests, the kernel benchmarks, the store's copy kernel at each slice size, a D0 and a D1
# transformer step profiled, D1/D2 step times, D1 without the fill of uninitialized memory, where a bfloat16 step's
# host time goes. Everything lands in $OUT (default ./gpu-out), eight files at most: run.log, the parts' JSON, the
# built _C (and build.log where the build fails).
# All of it takes over 12 minutes on an H200, more than a 10-minute window on a GPU machine: STEPS names the steps
# to run (default all, in this order), e.g. STEPS="tests host".
#   OUT=DIR [COMPARE=other-gpu-hashes.json] [STEPS="hashes ddp ..."] bash bench/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
exec > >(tee -a "$OUT/run.log") 2>&1
PY=${PY:-python3}
STEPS=${STEPS:-hashes cudnn ddp amp tests kernels store profile levels unfilled host}
stamp() { echo "== $(date +%T) $*"; }
# Whether step $1 is chosen, stamped in the log where it is.
step() { [[ " $STEPS " == *" $1 "* ]] && stamp "$1"; }

stamp device
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn',
torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version())"
so_suffix=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if [ ! -f "easyscale_ext/_C$so_suffix" ]; then
    stamp build
    start=$SECONDS
    TORCH_CUDA_ARCH_LIST=9.0 EASYSCALE_CUDA=1 MAX_JOBS=$(nproc) $PY setup.py -q build_ext --inplace \
        > /tmp/build.log 2>&1 || { cp /tmp/build.log "$OUT/"; tail -40 /tmp/build.log; exit 1; }
    echo "built in $((SECONDS - start)) s"
fi
strip -g -o "$OUT/_C$so_suffix" "easyscale_ext/_C$so_suffix"
$PY -c "import easyscale_ext as es; print('cuda_built', es.cuda_built())"

step hashes && timeout 200 $PY bench/bench_gpu.py --parts hashes --json "$OUT/gpu-hashes.json" ${COMPARE:+--compare "$COMPARE"}
step cudnn && timeout 300 $PY bench/bench_gpu.py --parts cudnn --json "$OUT/gpu-cudnn.json" ${COMPARE:+--compare "$COMPARE"}
step ddp && timeout 150 $PY bench/bench_gpu.py --parts ddp --json "$OUT/gpu-ddp.json"
step amp && timeout 200 $PY bench/bench_gpu.py --parts amp --json "$OUT/gpu-amp.json"
step tests && timeout 200 $PY -m pytest -ra -m gpu --continue-on-collection-errors -p no:cacheprovider -q -s tests 2>&1 \
    | grep -v "^ERROR collecting\|^E  \|^_____" | tail -40
step kernels && timeout 90 $PY bench/bench_core.py --quick --json "$OUT/core.json" 2>/dev/null
step store && nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc/core csrc/bench/bench_copy.cu -o /tmp/bench_copy \
    && $PY -c "import torchvision; print(*(p.numel() * 4 for p in torchvision.models.resnet50().parameters()))" \
    | timeout 60 /tmp/bench_copy
# One JSON for the last four steps: $OUT returns eight files at most.
last=$(for s in profile levels unfilled host; do [[ " $STEPS " == *" $s "* ]] && echo -n "$s,"; done)
if [ -n "$last" ]; then
    stamp "${last%,}"
    timeout 570 $PY bench/bench_gpu.py --parts "${last%,}" --json "$OUT/gpu-profile.json"
fi
stamp done
