// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp_steer: redirect the data plane's packets into the AF_XDP socket of
 * their RX queue and pass everything else to the kernel.
 *
 * It includes no system or libbpf header, only internal/bpf/xdp.h, the
 * definitions it shares with the packet-rate harness's programs (types,
 * UAPI numbers, helpers, wire formats), so the compiled object depends
 * only on the clang version (see ../gen.go).
 *
 * Matching order (first hit wins; see ../doc.go for the whole story):
 *   0. not Ethernet/IPv4/IPv6 with at most one 802.1Q tag  -> pass (not_ip)
 *      IPv6: up to 8 hop-by-hop, routing, destination options
 *      and fragment headers are walked to the upper layer
 *      header that fails a bounds or sanity check          -> pass (malformed)
 *      ICMPv6 ND/MLD (types 130-137, 143)                  -> pass (nd)
 *   1. destination rules: (dst, proto, dport), (dst, proto, 0), (dst, 0, 0)
 *   2. VXLAN rules:       (dst, UDP, dport)
 *   3. source rules:      (src, sport), (src, 0); a hit is vetoed when the
 *                         destination is in the infrastructure LPM trie
 *   otherwise                                              -> pass (no_match)
 * A hit calls bpf_redirect_map(xsks, rx_queue_index, XDP_PASS): with no
 * socket on that queue the packet passes (no_socket), or is dropped when
 * FLAG_DROP_NO_SOCKET is set.
 */

#include "../../../internal/bpf/xdp.h"

#define host16(x) be16(x)

/*
 * Rule keys, shared with Go (rule.go: ruleKey). kind says which match and
 * which address family; addr holds an IPv4 address in its first 4 bytes and
 * zeros after. port is in network byte order.
 */
enum {
	KIND_DST4 = 1,
	KIND_DST6 = 2,
	KIND_VXLAN4 = 3,
	KIND_VXLAN6 = 4,
	KIND_SRC4 = 5,
	KIND_SRC6 = 6,
};

struct rule_key {
	__u8 kind;
	__u8 proto;
	__be16 port;
	__u8 addr[16];
};

/* Infrastructure prefix key (LPM trie). prefixlen counts the family byte:
 * 8 + prefix bits. pad is never covered by a prefix and stays zero. */
struct lpm_key {
	__u32 prefixlen;
	__u8 family; /* 4 or 6 */
	__u8 addr[16];
	__u8 pad[3];
};

/*
 * Classes of entries present, written by Go (rule.go: class*). The program
 * skips lookups that cannot hit, so a Mux with only VIP:port rules pays one
 * hash lookup per non-matching packet.
 */
#define CLASS_DST_PORT (1 << 0)  /* (dst, proto, port) with port != 0 */
#define CLASS_DST_PROTO (1 << 1) /* (dst, proto, 0) with proto != 0 */
#define CLASS_DST_ADDR (1 << 2)  /* (dst, 0, 0) */
#define CLASS_VXLAN (1 << 3)     /* (dst, UDP, port) */
#define CLASS_SRC_PORT (1 << 4)  /* (src, port) with port != 0 */
#define CLASS_SRC_ADDR (1 << 5)  /* (src, 0) */
#define CLASS_INFRA (1 << 6)     /* infra trie not empty */
#define CLASS_ALL (1 << 7)       /* steer every frame (l2fwd, benchmarks) */
#define FLAG_DROP_NO_SOCKET (1 << 8) /* steered but no socket: drop, not pass */

struct steer_config {
	__u32 classes;
};

/* Per-CPU counters, summed by Go (Program.Stats). Every packet bumps exactly
 * one of the outcome counters (redirected .. nd); a steered packet also bumps
 * one match_* counter. */
struct steer_counters {
	__u64 redirected;
	__u64 no_socket;
	__u64 no_match;
	__u64 not_ip;
	__u64 malformed;
	__u64 infra;
	__u64 nd;
	__u64 match_dst;
	__u64 match_vxlan;
	__u64 match_src;
	__u64 match_all;
	__u64 no_socket_drop;
};

/* Sizes are placeholders: Load sets them from Options. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} steer_xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct rule_key);
	__type(value, __u8);
} steer_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_key);
	__type(value, __u8);
} steer_infra SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_config);
} steer_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_counters);
} steer_stats SEC(".maps");

static __always_inline int rule_hit(struct rule_key *k, __u8 proto, __be16 port)
{
	k->proto = proto;
	k->port = port;
	return bpf_map_lookup_elem(&steer_rules, k) != 0;
}

/* IPv6 extension headers the program walks to the upper-layer header:
 * the same set and bound as the Mux's parser (header.IPv6.TransportHeader,
 * header.IPv6MaxExtensionHeaders). */
