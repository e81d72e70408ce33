#!/usr/bin/env bash
# Side by side with NVIDIA Dynamo 1.6.1 (issue #18): the reference kit's aiperf workload B
# (`bench.sh`: 32 prefixes x 2048 + 256 tokens, OSL 64, concurrency 16, 400 requests) against
# Dynamo's frontend + 4 mockers (`start_dynamo.sh MODE 4`) and against `dynamo run` of the same
# graph (4 `dynamo-mocker` workers), 640 blocks of 64 tokens per worker, same timing model and
# speedup. Runs alternate (pair 1: Dynamo then ours, pair 2: ours then Dynamo, ...), each on a
# freshly started stack, so both see the same cold caches and the machine's drift cancels out
# in the ratios of back-to-back pairs. Prints the kit's table and ours/Dynamo ratios per pair.
#
# With PROBE=overhead it runs the kit's `overhead.sh` instead (wrk, 32 connections in a closed
# loop, small chat requests: req/s and frontend CPU per request, the issue's "small requests"),
# at SPEEDUP 1000 and MODES "kv" unless set.
#
# Usage: scripts/side_by_side.sh            (make side-by-side)
# Environment (defaults in brackets):
#   PROBE [bench]   bench (aiperf workload B) or overhead (wrk small requests)
#   DYNREF [/root/dynref]   the installed kit (../shared/reference/dynamo-1.6.1, ./install.sh)
#   BIN_DIR [${CARGO_TARGET_DIR:-target}/release]   dynamo, dynamo-epp, dynamo-sidecar, dynamo-mocker
#   PAIRS [2]  MODES ["kv round-robin"]  PORT [8000]  SPEEDUP [1.0]
#   OUT [.cache/side-by-side/DATE]   results: per run the kit's artifacts, summary.tsv, ratios.md
#   OUR_MODEL_DIR [.cache/models/qwen-mock]  (make model); aiperf tokenizes with the kit's copy
# bench.sh's own knobs (REQUESTS, CONCURRENCY, OSL, AIPERF_CPUS, ...) pass through; OSL
# defaults to 64 and AIPERF_CPUS to 1 here (the kit's workload B).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DYNREF="${DYNREF:-/root/dynref}"
BIN_DIR="${BIN_DIR:-${CARGO_TARGET_DIR:-$REPO/target}/release}"
PAIRS="${PAIRS:-2}"
PROBE="${PROBE:-bench}"
case "$PROBE" in
  bench) MODES="${MODES:-kv round-robin}" SPEEDUP="${SPEEDUP:-1.0}" ;;
  overhead) MODES="${MODES:-kv}" SPEEDUP="${SPEEDUP:-1000}" ;;
  *) echo "side_by_side: PROBE is bench or overhead, not $PROBE" >&2; exit 1 ;;
esac
PORT="${PORT:-8000}"
BLOCKS=640
BLOCK_SIZE=64
WORKERS=4
MODEL_NAME=qwen-mock
OUR_MODEL_DIR="${OUR_MODEL_DIR:-$REPO/.cache/models/qwen-mock}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$(realpath -m "${OUT:-$REPO/.cache/side-by-side/$STAMP}")"
export OSL="${OSL:-64}" AIPERF_CPUS="${AIPERF_CPUS:-1}" PORT MODEL_NAME

for f in "$PROBE.sh" start_dynamo.sh stop_dynamo.sh report_table.py .venv/bin/python .venv-bench/bin/aiperf model/qwen-mock/tokenizer.json; do
  [[ -e "$DYNREF/$f" ]] || { echo "side_by_side: no $DYNREF/$f; install the kit: cp -r ../shared/reference/dynamo-1.6.1/* \$DYNREF && \$DYNREF/install.sh" >&2; exit 1; }
done
for b in dynamo dynamo-epp dynamo-sidecar dynamo-mocker; do
  [[ -x "$BIN_DIR/$b" ]] || { echo "side_by_side: no $BIN_DIR/$b; cargo build --release --bins (or set BIN_DIR)" >&2; exit 1; }
