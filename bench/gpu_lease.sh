#!/bin/bash
# One short GPU lease, spent in issue 40's order: the CUDA tests, the scan benchmarks at 02's gpu
# sizes, the many-runs benchmark, the kernel profile, then one chunk of 02's gpu profile with the time
# left. Everything it measures lands in $OUT: gpu.txt (the summary, the scan and kernel tables),
# test_cuda.log, bench.log, the benchmarks' records, chunk.log and chunk.tar.gz. Only 8 files come
# back from a call, and all steps write 11: name fewer steps (those whose records are committed).
#
# Here, before the lease:
#     bash bench/gpu_lease.sh --prepare
# copies the offline data the device cannot reach and the gpu store's records into the ignored
# folder .lease/ (carry it), and takes results/runs out of the index (its ~120 MB of records would
# put the tree over the 64 MiB a call sends). After the call, and before any commit:
#     bash bench/gpu_lease.sh --restore
# On the device (the `run` tool; carry .lease), with the seconds the whole script may take (keep
# them under the command's limit) and the steps to take (default: all, in this order):
#     bash bench/gpu_lease.sh $OUT 570 tests,scan,steps,many,kernels,manynode,mps,chunk
#   tests  tests/test_cuda.py and the Triton scan's tests on the GPU (~2 min); the chunk is skipped if they fail
#   scan   bench/scan.py's candidates alone at 02's gpu sizes (~30 s)
#   steps  training steps of gpt, ti_ssm and ssm under CUDA graphs and eager, on the fused, the chunked
#          and the Triton scan (~5 min)
#   many   bench/many_runs.py: 8 runs at once against one alone, after a warm-up run (~3 min)
#   kernels  bench/gpu_kernels.py: GPU busy time and kernels of gpt's and ti_ssm's compiled step,
#          fused, chunked and Triton scan: what bounds ti_ssm's step (~2 min)
#   manynode  bench/many_runs.py with 8 node runs at once, the heaviest arm (~2 min)
#   mps    the same under CUDA MPS (started here, quit at the end; a chunk after it runs under it) (~2 min)
#   mpsd   only start CUDA MPS (quit at the end), e.g. mpsd,chunk: a chunk under MPS without the benchmark
#   chunk  the runs of 02's gpu profile that fit in what is left, less 30 s to pack them
# Back here: python -m nodelm_lib import-runs <files_at>/chunk.tar.gz --store results/runs/gpu
# (commit the records; the next lease continues where this chunk stopped), and copy the
# benchmarks' records under results/bench_cuda_*.
set -u
if [ "${1:-}" = "--prepare" ]; then
  # a record names the commit it was trained at: uncommitted library code would make it claim another's
  dirty=$(git status --porcelain -- nodelm_lib notebooks params)
  if [ -n "$dirty" ]; then
    echo "commit or stash these first: the chunk's records would name HEAD's commit, not this code" >&2
    echo "$dirty" >&2
    exit 1
  fi
  # Triton compiles its kernels on their first launch: one that cannot compile for the lease's GPU
  # (compute capability 9.0) is found here, in seconds, rather than there
  py=.venv/bin/python && [ -x "$py" ] || py=python3
  if "$py" -c 'import triton' 2>/dev/null; then
    if ! log=$("$py" -c 'from nodelm_lib.models import scan_triton as s; print(*s.compile_kernels(90), sep=", ")' 2>&1); then
      echo "$log" | tail -20 >&2
      echo "the Triton scan does not compile for sm_90 (above): fix it before the lease" >&2
      exit 1
    fi
    echo "the Triton scan compiles for sm_90: $(echo "$log" | tail -1)"
  else
    echo "Triton is not installed here: its kernels are not compiled ahead of the lease"
  fi
  shared=$(cd "$(dirname "$0")/../.." && pwd)/shared/data
  rm -rf .lease && mkdir -p .lease/data .lease/runs/gpu
  cp -r "$shared/wikitext-2-v1" "$shared/tinyshakespeare" "$shared/tiktoken_cache" .lease/data/  # the CUDA tests read tiny-shakespeare
  cp results/runs/gpu/*.json .lease/runs/gpu/ 2>/dev/null  # the next chunk reads back what earlier ones trained
  mkdir -p .lease/tokens && cp .cache/tokens/wikitext2-*-gpt2-* .lease/tokens/ 2>/dev/null  # saves tokenising there
  grep -qx '/.lease/' .git/info/exclude 2>/dev/null || echo '/.lease/' >> .git/info/exclude
  git rm -r -q --cached results/runs && echo '/results/runs/' >> .git/info/exclude
  echo "results/runs is out of the index: run 'bash bench/gpu_lease.sh --restore' after the call, before any commit"
  du -sh .lease
  exit 0
fi
if [ "${1:-}" = "--restore" ]; then
  git reset -q results/runs && sed -i '\#^/results/runs/$#d' .git/info/exclude && git status --short results/runs | head -3
  exit 0
fi
out=${1:?usage: bash bench/gpu_lease.sh OUT_DIR [seconds for the whole script] [steps] (or --prepare, here)}
total=${2:-570}
known=tests,scan,steps,many,kernels,manynode,mps,mpsd,chunk
steps=,${3:-tests,scan,steps,many,kernels,manynode,mps,chunk},
for step in ${steps//,/ }; do  # a misspelt step would otherwise be skipped without a word, on the lease's time
  [[ ",$known," == *",$step,"* ]] || { echo "unknown step '$step'; the steps are $known" >&2; exit 2; }
done
started=$(date +%s)
want() { [[ "$steps" == *",$1,"* ]]; }
left() { echo $(( total - ($(date +%s) - started) )); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NODELM_DATA_DIR=$PWD/.lease/data MPLBACKEND=Agg
# set, not left to the library: it keeps a TIKTOKEN_CACHE_DIR it finds, and the image brings one
# (/opt/tiktoken_cache) without GPT-2's files
echo "TIKTOKEN_CACHE_DIR before: ${TIKTOKEN_CACHE_DIR:-unset}" > "$out/gpu.txt"
export TIKTOKEN_CACHE_DIR=$PWD/.lease/data/tiktoken_cache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/gpu.txt"
# the records of earlier chunks, carried in .lease/ (results/runs itself does not travel), and
# WikiText-2's GPT-2 tokens if they were cached here (each is checked against a manifest on read)
mkdir -p results/runs/gpu .cache/tokens && cp -n .lease/runs/gpu/*.json results/runs/gpu/ 2>/dev/null
cp -n .lease/tokens/* .cache/tokens/ 2>/dev/null
tests_ok=1

if want tests; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_scan_triton.py > "$out/test_cuda.log" 2>&1
  code=$?; [ $code -eq 0 ] || tests_ok=0
  echo "test_cuda: exit $code ($(tail -1 "$out/test_cuda.log"))" | tee -a "$out/gpu.txt"
fi
if want scan; then
  timeout 150 python3 bench/scan.py --device cuda --batch 32 --seq 128 --channels 256 2>&1 \
    | grep -v -i warn | tee -a "$out/gpu.txt"
  echo "scan: exit ${PIPESTATUS[0]}" | tee -a "$out/gpu.txt"
fi
if want steps; then  # rows are written as they are measured: a timeout keeps what was timed
  timeout 300 python3 bench/record.py --only gpu --gpu-modes cudagraphs eager --gpu-archs ti_ssm ssm \
    --gpu-scan-chunk 8 --gpu-scan-triton --gpu-steps 20 --out "$out/bench_cuda_scan_steps" >> "$out/bench.log" 2>&1
  echo "steps: exit $?" | tee -a "$out/gpu.txt"
fi
if want many; then
  timeout 240 python3 bench/many_runs.py --workers 8 --steps 300 --out "$out/bench_cuda_many_runs" \
    >> "$out/bench.log" 2>&1
  echo "many: exit $? ($(tail -1 "$out/bench.log"))" | tee -a "$out/gpu.txt"
fi
if want kernels; then  # rows are written as they are measured, as in steps
  timeout 180 python3 bench/gpu_kernels.py --modes compiled --archs gpt ti_ssm --scan-chunk 8 --scan-triton --steps 10 \
    --out /tmp/bench_cuda_kernels >> "$out/bench.log" 2>&1
  echo "kernels: exit $?" | tee -a "$out/gpu.txt"
  cp /tmp/bench_cuda_kernels.json "$out/" 2>/dev/null; cat /tmp/bench_cuda_kernels.txt >> "$out/gpu.txt" 2>/dev/null
fi
many_node() {  # step $1: 8 node runs (the heaviest arm) at once against one alone, recorded as $2
  timeout 200 python3 bench/many_runs.py --arm node --workers 8 --steps 300 --out "$out/$2" >> "$out/bench.log" 2>&1
  echo "$1: exit $? ($(tail -1 "$out/bench.log"))" | tee -a "$out/gpu.txt"
}
start_mps() {  # CUDA MPS, once, for step $1: several processes' kernels on the GPU at once; what runs after it uses it too
  [ "${mps_started:-0}" = 1 ] && return 0
  nvidia-cuda-mps-control -d 2>> "$out/bench.log" && mps_started=1 && return 0
  echo "$1: the MPS control daemon did not start (bench.log)" | tee -a "$out/gpu.txt"
  return 1
}
if want manynode; then  # without MPS the processes take turns on the GPU
  many_node manynode bench_cuda_many_runs_node
fi
if want mpsd && start_mps mpsd; then
  echo "mpsd: CUDA MPS started" | tee -a "$out/gpu.txt"
fi
if want mps && start_mps mps; then
  many_node mps bench_cuda_many_runs_node_mps
fi
if want chunk; then
  # The margin covers packing (seconds: records only); should a run still overrun, SIGINT (not
  # timeout's SIGTERM) lets the chunk pack what was stored before the command's own limit kills
  # everything. A 4000-step run of 02's heavier arms, 8 at once, is priced near 480 s: every second
  # of the budget counts.
  budget=$(( $(left) - 30 ))
  echo "chunk budget: ${budget} s of $(left) s left" | tee -a "$out/gpu.txt"
  echo "store: $(ls results/runs/gpu | wc -l) records before the chunk" | tee -a "$out/gpu.txt"
  if [ $tests_ok -eq 0 ]; then
    echo "chunk skipped: the CUDA tests failed" | tee -a "$out/gpu.txt"
  elif [ "$budget" -le 60 ]; then
    echo "chunk skipped: no time left" | tee -a "$out/gpu.txt"
  else
    timeout -s INT -k 15 $(( budget + 15 )) \
      python3 -m nodelm_lib chunk 02_seed_comparison --profile gpu --budget "$budget" --unknown-run-s 150 \
      --archive "$out/chunk.tar.gz" > "$out/chunk.log" 2>&1
    echo "chunk: exit $? (0 complete, 3 more to do, 1 failed)" | tee -a "$out/gpu.txt"
    tail -5 "$out/chunk.log"
  fi
fi
if [ "${mps_started:-0}" = 1 ]; then  # leave the machine as it was found
  echo quit | nvidia-cuda-mps-control
fi
