#!/usr/bin/env bash
# Runs the microbenchmarks the way README.md reports them: ROUNDS separate
# processes per group (default 6), each running our side and the peer's
# side of every comparison back to back, so that the two sides of a ratio
# are measured seconds apart even when the machine's load drifts; then
# benchstat summarises (medians and 95% confidence intervals).
#
#   ./bench.sh                     # every group
#   ./bench.sh parse pipeline      # some groups
#   ROUNDS=10 OUT=/tmp/b ./bench.sh conntable
#
# Groups: parse, maglev-build, maglev-lookup, conntable (2 goroutines),
# conntable-1core, pipeline.
# Results go to $OUT/<group>.txt (default /tmp/xdplb-bench).
#
# PIN=N pins the single-core groups to CPU N with taskset (default: no
# pinning).
set -euo pipefail
cd "$(dirname "$0")"

rounds=${ROUNDS:-6}
pin=${PIN:-}
out=${OUT:-/tmp/xdplb-bench}
mkdir -p "$out"
go test -c -o "$out/bench.test" .

# group name → "GOMAXPROCS benchmark-regexp"
declare -A groups=(
	[parse]="1 ^BenchmarkParse$"
	[maglev-build]="1 ^BenchmarkMaglevBuild$"
	[maglev-lookup]="1 ^BenchmarkMaglevLookup$"
	[conntable]="2 ^BenchmarkConnTable$"
	[conntable-1core]="1 ^BenchmarkConnTable$"
	[pipeline]="1 ^BenchmarkPipeline$"
)
order=(parse maglev-build maglev-lookup conntable conntable-1core pipeline)
[ $# -gt 0 ] && order=("$@")

for g in "${order[@]}"; do
	read -r cpu pattern <<<"${groups[$g]:?unknown group $g}"
	: >"$out/$g.txt"
	for i in $(seq "$rounds"); do
		echo "== $g round $i/$rounds ($(uptime | sed 's/.*load/load/'))" >&2
		run=()
		if [ "$cpu" = 1 ] && [ -n "$pin" ] && command -v taskset >/dev/null; then
			run=(taskset -c "$pin")
		fi
		"${run[@]}" "$out/bench.test" -test.run '^$' -test.bench "$pattern" -test.cpu "$cpu" \
			-test.benchmem -test.count 1 -test.timeout 60m | tee -a "$out/$g.txt"
	done
	go run golang.org/x/perf/cmd/benchstat@latest -col /impl "$out/$g.txt" >"$out/$g.stat" || true
	cat "$out/$g.stat"
done
