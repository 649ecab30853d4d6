module github.com/xdplb/xdplb

go 1.26

require (
	github.com/asavie/xdp v0.3.3
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/cilium/ebpf v0.22.0
	github.com/google/gopacket v1.1.19
	github.com/stretchr/testify v1.12.1
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.43.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
