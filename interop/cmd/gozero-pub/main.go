// gozero-pub registers one value with go-zero's discov.Publisher (key
// "<key>/<lease id>" or "<key>/<id>", kept alive) without serving anything,
// prints {"event":"ready"} once registered, and revokes on SIGTERM or stdin EOF.
package main

import (
	"flag"
	"time"

	"github.com/zeromicro/go-zero/core/discov"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/proc"

	"waypost.interop/internal/peer"
)

func main() {
	etcd := flag.String("etcd", "127.0.0.1:2379", "comma-separated etcd endpoints")
	key := flag.String("key", "", "registration key")
	value := flag.String("value", "", "registered value (host:port)")
	id := flag.Int64("id", 0, "custom ID (0: the lease id)")
	flag.Parse()
	if *key == "" || *value == "" {
		peer.Fatalf("-key and -value are required")
	}
	logx.Disable()
	// go-zero's own SIGTERM handler also stops the publisher; keep its force-quit short
	proc.Setup(proc.ShutdownConf{WrapUpTime: 200 * time.Millisecond, WaitTime: 2 * time.Second})

	var opts []discov.PubOption
	if *id > 0 {
		opts = append(opts, discov.WithId(*id))
	}
	pub := discov.NewPublisher(peer.SplitList(*etcd), *key, *value, opts...)
	if err := pub.KeepAlive(); err != nil {
		peer.Fatalf("register: %v", err)
	}
	peer.Emit(map[string]any{"event": "ready"})
	peer.WaitForStop()
	pub.Stop()
	// Stop revokes asynchronously: give the revoke a moment before the process exits
	time.Sleep(300 * time.Millisecond)
}
