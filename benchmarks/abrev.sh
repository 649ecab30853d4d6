#!/usr/bin/env bash
# Measures a change on the Mux and Host Agent pipeline benchmarks: builds
# each package's test binary at a base revision (default main) and from
# the working tree, alternates them round by round (so both see the same
# machine state: on a shared machine only ratios taken this way mean
# anything), and prints each benchmark's CPU ns per packet per round, then
# the medians, and the after/before ratio.
#
#   benchmarks/abrev.sh                 # main against the working tree
#   ROUNDS=9 BENCHTIME=2s benchmarks/abrev.sh 70e4f82
#
# Each run is one process per binary and package with -test.cpu 1; the
# Mux's gopacket peer runs in the "after" binary (x-faster per round).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-main}
rounds=${ROUNDS:-5}
benchtime=${BENCHTIME:-1s}
d=$(mktemp -d)
wt="$d/base"
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$d"' EXIT
git worktree add --detach "$wt" "$base" >/dev/null
for pkg in mux hostagent; do
	(cd "$wt" && go test -c -o "$d/$pkg.before" "./$pkg/")
	go test -c -o "$d/$pkg.after" "./$pkg/"
done
bench() {
	case $1.$2 in
	mux.before) echo 'BenchmarkMuxPipeline/.*/impl=xdplb' ;;
	mux.after) echo 'BenchmarkMuxPipeline/.*/impl=(xdplb|gopacket)' ;;
	hostagent.*) echo 'BenchmarkHostAgentPipeline' ;;
	esac
}
for r in $(seq 1 "$rounds"); do
	echo "round $r/$rounds ($(uptime | sed 's/.*load/load/'))" >&2
	for pkg in mux hostagent; do
		for v in before after; do
			"$d/$pkg.$v" -test.run '^$' -test.bench "$(bench $pkg $v)" -test.cpu 1 -test.benchtime "$benchtime" |
				awk -v v=$v '/^Benchmark/ { for (i = 1; i < NF; i++) {
					if ($(i+1) == "cpu-ns/pkt") print $1, v, $i
					if ($(i+1) == "x-faster") print $1, "x-faster", $i } }'
		done
	done
done | tee "$d/rounds"
echo "medians (cpu-ns/pkt; x-faster: the gopacket peer's wall ns/pkt over ours, same process):"
sort -k1,1 -k2,2 -k3,3n "$d/rounds" | awk '
	{ k = $1 " " $2; v[k, ++n[k]] = $3 }
	END { for (k in n) { m = n[k]; print k, (m % 2 ? v[k, (m+1)/2] : (v[k, m/2] + v[k, m/2+1]) / 2) } }' | sort
# The ratio that means most on a shared machine: after over before within
# each round (the two ran seconds apart), then the median of those.
echo "after/before, per round and median:"
awk '
	$2 == "before" { b[$1] = $3 }
	$2 == "after" && ($1 in b) { r[$1, ++n[$1]] = $3 / b[$1]; delete b[$1] }
	END {
		for (k in n) {
			m = n[k]; s = ""
			for (i = 1; i <= m; i++) { v[i] = r[k, i]; s = s sprintf(" %.2f", v[i]) }
			for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
			printf "%s%s; median %.3f\n", k, s, m % 2 ? v[(m+1)/2] : (v[m/2] + v[m/2+1]) / 2
		}
	}' "$d/rounds" | sort
