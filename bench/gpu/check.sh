#!/usr/bin/env bash
# The CUDA and NCCL paths on a machine with one GPU, in one go (a few minutes):
#   bash bench/gpu/check.sh [OUTDIR]
# One GPU allows one NCCL rank (NCCL refuses two ranks on one device), so NCCL is checked at
# world size 1 and the late rank with four gloo ranks whose tensors share the GPU. Everything it
# ran and wrote is packed into OUTDIR/gpu.tar.gz; its last lines say what each step returned.
set -u
OUTDIR=${1:-${OUT:-/tmp/gpu_out}}
W=/tmp/commdebug_gpu
rm -rf "$W"; mkdir -p "$W" "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
RUN="$PY -m torch.distributed.run --standalone"
step() {  # step NAME TIMEOUT CMD...: log to $W/NAME.log, say its exit status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$W/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s" | tee -a "$W/steps.txt"
}
{ nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name())"; } >"$W/env.txt" 2>&1
cat "$W/env.txt"
step build 120 $PY setup.py -q build_ext --inplace
J=bench/gpu/nccl_job.py
step ref 120 env REF="$W/ref.json" $RUN --nproc-per-node 1 $J
step sync 150 $RUN --nproc-per-node 1 -m commdebug run -o "$W/sync" --timing --profile-steps 2-3 -- $J
step light 120 $RUN --nproc-per-node 1 -m commdebug run -o "$W/light" --light --timing -- $J
step nvtx 120 env COMMDEBUG_NVTX=1 $RUN --nproc-per-node 1 -m commdebug run -o "$W/nvtx" --timing -- $J
step async 120 $RUN --nproc-per-node 1 -m commdebug run -o "$W/async" --timing async -- $J
step async_hook 120 env COMMDEBUG_NCCL_COMPLETION_HOOK=1 $RUN --nproc-per-node 1 -m commdebug run -o "$W/async_hook" --timing async -- $J
# timing="events": its latencies against the profiler's NCCL kernels on the same steps, and the
# step time bare, under --timing events and under --timing sync (bench/gpu/events_check.py)
step events 150 $RUN --nproc-per-node 1 -m commdebug run -o "$W/events" --timing events --profile-steps 2-3 -- $J
step steps_bare 150 env STEPS="$W/steps_bare.json" STEP_COUNT=20 $RUN --nproc-per-node 1 $J
step steps_events 150 env STEPS="$W/steps_events.json" STEP_COUNT=20 $RUN --nproc-per-node 1 -m commdebug run -o "$W/steps_events" --light --timing events -- $J
step steps_sync 150 env STEPS="$W/steps_sync.json" STEP_COUNT=20 $RUN --nproc-per-node 1 -m commdebug run -o "$W/steps_sync" --light --timing sync -- $J
step events_check 60 sh -c "$PY bench/gpu/events_check.py $W | tee $W/events_check.txt"
step fr 120 env TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_ENABLE_TIMING=1 FR="$W/fr/rank0" $RUN --nproc-per-node 1 $J
step late 180 $RUN --nproc-per-node 4 -m commdebug run -o "$W/late" --timing --profile-steps 1-3 -- bench/gpu/late_gpu.py
for d in sync light events nvtx async async_hook fr late; do
  [ -d "$W/$d" ] || continue
  step "check_$d" 60 $PY -m commdebug check "$W/$d"
  step "report_$d" 60 sh -c "$PY -m commdebug report $W/$d --json > $W/report_$d.json"
done
step overlap_sync 60 sh -c "$PY -m commdebug overlap $W/sync --json > $W/overlap_sync.json"
step overlap_late 60 sh -c "$PY -m commdebug overlap $W/late --json > $W/overlap_late.json"
step report_late_text 60 $PY -m commdebug report "$W/late"
tar czf "$OUTDIR/gpu.tar.gz" -C "$W" . && ls -l "$OUTDIR"
cat "$W/steps.txt"
