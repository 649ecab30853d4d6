// Package control holds the desired state of an xdplb fleet: the document
// that says which VIPs exist, which backends (DIPs) serve them, how they
// are probed, how a Mux speaks BGP, and which VMs live on which host. It
// parses and strictly validates that document, converts it to data-path
// rules (flow.Rule), and keeps a node on the newest valid version of a
// document file (Watcher).
//
// # Versions
//
// A document carries a version. A node applies a version whole or not at
// all, never applies a version that is not above the one it runs, and
// reports the version it runs (Watcher.Status). An operator bumps version
// with every change; a changed file with a lower version is refused with
// ErrStaleVersion, and one with the running version but other content with
// ErrVersionConflict (which also matches ErrStaleVersion): the node keeps
// what runs, logs why, reports it (Status.Reason), and reads the file again
// until it holds a higher version.
//
// # Validation
//
// Parse refuses a document with any problem and reports every problem it
// finds (up to MaxErrors), each a *FieldError wrapping ErrInvalid, located
// by file, line and column and by field path, saying what is wrong and what
// is wanted:
//
//	web.yaml:14:7: vips[0].backends[2].mac: "02:00:00:00:01" is not a MAC address (want six hex pairs, e.g. 02:00:00:00:01:01)
//	web.yaml:4:5: vips[0]: unknown key "adress" (did you mean "address"?)
//	web.yaml:9:11: vips[1].port: 70000 is out of range (want 1..65535, or 0 or "all" for every port)
//	web.yaml:12:9: vips[1].backends[0].address: 2001:db8::1 is IPv6 but the VIP 198.18.100.1 is IPv4: ...
//
// Keys are strict: an unknown key is an error (with a suggestion when it
// looks like a typo of a known one), as is a value of the wrong type (a
// quoted number, a duration without a unit), a repeated key, or a second
// YAML document in the file. Anchors and aliases (&name, *name) and merge
// keys (<<: *name) may be used to share values.
//
// A Parser gives Parse's result and is faster on a text that repeats most
// of the one it parsed before (a fleet's large document from one version
// to the next): it decodes the YAML of the changed parts only; a
// Tracker parses with one.
//
// Beyond each value's own range, Parse checks across the document: VIP
// names are unique; no two VIPs share (VNI, protocol, address, port);
// backend names and (address, port) pairs are unique within a VIP; a DIP
// has its VIP's address family (DSR NAT rewrites the destination address
// in place; the VXLAN underlay, the host address, may be of either family);
// a DIP (VNI, address) has the same MAC and host wherever it is listed,
// and agrees with the hosts section when that lists it; a VM's address and
// MAC are unique in its VNI (a dual-stack VM lists its MAC once per
// family, on the same interface); host names and addresses are unique;
// BGP peers are unique; a Maglev table size is prime and holds the pool.
// Probe specs are checked by health.Spec.Validate, after defaults.
//
// # Format
//
// YAML. Durations are Go durations ("500ms", "2s", "1m30s"); integers are
// decimal, or 0x, 0o, 0b prefixed (a leading zero is refused: YAML 1.1
// reads it as octal); MAC addresses are six hex pairs and should be quoted
// (YAML 1.1 reads unquoted colon-separated digits as a base-60 number).
//
// Top level:
//
//	checksum        optional  "sha256:" and 64 hex digits; must be the first key (see Seal)
//	version         required  integer >= 1
//	written         optional  RFC 3339 time the document was written (sync-delay metric)
//	hash_seed       0         fleet-wide flow hash seed (flow.NewHasher), 0..2^64-1
//	maglev_min_table_size 0   smallest Maglev table of a VIP without table_size, 0..16777213
//	                          (0: 4093), rounded up to the sizes listed under table_size
//	node.name       ""        a per-node file's node; a Host Agent picks its host by it
//	                          (not allowed with nodes: there each node is started with its name)
//	infra_prefixes  none      prefixes (no host bits) whose traffic is never NATed
//	mux_prefixes    none      prefixes (no host bits) the Muxes send VXLAN from; Host Agents accept
//	                          VXLAN from nothing else and refuse to run without them (or -tunnel-sources)
//	bgp             none      a Mux's BGP speaker (below)
//	nodes           none      per-node settings, by node name: one document for the fleet (below)
//	vips            none      the services (below)
//	inbound_nat     none      one VIP port to one VM's port, over a range (below)
//	outbound        none      VIP addresses VMs may use as their source (below)
//	hosts           none      hosts and VMs, for Host Agents (below)
//	vip_addresses   none      a Host Agent's view only (package fleet writes it): every VIP
//	                          address of the fleet, for the client filters of a Host Agent
//	                          whose vips are only those its VMs serve; unique; a Mux, and
//	                          fleet.Apply (xdplbctl apply), refuse a document with it
//
// bgp:
//
//	asn             required  local AS, 1..4294967295 (not 23456, AS_TRANS)
//	router_id       required  IPv4 address
//	listen_port     179       0 = do not listen (outbound sessions only)
//	listen_addresses all      local addresses to accept sessions on (no 0.0.0.0/::); default every one
//	hold_time       90s       0 (no keepalives) or 3s..65535s, whole seconds; keepalive = hold/3
//	withdraw_grace  2s        0..1h; on shutdown: withdraw, keep forwarding this long, then stop
//	next_hop        (self)    IPv4 next hop announced for IPv4 VIPs; default the session's local address
//	next_hop6       (self)    global IPv6 next hop for IPv6 VIPs (not link-local); set it to announce them over IPv4 sessions (MP-BGP)
//	peers[]         none      address (required, unique; a link-local one must name the
//	                          interface the peer is on as its zone, fe80::1%eth0: an
//	                          interface name, not an index; such a peer needs next_hop6
//	                          and takes no password),
//	                          asn (required), port (179), passive (false),
//	                          password (none): TCP-MD5 (RFC 2385), 1..80 bytes,
//	                          ttl_security (0 = off): GTSM (RFC 5082), the peer's distance
//	                          in hops, 1..254 (1 = directly connected: only TTL 255 accepted)
//
// nodes (one document for every node; a node reads its part with
// Document.ForNode, by the name it is started with, e.g. mux -node mux-1):
//
//	<name>          required  a node name (1-253 letters, digits, '.', '_', '-'), unique
//	<name>.bgp      none      what this Mux sets for itself: router_id (required, unique
//	                          among the nodes, and then not allowed in the top-level bgp),
//	                          asn, listen_addresses, next_hop and next_hop6 replace the
//	                          fleet's; peers are added to the fleet's bgp.peers. hold_time,
//	                          withdraw_grace and listen_port are the fleet's.
//
// A fleet document looks like this (Host Agents find their entry of hosts
// by the name they are started with, -host):
//
//	bgp:
//	  asn: 65010
//	nodes:
//	  mux-1:
//	    bgp:
//	      router_id: 198.18.0.11
//	      peers: [{address: 198.18.0.1, asn: 65000}]
//	  mux-2:
//	    bgp:
//	      router_id: 198.18.0.12
//	      peers: [{address: 198.18.0.2, asn: 65000}]
//
// vips[]:
//
//	name            required  unique; 1-63 letters, digits, '.', '_', '-'
//	address         required  IPv4 or IPv6, not IPv4-mapped, no zone
//	protocol        required  tcp | udp
//	port            required  1..65535, or 0 / "all" = every port
//	vni             0         tenant VXLAN network identifier, 0..16777215
//	distribution    5-tuple   5-tuple | 3-tuple | 2-tuple: the flow fields that pick a backend
//	table_size      auto      Maglev table size: a prime <= 16777213, >= the number of backends;
//	                          auto (0): flow.MaglevAutoSize, the smallest of 251, 509, 1021, …
//	                          (the largest prime below each power of two) that is
//	                          >= maglev_min_table_size (default 4093) and >= 100 × the
//	                          backends listed (whatever their health), so the size
//	                          changes only when the pool crosses a doubling
//	probe           none      health check (below); without one, backends count as healthy
//	backends[]      none      the pool (below)
//
// vips[].probe (see package health):
//
//	type            required  tcp | http
//	port            backend   port probed; default the backend's port (the VIP's when that is 0)
//	path            /         http only
//	method          GET       http only
//	host            ip:port   http only: the Host header
//	expect_status   200       http only
//	interval        2s        from the end of one probe to the start of the next (probes never overlap)
//	timeout         1s        up to 1h, may exceed interval; default min(1s, interval/2);
//	                          down after timeout×fall + interval×(fall−1) (2s, 5s, fall 3: 19s)
//	rise            2         consecutive successes that bring a backend up
//	fall            3         consecutive failures that bring it down
//
// vips[].backends[]:
//
//	name            addr:port unique in the VIP; the backend's Maglev identity
//	address         required  the DIP, in the VIP's family
//	port            0         DIP port; 0 = the packet's destination port
//	mac             required  the DIP's MAC (inner Ethernet destination), unicast
//	host            required  the DIP host's physical address (VXLAN outer destination); a host
//	                          without a Host Agent (a kernel vxlan device) is not in hosts[]
//	weight          1         0..65535 relative share of new flows; 0 drains
//	state           active    active | draining (no new flows); health checks add "down"
//
// inbound_nat[] (e.g. SSH to single VMs through the VIP; each rule stands
// for one-backend VIPs named <name>-<port>, in Document.VIPs):
//
//	name            required  1-57 letters, digits, '.', '_', '-'
//	address         required  the VIP
//	protocol        tcp       tcp | udp
//	vni             0         the targets' VNI
//	ports           required  a port or a range, e.g. 50001-50100: port first+i goes to targets[i]
//	backend_port    required  the VMs' port, 1..65535
//	targets         required  VM addresses of the VNI listed in hosts[] (their MAC and host
//	                          come from there), one per port, in order
//
// outbound[] (source NAT through a VIP for connections VMs open; issue
// 13: Host Agents translate the DIPs' connections, package nat's SNAT;
// Muxes send the replies by the allocations, see package mux):
//
//	address         required  the VIP address used as the source; one section per address
//	vni             0         the DIPs' VNI
//	dips            required  VMs of the VNI listed in hosts[], in the address's family
//	ports           1024-65535 the pool; whole units only, and the address's inbound
//	                          ports (its VIPs' and inbound NAT rules', any protocol) are left out
//	unit            64        ports per allocation, a power of two, 8..4096
//	static[]        none      allocations without etcd: dip (one of dips) and ports
//	                          (whole units of the pool, not overlapping)
//	local[]         none      prefixes of the VNI's own network (address's family):
//	                          the DIPs' packets to them are east-west traffic, never
//	                          translated (the Host Agent passes them to its kernel)
//
// hosts[] and hosts[].vms[]:
//
//	name            address   unique host name
//	address         required  physical address: where Muxes send VXLAN
//	vxlan_port      4789      UDP port the host receives VXLAN on
//	vms[].vni       0         the VM's tenant
//	vms[].address   required  unique in the VNI
//	vms[].mac       required  unique in the VNI (dual-stack: once per family)
//	vms[].interface required  the VM's port on the host: a Linux interface name
//
// A complete, commented document is in testdata/example.yaml. A small one,
// ready to copy:
//
//	version: 1
//	written: 2026-11-30T10:00:00Z
//	hash_seed: 0x5eed1234
//	bgp:
//	  asn: 65010
//	  router_id: 198.18.0.10
//	  peers:
//	    - address: 198.18.0.1
//	      asn: 65000
//	vips:
//	  - name: web
//	    address: 198.18.100.1
//	    protocol: tcp
//	    port: 80
//	    vni: 100
//	    probe:
//	      type: http
//	      path: /healthz
//	      interval: 1s
//	      timeout: 500ms
//	    backends:
//	      - name: vm-a
//	        address: 198.19.1.1
//	        port: 8080
//	        mac: "02:00:00:00:01:01"
//	        host: 198.19.0.1
//	      - name: vm-b
//	        address: 198.19.1.2
//	        port: 8080
//	        mac: "02:00:00:00:01:02"
//	        host: 198.19.0.2
//	hosts:
//	  - name: host-1
//	    address: 198.19.0.1
//	    vms:
//	      - vni: 100
//	        address: 198.19.1.1
//	        mac: "02:00:00:00:01:01"
//	        interface: vm-a
//
// # Reloading
//
// A Watcher applies the file at start and again whenever it changes. It
// watches the file's directory, so an editor's rename-over-write and a
// Kubernetes ConfigMap's symlink swap are seen.
//
// Replace the file atomically (write a temporary file in the same
// directory, rename it over the document). A file written in place is read
// while it is written; a Watcher uses a read only when two reads a settle
// time apart (WatcherOptions.Debounce) agree, so a writer that pauses
// mid-file for longer than that can still be read torn, and many prefixes
// of a document are valid documents. A sealed document cannot be: Seal
// puts a first key
//
//	checksum: sha256:<hex>
//
// the SHA-256 of every other byte of the file, and Parse refuses a
// document that does not match its checksum, so every prefix of a sealed
// file is refused and a sealed document is never applied torn. The
// checksum is optional; a sealed file edited by hand must be resealed (or
// the line removed).
//
// To reload on SIGHUP as well:
//
//	hup := make(chan os.Signal, 1)
//	signal.Notify(hup, syscall.SIGHUP)
//	w := control.NewWatcher("/etc/xdplb/mux.yaml", control.WatcherOptions{Signals: hup})
//	err := w.Run(ctx, func(d *control.Document) error {
//		// healthOf(vip, backend) reports the health checker's verdict.
//		_, err := rules.Update(d.Version, d.Rules(healthOf))
//		return err
//	})
package control
