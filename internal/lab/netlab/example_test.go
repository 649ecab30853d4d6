//go:build linux

package netlab_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

func ExampleCheckPrefix() {
	for _, s := range []string{"198.18.0.1/24", "2001:db8:1::1/64", "198.18.0.1/8", "10.0.0.0/8"} {
		err := netlab.CheckPrefix(netip.MustParsePrefix(s))
		fmt.Println(s, errors.Is(err, netlab.ErrOutsideTestRange))
	}
	// Output:
	// 198.18.0.1/24 false
	// 2001:db8:1::1/64 false
	// 198.18.0.1/8 true
	// 10.0.0.0/8 true
}

// A client and a server namespace joined by a veth pair, used by a program
// (tests use netlab.New(t, prefix) instead and get the cleanup for free).
// It needs root, so it is compiled but not run by go test.
func Example() {
	lab, err := netlab.NewStandalone("demo")
	if err != nil {
		log.Fatal(err)
	}
	defer lab.Close()

	client, err := lab.Namespace("client")
	if err != nil {
		log.Fatal(err)
	}
	server, err := lab.Namespace("server")
	if err != nil {
		log.Fatal(err)
	}
	if _, _, err := lab.Veth(client, "eth0", server, "eth0"); err != nil {
		log.Fatal(err)
	}
	if err := errors.Join(
		client.AddAddr("eth0", "198.18.0.1/24"),
		server.AddAddr("eth0", "198.18.0.2/24"),
	); err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	ln, err := server.Listen(ctx, "tcp", "198.18.0.2:80")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			fmt.Fprintln(c, "hello from", server)
			c.Close()
		}
	}()
	conn, err := client.Dial(ctx, "tcp", "198.18.0.2:80")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Real programs run inside a namespace too:
	_ = server.Command(ctx, "bird", "-f", "-c", "/path/to/bird.conf")
}
