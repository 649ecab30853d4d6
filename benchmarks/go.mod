module github.com/xdplb/xdplb/benchmarks

go 1.26.0

replace github.com/xdplb/xdplb => ../

require (
	github.com/dchest/siphash v1.2.2
	github.com/google/gopacket v1.1.19
	github.com/kkdai/maglev v0.2.0
	github.com/puzpuzpuz/xsync/v4 v4.5.0
	github.com/stretchr/testify v1.12.1
	github.com/xdplb/xdplb v0.0.0-00010101000000-000000000000
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
