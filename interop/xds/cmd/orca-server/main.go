// orca-server is a grpc-go server of /waypost.test.Echo/Unary (the reply's
// `server` field is -name) that reports its load through grpc-go's own orca
// package (gRFC A51):
//
//   - per call: the endpoint-load-metrics-bin trailer, written by the
//     orca.CallMetricsServerOption interceptor from the values the handler sets
//     on orca.CallMetricsRecorderFromContext (off with -percall=false);
//   - out of band (-oob): xds.service.orca.v3.OpenRcaService/StreamCoreMetrics
//     registered with orca.Register over an orca.NewServerMetricsRecorder. grpc-go
//     sends the first report at once, then every max(requested interval, 30 s)
//     (its minimum reporting interval), so a changed value reaches an OOB client
//     on a new stream or after 30 s. -oob-floor D serves the same recorder
//     through a small OpenRcaService of this module instead, with floor D.
//
// It prints {"listening": "HOST:PORT"} once serving. Commands on stdin, one
// per line, each answered by one JSON line:
//
//	set cpu=X app=Y mem=Z rps=R eps=E named.K=V util.K=V   change the reported values
//	stats                                                   {"served": n}
//	quit                                                    graceful stop, exit
//
// SIGTERM stops it gracefully too; the last line is {"served": n, "stopped": true}.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/dynamicpb"

	"waypost.interop/xds/internal/echo"
	"waypost.interop/xds/internal/fastoob"
)

// load is what the server reports; negative means "not reported".
type load struct {
	CPU, App, Mem, RPS, EPS float64
	Named, Util             map[string]float64
}

type server struct {
	name    string
	percall bool
	mu      sync.Mutex
	cur     load
	oob     orca.ServerMetricsRecorder
	served  atomic.Int64
}

func (s *server) snapshot() load {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.cur
	l.Named = copyMap(s.cur.Named)
	l.Util = copyMap(s.cur.Util)
	return l
}

