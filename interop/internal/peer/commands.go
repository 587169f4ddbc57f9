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

// CallLoop reads "call N" / "quit" lines from stdin and answers each "call"
// with one JSON line {"counts": {...}} (see CallHealth).
func CallLoop(conn grpc.ClientConnInterface, timeout time.Duration, ctxFn func(context.Context, int) context.Context) {
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
		case "quit":
			return
		default:
			Emit(map[string]any{"error": "unknown command: " + fields[0]})
		}
	}
}
