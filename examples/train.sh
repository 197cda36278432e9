#!/bin/sh
# A training-like job for kairos (no GPU needed): counts steps, checkpoints every
# CHECKPOINT_EVERY steps and when asked to (the signal in KAIROS_CHECKPOINT_SIGNAL: SIGTERM, as
# Slurm sends, unless the job chose another with --checkpoint-signal: what kairos sends before a
# REQUEUE preemption or an elastic resize), and resumes from its checkpoint on the next attempt,
# on however many GPUs it has.
#
#   STEPS=50 CHECKPOINT_EVERY=10 OUT=steps.log kairos submit --qos training -- sh examples/train.sh
#
# Signals are handled at a safe point (top of the loop), so the checkpoint always matches the
# last step written: a resumed run neither skips nor repeats a step.
STEPS=${STEPS:-50}
EVERY=${CHECKPOINT_EVERY:-10}
OUT=${OUT:-/dev/stdout}
# Optional: a file that gets one line per attempt (attempt, GPU count, GPU ids).
ATTEMPTS=${ATTEMPTS:-/dev/null}
dir=${KAIROS_CHECKPOINT_DIR:-.}
step=0
[ -f "$dir/step" ] && step=$(cat "$dir/step")

checkpoint() {
  echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"
  touch "$dir/.kairos-checkpoint"
}

stop=0
signal=${KAIROS_CHECKPOINT_SIGNAL:-SIGTERM}
trap 'stop=1' "${signal#SIG}"
echo "attempt ${KAIROS_RESTART_COUNT:-0} resumes at step $step on ${KAIROS_GPUS:-?} GPUs"
echo "attempt ${KAIROS_RESTART_COUNT:-0} gpus ${KAIROS_GPUS:-?} devices ${CUDA_VISIBLE_DEVICES:-} step $step world ${WORLD_SIZE:-1}" >> "$ATTEMPTS"
while [ "$step" -lt "$STEPS" ]; do
  if [ "$stop" = 1 ]; then
    checkpoint
    echo "checkpointed at step $step; exiting for preemption or resize"
    exit 0
  fi
  step=$((step + 1))
  echo "step $step" >> "$OUT"
  [ $((step % EVERY)) -eq 0 ] && checkpoint
  sleep 0.1
done
checkpoint
echo "done at step $step"
