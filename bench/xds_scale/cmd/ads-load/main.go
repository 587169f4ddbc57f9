// ads-load: S xDS clients in one process, as a fleet of gRPC xDS clients looks to a control plane. Each client
// has its own connection and its own node id, opens an ADS stream (state of the world), subscribes in gRPC's
// order LDS -> RDS -> CDS -> EDS to one service (client i: svc-(i mod M)) and ACKs every response. A client whose
// stream fails before its first ClusterLoadAssignment counts one failed connect attempt and retries after a
// short jittered backoff (100 ms doubling to 2 s), as gRPC's xDS client does.
//
// -server takes one address or a comma-separated list (replicas): client i starts on servers[i mod n] and, each
// time its stream ends (or its connection cannot be made), moves to the next server in the list, as a gRPC client
// moves down its bootstrap. A stream that held an assignment is followed by a new stream at once (the backoff
// starts again from 100 ms), as grpc-go does after a stream that received a response. Each attempt first waits
// for its connection to be READY (bounded by -ready-timeout): an attempt whose TCP connection could not be made
// (connection refused: a server down) is "unreachable", not a refusal by a server; one whose TCP connection was
// made but that never got READY, or whose stream ended before its assignment, was refused.
//
// All S clients start at once (a connect storm). Output, JSON lines on stdout:
//
//	{"connected": S, "seconds": T, "p50_ms": .., "p99_ms": .., "failed_attempts": F, "codes": {...}}
//	  once every client holds its first assignment (or -connect-timeout passed: "connected" < S)
//
// stdin commands:
//
//	mark SVC   the next assignment of svc-SVC is a change to time: answered {"marked": SVC, "expect": N} at once;
//	           then, once each of the N clients of svc-SVC got a newer assignment (or -push-timeout passed),
//	           {"push": SVC, "got": n, "expect": N, "p50_ms", "p99_ms", "max_ms", "others": K} (times from the mark;
//	           others: responses that reached clients of other services meanwhile)
//	stats      {"streams": open, "responses": total responses received, "failed_attempts": F,
//	            "by_server": {addr: streams open on it}, "holding": clients whose current stream holds an assignment,
//	            "holding_by_server": {addr: n}, "reconnects": streams that got an assignment after the client had
//	            held one before (on any server), "failed_reconnects": streams that ended before their assignment
//	            or whose connection was accepted (TCP) but did not get READY, after the client had held one: the
//	            refusals of a reconnect storm, "unreachable": attempts whose TCP connection could not be made
//	            (connection refused: no server there), "codes": {code: attempts ended with it},
//	            "refused": the first 100 failed reconnects [{"error", "server", "dialed": Unix seconds of its
//	            last TCP connection, "at": Unix seconds it ended}] (a connection made just before a server died
//	            is reset by the dying kernel socket, not refused by a server that was up: "dialed" tells them apart)}
//	quit       exit
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const (
	typeLDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeRDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	typeCDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	typeEDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

var next = map[string]string{typeLDS: typeRDS, typeRDS: typeCDS, typeCDS: typeEDS}

// mark: the change being timed
type mark struct {
	epoch int64
	svc   int
	at    time.Time
}

type fleet struct {
	servers   []string
	services  int
	readyWait time.Duration
	current   atomic.Pointer[mark]
	arrivals  chan arrival
	failed    atomic.Int64
	open      atomic.Int64
	responses atomic.Int64
	// per server (index into servers): streams open, clients holding an assignment
	openBy    []atomic.Int64
	holdingBy []atomic.Int64
	holding   atomic.Int64
	// reconnects: assignments on a new stream after the client held one; failedReconnects: attempts after that
	// whose TCP connection was made but that ended before their assignment (refused by a server that was there)
	reconnects       atomic.Int64
	failedReconnects atomic.Int64
	unreachable      atomic.Int64
	codesMu          sync.Mutex
	codes            map[string]int
	refused          []map[string]any // the first refusedKept failed reconnects: error, server, dialed, at
	connected        chan time.Duration
}

type arrival struct {
	epoch int64
	svc   int
	after time.Duration
}

// refusedKept: how many failed reconnects the stats list one by one
const refusedKept = 100

// errFailed: the connection failed (TRANSIENT_FAILURE) before it was READY
var errFailed = status.Error(codes.Unavailable, "connection failed before READY")

// errNotReady: the connection was neither READY nor failed within -ready-timeout
var errNotReady = status.Error(codes.DeadlineExceeded, "connection not READY within -ready-timeout")

// ready waits for conn to be READY: nil, errFailed (it failed first) or errNotReady (the bound passed).
func ready(ctx context.Context, conn *grpc.ClientConn, bound time.Duration) error {
	conn.Connect()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		switch s := conn.GetState(); s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			// a fail-fast call on it ends at once with the connection's last error: say which
			if _, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx); err != nil {
				return fmt.Errorf("%w: %s", errFailed, status.Convert(err).Message())
			}
			return errFailed
		default:
			if !conn.WaitForStateChange(wctx, s) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return errNotReady
			}
		}
	}
}

