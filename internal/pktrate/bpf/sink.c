// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp_sink: count and drop the harness's test traffic at the sink.
 *
 * A frame is test traffic when it is Ethernet + IPv4 (no options, not a
 * fragment) + UDP to dst_port. Test traffic is dropped and counted as
 * delivered when its Ethernet destination is sink_mac (the DUT rewrote the
 * MACs as a router must) or as wrong_mac otherwise. Everything else (ARP,
 * IPv6 neighbour discovery, ...) is counted as other and passed to the
 * kernel.
 *
 * The counters are per CPU, so the hot path takes no lock and shares no
 * cache line; userspace sums them.
 */
#include "common.h"

/* Set by the loader before the program is loaded (frozen .rodata). */
volatile const __u8 sink_mac[ETH_ALEN];
volatile const __be16 dst_port;

struct sink_counters {
	__u64 packets;   /* test frames addressed to sink_mac */
	__u64 bytes;     /* their bytes, from the Ethernet header on */
	__u64 wrong_mac; /* test frames with another Ethernet destination */
	__u64 other;     /* everything else (passed) */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sink_counters);
} sink_stats SEC(".maps");

static __always_inline int mac_eq(const __u8 *a, const volatile __u8 *b)
{
	/* Byte compares: frames need not be 2-byte aligned in every driver. */
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] &&
	       a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
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
	struct ipv4_hdr *ip = (void *)(eth + 1);
	struct udp_hdr *udp = (void *)(ip + 1);
	if ((__u8 *)(udp + 1) > end || eth->proto != be16(ETH_P_IP) ||
	    ip->ver_ihl != 0x45 || ip->proto != IPPROTO_UDP ||
	    (ip->frag_off & be16(0x3fff)) != 0 || udp->dest != dst_port) {
		c->other++;
		return XDP_PASS;
	}
	if (mac_eq(eth->dst, sink_mac)) {
		c->packets++;
		c->bytes += end - data;
	} else {
		c->wrong_mac++;
	}
	return XDP_DROP;
}

char _license[] SEC("license") = "Dual BSD/GPL";
