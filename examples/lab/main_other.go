//go:build !linux

// Command lab runs the whole xdplb system in network namespaces; it needs
// Linux.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "lab: needs Linux (network namespaces, XDP, AF_XDP)")
	os.Exit(2)
}
