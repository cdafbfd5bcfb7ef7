#!/usr/bin/env bash
# `make demo`: Bootseer end to end on the embedded local store.
# A multi-GB sparse "checkpoint" in the content-addressed store (verified ranged reads, a
# corruption caught), a torch checkpoint loaded through the API and the FUSE mount, and a
# real image started lazily in runc: cold and recorded, then prefetched, then warmed; and a
# dependency install snapshotted once, then restored instead of re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
work=build/demo
$BIN/bootseer env unmount "$PWD/$work/env/venv" >/dev/null 2>&1 || true  # an earlier demo's
rm -rf "$work" && mkdir -p "$work"
export BOOTSEER_STORE="file://$PWD/$work/store"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "configuration (bootseer config show)"
$BIN/bootseer config show

step "a 4 GiB sparse checkpoint with three 8 MiB random regions"
src=$work/checkpoint.bin
truncate -s 4G "$src"
for off_mib in 0 2047 4088; do
  head -c 8M /dev/urandom | dd of="$src" bs=1M seek="$off_mib" conv=notrunc status=none
done
ls -lsh "$src"

step "bootseer store put (hashes every byte; holes stay holes)"
start=$(date +%s%N)
digest=$($BIN/bootseer store put "$src" --ref demo/checkpoint)
echo "stored $digest in $(( ($(date +%s%N) - start) / 1000000 )) ms"
$BIN/bootseer store stat demo/checkpoint

step "ranged reads, verified chunk by chunk, compared with dd on the source"
for spec in "0 4096" "$((2047 << 20)) 16777216" "$(((2 << 30) - 100)) 200" "$(((4 << 30) - 4096)) 4096"; do
  set -- $spec
  want=$(dd if="$src" bs=4096 iflag=skip_bytes,count_bytes skip="$1" count="$2" status=none | sha256sum | cut -c1-16)
  got=$($BIN/bootseer store get demo/checkpoint --offset "$1" --length "$2" | sha256sum | cut -c1-16)
  printf 'offset %-11s length %-9s  store %s  source %s  %s\n' "$1" "$2" "$got" "$want" \
    "$([ "$got" = "$want" ] && echo ok || { echo MISMATCH; exit 1; })"
done

step "whole object back to a file, compared with the source"
$BIN/bootseer store get demo/checkpoint -o "$work/copy.bin"
cmp "$src" "$work/copy.bin" && echo "identical ($(du -h "$work/copy.bin" | cut -f1) on disk: sparse)"

