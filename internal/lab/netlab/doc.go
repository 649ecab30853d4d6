// Package netlab builds throw-away network topologies for tests and the lab
// demo: named network namespaces, veth pairs between them, addresses, routes
// and sysctls, and it removes all of it again.
//
// A Lab owns everything it creates. New ties a Lab to a test: a tb.Cleanup
// removes every namespace (and with it every veth and every XDP program
// attached to one) even when the test fails or panics. NewStandalone is the
// same for binaries, which call Close themselves.
//
//	lab := netlab.New(t, "nx")
//	client, _ := lab.Namespace("client")
//	server, _ := lab.Namespace("server")
//	c, s, _ := lab.Veth(client, "eth0", server, "eth0")
//	_ = client.AddAddr(c.Name, "198.18.0.1/24")
//	_ = server.AddAddr(s.Name, "198.18.0.2/24")
//	ln, _ := server.Listen(ctx, "tcp", "198.18.0.2:80")
//	conn, _ := client.Dial(ctx, "tcp", "198.18.0.2:80")
//
// # Names
//
// A namespace is bind-mounted at /run/netns/<prefix>-<run>-<name>, the place
// `ip netns` uses, so `ip netns exec` and `ip -n` work on it while a test
// runs. <run> is the creating process id in base 36 followed by two random
// characters, so parallel test binaries never collide and CleanupStale can
// tell a crashed run (its process is gone) from a live one. Interfaces are
// created directly inside their namespaces, never in the caller's, so their
// names (at most 15 bytes) only need to be unique within a namespace.
//
// # Addresses
//
// AddAddr, AddRoute and the other methods that configure addresses refuse
// anything outside 198.18.0.0/15 (RFC 2544) and 2001:db8::/32 (RFC 3849)
// with ErrOutsideTestRange, so no test can route a packet to a real network.
//
// # Threads and namespaces
//
// Linux network namespaces belong to threads, not processes. NS.Do runs a
// function on a fresh OS thread that is locked, switched into the namespace
// and switched back afterwards; if switching back fails the thread is left
// locked so the Go runtime destroys it instead of reusing it. Sockets made
// inside Do (Listen, ListenPacket, Dial) stay in the namespace after Do
// returns and can be used from any goroutine. Goroutines started inside the
// function do not inherit the namespace.
//
// # Privileges
//
// Creating namespaces needs CAP_SYS_ADMIN and CAP_NET_ADMIN (in practice:
// root). RequireRoot skips a test with a clear message when they are
// missing and fails it when they are present but a namespace still cannot be
// made, so CI (which runs as root) never skips silently.
//
// The package is Linux-only.
package netlab
