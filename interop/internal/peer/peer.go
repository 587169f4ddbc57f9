// Package peer holds what every interop program shares: flag helpers, the
// health service that names the backend in a trailer, and JSON output.
package peer

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// BackendHeader is the trailer (and header) that names the backend which answered.
const BackendHeader = "x-backend"

var outMu sync.Mutex

// Emit prints v as one JSON line on stdout; the Python tests read these lines.
func Emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		Fatalf("marshal: %v", err)
	}
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintln(os.Stdout, string(b))
}

// Fatalf reports err on stderr and exits 2.
func Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

// SplitList splits a comma-separated flag value, dropping empty parts.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// NameInterceptor sets the backend name as a header and a trailer on every unary call.
func NameInterceptor(name string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md := metadata.Pairs(BackendHeader, name)
		_ = grpc.SetHeader(ctx, md)
		_ = grpc.SetTrailer(ctx, md)
		return h(ctx, req)
	}
}

// RegisterHealth registers a grpc.health.v1 service answering SERVING for ""
// and for "whoami".
func RegisterHealth(s *grpc.Server) *health.Server {
	hs := health.NewServer()
	hs.SetServingStatus("", grpc_health_v1.HealthCheckResponse_SERVING)
	hs.SetServingStatus("whoami", grpc_health_v1.HealthCheckResponse_SERVING)
	grpc_health_v1.RegisterHealthServer(s, hs)
	return hs
}

// Counts tallies which backend answered; failures are counted as "error:<code>".
type Counts map[string]int

// CallHealth makes n health checks over conn, each bounded by timeout, and
// counts the backend named in the trailer (or header).
func CallHealth(conn grpc.ClientConnInterface, n int, timeout time.Duration, ctxFn func(context.Context, int) context.Context) Counts {
	client := grpc_health_v1.NewHealthClient(conn)
	counts := Counts{}
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		if ctxFn != nil {
			ctx = ctxFn(ctx, i)
		}
		var header, trailer metadata.MD
		_, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
		cancel()
		if err != nil {
			counts["error:"+status.Code(err).String()]++
			continue
		}
		name := first(trailer.Get(BackendHeader))
		if name == "" {
			name = first(header.Get(BackendHeader))
		}
		if name == "" {
			name = "unnamed"
		}
		counts[name]++
	}
	return counts
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// Sorted returns a sorted copy of values (Go-side sets have no order).
func Sorted(values []string) []string {
	out := append([]string{}, values...)
	sort.Strings(out)
	return out
}
