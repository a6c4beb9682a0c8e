#!/bin/bash
# One short GPU lease, spent in issue 40's order: the CUDA tests, the scan benchmark at 02's gpu
# sizes, then one chunk of 02's gpu profile. Everything it measures lands in $OUT (at most 8 files).
#
# Here, before the lease (copies the offline data the device cannot reach into an ignored folder):
#     bash bench/gpu_lease.sh --prepare
# On the device (the `run` tool; carry .lease), with the seconds the whole script may take (keep
# them under the command's limit; the chunk gets what the tests and the scan leave, less a margin):
#     bash bench/gpu_lease.sh $OUT 560
# Back here: python -m nodelm_lib import-runs <files_at>/chunk.tar.gz --store results/runs/gpu
# (commit the records; the next lease continues where this chunk stopped), and keep the test log,
# the scan table and the chunk's log with the notes.
set -u
if [ "${1:-}" = "--prepare" ]; then
  shared=$(cd "$(dirname "$0")/../.." && pwd)/shared/data
  mkdir -p .lease/data
  cp -r "$shared/wikitext-2-v1" "$shared/tiktoken_cache" .lease/data/
  grep -qx '/.lease/' .git/info/exclude 2>/dev/null || echo '/.lease/' >> .git/info/exclude
  du -sh .lease
  exit 0
fi
out=${1:?usage: bash bench/gpu_lease.sh OUT_DIR [seconds for the whole script] (or --prepare, here)}
total=${2:-560}
started=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NODELM_DATA_DIR=$PWD/.lease/data MPLBACKEND=Agg
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/gpu.txt"

# 1. CUDA tests (about a minute)
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py > "$out/test_cuda.log" 2>&1
echo "test_cuda: exit $?" | tee -a "$out/gpu.txt"

# 2. the scan candidates at 02's gpu sizes: which one the layer should run on CUDA
timeout 150 python3 bench/scan.py --device cuda --batch 32 --seq 128 --channels 256 > "$out/scan_cuda.txt" 2>&1
echo "scan: exit $?" | tee -a "$out/gpu.txt"

# 3. a chunk of 02's gpu profile: runs that fit in what is left, records packed. The margin covers
# start-up and packing; should a run still overrun, SIGINT (not timeout's SIGTERM) lets the chunk
# pack what was stored before the command's own limit kills everything.
left=$(( total - ($(date +%s) - started) ))
budget=$(( left - 60 ))
echo "chunk budget: ${budget} s of ${left} s left" | tee -a "$out/gpu.txt"
[ "$budget" -gt 60 ] || { echo "no time left for a chunk" | tee -a "$out/gpu.txt"; exit 0; }
timeout -s INT -k 20 $(( left - 15 )) \
  python3 -m nodelm_lib chunk 02_seed_comparison --profile gpu --budget "$budget" --unknown-run-s 150 \
  --archive "$out/chunk.tar.gz" \
  > "$out/chunk.log" 2>&1
echo "chunk: exit $? (0 complete, 3 more to do, 1 failed)" | tee -a "$out/gpu.txt"
tail -5 "$out/chunk.log"