step "a flipped byte in the store is caught"
hex=${digest#sha256:}
blob="$work/store/blobs/sha256/${hex:0:2}/$hex"
printf '\xff' | dd of="$blob" bs=1 seek=$((2047 << 20)) conv=notrunc status=none
if $BIN/bootseer store get demo/checkpoint --offset $((2047 << 20)) --length 10 >/dev/null; then
  echo "corruption NOT detected"; exit 1
fi
echo "(the error above is the expected outcome)"

step "a real torch checkpoint: staged in with bootseer ckpt put"
$BIN/python - "$work/model.pt" <<'PY'
import sys, torch
g = torch.Generator().manual_seed(0)
state = {f"layer{i}.weight": torch.randn(2048, 2048, generator=g) for i in range(16)}
torch.save(state, sys.argv[1])
print(f"saved {len(state)} tensors, {sum(t.numel() * 4 for t in state.values()) >> 20} MiB")
PY
ckpt_url="file://$PWD/$work/checkpoints/step100"
$BIN/bootseer ckpt put "$work/model.pt" "$ckpt_url/model.pt"

step "loaded through the checkpoint-load API (striped reads, no local copy)"
$BIN/python - "$ckpt_url/model.pt" "$work/model.pt" <<'PY'
import sys, time, torch
import bootseer.checkpoint as ckpt
start = time.perf_counter()
state = ckpt.load(sys.argv[1], map_location="cpu", weights_only=True)
took = time.perf_counter() - start
original = torch.load(sys.argv[2], weights_only=True)
assert all(torch.equal(state[k], original[k]) for k in original), "tensors differ"
print(f"bootseer.checkpoint.load: {len(state)} tensors in {took:.2f} s, identical to the original")
PY

step "and through the FUSE mount (bootseer ckpt mount)"
mkdir -p "$work/mnt"
$BIN/bootseer ckpt mount "$ckpt_url" "$work/mnt"
trap '$BIN/bootseer ckpt umount "$work/mnt" 2>/dev/null || true' EXIT
ls -l "$work/mnt"
dd if="$work/mnt/model.pt" of=/dev/null bs=4M 2>&1 | tail -1
cmp "$work/mnt/model.pt" "$work/model.pt" && echo "mounted file identical to the original"
$BIN/bootseer ckpt umount "$work/mnt"
trap - EXIT


step "a real container image (Debian minbase + python3, two layers), converted to a lazy image"
layout=$($BIN/python -c "from bootseer_dev.image import build_image; print(build_image(with_python=True))")
echo "OCI layout: $layout ($(du -sh "$layout/blobs" | cut -f1) of compressed layers)"
export BOOTSEER_CACHE_DIR="$PWD/$work/cache"
start=$(date +%s%N)
$BIN/bootseer image convert "$layout" --name demo-python
echo "converted in $(( ($(date +%s%N) - start) / 1000000 )) ms"

APP='import asyncio, decimal, email.parser, http.client, json, unittest, xml.dom.minidom; print("app up")'

step "cold start, lazy, recorded: python3 in runc on an overlay over the lazy mount"
echo "(only what the start reads is fetched; which blocks, in which order, goes to the hot list)"
$BIN/bootseer image run demo-python --record --stats "$work/cold.json" -- python3 -c "$APP"

step "second start on a fresh node (empty cache): the hot list is prefetched while it starts"
BOOTSEER_CACHE_DIR="$PWD/$work/cache-node2" \
  $BIN/bootseer image run demo-python --no-record --stats "$work/warm.json" -- python3 -c "$APP"

step "bootseer warm on a third node before the job lands there, then its start"
BOOTSEER_CACHE_DIR="$PWD/$work/cache-node3" $BIN/bootseer warm --image demo-python
BOOTSEER_CACHE_DIR="$PWD/$work/cache-node3" \
  $BIN/bootseer image run demo-python --no-record --stats "$work/warmed.json" -- python3 -c "$APP"

step "the three starts side by side"
$BIN/python - "$work" <<'PY'
import json, sys
from pathlib import Path
rows = [("cold, lazy (recording)", "cold.json"), ("fresh node + prefetch", "warm.json"),
        ("after bootseer warm", "warmed.json")]
print(f"{'start':<26}{'seconds':>8}{'store reads':>13}{'MiB fetched':>13}")
for label, name in rows:
    s = json.loads((Path(sys.argv[1]) / name).read_text())
    pre = s.get("prefetch") or {}
    reads = s["fetch_requests"] + pre.get("fetch_requests", 0)
    mib = (s["bytes_fetched"] + pre.get("bytes_fetched", 0)) / 2**20
    print(f"{label:<26}{s['run_seconds']:>8.2f}{reads:>13}{mib:>13.1f}")
print("(local store: the gain here is round trips; with a remote store each one costs a "
      "network round trip — see make bench-image)")
PY

step "bootseer report: each node's startup timeline (created -> rootfs mounted -> exit)"
for node in cache cache-node2 cache-node3; do
  BOOTSEER_CACHE_DIR="$PWD/$work/$node" $BIN/bootseer report --since 1h
done
step "dependencies: the first run installs them and snapshots what the install changed"
venv="$PWD/$work/env/venv"
req="$work/requirements.txt"
echo "numpy==2.4.6" > "$req"
install="python3 -m venv $venv && $venv/bin/pip install -q --disable-pip-version-check -r $req"
start=$(date +%s%N)
key=$($BIN/bootseer env run --path "$venv" --key-file "$req" -- sh -c "$install")
first_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "snapshot key $key"
$BIN/bootseer env show "$key" | sed -n 1,7p  # (sed reads it all: no broken pipe)

step "a restart on a fresh node: the snapshot is restored, the install does not run"
rm -rf "$venv"
start=$(date +%s%N)
$BIN/bootseer env run --path "$venv" --key-file "$req" -- sh -c "$install"
second_ms=$(( ($(date +%s%N) - start) / 1000000 ))
"$venv/bin/python" -c 'import numpy; print("numpy", numpy.__version__, "imports from the restored venv")'
echo "install + snapshot: ${first_ms} ms; restore: ${second_ms} ms"
# As root, the restore mounted the node's unpacked copy of the snapshot: give it back.
$BIN/bootseer env unmount "$venv"

step "a training job restarted through the node agent and the runtime hook"
echo "(each node runs 'bootseer agent'; the job's bundle goes through bootseer-runtime, the"
echo " shim Docker and containerd call instead of runc: it asks the agent for the lazy root,"
echo " and its poststop hook releases it. Inside, the job restores its dependencies with"
echo " 'bootseer env run', reads its checkpoint through the API and signals ready.)"
job=$work/job
mkdir -p "$job/wheels"
echo "numpy==2.4.6" > "$job/requirements.txt"
$BIN/pip download -q --disable-pip-version-check --only-binary :all: --no-deps \
  -d "$job/wheels" -r "$job/requirements.txt"
agents=()
trap 'kill "${agents[@]}" 2>/dev/null || true' EXIT
start_agent() {  # NODE: a node = its own cache directory and agent
  local dir="$PWD/$work/$1"
  mkdir -p "$dir"
  # The operator's policy (docs/SECURITY.md): the job's image may record its hot list,
  # and checkpoints may be staged from the job's checkpoint directory; nothing else.
  BOOTSEER_CACHE_DIR="$dir/cache" BOOTSEER_IMAGE_RECORD_IMAGES=demo-python \
    BOOTSEER_CHECKPOINT_ALLOWED="$ckpt_url/" \
    $BIN/bootseer agent --socket "$dir/agent.sock" >"$dir/agent.log" 2>&1 &
  agents+=($!)
  until BOOTSEER_AGENT_SOCKET="$dir/agent.sock" $BIN/python -c \
      'import os, sys; from bootseer.agents.client import AgentClient; from pathlib import Path
AgentClient(Path(os.environ["BOOTSEER_AGENT_SOCKET"])).health()' 2>/dev/null; do sleep 0.1; done
}
run_job() {  # NODE ID
  local dir="$PWD/$work/$1"
  $BIN/python scripts/demo_job.py --id "$2" --image demo-python --socket "$dir/agent.sock" \
    --cache-dir "$dir/cache" --job-dir "$PWD/$job" --store "$BOOTSEER_STORE" \
    --checkpoint "$ckpt_url/model.pt"
}
on_node() {  # NODE COMMAND...: a bootseer command on that node
  local dir="$PWD/$work/$1"; shift
  BOOTSEER_CACHE_DIR="$dir/cache" BOOTSEER_AGENT_SOCKET="$dir/agent.sock" $BIN/bootseer "$@"
}

step "cold start on node A: image fetched on demand (hot list recorded), dependencies installed"
start_agent node-a
run_job node-a train-cold

step "restart on node B, staged first with bootseer warm (image hot blocks, env, checkpoint)"
start_agent node-b
on_node node-b warm --image demo-python --workload train --env "$(cat "$job/env-key")" \
  --checkpoint "$ckpt_url/model.pt"
echo "(a checkpoint outside the operator's checkpoint.allowed is refused by the root agent:)"
if on_node node-b warm --checkpoint file:///etc/shadow; then echo "NOT refused"; exit 1; fi
run_job node-b train-warm

step "bootseer report: where each start's time went (cold on A, warm on B)"
on_node node-a report --since 1h
on_node node-b report --since 1h
on_node node-a report --since 1h --json > "$work/report-cold.json"
on_node node-b report --since 1h --json > "$work/report-warm.json"
$BIN/python - "$work" <<'PY'
import json, sys
from pathlib import Path
starts = {label: json.loads((Path(sys.argv[1]) / f"report-{label}.json").read_text())[-1]
          for label in ("cold", "warm")}
phases = list(starts["cold"]["breakdown"])
print(f"{'phase':<24}{'cold (node A)':>14}{'warm (node B)':>14}")
for phase in phases:
    cold, warm = (starts[k]["breakdown"].get(phase) for k in ("cold", "warm"))
    print(f"{phase:<24}{cold:>14.2f}{warm:>14.2f}")
cold, warm = (starts[k]["startup_seconds"] for k in ("cold", "warm"))
print(f"{'created -> ready':<24}{cold:>14.2f}{warm:>14.2f}   ({cold / warm:.1f}x faster warm)")
PY
kill "${agents[@]}"; wait "${agents[@]}" 2>/dev/null || true
trap - EXIT

echo
echo "demo finished: store at $work/store, checkpoints at $work/checkpoints"
