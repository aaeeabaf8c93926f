cd /work/main
python benchmarks/null_gateway.py --step-ms 155 --burn > /tmp/r10/ng.port &
NG=$!
sleep 4
PORT=$(awk '{print $2}' /tmp/r10/ng.port)
for round in 1 2; do
  for cfg in "httpx asyncio" "aiohttp asyncio" "httpx uvloop" "aiohttp uvloop"; do
    set -- $cfg
    L=/tmp/r10/nullonly_$1_$2_${round}.log
    python benchmarks/serving.py --url http://127.0.0.1:$PORT --key sk-null --concurrency 16 --requests 64 --max-tokens 64 --threads 1 --no-engine --http-client $1 --loop $2 --json > $L 2>&1
    echo "$1 $2 $round $(grep '^gateway' $L | tr ' ' '\n' | grep -E 'paired_overhead_p(50|99)' | tr '\n' ' ') $(grep '^client_floor' $L | tr ' ' '\n' | grep ttft_p50)"
  done
done
kill $NG
