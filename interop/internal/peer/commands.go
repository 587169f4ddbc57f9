package peer

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// CallLoop reads commands from stdin, one per line, and answers each with one
// JSON line:
//
//	call N   N health checks: {"counts": {"<backend>": n, "error:<Code>": n}} (see CallHealth)
//	keys N   with hashKey set: one call per key "key-<i>", i < N: {"keys": {"key-<i>": "<backend>"}}
//	quit     exit
func CallLoop(conn grpc.ClientConnInterface, timeout time.Duration, ctxFn func(context.Context, int) context.Context,
	hashKey func(context.Context, string) context.Context) {
	Emit(map[string]any{"event": "ready"})
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "call":
			n := 1
			if len(fields) > 1 {
				if _, err := fmt.Sscan(fields[1], &n); err != nil {
					Emit(map[string]any{"error": "bad count: " + fields[1]})
					continue
				}
			}
			Emit(map[string]any{"counts": CallHealth(conn, n, timeout, ctxFn)})
		case "keys":
			n := 1
			if len(fields) > 1 {
				if _, err := fmt.Sscan(fields[1], &n); err != nil {
					Emit(map[string]any{"error": "bad count: " + fields[1]})
					continue
				}
			}
			if hashKey == nil {
				Emit(map[string]any{"error": "keys: no hash key support in this program"})
				continue
			}
			keys := map[string]string{}
			for i := 0; i < n; i++ {
				k := fmt.Sprintf("key-%d", i)
				one := CallHealth(conn, 1, timeout, func(ctx context.Context, _ int) context.Context { return hashKey(ctx, k) })
				for name := range one {
					keys[k] = name
				}
			}
			Emit(map[string]any{"keys": keys})
		case "quit":
			return
		default:
			Emit(map[string]any{"error": "unknown command: " + fields[0]})
		}
	}
}
