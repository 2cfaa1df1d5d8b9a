#!/usr/bin/env bash
# The whole GPU check in ONE device call, for a machine with an NVIDIA GPU whose python3 has
# numpy, CuPy, numba and torch but maybe not the rest (no registry needed). The device tool
# lends 15 minutes a session, a call at most 600 s and a machine's start 1-2 minutes of it,
# so the phases below share DEADLINE (570 s) in the order of what issue 47 most lacks, each
# bounded by its cap and by what is left; a phase that would get under 20 s is skipped and
# says so, and a second, short call can run what was skipped or failed:
#   tests/gpu/run.sh [PHASE ...]      (default: all, in this order)
#   where    the GPU and the cuDNN this process loads (singa.layers.kernels.cudnn)
#   layers   tests/gpu's kernel and layer tests: cuDNN's passes against im2col and the CPU,
#            and tests/unit/test_cudnn.py against the real libcudnn
#   zoo      bench/bench_gpu_zoo.py: ResNet-50, GoogLeNet, VGG-16, MobileNet v1 training
#            steps at batch 128, then 32, against torch float32 and TF32, and device memory
#            (each net's row printed as it is measured)
#   bench    bench/bench_gpu.py: SINGA's MLP, LeNet and cifar10 nets against torch, with and
#            without CUDA graphs and buckets, and ours on the CPU
#   training tests/gpu's training tests (SINGA's confs, bit-exact resumes, the fed LMDB ...)
#   fed      bench/bench_fed.py: images/s of a Caffe LMDB of JPEGs through the input layers on
#            this machine's cores, against the GPU's step; the training thread's crop on the GPU;
#            then bench/bench_decode_gil.py (with the py-spy wheel): decoding threads against
#            processes on all its cores
#   ops      bench/gpu_op_times.py: each layer's passes and operations at batch 1024 against
#            torch's, then a profile of ours into $OUT/gpu-profile.txt, if time is left
# The log is $OUT/gpu.log (default ./gpu-check/). Wheels in .whl/ (pyzmq, kazoo, protobuf,
# tensorboardX, pytest and its three, lmdb, py-spy: docs/gpu.md says how to fetch them) are
# installed to /tmp/site first. Exit status: 0 when every test phase that ran passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-$PWD/gpu-check}
DEADLINE=${DEADLINE:-570}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
fi
PHASES=("$@")
[ ${#PHASES[@]} -gt 0 ] || PHASES=(where layers zoo bench training fed ops)
failed=0

# phase CAP NAME CMD...: CMD under timeout min(CAP, what is left of DEADLINE)
phase() {
  local cap=$1 name=$2 left=$((DEADLINE - SECONDS))
  shift 2
  [ "$cap" -lt "$left" ] || cap=$left
  if [ "$cap" -lt 20 ]; then
    echo "== $name: skipped, ${left} s left of ${DEADLINE}"
    return 0
  fi
  echo "== $name: at ${SECONDS} s, for at most ${cap} s"
  timeout "$cap" "$@"
  local rc=$?
  echo "== $name: exit $rc at ${SECONDS} s"
  return $rc
}

PYTEST=(python3 -m pytest -v --tb=short -p no:cacheprovider -rfEs --durations=10
        -o faulthandler_timeout=120)

{
  for p in "${PHASES[@]}"; do
    case $p in
      where)
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        phase 30 where python3 -c "from singa.layers.kernels import cudnn
print('cuDNN candidates:', cudnn.candidates())
print('cuDNN', cudnn.version(), 'loaded')" ;;
      layers) phase 100 layers "${PYTEST[@]}" tests/unit/test_cudnn.py \
                tests/gpu/test_kernels_gpu.py tests/gpu/test_layers_gpu.py || failed=1 ;;
      zoo) (cd bench && phase 230 zoo python3 bench_gpu_zoo.py --batches 128,32) ;;
      bench) (cd bench && phase 150 bench python3 bench_gpu.py) ;;
      training) phase 300 training "${PYTEST[@]}" tests/gpu/test_training_gpu.py || failed=1 ;;
      fed) (cd bench && phase 60 fed python3 bench_fed.py
            phase 40 gil python3 bench_decode_gil.py --seconds 5) ;;
      ops) (cd bench && phase 60 ops python3 gpu_op_times.py --batch 1024)
           (cd bench && phase 60 profile python3 -c "import bench_gpu
bench_gpu.profile_threads('$OUT/gpu-profile.txt')") ;;
      *) echo "tests/gpu/run.sh: unknown phase '$p' (where layers zoo bench training fed ops)"
         failed=2 ;;
    esac
  done
  echo "run.sh: done at ${SECONDS} s, exit $failed"
  exit $failed
} 2>&1 | tee -a "$OUT/gpu.log"
exit "${PIPESTATUS[0]}"
