// Package bgp announces a Mux's VIPs to its routers over BGP, through an
// embedded GoBGP (v3) server.
//
// Every Mux announces each VIP that has at least one healthy DIP as a host
// route (a /32 or /128, see HostPrefix) with itself as next hop. The
// routers learn the same VIP from every Mux and spread its traffic over
// them with ECMP. A Mux withdraws a VIP when its last DIP goes down, and
// all of them when it drains, when its data path fails, and when it shuts
// down.
//
// # Use
//
// New checks a Config (a plain value; Validate reports every problem) and
// Start runs the server and configures the peers. The Mux then calls Sync
// with the host prefixes of its healthy VIPs after every configuration or
// health change; Sync announces what is new and withdraws what is gone.
// Drain withdraws everything but keeps the sessions, Resume re-announces;
// Reconfigure and SetPeers apply a reloaded configuration, adding, removing
// or re-creating peers. PeerStates and Collector (Prometheus) report the
// sessions.
//
// # Shutdown without dropping traffic
//
// Shutdown withdraws every prefix first, while the sessions stay up, so
// each router moves the VIPs to the other Muxes as soon as it processes the
// UPDATE (a few milliseconds against BIRD in the tests) instead of when a
// hold timer expires. It then waits Config.WithdrawGrace, during which the
// caller keeps forwarding the packets routers had already sent, and only
// then stops GoBGP, closing the sessions with a Cease NOTIFICATION. The
// Mux must therefore call Shutdown before it closes its sockets.
//
// # Next hops and address families
//
// By default a prefix is announced with next-hop self: GoBGP fills in the
// local address of each session. That works for IPv4 VIPs over IPv4
// sessions and IPv6 VIPs over IPv6 sessions. A session always carries its
// own address family; it carries the other only when the Config names a
// next hop of that family:
//
//   - NextHop6 set: IPv6 unicast is also enabled on IPv4 sessions
//     (multiprotocol BGP, RFC 4760), and IPv6 VIPs are announced with
//     NextHop6, which must be an address of the Mux on the link to the
//     routers. This is how a Mux that peers only over IPv4 announces IPv6
//     VIPs. Without it, next-hop self would put an IPv4-mapped address into
//     an IPv6 route, which routers reject (BIRD: "Invalid NEXT_HOP
//     attribute - mismatched address family"), so the family is left off.
//   - NextHop set: IPv4 VIPs are announced with it on every session, and
//     IPv4 unicast is also enabled on IPv6 sessions.
//
// A prefix no session carries is kept in the announced set (it reaches
// peers added later) and logged as a warning.
//
// # Link-local peers
//
// A peer may be an IPv6 link-local address with the interface it is on as
// its zone, "fe80::1%eth0", as in unnumbered peering. The zone is
// required: Config.Validate refuses a link-local peer without one, which
// the kernel would never dial nor an incoming session match, so it would
// stay down without a word. GoBGP dials it from that interface's
// link-local address (looked up by the interface's name when the peer is
// added, so Start or Reconfigure fails, naming the peer, if the interface
// or its link-local address is missing) and takes an incoming session
// from it on that interface. Config.Validate requires
// NextHop6 with such a peer, since next-hop self would announce no usable
// address (GoBGP 3.37.0 sends ::, which BIRD rejects: "Invalid NEXT_HOP
// attribute - zero address"), and refuses a Password on it, since GoBGP
// 3.37.0 cannot install the TCP-MD5 key for a zoned address. IPv4 VIPs go
// over the session only with NextHop, as on any IPv6 session.
//
// A peer whose ASN equals Config.ASN is an iBGP peer, any other an eBGP
// peer; both work with next-hop self. Graceful restart is not enabled, so
// a router removes a Mux's routes as soon as its session ends.
//
// # Exposure
//
// Config.ListenAddresses restricts the listener to the given local
// addresses (default every one, 0.0.0.0 and ::; ListenPort 0 listens
// nowhere). Peer.Password signs a session with TCP-MD5 (RFC 2385), set on
// the outgoing connection and, for the peer's address, on the listener;
// Peer.TTLSecurity turns on GTSM (RFC 5082): TTL 255 out, at least
// 256-hops in. Since Go 1.24 net listeners are multipath TCP sockets by
// default, on which the kernel refuses TCP-MD5 keys and IP_TTL (GoBGP
// would only log a warning and incoming sessions go unprotected): a
// program that uses either must listen with plain TCP, by building with
// "//go:debug multipathtcp=0" in its main package (examples/mux does).
// New and Reconfigure refuse such a Config otherwise (ErrMultipathTCP).
// Changing the listener (ListenPort, ListenAddresses), ASN or RouterID
// needs a new Announcer; CheckReconfigure says so before anything
// changes.
//
// # GoBGP
//
// GoBGP's logs go to Config.Logger through an adapter to log/slog. GoBGP
// v3 cannot end the goroutine that runs its event loop, so one idle
// goroutine stays behind after Shutdown; everything else (sessions,
// listeners, timers) is stopped. GoBGP's own detailed Prometheus collector
// is pkg/metrics.NewBgpCollector in the GoBGP module; Collector exposes
// the few series an operator of a load balancer alerts on.
//
// # Tests
//
// The tests need no privileges to run against a second GoBGP server on
// the loopback interface. As root they also run BIRD 2 (Debian package
// bird2) as the router in a network namespace, with two Muxes, each in its
// own namespace and process, and check the ECMP route in the router's
// kernel table.
package bgp
