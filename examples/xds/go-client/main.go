// A grpc-go client of the greet service (examples/greet.proto) through waypost's xDS control plane.
//
//	GRPC_XDS_BOOTSTRAP_CONFIG="$(waypost xds bootstrap --server waypost-xds:18000)" go run . -target xds:///greeter
//
// gRPC's own xDS client (the blank import below) asks the control plane for the service and balances every call.
// The two small greet messages are encoded with protowire, so the example needs no generated code.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // registers the xds:/// resolver and the xDS balancers
	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec passes already-encoded protobuf messages through (content type application/grpc+proto).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// helloRequest encodes greet.HelloRequest{name}.
func helloRequest(name string) []byte {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendString(b, name)
}

// helloReply decodes greet.HelloReply{message = 1, server = 2}.
func helloReply(b []byte) (message, server string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
		} else {
			var s string
			s, n = protowire.ConsumeString(b)
			switch num {
			case 1:
				message = s
			case 2:
				server = s
			}
		}
		if n < 0 {
			return "", "", protowire.ParseError(n)
		}
		b = b[n:]
	}
	return message, server, nil
}

func main() {
	target := flag.String("target", "xds:///greeter", "the service, as exported by waypost xds serve")
	calls := flag.Int("calls", 10, "number of calls")
	flag.Parse()
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("dial %s: %v", *target, err)
	}
	defer conn.Close()
	for i := 0; i < *calls; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, reply := helloRequest(fmt.Sprintf("call %d", i)), []byte(nil)
		err := conn.Invoke(ctx, "/greet.Greeter/SayHello", &req, &reply, grpc.ForceCodec(rawCodec{}), grpc.WaitForReady(true))
		cancel()
		if err != nil {
			log.Fatalf("call %d: %v", i, err)
		}
		message, server, err := helloReply(reply)
		if err != nil {
			log.Fatalf("call %d: bad reply: %v", i, err)
		}
		fmt.Println(message, "from", server)
	}
}