func apply(r orca.ServerMetricsRecorder, l load) {
	if l.CPU >= 0 {
		r.SetCPUUtilization(l.CPU)
	} else {
		r.DeleteCPUUtilization()
	}
	if l.App >= 0 {
		r.SetApplicationUtilization(l.App)
	} else {
		r.DeleteApplicationUtilization()
	}
	if l.Mem >= 0 {
		r.SetMemoryUtilization(l.Mem)
	} else {
		r.DeleteMemoryUtilization()
	}
	if l.RPS >= 0 {
		r.SetQPS(l.RPS)
	} else {
		r.DeleteQPS()
	}
	if l.EPS >= 0 {
		r.SetEPS(l.EPS)
	} else {
		r.DeleteEPS()
	}
	for k, v := range l.Util {
		r.SetNamedUtilization(k, v)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	name := flag.String("name", "", "server name (EchoReply.server)")
	cpu := flag.Float64("cpu", -1, "cpu_utilization to report (negative: none)")
	app := flag.Float64("app", -1, "application_utilization to report (negative: none)")
	mem := flag.Float64("mem", -1, "mem_utilization to report (negative: none)")
	rps := flag.Float64("rps", -1, "rps_fractional to report (negative: none)")
	eps := flag.Float64("eps", -1, "eps (errors per second) to report (negative: none)")
	oob := flag.Bool("oob", false, "serve OpenRcaService/StreamCoreMetrics (out-of-band reports)")
	oobFloor := flag.Duration("oob-floor", 0, "with -oob: serve OpenRcaService with this minimum interval instead of grpc-go's orca.Register (whose floor is 30 s)")
	percall := flag.Bool("percall", true, "report per call in the endpoint-load-metrics-bin trailer")
	callCPU := flag.Float64("call-cpu", -2, "per-call cpu_utilization when it should differ from the OOB one (-2: same)")
	var named, util echo.KV
	flag.Var(&named, "named", "per-call named_metrics k=v (repeatable)")
	flag.Var(&util, "util", "utilization[k]=v (repeatable; per call and OOB)")
	flag.Parse()
	if *name == "" {
		echo.Fatalf("-name is required")
	}
	s := &server{name: *name, percall: *percall}
	s.cur = load{CPU: *cpu, App: *app, Mem: *mem, RPS: *rps, EPS: *eps, Named: map[string]float64{}, Util: map[string]float64{}}
	for _, p := range named.Pairs() {
		v, err := strconv.ParseFloat(p[1], 64)
		if err != nil {
			echo.Fatalf("-named %s: %v", p[0], err)
		}
		s.cur.Named[p[0]] = v
	}
	for _, p := range util.Pairs() {
		v, err := strconv.ParseFloat(p[1], 64)
		if err != nil {
			echo.Fatalf("-util %s: %v", p[0], err)
		}
		s.cur.Util[p[0]] = v
	}

	var opts []grpc.ServerOption
	if *percall {
		opts = append(opts, orca.CallMetricsServerOption(nil))
	}
	srv := grpc.NewServer(opts...)
	if *oob {
		s.oob = orca.NewServerMetricsRecorder()
		apply(s.oob, s.cur)
		if *oobFloor > 0 {
			fastoob.Register(srv, s.oob, *oobFloor)
		} else if err := orca.Register(srv, orca.ServiceOptions{ServerMetricsProvider: s.oob}); err != nil {
			echo.Fatalf("orca.Register: %v", err)
		}
	}
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)

	handler := func(ctx context.Context, req any) (any, error) {
		s.served.Add(1)
		in := req.(*dynamicpb.Message)
		if d := echo.GetInt(in, "delay_ms"); d > 0 {
			select {
			case <-time.After(time.Duration(d) * time.Millisecond):
			case <-ctx.Done():
			}
		}
		if rec := orca.CallMetricsRecorderFromContext(ctx); rec != nil && s.percall {
			l := s.snapshot()
			if *callCPU > -2 {
				l.CPU = *callCPU
			}
			apply(rec, l)
			for k, v := range l.Named {
				rec.SetNamedMetric(k, v)
			}
		}
		failOn := echo.GetString(in, "fail_on")
		if c := echo.GetInt(in, "error_code"); c != 0 && (failOn == "" || containsName(failOn, s.name)) {
			details := echo.GetString(in, "error_details")
			if details == "" {
				details = "requested " + codes.Code(c).String()
			}
			return nil, status.Error(codes.Code(c), details)
		}
		out := echo.NewReply()
		echo.SetString(out, "message", echo.GetString(in, "message"))
		echo.SetString(out, "server", s.name)
		return out, nil
	}
	desc := grpc.ServiceDesc{
		ServiceName: echo.Service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Unary",
			Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := echo.NewRequest()
				if err := dec(in); err != nil {
					return nil, err
				}
				if icpt == nil {
					return handler(ctx, in)
				}
				return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: echo.UnaryMethod}, handler)
			},
		}},
	}
	srv.RegisterService(&desc, struct{}{})

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		echo.Fatalf("listen %s: %v", *listen, err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	echo.Emit(map[string]any{"listening": lis.Addr().String(), "name": s.name, "oob": *oob, "percall": *percall})

	quit := make(chan struct{}, 1)
	go s.commands(quit)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sigs:
	case <-quit:
	case err := <-served:
		echo.Fatalf("serve: %v", err)
	}
	hs.Shutdown()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(3 * time.Second):
		srv.Stop()
	}
	echo.Emit(map[string]any{"served": s.served.Load(), "stopped": true})
}

func copyMap(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func containsName(list, name string) bool {
	for _, n := range strings.Split(list, ",") {
		if strings.TrimSpace(n) == name {
			return true
		}
	}
	return false
}

// commands reads stdin (see the package comment); EOF leaves the server running.
func (s *server) commands(quit chan<- struct{}) {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "set":
			if err := s.set(fields[1:]); err != nil {
				echo.Emit(map[string]any{"error": err.Error()})
				continue
			}
			l := s.snapshot()
			echo.Emit(map[string]any{"set": map[string]any{"cpu": l.CPU, "app": l.App, "mem": l.Mem, "rps": l.RPS,
				"eps": l.EPS, "named": l.Named, "util": l.Util}})
		case "stats":
			echo.Emit(map[string]any{"served": s.served.Load()})
		case "quit":
			quit <- struct{}{}
			return
		default:
			echo.Emit(map[string]any{"error": "unknown command: " + fields[0]})
		}
	}
}

func (s *server) set(args []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.cur
	next.Named = copyMap(s.cur.Named)
	next.Util = copyMap(s.cur.Util)
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("want k=v, got %q", a)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("%s: %v", k, err)
		}
		switch {
		case k == "cpu":
			next.CPU = f
		case k == "app":
			next.App = f
		case k == "mem":
			next.Mem = f
		case k == "rps":
			next.RPS = f
		case k == "eps":
			next.EPS = f
		case strings.HasPrefix(k, "named."):
			next.Named[k[len("named."):]] = f
		case strings.HasPrefix(k, "util."):
			next.Util[k[len("util."):]] = f
		default:
			return fmt.Errorf("unknown key %q", k)
		}
	}
	s.cur = next
	if s.oob != nil {
		apply(s.oob, next)
	}
	return nil
}
