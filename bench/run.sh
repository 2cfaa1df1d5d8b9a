#!/bin/sh
# Run the benches with the repo venv, default settings (bench/README.md says what they
# measure). They print figures and exit 0 whatever the ratios: they measure, not judge.
set -e
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "bench/run.sh: $PWD/$PY not found (make the repo venv first)" >&2; exit 2; }
echo "== bench_mlp_step.py  $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cpus"
"$PY" bench/bench_mlp_step.py
echo
echo "== bench_conv.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_conv.py
echo
echo "== bench_checkpoint.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_checkpoint.py
echo
echo "== bench_exchange.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_exchange.py
echo
echo "== bench_partition.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_partition.py
echo
echo "== bench_frameworks.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_frameworks.py
echo
echo "== bench_startup.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_startup.py
echo
echo "== bench_api.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_api.py
echo
echo "== bench_small_fit.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_small_fit.py
echo
echo "== bench_cpu_ops.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_cpu_ops.py || echo "(needs the onednn extra)"
echo
echo "== bench_fed.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_fed.py
echo
echo "== bench_decode_gil.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_decode_gil.py || echo "(needs py-spy: pip install py-spy)"
echo
echo "== bench_notice.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_notice.py
echo
echo "== bench_input.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_input.py
echo
echo "== bench_gpu_launches.py  $(date -u '+%Y-%m-%d %H:%M UTC')"
"$PY" bench/bench_gpu_launches.py
