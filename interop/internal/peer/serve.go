package peer

import (
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
)

// ServeHealth listens on addr and serves grpc.health.v1 naming itself in the
// x-backend trailer. It returns the server and the bound address.
func ServeHealth(addr, name string) (*grpc.Server, string) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		Fatalf("listen %s: %v", addr, err)
	}
	bound := lis.Addr().String()
	if name == "" {
		name = bound
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(NameInterceptor(name)))
	RegisterHealth(s)
	go func() { _ = s.Serve(lis) }()
	return s, bound
}

// WaitForStop blocks until SIGTERM/SIGINT or stdin closes.
func WaitForStop() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	eof := make(chan struct{})
	go func() {
		buf := make([]byte, 256)
		for {
			if _, err := os.Stdin.Read(buf); err != nil {
				close(eof)
				return
			}
		}
	}()
	select {
	case <-sig:
	case <-eof:
	}
}