done
[[ -f "$OUR_MODEL_DIR/tokenizer.json" ]] || { echo "side_by_side: no $OUR_MODEL_DIR; run make model" >&2; exit 1; }
# overhead.sh reads wrk/chat.lua; the kit ships chat.lua at its top level.
if [[ $PROBE == overhead && ! -e $DYNREF/wrk/chat.lua ]]; then
  mkdir -p "$DYNREF/wrk" && cp "$DYNREF/chat.lua" "$DYNREF/wrk/chat.lua"
fi

TMP="$(mktemp -d)"
DYN_RUN="$TMP/dynamo-run"   # the kit's pids file and discovery store, ours alone
OUR_RUN="$TMP/ours-run"     # the pids file bench.sh's CPU sampler reads for our processes
OUR_PID=""
OUR_ADMIN=""
mkdir -p "$OUT/logs" "$OUR_RUN" "$TMP/bin"
touch "$OUR_RUN/pids"
rm -f "$OUT"/logs/*.log

stop_dynamo() { RUN_DIR="$DYN_RUN" "$DYNREF/stop_dynamo.sh" > /dev/null 2>&1 || true; }
stop_ours() {
  [[ -n "$OUR_PID" ]] || return 0
  # `dynamo run` stops its children on SIGTERM; it runs in its own session, so the group
  # is exactly what this script started.
  kill -TERM -- "-$OUR_PID" 2> /dev/null || true
  for _ in $(seq 1 75); do kill -0 "$OUR_PID" 2> /dev/null || break; sleep 0.2; done
  if kill -0 "$OUR_PID" 2> /dev/null; then
    kill -KILL -- "-$OUR_PID" 2> /dev/null || true
    # Its children run in groups of their own: a killed runner leaves them behind.
    while read -r _ pid; do kill -KILL "$pid" 2> /dev/null || true; done < "$OUR_RUN/pids"
  fi
  wait "$OUR_PID" 2> /dev/null || true
  OUR_PID=""
  : > "$OUR_RUN/pids"
}
cleanup() { stop_ours; stop_dynamo; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
# A copy, so that a rebuild in the shared target directory cannot change binaries mid-series.
cp "$BIN_DIR"/{dynamo,dynamo-epp,dynamo-sidecar,dynamo-mocker} "$TMP/bin/"
BIN_DIR="$TMP/bin"

port_free() { ! (exec 3<> "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null; }
wait_port_free() {
  for _ in $(seq 1 60); do port_free && return 0; sleep 0.5; done
  echo "side_by_side: port $PORT still in use" >&2; return 1
}

# The kit's graph as a DynamoGraphDeployment (e2e/tests/graphs/pressure-mocker.yaml with
# the kit's capacity and timing): the mocker flags are start_dynamo.sh's, by our names.
GRAPH="$TMP/workload-b.yaml"
cat > "$GRAPH" << EOF
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata:
  name: side-by-side
spec:
  backendFramework: mocker
  services:
    epp:
      componentType: epp
      replicas: 1
    worker:
      componentType: worker
      replicas: $WORKERS
      extraPodSpec:
        mainContainer:
          command: ["dynamo-mocker"]
          args: [--model-name, $MODEL_NAME, --num-gpu-blocks, "$BLOCKS", --block-size, "$BLOCK_SIZE",
                 --max-num-seqs, "256", --max-num-batched-tokens, "8192", --speedup-ratio, "$SPEEDUP"]
EOF

start_ours() { # MODE LOG
  local admin
  admin="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  OUR_ADMIN=$admin
  setsid "$BIN_DIR/dynamo" run -f "$GRAPH" --model-path "$OUR_MODEL_DIR" --port "$PORT" \
    --router-mode "$1" --admin-port "$admin" --bin-dir "$BIN_DIR" --no-planner > "$2" 2>&1 < /dev/null &
  OUR_PID=$!
  local deadline=$((SECONDS + 120)) graph=""
  until graph="$(curl -sf "http://127.0.0.1:$admin/graph")" \
    && [[ "$(jq '[.services[][] | select(.ready)] | length' <<< "$graph")" == "$WORKERS" ]] \
    && curl -sf "http://127.0.0.1:$PORT/v1/models" | grep -q "\"$MODEL_NAME\""; do
    kill -0 "$OUR_PID" 2> /dev/null || { echo "side_by_side: dynamo run exited; see $2" >&2; return 1; }
    ((SECONDS < deadline)) || { echo "side_by_side: dynamo run not ready in 120 s; see $2" >&2; return 1; }
    sleep 1
  done
  # The roles bench.sh sums: "frontend" (the picker), "mocker*" (engines); sidecars apart.
  jq -r '"frontend \(.epp_pid)", (.services[][] | "mocker\(.index) \(.engine_pid)", "sidecar\(.index) \(.sidecar_pid)")' \
    <<< "$graph" > "$OUR_RUN/pids"
  echo "$1 $WORKERS $PORT $SPEEDUP blocks=$BLOCKS bs=$BLOCK_SIZE stack=ours" > "$OUR_RUN/config"
  sleep 2
}

# The engines' own TTFT (vllm:time_to_first_token_seconds, from the engine's arrival),
# summed over our workers: "SUM COUNT" into FILE. The kit reads only the frontend's
# /metrics; with this, picker TTFT - round trip - engine TTFT splits our time by hop.
engine_ttft() { # FILE
  local graph
  graph="$(curl -sf "http://127.0.0.1:$OUR_ADMIN/graph")" || { echo "nan nan" > "$1"; return 0; }
  jq -r '.services[][] | .engine_metrics' <<< "$graph" | while read -r url; do curl -sf "$url" || true; done \
    | awk '/^vllm:time_to_first_token_seconds_sum/ {s += $2} /^vllm:time_to_first_token_seconds_count/ {c += $2}
           END {print s + 0, c + 0}' > "$1"
}

run_one() { # STACK MODE LABEL
  local stack=$1 mode=$2 label=$3 log="$OUT/logs/$3.log" run_dir
  wait_port_free || return 1
  echo "== $label" >&2
  if [[ $stack == dynamo ]]; then
    run_dir="$DYN_RUN"
    RUN_DIR="$DYN_RUN" LOG_DIR="$TMP/dynamo-logs" NUM_GPU_BLOCKS=$BLOCKS BLOCK_SIZE=$BLOCK_SIZE SPEEDUP=$SPEEDUP \
      "$DYNREF/start_dynamo.sh" "$mode" "$WORKERS" >&2 \
      || { cat "$TMP"/dynamo-logs/*.log > "$log" 2> /dev/null; stop_dynamo; return 1; }
  else
    run_dir="$OUR_RUN"
    start_ours "$mode" "$log" || { stop_ours; return 1; }
  fi
  local rc=0
  if [[ $PROBE == overhead ]]; then
    RUN_DIR="$run_dir" "$DYNREF/overhead.sh" "$label" > "$TMP/overhead.txt" || rc=$?
    cat "$TMP/overhead.txt" >&2
    cp "$TMP/overhead.txt" "$DYNREF/results/$label/overhead.txt" 2> /dev/null || rc=1
  else
    [[ $stack == ours ]] && engine_ttft "$TMP/engine_before"
    RUN_DIR="$run_dir" "$DYNREF/bench.sh" "$label" >&2 || rc=$?
  fi
  if [[ $stack == ours && $PROBE == bench ]]; then
    engine_ttft "$TMP/engine_after"
    read -r s0 c0 < "$TMP/engine_before"
    read -r s1 c1 < "$TMP/engine_after"
    python3 -c 'import json, sys; s0, c0, s1, c1 = map(float, sys.argv[2:]); json.dump({"engine_ttft_ms": 1000 * (s1 - s0) / (c1 - c0) if c1 > c0 else float("nan")}, open(sys.argv[1], "w"))' \
      "$DYNREF/results/$label/engine_side.json" "$s0" "$c0" "$s1" "$c1" || true
  fi
  if [[ $stack == dynamo ]]; then
    stop_dynamo
    cat "$TMP"/dynamo-logs/*.log > "$log" 2> /dev/null || true
    rm -rf "$TMP/dynamo-logs"
  else
    stop_ours
  fi
  rm -rf "${OUT:?}/$label"
  cp -r "$DYNREF/results/$label" "$OUT/$label"
  return "$rc"
}

labels=()
for ((pair = 1; pair <= PAIRS; pair++)); do
  for mode in $MODES; do
    # Alternate who goes first, so a machine that speeds up or slows down favours neither.
    order=(dynamo ours); ((pair % 2 == 0)) && order=(ours dynamo)
    for stack in "${order[@]}"; do
      label="sbs-$STAMP-p$pair-$stack-$mode"
      if run_one "$stack" "$mode" "$label"; then labels+=("$label"); else echo "side_by_side: $label failed" >&2; fi
    done
  done
done
((${#labels[@]} > 0)) || { echo "side_by_side: no run succeeded" >&2; exit 1; }

if [[ $PROBE == overhead ]]; then
  # overhead.sh prints one line per run: "OVERHEAD label=... req_s=... fe_cpu_ms_per_req=... | config".
  python3 - "$OUT" "${labels[@]}" << 'EOF' | tee "$OUT/ratios.md"
import os, sys
out, labels = sys.argv[1], sys.argv[2:]
runs = {}  # (pair, mode) -> {stack: fields}
for label in labels:
    line = open(os.path.join(out, label, "overhead.txt")).read().split("|")[0].split()
    fields = dict(kv.split("=", 1) for kv in line[1:])
    _, _, pair, stack, mode = label.split("-", 4)
    runs.setdefault((int(pair[1:]), mode), {})[stack] = fields
f = lambda r, k: float(r[k])
print("| pair | mode | req/s ours / Dynamo | latency p50 ms ours / Dynamo | frontend CPU ms per request ours / Dynamo | req/s ratio | CPU ratio |")
print("|---|---|---|---|---|---|---|")
for (pair, mode), s in sorted(runs.items()):
    if "ours" in s and "dynamo" in s:
        o, d = s["ours"], s["dynamo"]
        print(f"| {pair} | {mode} | {f(o, 'req_s'):.0f} / {f(d, 'req_s'):.0f} | {f(o, 'lat_p50_ms'):.2f} / {f(d, 'lat_p50_ms'):.2f} "
              f"| {f(o, 'fe_cpu_ms_per_req'):.2f} / {f(d, 'fe_cpu_ms_per_req'):.2f} "
              f"| {f(o, 'req_s') / f(d, 'req_s'):.2f} | {f(o, 'fe_cpu_ms_per_req') / f(d, 'fe_cpu_ms_per_req'):.2f} |")
EOF
  echo "side_by_side: results in $OUT" >&2
  exit 0
fi

# This run's rows of the kit's summary, the kit's table, then ours/Dynamo per pair.
python3 - "$DYNREF/results/summary.tsv" "$OUT/summary.tsv" "${labels[@]}" << 'EOF'
import sys
src, dst, labels = sys.argv[1], sys.argv[2], set(sys.argv[3:])
lines = open(src).read().splitlines()
with open(dst, "w") as f:
    f.write(lines[0] + "\n")
    f.writelines(l + "\n" for l in lines[1:] if l.split("\t")[0] in labels)
EOF
{
  echo "# Side by side with Dynamo 1.6.1, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
  echo
  echo "PAIRS=$PAIRS MODES=\"$MODES\" SPEEDUP=$SPEEDUP OSL=$OSL AIPERF_CPUS=$AIPERF_CPUS workers=$WORKERS x $BLOCKS blocks x $BLOCK_SIZE tokens"
  echo
  "$DYNREF/.venv-bench/bin/python" "$DYNREF/report_table.py" "$OUT"
  echo
  python3 - "$OUT/summary.tsv" << 'EOF'
import csv, sys
rows = {r["label"]: r for r in csv.DictReader(open(sys.argv[1]), delimiter="\t")}
runs = {}  # (pair, mode) -> {stack: row}
for label, r in rows.items():
    _, _, pair, stack, mode = label.split("-", 4)
    runs.setdefault((int(pair[1:]), mode), {})[stack] = r
f = lambda r, k: float(r[k])
print("| pair | mode | hit % ours / Dynamo | TTFT p50 ms ours / Dynamo | TTFT p99 ms ours / Dynamo | req/s ours / Dynamo | hit ratio | TTFT p50 ratio | TTFT p99 ratio | req/s ratio |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (pair, mode), s in sorted(runs.items()):
    if "ours" not in s or "dynamo" not in s:
        continue
    o, d = s["ours"], s["dynamo"]
    cells = [f"{f(o, k):.1f} / {f(d, k):.1f}" for k in ("cache_hit_pct", "ttft_p50", "ttft_p99")]
    cells.append(f"{f(o, 'req_s'):.2f} / {f(d, 'req_s'):.2f}")
    ratios = [f"{f(o, k) / f(d, k):.2f}" for k in ("cache_hit_pct", "ttft_p50", "ttft_p99", "req_s")]
    print(f"| {pair} | {mode} | " + " | ".join(cells + ratios) + " |")
# kv's margin over round-robin within each stack (the issue's "kv beats round-robin by at least Dynamo's margin").
margins = []
for (pair, mode), s in sorted(runs.items()):
    rr = runs.get((pair, "round-robin"), {})
    if mode != "kv":
        continue
    for stack in ("ours", "dynamo"):
        if stack in s and stack in rr:
            kv, r = s[stack], rr[stack]
            margins.append(f"| {pair} | {stack} | {f(kv, 'cache_hit_pct') / f(r, 'cache_hit_pct'):.2f} | "
                           f"{f(r, 'ttft_p50') / f(kv, 'ttft_p50'):.2f} | {f(r, 'ttft_p99') / f(kv, 'ttft_p99'):.2f} |")
if margins:
    print()
    print("kv over round-robin (above 1: kv better)")
    print()
    print("| pair | stack | hit kv / rr | TTFT p50 rr / kv | TTFT p99 rr / kv |")
    print("|---|---|---|---|---|")
    print("\n".join(margins))
EOF
  echo
  echo "Where the time to first token goes (server-side means, ms; the frontend's histograms over"
  echo "the run, and for ours the engines' own TTFT): round trip - engine = sidecar, HTTP and the"
  echo "engine's intake; TTFT - round trip = the frontend's own time (preprocess, route, relay)."
  echo
  python3 - "$OUT" "${labels[@]}" << 'EOF'
import json, os, sys
out, labels = sys.argv[1], sys.argv[2:]
def read(label, name):
    try:
        return json.load(open(os.path.join(out, label, name)))
    except (OSError, ValueError):
        return {}
print("| run | TTFT | preprocess | route | round trip | engine TTFT | round trip - engine | TTFT - round trip |")
print("|---|---|---|---|---|---|---|---|")
for label in labels:
    s, e = read(label, "server_side.json"), read(label, "engine_side.json")
    g = lambda d, k: float(d.get(k, float("nan")))
    ttft, rt, eng = g(s, "fe_ttft_ms"), g(s, "rp_roundtrip_ttft_ms"), g(e, "engine_ttft_ms")
    cells = [ttft, g(s, "preprocess_ms"), g(s, "route_ms"), rt, eng, rt - eng, ttft - rt]
    print(f"| {label.split('-', 2)[2]} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
EOF
} | tee "$OUT/ratios.md"
echo "side_by_side: results in $OUT" >&2
