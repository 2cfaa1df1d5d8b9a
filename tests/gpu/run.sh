#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with an NVIDIA GPU whose python3 has numpy,
# CuPy, numba and torch but maybe not the rest (no registry needed): tests/gpu, then
# bench/bench_gpu.py (GPU against torch on the same GPU, and our CPU), the log in
# $OUT/gpu.log (default ./gpu-check/), a profile of ours in $OUT/gpu-profile.txt, then the GPU
# time of each layer's passes and of each operation in them at batch 1024, and of the same
# products and convolutions by torch (bench/gpu_op_times.py) in the log, and where py-spy is
# among the wheels, its samples of the GIL's holders in $OUT/gpu-pyspy.txt (collapsed stacks).
# Wheels in .whl/ (pyzmq, kazoo, protobuf, tensorboardX, pytest and its three, py-spy, lmdb:
# docs/gpu.md says how to fetch them) are installed to /tmp/site first.
# Exit status: pytest's.
# `tests/gpu/run.sh zoo` instead runs only bench/bench_gpu_zoo.py (training steps of ResNet-50,
# GoogLeNet, VGG-16 and MobileNet v1 at batch 32 and 128 against torch: time and device
# memory, about 4 minutes), the log in $OUT/gpu-zoo.log, exit status the bench's: a device
# call of its own, since the above already takes the 560 s of one.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-$PWD/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
fi
if [ "${1:-}" = zoo ]; then
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    (cd bench && timeout 540 python3 bench_gpu_zoo.py); } 2>&1 | tee "$OUT/gpu-zoo.log"
  exit "${PIPESTATUS[0]}"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  # the device tool's limit is 600 s a call: tests, bench and operation times fit in 560 s
  timeout 330 python3 -m pytest -v --tb=short -p no:cacheprovider -rfEsP --durations=15 \
    -o faulthandler_timeout=150 tests/gpu
  echo "pytest exit $?"
  (cd bench && timeout 170 python3 bench_gpu.py --profile "$OUT/gpu-profile.txt")
  (cd bench && timeout 60 python3 gpu_op_times.py --batch 1024)
  # where the GIL's holders spend a step (MLP, batch 64), if time is left
  if [ -x /tmp/site/bin/py-spy ] && [ "$SECONDS" -lt 480 ]; then
    (cd bench && timeout $((580 - SECONDS)) /tmp/site/bin/py-spy record --threads --gil \
       --rate 1000 --format raw -o "$OUT/gpu-pyspy.txt" -- python3 -c \
       "import bench_gpu; bench_gpu.profile_threads('/dev/null', steps=300, interval=0.05)") \
      || echo "py-spy: no profile"
  fi
} 2>&1 | tee "$OUT/gpu.log"
grep -q "^pytest exit 0$" "$OUT/gpu.log"
