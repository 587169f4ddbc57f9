// gozero-hash prints {key: address} for every key read from stdin (one per
// line), using go-zero's core/hash ring exactly as zrpc's consistent_hash
// balancer builds it (NewCustomConsistentHash(100, hash.Hash), Add(addr)).
package main

import (
	"bufio"
	"flag"
	"os"

	"github.com/zeromicro/go-zero/core/hash"

	"waypost.interop/internal/peer"
)

func main() {
	addrs := flag.String("addrs", "", "comma-separated address set")
	replicas := flag.Int("replicas", 100, "virtual nodes per address (zrpc uses 100)")
	flag.Parse()
	list := peer.SplitList(*addrs)
	if len(list) == 0 {
		peer.Fatalf("-addrs is required")
	}
	ring := hash.NewCustomConsistentHash(*replicas, hash.Hash)
	for _, a := range list {
		ring.Add(a)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		key := sc.Text()
		if key == "" {
			continue
		}
		node, ok := ring.Get(key)
		if !ok {
			peer.Fatalf("no node for key %q", key)
		}
		out[key] = node.(string)
	}
	if err := sc.Err(); err != nil {
		peer.Fatalf("stdin: %v", err)
	}
	peer.Emit(out)
}
