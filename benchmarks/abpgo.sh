#!/usr/bin/env bash
# Measures what profile-guided optimisation gains on the Mux and Host Agent
# pipeline benchmarks: builds each package's test binary with and without
# the binary's default.pgo, alternates them round by round (so both see the
# same machine state), and prints each benchmark's CPU ns per packet per
# round, then the medians. Usage: ROUNDS=5 benchmarks/abpgo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
for pkg in mux hostagent; do
	go test -c -o "$d/$pkg.nopgo" "./$pkg/"
	go test -c -pgo="examples/$pkg/default.pgo" -o "$d/$pkg.pgo" "./$pkg/"
done
bench() {
	case $1 in
	mux) echo 'BenchmarkMuxPipeline/.*/impl=xdplb' ;;
	hostagent) echo 'BenchmarkHostAgentPipeline' ;;
	esac
}
for r in $(seq 1 "$rounds"); do
	for pkg in mux hostagent; do
		for v in nopgo pgo; do
			"$d/$pkg.$v" -test.run '^$' -test.bench "$(bench $pkg)" -test.cpu 1 -test.benchtime 1s |
				awk -v v=$v '/^Benchmark/ { for (i = 1; i < NF; i++) if ($(i+1) == "cpu-ns/pkt") print $1, v, $i }'
		done
	done
done | tee "$d/rounds"
echo "medians (cpu-ns/pkt):"
sort -k1,1 -k2,2 -k3,3n "$d/rounds" | awk '
	{ k = $1 " " $2; v[k, ++n[k]] = $3 }
	END { for (k in n) { m = n[k]; print k, (m % 2 ? v[k, (m+1)/2] : (v[k, m/2] + v[k, m/2+1]) / 2) } }' | sort
