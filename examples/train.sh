#!/bin/sh
# A training-like job for kairos (no GPU needed): counts steps, checkpoints every
# CHECKPOINT_EVERY steps and when asked to (SIGUSR1, what kairos sends before a REQUEUE
# preemption), and resumes from its checkpoint on the next attempt.
#
#   STEPS=50 CHECKPOINT_EVERY=10 OUT=steps.log kairos submit --qos training -- sh examples/train.sh
#
# Signals are handled at a safe point (top of the loop), so the checkpoint always matches the
# last step written: a resumed run neither skips nor repeats a step.
STEPS=${STEPS:-50}
EVERY=${CHECKPOINT_EVERY:-10}
OUT=${OUT:-/dev/stdout}
dir=${KAIROS_CHECKPOINT_DIR:-.}
step=0
[ -f "$dir/step" ] && step=$(cat "$dir/step")

checkpoint() {
  echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"
  touch "$dir/.kairos-checkpoint"
}

stop=0
trap 'stop=1' USR1
echo "attempt ${KAIROS_RESTART_COUNT:-0} resumes at step $step"
while [ "$step" -lt "$STEPS" ]; do
  if [ "$stop" = 1 ]; then
    checkpoint
    echo "checkpointed at step $step; exiting for preemption"
    exit 0
  fi
  step=$((step + 1))
  echo "step $step" >> "$OUT"
  [ $((step % EVERY)) -eq 0 ] && checkpoint
  sleep 0.1
done
checkpoint
echo "done at step $step"
