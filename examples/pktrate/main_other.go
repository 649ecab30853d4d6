//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "pktrate: the packet-rate harness needs Linux (network namespaces, veth, XDP, AF_XDP)")
	os.Exit(1)
}
