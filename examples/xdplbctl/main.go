// Command xdplbctl manages an xdplb fleet whose document is in etcd.
//
//	xdplbctl -etcd http://198.18.0.1:2379 apply -f fleet.yaml
//	xdplbctl -etcd http://198.18.0.1:2379 diff -f fleet.yaml
//	xdplbctl -etcd http://198.18.0.1:2379 status [-o json]
//	xdplbctl -etcd http://198.18.0.1:2379 get
//
// apply validates the file with the nodes' own parser (errors name
// file:line:column and field; nothing is written), refuses a version that
// is not above the fleet's, and writes with a compare-and-swap
// transaction (fleet.Apply). diff says what the file would change. status
// shows every node — role, applied version, sync delay, data path, last
// error — which version is live on how many nodes, and every VIP's
// backends with their health as the fleet sees it, and every outbound
// VIP's port pool (units free, held, static, guarded) with each DIP's
// ranges. get prints the stored document. -o json gives status and diff
// as JSON for scripts.
//
// The etcd endpoints may also come from $XDPLB_ETCD.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: xdplbctl [-etcd endpoints] [-prefix /xdplb/] command
commands:
  apply -f FILE   validate FILE and make it the fleet's document
  diff -f FILE    what applying FILE would change
  status          every node and VIP as the fleet sees it
  get             print the fleet's document
`

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("xdplbctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	endpoints := fs.String("etcd", os.Getenv("XDPLB_ETCD"), "etcd endpoints, comma-separated (default $XDPLB_ETCD)")
	prefix := fs.String("prefix", fleet.DefaultPrefix, "the fleet's etcd key prefix")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for etcd")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	sub := flag.NewFlagSet("xdplbctl "+cmd, flag.ContinueOnError)
	sub.SetOutput(stderr)
	file := sub.String("f", "", "the document file")
	output := sub.String("o", "table", "output: table or json")
	if err := sub.Parse(rest); err != nil {
		return 2
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "xdplbctl: -o %q: want table or json\n", *output)
		return 2
	}
	var doc *control.Document
	var text []byte
	switch cmd {
	case "apply", "diff":
		if *file == "" {
			fmt.Fprintf(stderr, "xdplbctl %s: -f FILE is required\n", cmd)
			return 2
		}
		var err error
		if doc, err = control.Load(*file); err != nil {
			// Every problem, located; nothing is written.
			fmt.Fprintln(stderr, err)
			return 1
		}
		if text, err = os.ReadFile(*file); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	case "status", "get":
	default:
		fmt.Fprintf(stderr, "xdplbctl: unknown command %q\n", cmd)
		fs.Usage()
		return 2
	}
	if *endpoints == "" {
		fmt.Fprintln(stderr, "xdplbctl: no etcd endpoints: -etcd or $XDPLB_ETCD")
		return 2
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: *timeout, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintf(stderr, "xdplbctl: etcd: %v\n", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch cmd {
	case "apply":
		rev, err := fleet.Apply(ctx, c, *prefix, text, doc, who())
		if err != nil {
			fmt.Fprintf(stderr, "xdplbctl apply: %s: %v\n", *file, err)
			if errors.Is(err, control.ErrStaleVersion) || errors.Is(err, fleet.ErrConcurrentWrite) {
				return 3
			}
			return 1
		}
		fmt.Fprintf(stdout, "applied version %d (revision %d)\n", doc.Version, rev)
	case "diff":
		cur, err := fleet.Get(ctx, c, *prefix)
		if err != nil {
			fmt.Fprintf(stderr, "xdplbctl: %v\n", err)
			return 1
		}
		lines := fleet.Diff(cur.Doc, doc)
		if *output == "json" {
			writeJSON(stdout, lines)
			break
		}
		for _, l := range lines {
			fmt.Fprintln(stdout, l)
		}
		if cur.Doc != nil && doc.Version <= cur.Doc.Version {
			fmt.Fprintf(stdout, "note: version %d is not above the fleet's %d: apply would refuse it\n", doc.Version, cur.Doc.Version)
		}
	case "get":
		cur, err := fleet.Get(ctx, c, *prefix)
		if err != nil {
			fmt.Fprintf(stderr, "xdplbctl: %v\n", err)
			return 1
		}
		if cur.Text == nil {
			fmt.Fprintln(stderr, "xdplbctl: the fleet has no document yet")
			return 1
		}
		stdout.Write(cur.Text)
	case "status":
		f, err := fleet.ReadStatus(ctx, c, *prefix)
		if err != nil {
			fmt.Fprintf(stderr, "xdplbctl: %v\n", err)
			return 1
		}
		if *output == "json" {
			writeJSON(stdout, fleet.Report(f, time.Now()))
			break
		}
		printStatus(stdout, fleet.Report(f, time.Now()))
	}
	return 0
}

func who() string {
	u, h := "?", "?"
	if cu, err := user.Current(); err == nil {
		u = cu.Username
	}
	if hn, err := os.Hostname(); err == nil {
		h = hn
	}
	return u + "@" + h
}

func writeJSON(w io.Writer, v any) {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	e.Encode(v)
}

func printStatus(w io.Writer, r fleet.StatusReport) {
	if r.Version == 0 {
		fmt.Fprintln(w, "document: none (xdplbctl apply -f FILE writes one)")
	} else {
		fmt.Fprintf(w, "document: version %d (revision %d), committed %s by %s\n", r.Version, r.Revision,
			r.Committed.Format(time.RFC3339), r.CommittedBy)
		fmt.Fprintf(w, "live: %s\n", r.Live)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROLE\tNAME\tVERSION\tSYNC DELAY\tDATA PATH\tUPDATED\tLAST ERROR")
	for _, n := range r.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s ago\t%s\n", n.Role, n.Name, n.Version, n.SyncDelay.Round(time.Millisecond),
			n.DataPath, n.Age.Round(time.Second), n.LastError)
	}
	tw.Flush()
	if len(r.VIPs) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VIP\tSERVICE\tBACKEND\tDIP\tHOST\tSTATE\tHEALTH")
		for _, v := range r.VIPs {
			for _, b := range v.Backends {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.Service, b.Name, b.DIP, b.Host, b.State, b.Health)
			}
		}
		tw.Flush()
	}
	if len(r.Outbound) > 0 {
		// Each outbound VIP's pool in units, then every DIP's ranges.
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "OUTBOUND\tVNI\tUNIT\tUNITS\tFREE\tHELD\tSTATIC\tGUARDED")
		for _, o := range r.Outbound {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", o.Address, o.VNI, o.Unit, o.Units, o.Free, o.Held, o.Static, o.Guarded)
		}
		tw.Flush()
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "OUTBOUND\tDIP\tHOST\tPORTS\tRANGES")
		for _, o := range r.Outbound {
			for _, h := range o.Holders {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", o.Address, h.DIP, h.Host, h.Ports, strings.Join(h.Ranges, ", "))
			}
		}
		tw.Flush()
	}
}
