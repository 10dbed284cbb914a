package faults_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
)

// cutFor is how long TestConnectionsCut cuts connections.
const cutFor = 2 * time.Minute

// TestConnectionsCut: for two minutes under load, every connection between
// the relay and PostgreSQL (pool, lease, replication) is cut through the
// proxy every 1 to 4 seconds, with the poll reader and, at the same time
// on another database, the WAL reader. The log holds every committed event
// exactly once, in per-key order.
func TestConnectionsCut(t *testing.T) {
	for i, source := range []string{"poll", "cdc"} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ledger := e2e.NewLedger()
			var r *node
			if source == "cdc" {
				r, _ = e.cdcNode("relay")
			} else {
				r = e.newNode("relay")
			}
			r.start()
			e2e.WaitRole(t, r.proc, "leader", 30*time.Second)
			stopWriters := e.steady(200, 200*time.Millisecond, ledger)
			rng := rand.New(rand.NewPCG(uint64(i), 13))
			cuts, conns := 0, 0
			for end := time.Now().Add(cutFor); time.Now().Before(end); {
				time.Sleep(time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))) // deliberate pause: random 1-4 s between connection cuts
				conns += r.proxy.Cut()
				cuts++
				if r.proc.Exited() {
					t.Fatalf("the relay exited after %d cuts:\n%s", cuts, r.proc.Output())
				}
			}
			stopWriters()
			e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
			r.stop()
			n := e.checkAll(ledger)
			if conns == 0 {
				t.Errorf("%d cuts closed no connection: the relay does not reach PostgreSQL through the proxy", cuts)
			}
			t.Logf("%s: %d events exactly once in per-key order through %d cuts of %d connections in %v", source, n, cuts, conns, cutFor)
		})
	}
}