func (f *fleet) client(ctx context.Context, i int, start time.Time) {
	svc := i % f.services
	name := fmt.Sprintf("svc-%d", svc)
	node := &core.Node{Id: fmt.Sprintf("ads-load-%d", i), Cluster: "ads-load"}
	const initialBackoff = 100 * time.Millisecond
	backoff := initialBackoff
	connected := false // this client held an assignment once
	srv := i % len(f.servers)
	var lastEpoch int64
	for ctx.Err() == nil {
		held := false           // this stream got its assignment
		var dialed atomic.Int64 // when a TCP connection of this attempt was last made (Unix µs; 0: none was)
		dialer := func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err == nil {
				dialed.Store(time.Now().UnixMicro())
			}
			return c, err
		}
		err := func() error {
			conn, err := grpc.NewClient(f.servers[srv], grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(dialer), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
			if err != nil {
				return err
			}
			defer conn.Close()
			if err := ready(ctx, conn, f.readyWait); err != nil {
				return err
			}
			stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
			if err != nil {
				return err
			}
			f.open.Add(1)
			f.openBy[srv].Add(1)
			defer func() {
				f.open.Add(-1)
				f.openBy[srv].Add(-1)
				if held {
					f.holding.Add(-1)
					f.holdingBy[srv].Add(-1)
				}
			}()
			if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typeLDS, ResourceNames: []string{name}}); err != nil {
				return err
			}
			seen := map[string]bool{}
			for {
				resp, err := stream.Recv()
				if err != nil {
					return err
				}
				f.responses.Add(1)
				t := resp.GetTypeUrl()
				if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: t, VersionInfo: resp.GetVersionInfo(),
					ResponseNonce: resp.GetNonce(), ResourceNames: []string{name}}); err != nil {
					return err
				}
				if !seen[t] {
					seen[t] = true
					if nt, ok := next[t]; ok {
						if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: nt, ResourceNames: []string{name}}); err != nil {
							return err
						}
					}
				}
				if t != typeEDS {
					continue
				}
				if !held {
					held = true
					f.holding.Add(1)
					f.holdingBy[srv].Add(1)
					if connected {
						f.reconnects.Add(1)
					}
				}
				if !connected {
					connected = true
					f.connected <- time.Since(start)
					if m := f.current.Load(); m != nil {
						lastEpoch = m.epoch // a mark before this client connected is not its change
					}
					continue
				}
				if m := f.current.Load(); m != nil && m.epoch > lastEpoch {
					lastEpoch = m.epoch
					f.arrivals <- arrival{m.epoch, svc, time.Since(m.at)}
				} else if m != nil {
					select { // a response beyond the timed one: counted if there is room, never waited for
					case f.arrivals <- arrival{-1, svc, 0}:
					default:
					}
				}
			}
		}()
		if ctx.Err() != nil {
			return
		}
		unreachable := dialed.Load() == 0
		if unreachable {
			f.unreachable.Add(1)
		}
		if !connected {
			f.failed.Add(1)
		} else if !held && !unreachable {
			f.failedReconnects.Add(1)
			f.codesMu.Lock()
			if len(f.refused) < refusedKept {
				f.refused = append(f.refused, map[string]any{"error": err.Error(), "server": f.servers[srv],
					"dialed": float64(dialed.Load()) / 1e6,
					"at":     float64(time.Now().UnixMicro()) / 1e6})
			}
			f.codesMu.Unlock()
		}
		code := status.Code(err).String()
		f.codesMu.Lock()
		f.codes[code]++
		f.codesMu.Unlock()
		srv = (srv + 1) % len(f.servers) // the next server of the list, as a client moves down its bootstrap
		if held {
			backoff = initialBackoff // a stream that held an assignment: a new one at once
			continue
		}
		time.Sleep(backoff/2 + time.Duration(rand.Int63n(int64(backoff))))
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
}

func percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(a, b int) bool { return ds[a] < ds[b] })
	idx := int(p * float64(len(ds)-1))
	return float64(ds[idx].Microseconds()) / 1000
}

func main() {
	server := flag.String("server", "127.0.0.1:18000", "the control plane, or a comma-separated list of replicas")
	streams := flag.Int("streams", 100, "clients (one connection and one ADS stream each)")
	services := flag.Int("services", 1, "services the clients spread over (client i: svc-(i mod M))")
	connectTimeout := flag.Duration("connect-timeout", 120*time.Second, "bound on the connect storm")
	pushTimeout := flag.Duration("push-timeout", 60*time.Second, "bound on one timed change")
	readyTimeout := flag.Duration("ready-timeout", 20*time.Second, "bound on one connection getting READY")
	flag.Parse()
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	var servers []string
	for _, s := range strings.Split(*server, ",") {
		if s = strings.TrimSpace(s); s != "" {
			servers = append(servers, s)
		}
	}
	if len(servers) == 0 {
		fmt.Fprintln(os.Stderr, "ads-load: -server: no address")
		os.Exit(2)
	}
	f := &fleet{servers: servers, services: *services, readyWait: *readyTimeout, arrivals: make(chan arrival, 1<<20),
		codes: map[string]int{}, connected: make(chan time.Duration, *streams),
		openBy: make([]atomic.Int64, len(servers)), holdingBy: make([]atomic.Int64, len(servers))}
	out := json.NewEncoder(os.Stdout)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	for i := 0; i < *streams; i++ {
		go f.client(ctx, i, start)
	}
	var times []time.Duration
	deadline := time.After(*connectTimeout)
wait:
	for len(times) < *streams {
		select {
		case d := <-f.connected:
			times = append(times, d)
		case <-deadline:
			break wait
		}
	}
	var last time.Duration
	for _, d := range times {
		last = max(last, d)
	}
	f.codesMu.Lock()
	codes := map[string]int{}
	for k, v := range f.codes {
		codes[k] = v
	}
	f.codesMu.Unlock()
	_ = out.Encode(map[string]any{"connected": len(times), "seconds": last.Seconds(), "p50_ms": percentile(times, 0.5),
		"p99_ms": percentile(times, 0.99), "failed_attempts": f.failed.Load(), "codes": codes})

	per := make([]int, *services)
	for i := 0; i < *streams; i++ {
		per[i%*services]++
	}
	var epoch int64
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "mark":
			svc := 0
			if len(fields) > 1 {
				svc, _ = strconv.Atoi(fields[1])
			}
			for len(f.arrivals) > 0 { // stale arrivals of an earlier change
				<-f.arrivals
			}
			epoch++
			f.current.Store(&mark{epoch: epoch, svc: svc, at: time.Now()})
			_ = out.Encode(map[string]any{"marked": svc, "expect": per[svc%*services]})
			var got []time.Duration
			others := 0
			timeout := time.After(*pushTimeout)
		collect:
			for len(got) < per[svc%*services] {
				select {
				case a := <-f.arrivals:
					if a.epoch == epoch && a.svc == svc {
						got = append(got, a.after)
					} else {
						others++
					}
				case <-timeout:
					break collect
				}
			}
			var mx time.Duration
			for _, d := range got {
				mx = max(mx, d)
			}
			_ = out.Encode(map[string]any{"push": svc, "got": len(got), "expect": per[svc%*services],
				"p50_ms": percentile(got, 0.5), "p99_ms": percentile(got, 0.99),
				"max_ms": float64(mx.Microseconds()) / 1000, "others": others})
		case "stats":
			byServer, holdingBy := map[string]int64{}, map[string]int64{}
			for k, addr := range f.servers {
				byServer[addr] += f.openBy[k].Load()
				holdingBy[addr] += f.holdingBy[k].Load()
			}
			f.codesMu.Lock()
			codes := map[string]int{}
			for k, v := range f.codes {
				codes[k] = v
			}
			refused := append([]map[string]any{}, f.refused...)
			f.codesMu.Unlock()
			_ = out.Encode(map[string]any{"streams": f.open.Load(), "responses": f.responses.Load(),
				"failed_attempts": f.failed.Load(), "by_server": byServer, "holding": f.holding.Load(),
				"holding_by_server": holdingBy, "reconnects": f.reconnects.Load(),
				"failed_reconnects": f.failedReconnects.Load(), "unreachable": f.unreachable.Load(),
				"codes": codes, "refused": refused})
		case "quit":
			return
		}
	}
}
