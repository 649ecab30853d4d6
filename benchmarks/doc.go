// Package benchmarks measures xdplb's data-path packages against peers, in
// the same process and the same run, so that every figure comes with a
// ratio rather than a bare number:
//
//   - frame parsing to a 5-tuple: engine.ParsePacket against gopacket's
//     DecodingLayerParser;
//   - Maglev: flow.NewMaglev and Maglev.Lookup against
//     github.com/kkdai/maglev;
//   - the connection table: flow.ConnTable against sync.Map and
//     github.com/puzpuzpuz/xsync/v4's Map;
//   - the Mux's parse and balance pipeline run by engine.Worker over an
//     engine.MemPort, against the same job written with gopacket, a Go map
//     and kkdai/maglev.
//
// It is a separate Go module, so that the peers never become dependencies
// of the library. The peers' implementations used by the benchmarks live in
// peers.go; TestPeersAgree checks that they compute what ours compute where
// they should, so that the comparisons are like for like. README.md lists
// what each benchmark measures, the results on the reference machine and
// the commands that reproduce them.
package benchmarks
