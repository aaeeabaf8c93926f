cd /work/main
KEY=$(cat ${KEYFILE:-/tmp/bench/key})
MODE=$1; PORT=$2; ROUNDS=${3:-2}
for round in $(seq ${FIRST:-1} $ROUNDS); do
  for hc in httpx aiohttp; do
    L=/tmp/r10/${MODE}_${hc}_${round}.log
    python benchmarks/serving.py --url http://127.0.0.1:$PORT --key $KEY --concurrency 16 --requests 64 --max-tokens 64 --threads 1 --no-engine --loaded-floor --http-client $hc --json > $L 2>&1
    python - $L <<'PY'
import json,sys
r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
g,lf,cf,a=r["gateway"],r["loaded_floor"],r["client_floor"],r["api"]
print(sys.argv[1].split("/")[-1], "ours", g["paired_overhead_p50_ms"], g["paired_overhead_p99_ms"], "null", lf["paired_overhead_p50_ms"], lf["paired_overhead_p99_ms"], "idle", cf["ttft_p50_ms"], "itl", a["itl_p50_ms"], "web", g["web_processing_p50_ms"])
PY
  done
done
