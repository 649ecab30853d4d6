package nexthop

import (
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// subscribeNexthops follows the kernel's nexthop objects (Linux ≥ 5.3:
// routes added with `nhid N`, as FRR installs them): it sends on ch once
// per batch of RTM_NEWNEXTHOP and RTM_DELNEXTHOP notifications read, until
// done is closed or the socket fails (events lost), then closes ch. With
// net.ipv4.nexthop_compat_mode=0 a changed nexthop object changes the
// routes using it without any route notification. On an older kernel the
// group does not exist and nothing arrives. ns is as subscribeNS returns.
func subscribeNexthops(ns netns.NsHandle, ch chan<- struct{}, done <-chan struct{}, rcvbuf int, onErr func(error)) error {
	s, err := nl.SubscribeAt(ns, netns.None(), unix.NETLINK_ROUTE, unix.RTNLGRP_NEXTHOP)
	if err != nil {
		return err
	}
	if err := s.SetReceiveBufferSize(rcvbuf, false); err != nil {
		s.Close()
		return err
	}
	go func() {
		<-done
		s.Close()
	}()
	go func() {
		defer close(ch)
		for {
			msgs, from, err := s.Receive()
			if err != nil {
				onErr(err)
				return
			}
			if from.Pid != nl.PidKernel {
				continue
			}
			changed := false
			for _, m := range msgs {
				changed = changed || m.Header.Type == unix.RTM_NEWNEXTHOP || m.Header.Type == unix.RTM_DELNEXTHOP
			}
			if changed {
				select {
				case ch <- struct{}{}:
				case <-done:
					return
				}
			}
		}
	}()
	return nil
}

// onNexthop handles a change of nexthop objects. Which routes use an
// object is not known here (the route notifications' RTA_NH_ID is not
// parsed), so every entry is resolved again after the settle delay, as
// after a burst of route changes.
func (st *runState) onNexthop() {
	st.r.stats.routeEvents.Add(1)
	st.routeAll = true
	st.routeDirt = st.routeDirt[:0]
}
