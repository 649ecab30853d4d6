// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp_sink: count and drop the harness's test traffic at the sink.
 *
 * A frame is a test frame when it is Ethernet + IPv4 (no options, not a
 * fragment) + UDP to dst_port, and (when dst_addr is not zero) to dst_addr.
 * It is a VXLAN test frame when it is Ethernet + IPv4 (no options, not a
 * fragment) + UDP to port 4789 + VXLAN (I flag) around a test frame: what
 * a Mux sends. Test frames of either kind are dropped, and counted apart:
 * as delivered (packets or vxlan_packets) when their (outer) Ethernet
 * destination is sink_mac (the DUT rewrote the MACs as a router must),
 * else as wrong_mac. Everything else (ARP, IPv6 neighbour discovery, ...)
 * is counted as other and passed to the kernel.
 *
 * With capture_max set (a test, never a measurement: the branch is pruned
 * when it is zero), the first capture_max test frames of each CPU, up to
 * CAPTURE_SLOTS, are also copied (their first CAPTURE_LEN bytes) into the
 * per-CPU captures map, for userspace to check byte for byte.
 *
 * The counters are per CPU, so the hot path takes no lock and shares no
 * cache line; userspace sums them.
 */
#include "../../../bpf/xdp.h"

#define CAPTURE_SLOTS 16
#define CAPTURE_LEN 256

/* Set by the loader before the program is loaded (frozen .rodata). */
volatile const __u8 sink_mac[ETH_ALEN];
volatile const __be16 dst_port;
volatile const __be32 dst_addr; /* 0: any */
volatile const __u32 capture_max;

struct sink_counters {
	__u64 packets;       /* test frames addressed to sink_mac */
	__u64 bytes;         /* their bytes, from the Ethernet header on */
	__u64 vxlan_packets; /* VXLAN test frames addressed to sink_mac */
	__u64 vxlan_bytes;   /* their bytes, outer headers included */
	__u64 wrong_mac;     /* test frames of either kind with another destination */
	__u64 other;         /* everything else (passed) */
	__u64 captured;      /* frames copied into captures */
};

struct capture {
	__u32 len; /* bytes of the frame (data holds at most CAPTURE_LEN) */
	__u8 data[CAPTURE_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sink_counters);
} sink_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CAPTURE_SLOTS);
	__type(key, __u32);
	__type(value, struct capture);
} captures SEC(".maps");

static __always_inline int mac_eq(const __u8 *a, const volatile __u8 *b)
{
	/* Byte compares: frames need not be 2-byte aligned in every driver. */
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] &&
	       a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

/* udp_of returns the UDP header of an Ethernet + IPv4 (no options, not a
 * fragment) + UDP frame starting at eth, or 0. */
static __always_inline struct udp_hdr *udp_of(struct eth_hdr *eth, __u8 *end, __be32 *daddr)
{
	struct ipv4_hdr *ip = (void *)(eth + 1);
	struct udp_hdr *udp = (void *)(ip + 1);
	if ((__u8 *)(udp + 1) > end || eth->proto != be16(ETH_P_IP) ||
	    ip->ver_ihl != 0x45 || ip->proto != IPPROTO_UDP ||
	    (ip->frag_off & be16(0x3fff)) != 0)
		return 0;
	*daddr = ip->daddr;
	return udp;
}

static __always_inline int is_test(struct udp_hdr *udp, __be32 daddr)
{
	return udp->dest == dst_port && (dst_addr == 0 || daddr == dst_addr);
}

static __always_inline void capture(struct xdp_md *ctx, struct sink_counters *c, __u64 len)
{
	__u32 slot = c->captured;
	if (slot >= capture_max || slot >= CAPTURE_SLOTS)
		return;
	struct capture *cap = bpf_map_lookup_elem(&captures, &slot);
	if (!cap)
		return;
	/* The verifier wants n provably within [1, CAPTURE_LEN]: clamp,
	 * then mask in a register it tracks as unsigned. */
	__u64 n = len;
	if (n > CAPTURE_LEN)
		n = CAPTURE_LEN;
	asm volatile("%0 &= 0x1ff" : "+r"(n));
	if (n == 0 || n > CAPTURE_LEN)
		return;
	if (bpf_xdp_load_bytes(ctx, 0, cap->data, n) == 0) {
		cap->len = len;
		c->captured++;
	}
}

SEC("xdp")
int xdp_sink(struct xdp_md *ctx)
{
	__u8 *data = (__u8 *)(long)ctx->data;
	__u8 *end = (__u8 *)(long)ctx->data_end;
	__u32 key = 0;
	struct sink_counters *c = bpf_map_lookup_elem(&sink_stats, &key);
	if (!c)
		return XDP_PASS;

	struct eth_hdr *eth = (void *)data;
	__be32 daddr = 0;
	struct udp_hdr *udp = udp_of(eth, end, &daddr);
	if (!udp) {
		c->other++;
		return XDP_PASS;
	}
	int vxlan = 0;
	if (!is_test(udp, daddr)) {
		struct vxlan_hdr *vx = (void *)(udp + 1);
		struct eth_hdr *inner = (void *)(vx + 1);
		struct udp_hdr *iudp;
		if (udp->dest != be16(VXLAN_PORT) || (__u8 *)(inner + 1) > end ||
		    (vx->flags & 0x08) == 0 || !(iudp = udp_of(inner, end, &daddr)) ||
		    !is_test(iudp, daddr)) {
			c->other++;
			return XDP_PASS;
		}
		vxlan = 1;
	}
	__u64 len = end - data;
	if (!mac_eq(eth->dst, sink_mac)) {
		c->wrong_mac++;
	} else if (vxlan) {
		c->vxlan_packets++;
		c->vxlan_bytes += len;
	} else {
		c->packets++;
		c->bytes += len;
	}
	if (capture_max)
		capture(ctx, c, len);
	return XDP_DROP;
}

char _license[] SEC("license") = "Dual BSD/GPL";
