# Sourced by the GPU check scripts (benchmarks/gpu_check.sh, gpu_study_check.sh) from the repository root.
# On a lent GPU machine with the ignored folder .gpu/ carried along: the wheels its image lacks
# (.gpu/whl, for its Python) go into /tmp/site, and the data is .gpu/data. Elsewhere (a CPU rehearsal) the
# data is CLSR_DATA_DIR, else .gpu/data. Either way this checkout's package (and clsr_bench), offline.
if [ -d .gpu/whl ] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/platform:$PWD/benchmarks CLSR_DATA_DIR=$PWD/.gpu/data
else
  export PYTHONPATH=$PWD/platform:$PWD/benchmarks CLSR_DATA_DIR=${CLSR_DATA_DIR:-$PWD/.gpu/data}
fi
if [ ! -d "$CLSR_DATA_DIR" ]; then
  echo "no data folder $CLSR_DATA_DIR: carry .gpu/data (see the script's header), or set CLSR_DATA_DIR (a CPU rehearsal: ../shared/data)" >&2
  exit 1
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