#define IPPROTO_HOPOPTS 0
#define IPPROTO_ROUTING 43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_DSTOPTS 60
#define IPV6_MAX_EXT 8

static __always_inline int ipv6_walked(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING ||
	       nh == IPPROTO_FRAGMENT || nh == IPPROTO_DSTOPTS;
}

/* Extension headers the program does not walk: the upper-layer protocol
 * behind them is unknown. */
static __always_inline int ipv6_opaque(__u8 nh)
{
	switch (nh) {
	case 51:  /* AH */
	case 135: /* mobility */
	case 139: /* HIP */
	case 140: /* shim6 */
	case 253:
	case 254: /* experimental */
		return 1;
	}
	return 0;
}

SEC("xdp")
int xdp_steer(struct xdp_md *ctx)
{
	__u8 *data = (__u8 *)(long)ctx->data;
	__u8 *end = (__u8 *)(long)ctx->data_end;
	__u32 zero = 0;
	struct steer_counters *st;
	struct steer_config *cfg;
	struct rule_key dk, sk;
	__u32 classes;
	__be16 eth_type, sport = 0, dport = 0;
	__u8 *l3, proto, v6, ports = 0, later = 0;
	long ret;

	st = bpf_map_lookup_elem(&steer_stats, &zero);
	cfg = bpf_map_lookup_elem(&steer_config, &zero);
	if (!st || !cfg)
		return XDP_PASS; /* cannot happen: arrays of one entry */
	classes = cfg->classes;
	if (classes & CLASS_ALL) {
		st->match_all++;
		goto redirect;
	}

	if (data + ETH_HLEN > end)
		goto malformed;
	eth_type = *(__be16 *)(data + 12);
	l3 = data + ETH_HLEN;
	if (eth_type == be16(ETH_P_8021Q)) {
		if (l3 + 4 > end)
			goto malformed;
		eth_type = *(__be16 *)(l3 + 2);
		l3 += 4;
	}

	__builtin_memset(&dk, 0, sizeof(dk));
	__builtin_memset(&sk, 0, sizeof(sk));

	if (eth_type == be16(ETH_P_IP)) {
		struct ipv4_hdr *ip = (struct ipv4_hdr *)l3;
		__u32 hlen, tot;
		__u8 *l4;

		if ((__u8 *)(ip + 1) > end)
			goto malformed;
		if ((ip->ver_ihl >> 4) != 4)
			goto malformed;
		hlen = (ip->ver_ihl & 0x0f) << 2;
		tot = host16(ip->tot_len);
		/* tot_len may be shorter than the frame (Ethernet padding),
		 * never longer. */
		if (hlen < sizeof(*ip) || tot < hlen || l3 + tot > end)
			goto malformed;
		v6 = 0;
		proto = ip->proto;
		__builtin_memcpy(dk.addr, &ip->daddr, 4);
		__builtin_memcpy(sk.addr, &ip->saddr, 4);
		/* Only the first fragment (offset 0) carries the ports. */
		if ((ip->frag_off & be16(0x1fff)) == 0 &&
		    (proto == IPPROTO_TCP || proto == IPPROTO_UDP)) {
			__u32 need = proto == IPPROTO_TCP ? TCP_HLEN : UDP_HLEN;

			l4 = l3 + hlen;
			if (l4 + 4 > end || hlen + need > tot)
				goto malformed;
			sport = *(__be16 *)l4;
			dport = *(__be16 *)(l4 + 2);
			ports = 1;
		}
	} else if (eth_type == be16(ETH_P_IPV6)) {
		struct ipv6_hdr *ip6 = (struct ipv6_hdr *)l3;
		__u8 *l4 = l3 + sizeof(*ip6);
		__u32 plen;

		if ((__u8 *)(ip6 + 1) > end)
			goto malformed;
		if ((*l3 >> 4) != 6)
			goto malformed;
		plen = host16(ip6->payload_len);
		if (l4 + plen > end)
			goto malformed;
		v6 = 1;
		proto = ip6->nexthdr;
		__builtin_memcpy(dk.addr, ip6->daddr, 16);
		__builtin_memcpy(sk.addr, ip6->saddr, 16);
		/* Walk hop-by-hop, routing, destination options and fragment
		 * headers, each within the payload length. After a fragment
		 * header with a non-zero offset there is no upper-layer header:
		 * proto is known, ports are not. */
#pragma unroll
		for (int i = 0; i < IPV6_MAX_EXT; i++) {
			__u32 hl;

			if (!ipv6_walked(proto))
				break;
			if (l4 + 8 > end || plen < 8)
				goto malformed;
			if (proto == IPPROTO_FRAGMENT) {
				hl = 8;
				if (*(__be16 *)(l4 + 2) & be16(0xfff8))
					later = 1;
			} else {
				hl = ((__u32)l4[1] + 1) * 8;
			}
			if (hl > plen)
				goto malformed;
			proto = *l4;
			l4 += hl;
			plen -= hl;
			if (later)
				break;
		}
		if (!later && ipv6_walked(proto))
			goto malformed; /* more than IPV6_MAX_EXT headers */
		if (later) {
			/* a later fragment: (dst, proto, 0) and (dst, 0, 0) */
		} else if (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
			__u32 need = proto == IPPROTO_TCP ? TCP_HLEN : UDP_HLEN;

			if (l4 + 4 > end || plen < need)
				goto malformed;
			sport = *(__be16 *)l4;
			dport = *(__be16 *)(l4 + 2);
			ports = 1;
		} else if (proto == IPPROTO_ICMPV6) {
			__u8 type;

			if (l4 + 1 > end || plen < 4)
				goto malformed;
			type = *l4;
			/* MLD (130-132, 143) and ND (133-137) belong to the
			 * kernel whatever the rules say. */
			if ((type >= 130 && type <= 137) || type == 143) {
				st->nd++;
				return XDP_PASS;
			}
		} else if (ipv6_opaque(proto)) {
			proto = 0; /* unknown: address-wide rules only */
		}
	} else {
		st->not_ip++;
		return XDP_PASS;
	}

	/* 1. Destination (Mux uplink: VIPs). */
	dk.kind = v6 ? KIND_DST6 : KIND_DST4;
	if ((classes & CLASS_DST_PORT) && ports && rule_hit(&dk, proto, dport))
		goto match_dst;
	if ((classes & CLASS_DST_PROTO) && proto && rule_hit(&dk, proto, 0))
		goto match_dst;
	if ((classes & CLASS_DST_ADDR) && rule_hit(&dk, 0, 0))
		goto match_dst;

	/* 2. VXLAN to a local address (Host Agent uplink). */
	if ((classes & CLASS_VXLAN) && ports && proto == IPPROTO_UDP) {
		dk.kind = v6 ? KIND_VXLAN6 : KIND_VXLAN4;
		if (rule_hit(&dk, IPPROTO_UDP, dport))
			goto match_vxlan;
	}

	/* 3. Source (VM port: DSR return traffic), unless the destination is
	 * infrastructure. The trie is consulted only after a source hit: the
	 * verdict is the same as checking it first, and packets that match
	 * nothing never pay for the trie walk. */
	sk.kind = v6 ? KIND_SRC6 : KIND_SRC4;
	if (((classes & CLASS_SRC_PORT) && ports && rule_hit(&sk, 0, sport)) ||
	    ((classes & CLASS_SRC_ADDR) && rule_hit(&sk, 0, 0))) {
		if (classes & CLASS_INFRA) {
			struct lpm_key lk;

			__builtin_memset(&lk, 0, sizeof(lk));
			lk.prefixlen = 8 + (v6 ? 128 : 32);
			lk.family = v6 ? 6 : 4;
			__builtin_memcpy(lk.addr, dk.addr, 16);
			if (bpf_map_lookup_elem(&steer_infra, &lk)) {
				st->infra++;
				return XDP_PASS;
			}
		}
		goto match_src;
	}

	st->no_match++;
	return XDP_PASS;

malformed:
	st->malformed++;
	return XDP_PASS;

match_dst:
	st->match_dst++;
	goto redirect;
match_vxlan:
	st->match_vxlan++;
	goto redirect;
match_src:
	st->match_src++;
redirect:
	ret = bpf_redirect_map(&steer_xsks, ctx->rx_queue_index,
			       (classes & FLAG_DROP_NO_SOCKET) ? XDP_DROP : XDP_PASS);
	if (ret == XDP_REDIRECT)
		st->redirected++;
	else if (ret == XDP_DROP)
		st->no_socket_drop++;
	else
		st->no_socket++;
	return ret;
}

char _license[] SEC("license") = "Dual BSD/GPL";
