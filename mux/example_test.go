package mux_test

import (
	"fmt"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/mux"
)

const exampleDoc = `
version: 3
hash_seed: 0x5eed
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - name: vm-a
        address: 198.19.1.1
        port: 8080
        mac: "02:00:00:00:01:01"
        host: 198.19.0.1
      - name: vm-b
        address: 198.19.1.2
        port: 8080
        mac: "02:00:00:00:01:02"
        host: 198.19.0.2
        weight: 2
`

// A Mux's plan is everything it will run for a document — rules with
// their Maglev tables, steering entries, probes, announcements — built
// with no I/O, so it can be shown (mux -plan) or tested before a node
// applies it.
func ExampleNewPlan() {
	doc, err := control.Parse([]byte(exampleDoc))
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := mux.NewPlan(doc, "mux-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(p)
	// Output:
	// version 3, hash seed 0x5eed
	// vip web: 198.18.100.1 proto 6 port 80 vni 100, 5-tuple, table 4093, 2 backends
	//   backend vm-a: 198.19.1.1 port 8080 weight 1 via 198.19.0.1
	//   backend vm-b: 198.19.1.2 port 8080 weight 2 via 198.19.0.2
	// steer 198.18.100.1 proto 6 port 80
	// steer 198.18.100.1 proto 1 port 0
	// announce 198.18.100.1/32 (when servable)
}

// The diff of two plans says what a reload must change: here a backend
// added to one VIP rebuilds that VIP's Maglev table and nothing else.
func ExamplePlan_Diff() {
	plan := func(text string) *mux.Plan {
		doc, err := control.Parse([]byte(text))
		if err != nil {
			panic(err)
		}
		p, err := mux.NewPlan(doc, "mux-1")
		if err != nil {
			panic(err)
		}
		return p
	}
	old := plan(exampleDoc)
	next := plan(exampleDoc[:len(exampleDoc)-1] + `
      - name: vm-c
        address: 198.19.1.3
        port: 8080
        mac: "02:00:00:00:01:03"
        host: 198.19.0.2
`)
	d := old.Diff(next)
	fmt.Println("changed VIPs:", d.ChangedVIPs, "tables:", d.Tables)
	fmt.Println("steering:", len(d.SteerAdded), "added,", len(d.SteerRemoved), "removed; BGP:", d.BGP, "hash seed:", d.HashSeed)
	fmt.Println("nothing from a plan to itself:", next.Diff(next).Empty())
	// Output:
	// changed VIPs: [web] tables: [web]
	// steering: 0 added, 0 removed; BGP: false hash seed: false
	// nothing from a plan to itself: true
}
