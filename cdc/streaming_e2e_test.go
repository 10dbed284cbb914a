package cdc_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestE2EStreamedCrashLoop: 8 writers commit 40,000 events over 1,000 keys
// in transactions of up to 400 events (one in 25 rolled back) into a
// database whose walsenders stream anything past 64 kB, while the relay
// is SIGKILLed at random moments at least 8 times, every third time with
// its acknowledgements held back. Every committed event is in the log
// exactly once, each key's in commit order, none rolled back, and the
// slot's statistics show that transactions were streamed.
func TestE2EStreamedCrashLoop(t *testing.T) {
	env := newRelayEnv(t)
	admin := pgtest.Connect(t, env.url)
	streamEarly(t, admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ledger := e2e.NewLedger()
	relay := env.start()
	load := e2e.CrashLoad(env.url, 40_000, 1000)
	load.PerTx = 400
	writeDone := e2e.WriteAsync(ctx, load, ledger)

	relay, kills, held := env.killLoop(rand.NewPCG(23, 2), 8, [2]time.Duration{200 * time.Millisecond, 1200 * time.Millisecond}).
		Run(t, ctx, relay, writeDone)
	e2e.WaitDrained(t, env.url, "outbox", 2*time.Minute)
	relay.Stop(time.Minute)
	if !strings.Contains(relay.Output(), "streaming=true") {
		t.Fatalf("the relay did not stream:\n%s", relay.Output())
	}
	n := e2e.CheckLog(t, env.dataDir, ledger)
	requireStreamed(t, admin, env.slot, 10)
	t.Logf("%d events exactly once in per-key order through %d SIGKILLs (%d with acknowledgements held back) while transactions streamed; %d rolled-back events absent",
		n, kills, held, len(ledger.RolledBack))
}

// TestE2EPostgresRestartWhileStreaming restarts PostgreSQL (immediate
// shutdown) twice under the relay while writers' transactions of up to
// 400 events stream: every committed event once, in per-key order.
func TestE2EPostgresRestartWhileStreaming(t *testing.T) { postgresRestartMidStream(t, 400, true) }
