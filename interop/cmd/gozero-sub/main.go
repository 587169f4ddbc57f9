// gozero-sub runs a go-zero discov.Subscriber and prints its Values() (sorted)
// as one JSON line at start and each time they change, until stdin closes or
// -timeout passes.
package main

import (
	"flag"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/zeromicro/go-zero/core/discov"
	"github.com/zeromicro/go-zero/core/logx"

	"waypost.interop/internal/peer"
)

func main() {
	etcd := flag.String("etcd", "127.0.0.1:2379", "comma-separated etcd endpoints")
	key := flag.String("key", "", "discovery key")
	exclusive := flag.Bool("exclusive", false, "discov.Exclusive()")
	exact := flag.Bool("exact", false, "discov.WithExactMatch()")
	timeout := flag.Duration("timeout", 60*time.Second, "exit after this long")
	flag.Parse()
	if *key == "" {
		peer.Fatalf("-key is required")
	}
	logx.Disable()

	var opts []discov.SubOption
	if *exclusive {
		opts = append(opts, discov.Exclusive())
	}
	if *exact {
		opts = append(opts, discov.WithExactMatch())
	}
	sub, err := discov.NewSubscriber(peer.SplitList(*etcd), *key, opts...)
	if err != nil {
		peer.Fatalf("subscriber: %v", err)
	}
	defer sub.Close()

	var mu sync.Mutex
	var last []string
	printed := false
	report := func() {
		mu.Lock()
		defer mu.Unlock()
		vals := peer.Sorted(sub.Values())
		if printed && slices.Equal(vals, last) {
			return
		}
		printed, last = true, vals
		peer.Emit(map[string]any{"values": vals})
	}
	sub.AddListener(report)
	report()

	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	// Listeners fire on every update; the poll catches a listener that raced
	// with the first report.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(*timeout)
	for {
		select {
		case <-done:
			return
		case <-deadline:
			return
		case <-tick.C:
			report()
		}
	}
}
