#!/usr/bin/env bash
# --save under SIGINT and SIGTERM, end to end (the real binary): a `run --save` over an existing
# checkpoint, sharded one tensor per file so the save is many writes, is interrupted at the first
# temporary file of its save (the directory polled) and at a spread of fixed delays (before the
# save, or after it finished). Whatever the moment, the process ends with the signal's
# conventional status 128 + N (or 0 when it finished first), no *.tmp.* file is left, and the
# directory holds one complete checkpoint, the old or the new, that `run --weights` loads.
# Usage: save_signal.sh TSPEMU
set -u
set -m  # job control: a background job of a script would otherwise ignore SIGINT
tspemu=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "save_signal.sh: FAILED: $*" >&2; exit 1; }
model=(-q --layers 8 --hidden 256 --heads 4 --kv-heads 4 --ffn 512 --vocab 256 --seq 64 --no-check)
"$tspemu" run "${model[@]}" --save "$dir/old" >"$dir/first.txt" 2>&1 ||
  fail "the first save: $(cat "$dir/first.txt")"
interrupted=0 during_save=0 runs=0

# One interrupted run: SIGNAL, then WHEN: a delay in seconds, or "save" for the first temporary.
interrupt() {
  local sig=$1 when=$2 saw=0
  rm -rf "$dir/ckpt"
  cp -r "$dir/old" "$dir/ckpt"
  "$tspemu" run "${model[@]}" --seed 7 --save "$dir/ckpt" --save-shard-size 1 \
    >"$dir/out.txt" 2>&1 &
  local pid=$!
  if [ "$when" = save ]; then
    # A shard's temporary: the save has begun (--save's check at start-up makes one beside
    # config.json only).
    until compgen -G "$dir/ckpt/model-*.tmp.*" >/dev/null || ! kill -0 "$pid" 2>/dev/null; do :; done
    compgen -G "$dir/ckpt/model-*.tmp.*" >/dev/null && saw=1
  else
    sleep "$when"
  fi
  kill -s "$sig" "$pid" 2>/dev/null
  wait "$pid"
  local status=$? want=$((128 + $(kill -l "$sig")))
  runs=$((runs + 1))
  [ "$status" -eq 0 ] || [ "$status" -eq "$want" ] ||
    fail "SIG$sig at $when: exit $status, expected $want or 0: $(tail -3 "$dir/out.txt")"
  [ "$status" -eq "$want" ] && interrupted=$((interrupted + 1))
  local old_intact=0
  diff -r "$dir/old" "$dir/ckpt" >/dev/null && old_intact=1
  # Interrupted while staging: the old checkpoint byte for byte. Otherwise the new one, whole.
  [ "$saw" -eq 1 ] && [ "$status" -eq "$want" ] && [ "$old_intact" -eq 1 ] &&
    during_save=$((during_save + 1))
  [ "$old_intact" -eq 1 ] || [ -f "$dir/ckpt/model.safetensors.index.json" ] ||
    fail "SIG$sig at $when: neither the old checkpoint nor the new: $(ls "$dir/ckpt")"
  local leftovers
  leftovers=$(find "$dir/ckpt" -name '*.tmp.*')
  [ -z "$leftovers" ] || fail "SIG$sig at $when left: $leftovers"
  "$tspemu" run -q --seq 64 --no-check --weights "$dir/ckpt" >"$dir/load.txt" 2>&1 ||
    fail "SIG$sig at $when: the checkpoint left does not load: $(tail -3 "$dir/load.txt")"
}

for sig in INT TERM; do
  for when in save save save 0.05 0.3 0.6 1.0; do interrupt "$sig" "$when"; done
done
[ "$during_save" -gt 0 ] || fail "no signal arrived during a save in $runs runs"
echo "save_signal.sh: $interrupted of $runs runs interrupted ($during_save during the save)," \
  "every checkpoint left whole"
